"""The lean forward computes what the model's own forward computes, for every attention layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm_model_factory import build_model
from transformers import AutoModelForCausalLM
from transformers.cache_utils import Cache, DynamicLayer

from tensorgate.backends.llm_lean_forward import lean_forward


@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2), (2, 1)], ids=["mha", "gqa", "mqa"])
def test_prefill_and_decode_match_the_models_forward(tmp_path: Path, heads: int, kv_heads: int) -> None:
    directory = build_model(tmp_path / "m" / "1", hidden=32, heads=heads, kv_heads=kv_heads, seed=heads + kv_heads)
    model = AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True, local_files_only=True).eval()
    lean = lean_forward(model)
    assert lean is not None
    generator = torch.Generator().manual_seed(1)
    lengths = [9, 4, 1, 7]  # left-padded to 9: one row of a single token, one with no padding
    width = max(lengths)
    ids = torch.randint(7, 60, (len(lengths), width), generator=generator)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = Cache(layers=[DynamicLayer() for _ in range(lean.num_layers)])
        got = lean(ids, positions, mask, cache)
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

        # Then two decode steps over the cache the prefill wrote, against the whole sequence recomputed.
        for _ in range(2):
            new = torch.randint(7, 60, (len(lengths), 1), generator=generator)
            ids = torch.cat([ids, new], dim=1)
            mask = torch.cat([mask, torch.ones_like(new)], dim=1)
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
            got = lean(new, positions[:, -1:], mask, cache)
            want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
