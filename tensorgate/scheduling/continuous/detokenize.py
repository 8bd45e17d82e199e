"""One generation's text, decoded as its tokens come, in time linear in its length.

Decoding a sequence's whole output after every token costs quadratic time in its length. As vLLM's
detokenizer does, :class:`IncrementalText` decodes only a window: the tokens since the last text
it gave out (``prefix``) and those after them (``read`` onwards). The window's text before and
after the new tokens differ by exactly what they add, whatever the tokenizer does at the start of
a decode (a SentencePiece tokenizer drops a word's leading space there: in both decodes alike).
A window that ends inside a multi-byte character (the text ends in U+FFFD) waits for the next
token instead of giving out half a character.

Stop strings are looked for only where a new one could be: from the longest stop string's length
(less one) before the new text. While streaming, that many of the last characters are held back,
since they may be the start of a stop string the next token completes; a client never sees any
part of a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class IncrementalText:
    __slots__ = ("_decode", "_hold", "_prefix", "_read", "_sent", "_stops", "stopped", "text")

    def __init__(self, decode: Decode, stops: tuple[str, ...] = ()) -> None:
        self._decode = decode
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._prefix = 0  # token index where the decoding window starts
        self._read = 0  # token index up to which the text is already given out of the window
        self._sent = 0  # characters of ``text`` handed out
        self.text = ""  # the text so far (cut before a stop string once one is found)
        self.stopped = False  # a stop string was found: ``text`` is final

    def add(self, token_ids: Sequence[int], *, final: bool = False) -> None:
        """Take in the output's tokens so far (``token_ids``: all of them, the new ones last).
        ``final``: the output has ended, so an incomplete character at its end is kept as it is."""
        if self.stopped:
            return
        before = self._decode(token_ids[self._prefix : self._read])
        after = self._decode(token_ids[self._prefix :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return  # nothing new yet, or half a character: the window grows by the next token
        new = after[len(before) :]
        self._prefix, self._read = self._read, len(token_ids)
        if not self._stops:
            self.text += new
            return
        begin = max(0, len(self.text) - self._hold)
        text = self.text + new
        hits = [found for found in (text.find(stop, begin) for stop in self._stops) if found >= 0]
        if hits:
            text = text[: min(hits)]
            self.stopped = True
        self.text = text

    def take(self, final: bool = False) -> str:
        """The text not handed out yet: all of it once the output has ended (``final``) or stopped,
        else all but the characters a stop string could still begin in."""
        end = len(self.text)
        if not final and not self.stopped:
            end = max(self._sent, end - self._hold)
        out = self.text[self._sent : end]
        self._sent = end
        return out
