"""One loaded causal LM and the caches of the sequences it is generating, run a step at a time."""

from __future__ import annotations

import logging
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import Cache

from tensorgate.backends.base import Device
from tensorgate.backends.llm import kv_cache, row_groups
from tensorgate.backends.llm.kv_cache import DecodeBatch
from tensorgate.backends.llm.lean_forward import LeanForward, lean_forward
from tensorgate.backends.llm.sampling import Sampler
from tensorgate.backends.llm.tokenizer import TokenizerCodec
from tensorgate.errors import ModelLoadError
from tensorgate.generation import Sampled, ScheduledChunk, StepPlan

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_REQUIRED = ("config.json", "model.safetensors")


def torch_device(device: Device) -> str:
    if device.kind == "cpu":
        return "cpu"
    if device.kind == "gpu":
        if not torch.cuda.is_available():
            raise ModelLoadError("instance_group kind gpu needs CUDA, which this torch build or host does not have")
        return f"cuda:{device.index}"
    raise ModelLoadError("the llm backend runs on cpu or gpu; npu needs torch_npu, which is not installed")


def load_causal_lm(
    directory: Path, device: Device, dtype: str = "float32", threads: int = 0, lean: bool = True
) -> CausalLMRunner:
    """Load a model directory (config.json, model.safetensors, tokenizer files) onto ``device``."""
    missing = [name for name in _REQUIRED if not (directory / name).is_file()]
    if missing:
        raise ModelLoadError(f"the llm model directory lacks {', '.join(missing)} (safetensors weights only)")
    where = torch_device(device)
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, use_safetensors=True, dtype=_DTYPES[dtype]
        )
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the language model: {type(exc).__name__}: {exc}") from exc
    return CausalLMRunner(model.to(where).eval(), config, TokenizerCodec(tokenizer), where, dtype, threads, lean)


