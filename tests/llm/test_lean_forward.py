"""The lean forward computes what the model's own forward computes, for every attention layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from llm_model_factory import build_model
from transformers import AutoModelForCausalLM
from transformers.cache_utils import Cache, DynamicLayer

from tensorgate.backends.llm.lean_forward import LeanForward, lean_forward


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


def _load(tmp_path: Path, dtype: torch.dtype = torch.float32, **shape: int) -> tuple[Any, LeanForward]:
    directory = build_model(tmp_path / "m" / "1", hidden=32, **shape)
    model = AutoModelForCausalLM.from_pretrained(
        directory, use_safetensors=True, local_files_only=True, dtype=dtype
    ).eval()
    lean = lean_forward(model)
    assert lean is not None
    return model, lean


def _left_padded(lengths: list[int], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(lengths)
    ids = torch.randint(7, 60, (len(lengths), width), generator=generator)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    return ids, mask, (mask.cumsum(dim=1) - 1).clamp(min=0)


def test_row_groups_attend_over_only_the_key_columns_each_range_needs(tmp_path: Path) -> None:
    # A decode batch ordered longest first, as the backend keeps it: the short rows' ranges attend
    # over their last few key columns only, and must get what attending over every column gives.
    model, lean = _load(tmp_path, heads=4, kv_heads=2)
    generator = torch.Generator().manual_seed(2)
    lengths = [12, 11, 5, 4, 1]
    ids, mask, positions = _left_padded(lengths, generator)
    with torch.inference_mode():
        grouped = Cache(layers=[DynamicLayer() for _ in range(lean.num_layers)])
        whole = Cache(layers=[DynamicLayer() for _ in range(lean.num_layers)])
        lean(ids, positions, mask, grouped)
        lean(ids, positions, mask, whole)
        for step in range(1, 4):
            new = torch.randint(7, 60, (len(lengths), 1), generator=generator)
            ids = torch.cat([ids, new], dim=1)
            mask = torch.cat([mask, torch.ones_like(new)], dim=1)
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
            now = [n + step for n in lengths]
            groups = [(0, 2, now[0]), (2, 4, now[2]), (4, 5, now[4])]
            got = lean(new, positions[:, -1:], mask, grouped, groups)
            assert torch.equal(got.isfinite(), torch.ones_like(got, dtype=torch.bool))
            torch.testing.assert_close(got, lean(new, positions[:, -1:], mask, whole), rtol=1e-5, atol=1e-5)
            want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bfloat16_matches_the_models_own_bfloat16_forward(tmp_path: Path) -> None:
    # Both sides round to bfloat16 at different points (fused projections, another attention
    # kernel), so they agree to bfloat16's precision, and on the greedy choice of every row.
    model, lean = _load(tmp_path, dtype=torch.bfloat16, heads=4, kv_heads=2)
    generator = torch.Generator().manual_seed(3)
    lengths = [9, 6, 1]
    ids, mask, positions = _left_padded(lengths, generator)
    with torch.inference_mode():
        cache = Cache(layers=[DynamicLayer() for _ in range(lean.num_layers)])
        got = lean(ids, positions, mask, cache)
        for step in range(3):
            want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
            assert got.dtype == want.dtype == torch.bfloat16
            scale = want.float().abs().max()
            assert (got.float() - want.float()).abs().max() <= 0.03 * scale, f"step {step}"
            assert torch.equal(got.argmax(dim=-1), want.argmax(dim=-1)), f"step {step}"
            new = got.argmax(dim=-1, keepdim=True)
            ids = torch.cat([ids, new], dim=1)
            mask = torch.cat([mask, torch.ones_like(new)], dim=1)
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
            got = lean(new, positions[:, -1:], mask, cache)
