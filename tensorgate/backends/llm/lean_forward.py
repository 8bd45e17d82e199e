"""A Llama-family model's forward pass over its own weights, fused: the math of the ``llm`` backend.

Used for decode steps and prefill chunks of plain Llama models unless ``llm.lean_forward`` is
false (see :func:`lean_forward`); any other model runs its own ``forward``. It replaces
transformers' Llama forward, which it beats served over HTTP by 1.28x in tokens/s on the
7 M-parameter model of ``benchmarks/bench_llm_realistic.py`` (time per output token 1.2-1.55x).

The cache it writes to is the backend's business: a layer's ``cached.update(keys, values)``
returns every cached key and value of that layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

from tensorgate.backends.llm.row_groups import RowGroups


class LeanForward:
    """A forward pass through a Llama-family model's own weights, for decode steps and prefill chunks.

    The same math as the model's forward with fewer, larger tensor operations: for a small model
    the per-operation cost is most of a step (profiled: HF's forward spent ~4 ms of Python per call
    on this host, and a module-by-module decode still spent a quarter of a step setting up
    ``scaled_dot_product_attention`` for one query per row). Here:

    - q, k and v come out of one matmul, gate and up out of another: the model's projection
      weights are re-pointed at views of one fused tensor, so nothing is stored twice and the
      model's own forward reads the very same memory;
    - attention is two batched matmuls and a softmax, with the query heads that share a key/value
      head stacked as rows of one matrix (grouped-query attention without copying keys);
    - the mask (padding, causality) becomes one additive bias per call, shared by every layer.
    """

    def __init__(self, model: Any) -> None:
        inner = model.model
        config = model.config
        self._heads = int(config.num_attention_heads)
        self._kv_heads = int(getattr(config, "num_key_value_heads", None) or self._heads)
        self._head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self._heads)
        self._embed = inner.embed_tokens.weight
        self._rotary = inner.rotary_emb
        self._norm = _RMSNorm(inner.norm)
        self._head = model.lm_head.weight
        self._layers = [_LeanLayer(layer, self._heads, self._kv_heads, self._head_dim) for layer in inner.layers]
        half = self._head_dim // 2
        # rotate_half as a matrix: x @ R == cat(-x[half:], x[:half]); one matmul instead of four ops.
        rotate = torch.zeros(self._head_dim, self._head_dim, dtype=self._embed.dtype, device=self._embed.device)
        rotate[half:, :half] = -torch.eye(half)
        rotate[:half, half:] = torch.eye(half)
        self._rotate = rotate
        # Rotary cos and sin of every position, computed once by the model's own module: a lookup
        # per step instead of its ten operations (~35 us a decode step here). Not for the rope types
        # whose frequencies change with the sequence's length.
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        if getattr(self._rotary, "rope_type", "default") not in ("dynamic", "longrope"):
            every = torch.arange(int(config.max_position_embeddings), device=self._embed.device)[None]
            with torch.inference_mode():
                cos, sin = self._rotary(self._embed[None, :1], every)
            self._rope = (cos[0], sin[0])

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor,
        cache: Cache,
        row_groups: RowGroups | None = None,
    ) -> torch.Tensor:
        """Logits after each row's last token.

        ``ids`` and ``positions`` are (rows, T): T new tokens per row, left-padded, positions below
        the model's ``max_position_embeddings``; ``key_mask`` is (rows, cached + T), true where a
        real token is (or is about to be) cached. ``row_groups``
        (decode steps only): consecutive row ranges and how many of the last key columns each
        needs, so that short rows do not pay for attending over the longest row's padding.
        """
        count = ids.shape[1]
        hidden = F.embedding(ids, self._embed)  # (rows, T, hidden)
        if self._rope is not None:
            cos, sin = self._rope[0][positions], self._rope[1][positions]  # (rows, T, head_dim)
        else:
            cos, sin = self._rotary(hidden, positions)
        bias = self._bias(key_mask.bool(), count, hidden.dtype)
        groups = row_groups if count == 1 and row_groups and len(row_groups) > 1 else None
        for layer, cached in zip(self._layers, cache.layers, strict=True):
            hidden = layer(hidden, cos[:, :, None], sin[:, :, None], self._rotate, bias, cached, groups)
        return F.linear(self._norm(hidden[:, -1]), self._head)

    def _bias(self, key_mask: torch.Tensor, count: int, dtype: torch.dtype) -> torch.Tensor:
        """0 where a query may look, -inf elsewhere.

        A decode step (T = 1) gets (rows * kv_heads, 1, keys): every query head of a row sees the
        same keys, and ``baddbmm`` broadcasts it at no cost, instead of a copy per head.
        A prefill (T > 1) gets (rows, 1, T, keys), the mask of ``scaled_dot_product_attention``.
        """
        rows, keys = key_mask.shape
        if count == 1:
            zero = torch.zeros((), dtype=dtype, device=key_mask.device)
            bias = torch.where(key_mask[:, None, :], zero, zero - math.inf)
            if self._kv_heads == 1:
                return bias
            return bias[:, None].expand(rows, self._kv_heads, 1, keys).reshape(rows * self._kv_heads, 1, keys)
        cached = keys - count
        allowed = key_mask[:, None, :]
        if count > 1:
            causal = torch.ones((count, keys), dtype=torch.bool, device=key_mask.device).tril(cached)
            allowed = allowed & causal
            # A padding query sees only itself: a row of -inf would give NaN, and NaN keys and
            # values at padded positions would reach real queries through 0 * NaN.
            itself = torch.zeros((count, keys), dtype=torch.bool, device=key_mask.device)
            itself[:, cached:] = torch.eye(count, dtype=torch.bool, device=key_mask.device)
            allowed = allowed | itself
        bias = torch.zeros(allowed.shape, dtype=dtype, device=key_mask.device).masked_fill_(~allowed, -math.inf)
        return bias[:, None]  # (rows, 1, T, keys): every head of a row sees the same keys


class _LeanLayer:
    """One decoder layer over fused weights (see ``LeanForward``)."""

    def __init__(self, layer: Any, heads: int, kv_heads: int, head_dim: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self._qkv = _fuse(attn.q_proj, attn.k_proj, attn.v_proj)
        self._gate_up = _fuse(mlp.gate_proj, mlp.up_proj)
        self._out = attn.o_proj.weight
        self._down = mlp.down_proj.weight
        self._act = mlp.act_fn
        self._attn_norm = _RMSNorm(layer.input_layernorm)
        self._mlp_norm = _RMSNorm(layer.post_attention_layernorm)
        self._scaling = float(attn.scaling)
        self._heads, self._kv_heads, self._head_dim = heads, kv_heads, head_dim
        self._intermediate = int(mlp.gate_proj.weight.shape[0])

    def __call__(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rotate: torch.Tensor,
        bias: torch.Tensor,
        cached: Any,
        row_groups: RowGroups | None = None,
    ) -> torch.Tensor:
        rows, count = hidden.shape[0], hidden.shape[1]
        heads, kv_heads, dim = self._heads, self._kv_heads, self._head_dim
        groups = heads // kv_heads
        qkv = F.linear(self._attn_norm(hidden), self._qkv)  # (rows, T, (heads + 2 kv_heads) * dim)
        qk = qkv[..., : (heads + kv_heads) * dim].view(rows, count, heads + kv_heads, dim)
        qk = qk * cos + torch.matmul(qk, rotate) * sin
        v = qkv[..., (heads + kv_heads) * dim :].view(rows, count, kv_heads, dim)
        keys, values = cached.update(qk[:, :, heads:].transpose(1, 2), v.transpose(1, 2))  # (rows, kv, keys, dim)
        if count > 1:
            # A prefill: torch's fused attention never builds the (T, keys) scores of every head in
            # memory. For 8 prompts of 256 tokens it took 1.9 ms where the matmuls below took 7.9 ms
            # (the scores outgrow the cache); for a decode step's one query per row it is slower.
            out = F.scaled_dot_product_attention(
                qk[:, :, :heads].transpose(1, 2),
                keys,
                values,
                attn_mask=bias,
                scale=self._scaling,
                enable_gqa=groups > 1,
            )
            return self._mlp(hidden + F.linear(out.transpose(1, 2).reshape(rows, count, heads * dim), self._out))
        length = keys.shape[2]
        q = qk[:, :, :heads].reshape(rows, count, kv_heads, groups, dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(rows * kv_heads, groups * count, dim)
        keys_t = keys.reshape(rows * kv_heads, length, dim).transpose(1, 2)
        values = values.reshape(rows * kv_heads, length, dim)
        if row_groups is None:
            out = self._attend(bias, q, keys_t, values)
        else:  # each range of rows over the last key columns it needs (the rest is its padding)
            out = torch.cat(
                [
                    self._attend(
                        bias[first * kv_heads : end * kv_heads, :, length - width :],
                        q[first * kv_heads : end * kv_heads],
                        keys_t[first * kv_heads : end * kv_heads, :, length - width :],
                        values[first * kv_heads : end * kv_heads, length - width :],
                    )
                    for first, end, width in row_groups
                ]
            )
        out = out.view(rows, kv_heads, groups, count, dim).permute(0, 3, 1, 2, 4).reshape(rows, count, heads * dim)
        return self._mlp(hidden + F.linear(out, self._out))

    def _mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(self._mlp_norm(hidden), self._gate_up).split(self._intermediate, dim=-1)
        return hidden + F.linear(self._act(gate) * up, self._down)

    def _attend(self, bias: torch.Tensor, q: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        scores = torch.baddbmm(bias, q, keys_t, alpha=self._scaling)
        return torch.bmm(torch.softmax(scores, dim=-1), values)


class _RMSNorm:
    """A Llama RMSNorm module's weights as one fused ``torch.rms_norm`` call (the module makes seven
    tensor operations of it, in float32 as this does)."""

    def __init__(self, norm: Any) -> None:
        self._weight = norm.weight
        self._eps = float(norm.variance_epsilon)
        self._shape = (int(norm.weight.shape[0]),)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dtype != torch.float32:  # as the module: normalize in float32, cast back, then scale
            return self._weight * F.rms_norm(hidden.float(), self._shape, None, self._eps).to(hidden.dtype)
        return F.rms_norm(hidden, self._shape, self._weight, self._eps)


def _fuse(*linears: Any) -> torch.Tensor:
    """One weight for several bias-free projections of the same input; each module's weight becomes a
    view of it, so the memory is not doubled and the model's own forward computes the same thing."""
    fused = torch.cat([linear.weight.detach() for linear in linears])
    offset = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = torch.nn.Parameter(fused[offset : offset + rows], requires_grad=False)
        offset += rows
    return fused


def lean_forward(model: Any) -> LeanForward | None:
    """The lean forward for plain Llama models (eval mode, no biases); None for anything else."""
    config = model.config
    plain = (
        config.model_type == "llama"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "pretraining_tp", 1) == 1
        and not model.training
    )
    return LeanForward(model) if plain else None
