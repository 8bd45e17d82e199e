"""The vocabulary of text generation, shared by every layer that takes part in it.

The protocols build :class:`SamplingParams` and read :class:`GenerationStream`\\ s of
:class:`TokenEvent`\\ s; the step scheduler plans :class:`StepPlan`\\ s of :class:`ScheduledChunk`\\ s;
a generative backend runs them and answers :class:`Sampled` tokens. No torch and nothing of the
request path here, as in :mod:`tensorgate.types`: every layer imports this leaf, not each other.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token and when to stop. ``temperature == 0`` means greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # how many alternatives to report besides the chosen token

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens, the context length, or the cache cannot hold it
    CANCELLED = "cancelled"  # the client went away
    EXPIRED = "expired"  # its deadline passed while it waited
    ERROR = "error"  # the model raised on its step


# -- one step: what the step scheduler asks of a generative backend ------------------------------


class ScheduledChunk(NamedTuple):
    """Compute ``token_ids`` at positions ``start..`` of one sequence; sample after them if ``sample``.

    A named tuple, as :class:`Sampled`: one is made per running sequence per step, and a frozen
    dataclass's ``__init__`` cost several times a tuple's (profiled: the largest part of
    scheduling a step of 100 sequences).
    """

    seq_id: int
    start: int
    token_ids: tuple[int, ...]
    sample: bool
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class StepPlan:
    chunks: tuple[ScheduledChunk, ...]
    freed: tuple[int, ...]  # sequences whose cache the runner drops before this step
    preempted: tuple[int, ...] = ()  # among ``freed``: coming back later, so their sampler state is kept

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.freed


class Sampled(NamedTuple):
    """The token a step picked for one sequence, its log-probability and the top alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class StepRunner(Protocol):
    def run_step(self, plan: StepPlan) -> dict[int, Sampled]:
        """Run one step (called from the engine's worker thread only)."""
        ...

    def reset(self) -> None:
        """Drop every sequence's state (called once when an engine starts)."""
        ...


class TextCodec(Protocol):
    """A tokenizer as generation uses it: text to ids and back, and the chat template."""

    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    @property
    def has_chat_template(self) -> bool: ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]: ...


class GenerativeRunner(StepRunner, Protocol):
    """A loaded generative backend (``backends.registry.load_generative``): a model that runs
    steps, its tokenizer, and the sizes the KV budget and the context limit are set from."""

    max_position_embeddings: int
    kv_bytes_per_token: int

    @property
    def codec(self) -> TextCodec: ...

    def close(self) -> None: ...


# -- what a caller of the engine holds -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token: its id, the text it adds, and the finish reason on the last one."""

    token_id: int | None
    text: str
    logprob: float = 0.0
    top: tuple[tuple[int, float], ...] = ()
    finish_reason: FinishReason | None = None
    count: int = 1  # tokens this event stands for (more than one when coalesced)


@dataclass(slots=True, eq=False)
class GenerationStream:
    """What a caller holds for one request: an async iterator of :class:`TokenEvent`.

    The engine fills it (:meth:`put`, on the event loop) and is told through ``abort`` when the
    caller stops reading before the end.
    """

    seq_id: int
    prompt_tokens: int
    abort: Callable[[int], None] = field(repr=False)
    _queue: asyncio.Queue[TokenEvent | BaseException] = field(default_factory=asyncio.Queue, repr=False)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    arrival: float = 0.0
    first_token_at: float | None = None
    stop: tuple[str, ...] = ()
    incremental: bool = True
    # Told once, when the reader is done with the stream, whether an error ended it (the service's
    # traffic state judges a canary by this, as it does by tensor requests).
    on_end: Callable[[bool], None] | None = field(default=None, repr=False)

    def put(self, item: TokenEvent | BaseException) -> None:
        """Hand the reader its next event, or the error that ends the stream."""
        self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self.events()

    async def events(self, *, coalesce: bool = False) -> AsyncIterator[TokenEvent]:
        """The events as they come. With ``coalesce``, tokens already waiting when the caller comes
        back are merged into one event (their texts joined, ``count`` summed): a streaming client
        that falls behind gets fewer, larger chunks instead of a growing backlog."""
        failed = False
        try:
            while True:
                item = await self._queue.get()
                while coalesce and not isinstance(item, BaseException) and item.finish_reason is None:
                    try:
                        following = self._queue.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                    if isinstance(following, BaseException):
                        yield item
                        item = following
                        break
                    item = TokenEvent(
                        following.token_id,
                        item.text + following.text,
                        following.logprob,
                        following.top,
                        following.finish_reason,
                        item.count + following.count,
                    )
                if isinstance(item, BaseException):
                    failed = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    failed = item.finish_reason is FinishReason.ERROR
                    return
        finally:
            if self.finish_reason is None:
                self.cancel()
            on_end, self.on_end = self.on_end, None
            if on_end is not None:
                on_end(failed)

    def cancel(self) -> None:
        """The client went away: free the slot and the cache at the next step."""
        self.abort(self.seq_id)


async def collect(stream: GenerationStream) -> list[TokenEvent]:
    """All events of a stream (for non-streaming callers)."""
    return [event async for event in stream]
