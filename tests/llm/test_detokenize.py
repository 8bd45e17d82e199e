"""Incremental detokenization: the same text as decoding the whole output, in linear time, and never a
piece of a stop string on the wire."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_model_factory import build_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tensorgate.scheduling.continuous.detokenize import IncrementalText

TEXT = (
    "Crème brûlée, naïve façade, jalapeño: déjà vu! 東京の夜は静かです。 Ünïcödé snowman ☃ and rocket 🚀🚀 "
    "plain words for the merges, plain words again, and more plain words. "
) * 3


def _byte_level() -> Tokenizer:
    """GPT-2's scheme: byte-level BPE, so one character may take several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [TEXT], trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return tok


def _metaspace() -> Tokenizer:
    """SentencePiece's scheme: a word's leading space is part of its token, dropped at a decode's start."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
    return tok


TOKENIZERS = {"byte-level": _byte_level(), "metaspace": _metaspace()}


def _streamed(decode: object, ids: Sequence[int], stops: tuple[str, ...] = ()) -> tuple[list[str], IncrementalText]:
    text = IncrementalText(decode, stops)  # type: ignore[arg-type]
    pieces = []
    for end in range(1, len(ids) + 1):
        final = end == len(ids)
        text.add(ids[:end], final=final)
        pieces.append(text.take(final=final))
        if text.stopped:
            break
    return pieces, text


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(start=st.integers(0, len(TEXT) - 1), length=st.integers(1, 120))
def test_the_streamed_text_is_the_whole_decode(name: str, start: int, length: int) -> None:
    tok = TOKENIZERS[name]
    ids = tok.encode(TEXT[start : start + length]).ids
    pieces, text = _streamed(tok.decode, ids)
    whole = tok.decode(ids)
    assert "".join(pieces) == whole == text.text
    assert not any(piece.endswith("\ufffd") for piece in pieces)  # never half a character on the wire


def test_a_long_output_costs_linear_time() -> None:
    tok = TOKENIZERS["byte-level"]
    ids = (tok.encode(TEXT).ids * 40)[:4000]
    calls, tokens = 0, 0

    def counting(window: Sequence[int]) -> str:
        nonlocal calls, tokens
        calls += 1
        tokens += len(window)
        return tok.decode(list(window))

    pieces, _ = _streamed(counting, ids)
    assert "".join(pieces) == tok.decode(ids)
    assert calls == 2 * len(ids)  # two decodes per token, whatever the length so far
    assert tokens < 8 * len(ids)  # of a window a few tokens long: the whole output is never decoded again


def test_the_word_level_tokenizer_of_the_served_model() -> None:
    tok = build_tokenizer()
    ids = tok.encode("the cat sat on the mat and the dog sat too", add_special_tokens=False)
    pieces, _ = _streamed(tok.decode, ids)
    assert "".join(pieces) == tok.decode(ids)


@pytest.mark.parametrize("name", list(TOKENIZERS))
@pytest.mark.parametrize("stop", ["plain words", "déjà", "🚀", "e, "])
def test_a_stop_string_ends_the_text_and_no_part_of_it_is_sent(name: str, stop: str) -> None:
    tok = TOKENIZERS[name]
    ids = tok.encode(TEXT).ids
    pieces, text = _streamed(tok.decode, ids, (stop, "never there"))
    whole = tok.decode(ids)
    expected = whole[: whole.index(stop)]
    assert text.stopped and text.text == expected
    assert "".join(pieces) == expected
    for piece in pieces:  # nothing of the stop string went out before it was known to be one
        assert stop not in piece


def test_held_back_characters_go_out_at_the_end() -> None:
    tok = TOKENIZERS["metaspace"]
    ids = tok.encode("plain words again").ids
    pieces, text = _streamed(tok.decode, ids, ("a stop string longer than the whole text",))
    assert not text.stopped
    assert pieces[-1]  # held back while a stop string could still begin, all out at the end
    assert "".join(pieces) == tok.decode(ids)
