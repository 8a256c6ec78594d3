"""Turns that end at a stop string or follow a grammar, for engines that sample token by token (the hf engine).

A request's `SamplingParams.stop` ends its turn at the first stop string in the decoded text (the token that
completes it is the turn's last); `SamplingParams.grammar` (llguidance's Lark dialect, which embeds JSON schemas
with `%json`) masks, before each draw, the tokens the grammar cannot take next, so the turn is a sentence of it.
The sampler draws from the masked distribution and records that distribution's log-prob: what the token was
sampled from. `cut_at_stop` gives the same cut for an engine that sampled past a stop string.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)


class IncrementalText:
    """The text of a growing list of token ids, each step decoding only the tokens since the last complete
    character (vLLM's and transformers' streamers do the same); a character split across tokens is held until
    its last byte arrives."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # ids[_prefix:_read] decode to the last few characters already in text
        self._read = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def add(self, ids: Sequence[int]) -> str:
        """Append `ids`; the text they complete."""
        self.ids += ids
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        new = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += new
        return new

    def rest(self) -> str:
        """What the ids not in `text` yet decode to (a character still split across tokens shows as U+FFFD)."""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        return after[len(before) :] if len(after) > len(before) else ""


class StopStrings:
    """Finds the first stop string in a text that grows at its end."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, since: int = 0) -> tuple[int, str] | None:
        """(where, which) of the earliest stop string in `text` that ends after position `since` (the text up to
        `since` held none), or None."""
        start = max(0, since - self.longest + 1)
        found = [(at, s) for s in self.stops if (at := text.find(s, start)) >= 0]
        return min(found, key=lambda f: (f[0], -len(f[1]))) if found else None

    def held(self, text: str) -> int:
        """How many characters at the end of `text` could begin a stop string (not to be shown yet)."""
        for n in range(min(self.longest - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0


@dataclass
class StopCut:
    """Where a turn ends by a stop string: `tokens` ids are kept (the last one completes the stop string), the
    reply's text is `text` (cut before it)."""

    tokens: int
    text: str
    stop: str


def cut_at_stop(tokenizer, ids: Sequence[int], stops: Sequence[str]) -> StopCut | None:
    """The first stop string in the text of `ids` and the token that completes it, or None (no stop string)."""
    matcher = StopStrings(stops)
    if not matcher.stops:
        return None
    text = IncrementalText(tokenizer)
    for k, token in enumerate(ids):
        seen = len(text.text)
        if text.add([token]) and (found := matcher.find(text.text, seen)) is not None:
            at, stop = found
            return StopCut(k + 1, text.text[:at], stop)
    return None


class Vocabulary:
    """An engine's tokenizer as the grammar matcher reads it (made once, on first use: ~0.3 s), and the width of
    the model's logits (which may pad the tokenizer's vocabulary)."""

    def __init__(self, tokenizer, width: int):
        self.tokenizer, self.width = tokenizer, width

    @functools.cached_property
    def guidance(self):
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.width)


class TurnGuide:
    """One request's stop strings and grammar: `allowed()` before each draw, `accept(token)` after it."""

    def __init__(self, vocabulary: Vocabulary, stops: Sequence[str] = (), grammar: str | None = None):
        self.vocabulary = vocabulary
        self.stops = StopStrings(stops)
        self.text = IncrementalText(vocabulary.tokenizer) if self.stops.stops else None
        self.matcher = None
        if grammar is not None:
            import llguidance

            self.matcher = llguidance.LLMatcher(vocabulary.guidance, grammar, log_level=0)
            if self.matcher.is_error():
                raise ValueError(f"the grammar does not compile: {self.matcher.get_error()}")
        self.stop: str | None = None
        """The stop string that ended the turn."""

    def allowed(self) -> torch.Tensor | None:
        """[width] bool: the tokens the grammar can take next (None: any)."""
        if self.matcher is None:
            return None
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.vocabulary.width].astype(bool))
        if not mask.any():  # a dead end (the matcher failed): only the end of the turn
            mask[self.vocabulary.tokenizer.eos_token_id] = True
        return mask

    def accept(self, token: int) -> bool:
        """Take the sampled token; True when the turn ends with it (a stop string completed). A grammar that is
        complete allows only the end-of-turn token next, which the engine then samples (it ends the turn)."""
        ended = False
        if self.matcher is not None and not self.matcher.consume_token(token):
            log.warning("guided turn: the grammar refused token %d (%s); the turn ends", token,
                        self.matcher.get_error())  # fmt: skip
            ended = True
        if self.text is not None:
            seen = len(self.text.text)
            if self.text.add([token]) and (found := self.stops.find(self.text.text, seen)) is not None:
                self.stop = found[1]
                ended = True
        return ended


def allowed_tokens(guides: list[TurnGuide | None], width: int) -> torch.Tensor | None:
    """[rows, width] bool: the tokens each row may draw (its grammar's mask; any for a row without one), or None
    when no row has a grammar."""
    masks = [g.allowed() if g is not None else None for g in guides]
    if all(m is None for m in masks):
        return None
    allowed = torch.ones(len(masks), width, dtype=torch.bool)
    for row, mask in enumerate(masks):
        if mask is not None:
            allowed[row] = False
            allowed[row, : len(mask)] = mask[:width]
    return allowed