class CausalLMRunner:
    """Runs :class:`StepPlan`\\ s: drops freed caches, prefills chunks, decodes every decoding
    sequence in one forward over the decode batch, and samples."""

    def __init__(
        self, model: Any, config: Any, codec: TokenizerCodec, device: str, dtype: str, threads: int, lean: bool
    ) -> None:
        self.model = model
        self.codec = codec
        self.device = device
        self._threads = threads
        self._lean: LeanForward | None = lean_forward(model) if lean else None
        text = config.get_text_config(decoder=True)
        self._layer_count = int(text.num_hidden_layers)
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        self.max_position_embeddings = int(getattr(text, "max_position_embeddings", 2048) or 2048)
        self.kv_bytes_per_token = 2 * self._layer_count * kv_heads * head_dim * _DTYPES[dtype].itemsize
        self._solo: dict[int, Cache] = {}  # sequences outside the decode batch, each with its own cache
        self._batch: DecodeBatch | None = None
        self._sampler = Sampler(device)

    def reset(self) -> None:
        """Forget every sequence (an engine starting over this runner). Called from the thread that
        will run the steps, so the intra-op thread setting lands there: OpenMP keeps it per thread
        (a server whose load thread set 1 still stepped with 2 threads, twice as slow)."""
        if self._threads > 0:
            torch.set_num_threads(self._threads)
        self._solo.clear()
        self._batch = None
        self._sampler.reset()

    def close(self) -> None:
        self.reset()
        self.model = None

    # -- one step --------------------------------------------------------------------------------

    def run_step(self, plan: StepPlan) -> dict[int, Sampled]:
        """Drop freed caches, run prefill chunks one by one and every decode in one forward, sample."""
        with torch.inference_mode():
            return self._run_step(plan)

    def _run_step(self, plan: StepPlan) -> dict[int, Sampled]:
        preempted = set(plan.preempted)
        for seq_id in plan.freed:
            self._solo.pop(seq_id, None)
            if seq_id not in preempted:
                self._sampler.forget(seq_id)
        freed = set(plan.freed)
        decodes: dict[int, ScheduledChunk] = {}  # one token at a position > 0: a row of the decode batch
        prefills: list[ScheduledChunk] = []
        for c in plan.chunks:
            if len(c.token_ids) == 1 and c.start > 0:
                decodes[c.seq_id] = c
            else:
                prefills.append(c)
        self._reshape_batch(freed, decodes.keys())
        logits: list[torch.Tensor] = []
        sampled_chunks: list[ScheduledChunk] = []
        fresh = [c for c in prefills if c.start == 0 and c.seq_id not in self._solo]
        if len(fresh) > 1:  # the first chunks of several prompts: left-padded forwards of similar widths
            fresh.sort(key=lambda c: len(c.token_ids), reverse=True)
            widths = [len(c.token_ids) for c in fresh]
            for first, end in row_groups.similar_widths(widths, 0, len(fresh)):
                group = fresh[first:end]
                outs = self._prefill_fresh(group) if len(group) > 1 else [self._prefill(group[0])]
                for chunk, out in zip(group, outs, strict=True):
                    if chunk.sample:
                        logits.append(out)
                        sampled_chunks.append(chunk)
            batched = {c.seq_id for c in fresh}
            prefills = [c for c in prefills if c.seq_id not in batched]
        for chunk in prefills:
            out = self._prefill(chunk)
            if chunk.sample:
                logits.append(out)
                sampled_chunks.append(chunk)
        if decodes:
            batch_logits, row_chunks = self._decode(decodes)
            rows = [i for i, c in enumerate(row_chunks) if c is not None and c.sample]
            wanted = [c for c in row_chunks if c is not None and c.sample]
            if not logits:  # decodes alone, the usual step: the batch's logits are sampled in place
                if len(rows) != len(row_chunks):
                    batch_logits = batch_logits.index_select(0, torch.tensor(rows, device=batch_logits.device))
                return self._sampler.sample(batch_logits.float(), wanted)
            logits.extend(batch_logits[i] for i in rows)
            sampled_chunks.extend(wanted)
        if not logits:
            return {}
        return self._sampler.sample(torch.stack(logits).float(), sampled_chunks)

    def _new_cache(self) -> Cache:
        return kv_cache.new_cache(None if self._lean is None else self._lean.num_layers)

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Cache,
        groups: row_groups.RowGroups | None = None,
    ) -> torch.Tensor:
        """Logits after each row's last token; ``mask`` covers the cached tokens and the new ones.

        ``groups`` (decode steps) lets the lean forward skip padding; a model's own forward
        attends over every column.
        """
        if self._lean is not None:
            return self._lean(ids, positions, mask, cache, groups)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1]

    def _prefill(self, chunk: ScheduledChunk) -> torch.Tensor:
        cache = self._solo.get(chunk.seq_id)
        if cache is None:
            if chunk.start != 0:
                raise RuntimeError(f"sequence {chunk.seq_id} has no cache to continue at {chunk.start}")
            cache = self._new_cache()
            self._solo[chunk.seq_id] = cache
        elif cache.get_seq_length() != chunk.start:
            raise RuntimeError(f"sequence {chunk.seq_id} cache holds {cache.get_seq_length()}, not {chunk.start}")
        count = len(chunk.token_ids)
        ids = torch.tensor([chunk.token_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(chunk.start, chunk.start + count, device=self.device).unsqueeze(0)
        mask = torch.ones((1, chunk.start + count), dtype=torch.long, device=self.device)
        return self._forward(ids, positions, mask, cache)[0]

    def _prefill_fresh(self, chunks: list[ScheduledChunk]) -> list[torch.Tensor]:
        """First chunks of several prompts in one left-padded forward; each keeps its own cache after."""
        width = max(len(c.token_ids) for c in chunks)
        pads = [width - len(c.token_ids) for c in chunks]
        ids = [[0] * p + list(c.token_ids) for p, c in zip(pads, chunks, strict=True)]
        mask = [[0] * p + [1] * len(c.token_ids) for p, c in zip(pads, chunks, strict=True)]
        positions = [[0] * p + list(range(len(c.token_ids))) for p, c in zip(pads, chunks, strict=True)]
        cache = self._new_cache()
        logits = self._forward(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            torch.tensor(mask, dtype=torch.long, device=self.device),
            cache,
        )
        kv = kv_cache.layers_of(cache)
        for row, (pad, chunk) in enumerate(zip(pads, chunks, strict=True)):
            self._solo[chunk.seq_id] = kv_cache.cache_of(
                [(k[row : row + 1, :, pad:], v[row : row + 1, :, pad:]) for k, v in kv]
            )
        return [logits[row] for row in range(len(chunks))]

    def _reshape_batch(self, freed: set[int], decoding: AbstractSet[int]) -> None:
        """Make the decode batch hold the sequences decoding this step.

        A row that leaves is marked dead rather than copied out at once: it keeps riding along
        (its output ignored) until dead rows reach a quarter of the batch or sequences join, when
        one copy compacts the batch. Rebuilding on every departure was a visible share of step time.
        """
        batch = self._batch
        if batch is not None and batch.live == decoding:  # the usual step: the same rows again
            return
        if batch is not None:
            for i, seq_id in enumerate(batch.rows):
                if seq_id is None or seq_id in decoding:
                    continue
                if seq_id not in freed:  # alive but skipping this step: back to a cache of its own
                    self._solo[seq_id] = batch.extract(i)
                batch.rows[i] = None
                batch.live.discard(seq_id)
            if not batch.live:
                self._batch = batch = None
        joining = sorted(s for s in decoding if batch is None or s not in batch.live)
        dead = 0 if batch is None else len(batch.rows) - len(batch.live)
        if joining or (batch is not None and dead and dead * 4 >= len(batch.rows)):
            self._batch = kv_cache.rebuild(batch, [(s, self._own_layers(s)) for s in joining], self._layer_count)

    def _own_layers(self, seq_id: int) -> list[kv_cache.LayerKV]:
        cache = self._solo.pop(seq_id, None)
        if cache is None:
            raise RuntimeError(f"sequence {seq_id} decodes without a prefilled cache")
        return kv_cache.layers_of(cache)

    def _decode(self, decodes: dict[int, ScheduledChunk]) -> tuple[torch.Tensor, list[ScheduledChunk | None]]:
        """One forward for every row of the decode batch: its logits, and each row's chunk (None: departed)."""
        batch = self._batch
        assert batch is not None and batch.live == decodes.keys()
        row_chunks = [None if s is None else decodes[s] for s in batch.rows]
        ids = [0 if c is None else c.token_ids[0] for c in row_chunks]
        lengths = [0 if c is None else c.start + 1 for c in row_chunks]
        rows = len(ids)
        ones = torch.ones((rows, 1), dtype=torch.long, device=self.device)
        batch.mask = torch.cat([batch.mask, ones], dim=1)
        # Flat lists: torch builds a tensor from a list of one-element lists several times slower.
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device).view(rows, 1)
        positions_t = (torch.tensor(lengths, dtype=torch.long, device=self.device) - 1).clamp_(min=0).view(rows, 1)
        if batch.ranges is None:
            batch.ranges = row_groups.row_ranges(lengths)
        logits = self._forward(
            ids_t, positions_t, batch.mask, batch.cache, row_groups.row_groups(batch.ranges, lengths)
        )
        return logits, row_chunks
