"""The model's tokenizer as generation uses it (:class:`tensorgate.generation.TextCodec`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TokenizerCodec:
    """Prompts to ids, ids to text, chat messages to a prompt, through a transformers tokenizer."""

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
