"""Server-sent event parsing and OpenAI stream decoding, without a server."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.bench.targets.openai import chat_body, completion_body, event_text
from tensorgate.bench.targets.sse import SseParser

STREAM = (
    b'data: {"choices":[{"text":"Hel"}]}\n\n'
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"text":"lo"}]}\r\n\r\n'
    b"event: message\ndata: [DONE]\n\n"
)


def test_parser_yields_each_event_payload() -> None:
    assert SseParser().feed(STREAM) == ['{"choices":[{"text":"Hel"}]}', '{"choices":[{"text":"lo"}]}', "[DONE]"]


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=10))
def test_parser_is_independent_of_chunking(cuts: list[int]) -> None:
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    parser = SseParser()
    events = [e for a, b in itertools.pairwise(bounds) for e in parser.feed(STREAM[a:b])]
    assert events == SseParser().feed(STREAM)


def test_multiline_data_is_joined() -> None:
    assert SseParser().feed(b"data: a\ndata: b\n\n") == ["a\nb"]


def test_completion_and_chat_events() -> None:
    assert event_text('{"choices":[{"text":"hi","index":0}]}', chat=False) == "hi"
    assert event_text('{"choices":[{"delta":{"content":"hi"}}]}', chat=True) == "hi"
    assert event_text('{"choices":[{"delta":{"role":"assistant"}}]}', chat=True) is None
    assert event_text('{"choices":[]}', chat=False) is None
    assert event_text("[DONE]", chat=True) is None
    with pytest.raises(ValueError):
        event_text('{"error":{"message":"boom"}}', chat=False)
    with pytest.raises(ValueError):
        event_text("not json", chat=False)


def test_request_bodies_stream() -> None:
    assert completion_body("m", "p", 8) == {"model": "m", "prompt": "p", "max_tokens": 8, "stream": True}
    chat = chat_body("m", "p", 8)
    assert chat["stream"] is True and chat["messages"] == [{"role": "user", "content": "p"}]
