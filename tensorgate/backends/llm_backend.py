"""The ``llm`` backend: a Hugging Face causal LM run one continuous-batching step at a time.

Loaded once from a local directory (config.json, model.safetensors, tokenizer files): never
downloaded, safetensors only. Caches are kept per sequence: a sequence being prefilled owns a
cache of its own; once it decodes it joins the decode batch, one left-padded cache for all decoding
sequences with an attention mask and explicit position ids, so every decode step is one forward
for all of them. Rows join (left-padded to the batch length) and leave (dropped) between steps;
padding columns that no row needs any more are trimmed.

Called from one worker thread only (the engine's); never sees queues, HTTP or asyncio.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from tensorgate.backends.base import Device
from tensorgate.backends.llm_lean_forward import LeanForward, RowGroups, lean_forward
from tensorgate.backends.llm_step import Sampled, SamplingParams, ScheduledChunk, StepPlan
from tensorgate.errors import ModelLoadError

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


class TextCodec:
    """The model's tokenizer: prompts to ids, ids to text, chat messages to a prompt."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        # transformers' decode converts every id through Python first (profiled: ~4x the Rust call);
        # the raw tokenizer gives the same text when no clean-up of spaces is configured.
        raw = getattr(tokenizer, "_tokenizer", None)
        cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self._raw: Any = raw if raw is not None and not cleanup else None
        self.eos_token_id: int | None = tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True))

    def decode(self, token_ids: Sequence[int]) -> str:
        if self._raw is not None:  # the Rust tokenizer directly: called for every token of every stream
            return str(self._raw.decode(list(token_ids), skip_special_tokens=True))
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        return str(self._tok.convert_ids_to_tokens(int(token_id)))

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        text = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self._tok.encode(text, add_special_tokens=False))


# Spare columns in the decode batch's slab: appends write in place until they run out.
_SPARE_COLUMNS = 64

# Prompts prefilled together are left-padded to the longest, and the padding costs as much as real
# tokens (more in attention, which grows with the square of the width). Several prompts of one step
# run as groups of similar lengths when a split saves at least MIN_PAD_SAVING of the token slots
# and at least MIN_SAVED_SLOTS of them: a forward has a fixed cost too (measured on the benchmark's
# small Llama: about what 500 token slots cost). On the benchmark's prompts of 16-256 tokens this
# took mean time to first token from 0.21 s to 0.11 s; whole-run time moved within noise (-1 to -5 %).
MIN_PAD_SAVING = 0.2
MIN_SAVED_SLOTS = 256
MAX_GROUP_DEPTH = 2  # at most 4 forwards per step


# A decode step's attention over the padded batch is its largest cost, and the padding is wasted:
# rows sit in the batch longest first, and ranges of shorter rows attend over only the key columns
# they need when that saves at least this many (row, key) pairs. A range costs three more tensor
# operations per layer, about what 2,000 pairs cost on the benchmark's small Llama.
MIN_SAVED_KEY_SLOTS = 4096


def _similar_widths(
    widths: list[int], low: int, high: int, depth: int = MAX_GROUP_DEPTH, min_saved: int = MIN_SAVED_SLOTS
) -> list[tuple[int, int]]:
    """Row ranges of ``widths`` (sorted, longest first) to pad and run together."""
    whole = (high - low) * widths[low]
    if depth == 0 or high - low < 2:
        return [(low, high)]
    split = min(range(low + 1, high), key=lambda k: (k - low) * widths[low] + (high - k) * widths[k])
    saved = whole - (split - low) * widths[low] - (high - split) * widths[split]
    if saved < MIN_PAD_SAVING * whole or saved < min_saved:
        return [(low, high)]
    return _similar_widths(widths, low, split, depth - 1, min_saved) + _similar_widths(
        widths, split, high, depth - 1, min_saved
    )


def _row_ranges(lengths: list[int]) -> list[tuple[int, int]]:
    """Ranges of decode rows (about longest first) worth attending over different key columns."""
    widths = lengths[:]
    for i in range(len(widths) - 2, -1, -1):  # a range needs its longest row's columns
        widths[i] = max(widths[i], widths[i + 1])
    return _similar_widths(widths, 0, len(widths), min_saved=MIN_SAVED_KEY_SLOTS)


