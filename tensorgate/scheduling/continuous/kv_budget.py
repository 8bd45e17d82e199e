"""The KV cache budget: a fixed number of fixed-size blocks, computed from a byte budget.

Pure accounting. The bytes one token's keys and values take come from the model config:
``2 (K and V) x layers x kv_heads x head_dim x dtype bytes``.
"""

from __future__ import annotations


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * layers * kv_heads * head_dim * dtype_bytes


class KVBudget:
    def __init__(self, total_bytes: int, bytes_per_token: int, block_size: int) -> None:
        if bytes_per_token < 1 or block_size < 1:
            raise ValueError("bytes_per_token and block_size are positive")
        self.block_size = block_size
        self.bytes_per_block = bytes_per_token * block_size
        self.total_blocks = total_bytes // self.bytes_per_block
        self.used_blocks = 0

    @property
    def capacity_tokens(self) -> int:
        return self.total_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    @property
    def usage(self) -> float:
        return 0.0 if self.total_blocks == 0 else self.used_blocks / self.total_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_grow(self, held: int, tokens: int) -> bool:
        """Whether a holder of ``held`` blocks can grow to cover ``tokens`` tokens."""
        return self.blocks_for(tokens) - held <= self.free_blocks

    def grow(self, held: int, tokens: int) -> int:
        """Allocate what covering ``tokens`` needs beyond ``held``; returns the new holding."""
        need = max(0, self.blocks_for(tokens) - held)
        if need > self.free_blocks:
            raise RuntimeError("KV cache over budget")  # callers check can_grow first
        self.used_blocks += need
        return held + need

    def release(self, held: int) -> None:
        self.used_blocks -= held
        assert self.used_blocks >= 0, "released more blocks than were held"
