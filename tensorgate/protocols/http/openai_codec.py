"""OpenAI-compatible request schemas and response documents for completions and chat.

Requests are validated with pydantic at the edge (unknown fields are ignored, as OpenAI's own
server tolerates newer client fields); bad values become InvalidInput (400) naming the field.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tensorgate.errors import InvalidInput
from tensorgate.generation import SamplingParams

MAX_N = 16
_M = TypeVar("_M", bound=BaseModel)
MAX_STOPS = 8


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=False)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    priority: int | None = Field(default=None, ge=0)
    stream_options: dict[str, Any] | None = None

    def sampling(self, max_tokens: int, logprobs: int | None, index: int) -> SamplingParams:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > MAX_STOPS:
            raise InvalidInput(f"at most {MAX_STOPS} stop sequences")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            seed=None if self.seed is None else self.seed + index,
            stop=tuple(s for s in stops if s),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidInput("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=5)


def parse(kind: type[_M], document: dict[str, Any]) -> _M:
    try:
        return kind.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidInput(f"invalid '{where}': {first['msg']}") from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())  # OpenAI's "created" is a Unix timestamp, not a duration


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_logprobs(
    tokens: list[str], logprobs: list[float], tops: list[dict[str, float]], offsets: list[int]
) -> dict[str, Any]:
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