def _row_groups(ranges: list[tuple[int, int]], lengths: list[int]) -> RowGroups:
    """Each range with the key columns its longest row needs this step."""
    return [(first, end, max(lengths[first:end])) for first, end in ranges]


class _SlabLayer(DynamicLayer):  # type: ignore[misc]
    """A cache layer whose keys and values sit in a preallocated slab with spare columns.

    HF's DynamicLayer concatenates on every step, copying the whole batch's cache each time; for
    the decode batch that copy was the largest cost of a step (profiled: about 40% of step time
    with 100 sequences). Here an append writes the new column in place; the slab grows rarely.

    Keys are stored transposed, (rows, heads, head_dim, positions), and shown as the usual
    (rows, heads, positions, head_dim) view. Attention multiplies queries by the keys' transpose,
    and a batched matmul over these small matrices runs about twice as fast when that operand is
    contiguous along positions (100 rows of 450 keys: 0.44 ms against 0.21 ms per layer and step,
    measured alone), so that operation takes about half as long.
    """

    def __init__(self, keys_t: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Adopt slabs ``keys_t`` (rows, heads, head_dim, capacity) and ``values`` (rows, heads,
        capacity, head_dim) whose first ``length`` positions are filled."""
        super().__init__()
        self._kt = keys_t
        self._v = values
        self._len = length
        self.device = keys_t.device
        self.is_initialized = True
        self._expose()

    def _expose(self) -> None:
        self.keys = self._kt[..., : self._len].transpose(2, 3)
        self.values = self._v[:, :, : self._len]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if self._len + n > self._v.shape[2]:
            grow = max(n, _SPARE_COLUMNS, self._v.shape[2] // 4)
            self._kt = torch.cat([self._kt, self._kt.new_empty((*self._kt.shape[:3], grow))], dim=3)
            self._v = torch.cat([self._v, self._v.new_empty((*self._v.shape[:2], grow, self._v.shape[3]))], dim=2)
        self._kt[..., self._len : self._len + n] = key_states.transpose(2, 3)
        self._v[:, :, self._len : self._len + n] = value_states
        self._len += n
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return int(self._len)


@dataclass(slots=True)
class _DecodeBatch:
    """The left-padded cache of every decoding sequence: row ``i`` belongs to ``rows[i]``."""

    rows: list[int | None]  # None: a departed row, compacted away later
    cache: Cache
    mask: torch.Tensor  # (rows, padded length), 1 where a real token is cached
    live: set[int] = field(default_factory=set)  # the rows that are not None
    # Row ranges for attention, found at the batch's first step (~70 us for 100 rows). Every row
    # then grows by a token a step, so the best split stays put; departures only shrink needs.
    ranges: list[tuple[int, int]] | None = None


def _runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(destination, source) row pairs, both increasing, as runs (first destination, first source, count)."""
    runs: list[tuple[int, int, int]] = []
    for dst, src in pairs:
        if runs and runs[-1][0] + runs[-1][2] == dst and runs[-1][1] + runs[-1][2] == src:
            first, source, count = runs[-1]
            runs[-1] = (first, source, count + 1)
        else:
            runs.append((dst, src, 1))
    return runs


def _right_align(
    kt: torch.Tensor, v: torch.Tensor, rows: slice, width: int, keys_t: torch.Tensor, values: torch.Tensor
) -> None:
    """Write ``rows`` of a slab pair filled to ``width``: ``keys_t`` (rows, heads, head_dim, n) and
    ``values`` (rows, heads, n, head_dim) in the last n positions, zeros before them."""
    start = width - keys_t.shape[3]
    kt[rows, :, :, :start] = 0
    v[rows, :, :start] = 0
    kt[rows, :, :, start:width] = keys_t
    v[rows, :, start:width] = values


def _layers(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_of(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    return DynamicCache(ddp_cache_data=kv)


class CausalLMRunner:
    """One loaded model and the caches of the sequences it is generating."""

    def __init__(self) -> None:
        self.model: Any = None
        self.codec: TextCodec | None = None
        self.device = "cpu"
        self.max_position_embeddings = 2048
        self.kv_bytes_per_token = 0
        self._layer_count = 0
        self._threads = 0
        self._lean: LeanForward | None = None
        self._solo: dict[int, DynamicCache] = {}
        self._batch: _DecodeBatch | None = None
        self._generators: dict[int, torch.Generator] = {}

    # -- loading ---------------------------------------------------------------------------------

    def load(
        self, directory: Path, device: Device, dtype: str = "float32", threads: int = 0, lean: bool = True
    ) -> None:
        missing = [name for name in _REQUIRED if not (directory / name).is_file()]
        if missing:
            raise ModelLoadError(f"the llm model directory lacks {', '.join(missing)} (safetensors weights only)")
        self.device = torch_device(device)
        self._threads = threads
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
        self.model = model.to(self.device).eval()
        self.codec = TextCodec(tokenizer)
        self._lean = lean_forward(self.model) if lean else None
        text = config.get_text_config(decoder=True)
        layers = self._layer_count = int(text.num_hidden_layers)
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        self.max_position_embeddings = int(getattr(text, "max_position_embeddings", 2048) or 2048)
        self.kv_bytes_per_token = 2 * layers * kv_heads * head_dim * _DTYPES[dtype].itemsize

    def reset(self) -> None:
        """Forget every sequence (an engine starting over this runner). Called from the thread that
        will run the steps, so the intra-op thread setting lands there: OpenMP keeps it per thread
        (measured: a server whose load thread set 1 still stepped with 2 threads, 2x slower here)."""
        if self._threads > 0:
            torch.set_num_threads(self._threads)
        self._solo.clear()
        self._batch = None
        self._generators.clear()

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
                self._generators.pop(seq_id, None)
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
            for first, end in _similar_widths(widths, 0, len(fresh)):
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
                return self._sample(batch_logits.float(), wanted)
            logits.extend(batch_logits[i] for i in rows)
            sampled_chunks.extend(wanted)
        if not logits:
            return {}
        return self._sample(torch.stack(logits).float(), sampled_chunks)

    def _new_cache(self) -> Cache:
        if self._lean is None:
            return DynamicCache()
        return Cache(layers=[DynamicLayer() for _ in range(self._lean.num_layers)])

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Cache,
        row_groups: RowGroups | None = None,
    ) -> torch.Tensor:
        """Logits after each row's last token; ``mask`` covers the cached tokens and the new ones.

        ``row_groups`` (decode steps) lets the lean forward skip padding; a model's own forward
        attends over every column.
        """
        if self._lean is not None:
            return self._lean(ids, positions, mask, cache, row_groups)
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
        kv = _layers(cache)
        for row, (pad, chunk) in enumerate(zip(pads, chunks, strict=True)):
            self._solo[chunk.seq_id] = _cache_of(
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
                    self._solo[seq_id] = self._extract(batch, i)
                batch.rows[i] = None
                batch.live.discard(seq_id)
            if not batch.live:
                self._batch = batch = None
        joining = sorted(s for s in decoding if batch is None or s not in batch.live)
        dead = 0 if batch is None else len(batch.rows) - len(batch.live)
        if joining or (batch is not None and dead and dead * 4 >= len(batch.rows)):
            self._rebuild(joining)

    def _extract(self, batch: _DecodeBatch, row: int) -> DynamicCache:
        length = int(batch.mask[row].sum())
        width = batch.mask.shape[1]
        kv = [
            (k[row : row + 1, :, width - length :], v[row : row + 1, :, width - length :])
            for k, v in _layers(batch.cache)
        ]
        return _cache_of([(k.clone(), v.clone()) for k, v in kv])

    def _rebuild(self, joining: list[int]) -> None:
        """A new decode batch: the live rows and the joining sequences, longest first, in new slabs.

        Each row's keys and values are copied once, into place. (Padding every part, concatenating,
        reordering and copying the result into slabs copied the whole batch four times a join, and
        while requests arrive a few at a time sequences join at most steps.)
        """
        batch = self._batch
        # (cached length, sequence, row in the old batch or -1, its own cache's layers when joining)
        entries: list[tuple[int, int, int, list[tuple[torch.Tensor, torch.Tensor]] | None]] = []
        if batch is not None:
            lengths = batch.mask.sum(dim=1).tolist()
            entries += [(int(lengths[i]), s, i, None) for i, s in enumerate(batch.rows) if s is not None]
        for seq_id in joining:
            cache = self._solo.pop(seq_id, None)
            if cache is None:
                raise RuntimeError(f"sequence {seq_id} decodes without a prefilled cache")
            kv = _layers(cache)
            entries.append((int(kv[0][0].shape[2]), seq_id, -1, kv))
        # Longest first, so that decode steps can give ranges of shorter rows fewer key columns
        # (every row then grows by one token a step, which keeps the order until the next rebuild).
        entries.sort(key=lambda e: -e[0])
        width = entries[0][0]
        runs = _runs([(k, e[2]) for k, e in enumerate(entries) if e[3] is None])
        layers = []
        for index in range(self._layer_count):
            kt, v = self._empty_slabs(batch, entries, index, width)
            if runs:  # the old batch's rows keep their order: a slice copy per run of them
                old = batch.cache.layers[index]  # type: ignore[union-attr]
                cols = min(old._len, width)
                for first, source, count in runs:
                    rows_in = slice(source, source + count)
                    _right_align(
                        kt,
                        v,
                        slice(first, first + count),
                        width,
                        old._kt[rows_in, :, :, old._len - cols : old._len],
                        old._v[rows_in, :, old._len - cols : old._len],
                    )
            for k, (_, _, _, own) in enumerate(entries):
                if own is not None:
                    keys, values = own[index]
                    _right_align(kt, v, slice(k, k + 1), width, keys.transpose(2, 3), values)
            layers.append(_SlabLayer(kt, v, width))
        starts = width - torch.tensor([e[0] for e in entries], device=self.device)
        mask = (torch.arange(width, device=self.device)[None, :] >= starts[:, None]).long()
        rows: list[int | None] = [e[1] for e in entries]
        self._batch = _DecodeBatch(rows, Cache(layers=layers), mask, {e[1] for e in entries})

    @staticmethod
    def _empty_slabs(
        batch: _DecodeBatch | None, entries: list[Any], index: int, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Slabs for layer ``index``, not yet written (the caller zeroes every padding column: a
        NaN there would reach real rows through 0 x NaN)."""
        if batch is not None:
            old = batch.cache.layers[index]
            keys_t, values = old._kt, old._v
            heads, key_dim, value_dim = keys_t.shape[1], keys_t.shape[2], values.shape[3]
        else:
            keys_t, values = next(e[3] for e in entries if e[3] is not None)[index]
            heads, key_dim, value_dim = keys_t.shape[1], keys_t.shape[3], values.shape[3]
        rows, capacity = len(entries), width + _SPARE_COLUMNS
        return keys_t.new_empty((rows, heads, key_dim, capacity)), values.new_empty((rows, heads, capacity, value_dim))

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
            batch.ranges = _row_ranges(lengths)
        logits = self._forward(ids_t, positions_t, batch.mask, batch.cache, _row_groups(batch.ranges, lengths))
        return logits, row_chunks

    # -- sampling --------------------------------------------------------------------------------

    def _generator(self, seq_id: int, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
            self._generators[seq_id] = gen
        return gen

    def _sample(self, logits: torch.Tensor, chunks: list[ScheduledChunk]) -> dict[int, Sampled]:
        logprobs = torch.log_softmax(logits, dim=-1)
        greedy = torch.argmax(logits, dim=-1)
        chosen: list[int] = greedy.tolist()
        drawn = False
        for i, chunk in enumerate(chunks):
            if not chunk.params.greedy:
                chosen[i] = self._draw(logits[i], chunk.params, self._generator(chunk.seq_id, chunk.params.seed))
                drawn = True
        index = torch.tensor(chosen, device=logits.device) if drawn else greedy
        picked: list[float] = logprobs.gather(1, index[:, None]).view(-1).tolist()
        result: dict[int, Sampled] = {}
        for i, chunk in enumerate(chunks):
            top: tuple[tuple[int, float], ...] = ()
            wanted = chunk.params.logprobs
            if wanted:
                values, indices = torch.topk(logprobs[i], min(wanted, logprobs.shape[-1]))
                top = tuple(zip(indices.tolist(), values.tolist(), strict=True))
            result[chunk.seq_id] = Sampled(chosen[i], picked[i], top)
        return result

    @staticmethod
    def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
        scores = logits / max(params.temperature, 1e-5)
        if params.top_k > 0 and params.top_k < scores.shape[-1]:
            kth = torch.topk(scores, params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, -math.inf)
        if params.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True)
            cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
            drop = cumulative - torch.softmax(sorted_scores, dim=-1) > params.top_p
            sorted_scores = sorted_scores.masked_fill(drop, -math.inf)
            scores = torch.full_like(scores, -math.inf).scatter(0, order, sorted_scores)
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator).item())
