"""One choice's turn as the client receives it, made from the sampled tokens: its text cut before a stop string,
and the calls parsed out of it in the run's call syntax.

Streamed, text leaves as its tokens are sampled: characters that could begin a stop string wait until they
cannot, and where the syntax frames its calls (`CallSyntax.framing`: Hermes' `<tool_call>`) a call is announced
once its head (`{"name": ..., "arguments": `) names an offered tool and its arguments stream as they are written;
a call whose head does not show (other key order, unknown tool) is judged whole when it closes. Whatever was
sent is what the turn is: the text deltas joined, the calls as streamed (a call that breaks after its arguments
began stays a call with the arguments as written, and is counted as a format error). Not streamed, the turn is
judged whole: a malformed call comes back as the text the model wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from toolrl.gateway.turns import ArgumentsDelta, CallStarted, Event, FunctionCall, TextDelta, arguments_text
from toolrl.parsers.base import CallFraming, CallSyntax
from toolrl.rollout.guidance import IncrementalText, StopStrings
from toolrl.tools.call import ToolCall

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.){1,256})"\s*,\s*"([A-Za-z_]{1,32})"\s*:\s*')
"""A call's head in a framed JSON syntax: its name, then the key of its arguments."""
_JSON_OUTSIDE_STRINGS = set(" \t\r\n,:-+.0123456789eEtruefalsn")


def reply_text(tokenizer, ids: Sequence[int]) -> str:
    """The text of a turn's ids as a stream of them shows it (IncrementalText, then what is left)."""
    text = IncrementalText(tokenizer)
    text.add(list(ids))
    return text.text + text.rest()


def _pending_prefix(text: str, marker: str) -> int:
    """How many characters at the end of `text` begin `marker` (and so must wait)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class _ArgumentsScanner:
    """Follows a JSON object as its characters come: where it ends, or where it stops being JSON."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped = 0, False, False
        self.done = self.broken = False

    def feed(self, text: str) -> int:
        """How many characters of `text` belong to the object (leading white space included)."""
        for k, ch in enumerate(text):
            if self.depth == 0:
                if ch.isspace():
                    continue
                if ch != "{":
                    self.broken = True
                    return k
                self.depth = 1
            elif self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return k + 1
            elif ch not in _JSON_OUTSIDE_STRINGS:
                self.broken = True
                return k
        return len(text)


class TurnText:
    """Presents one choice's turn: `feed(ids)` as tokens are sampled (streamed), `finish(text)` once the turn is
    over (with its final text, cut at a stop string); `calls` and `text` are what the client got."""

    def __init__(
        self,
        index: int,
        tokenizer,
        syntax: CallSyntax,
        tools: Mapping[str, list[str]] | None,
        stops: Sequence[str] = (),
        max_calls: int = 16,
        id_prefix: str = "call",
        streamed: bool = True,
    ):
        self.index, self.syntax, self.tools, self.max_calls = index, syntax, tools, max_calls
        self.id_prefix = id_prefix
        self.decoded = IncrementalText(tokenizer)
        self.stops = StopStrings(stops)
        self.stopped = False
        self.framing: CallFraming | None = syntax.framing if tools else None
        self.incremental = streamed and (not tools or self.framing is not None)
        """Whether what is sampled is shown as it comes (else at the end: a syntax without framing may be
        writing a call anywhere)."""
        self.pieces: list[str] = []
        self.calls: list[FunctionCall] = []
        self._arguments: list[str] = []
        self.format_breaks = 0
        """Streamed calls that broke after their arguments began."""
        self.cut_calls = 0
        """Calls the end of the turn cut before their closing (the token cap): dropped, never shown as text."""
        self.calls_past_limit = 0
        """Whole calls past max_calls: dropped, never shown as text."""
        self._state, self._pos, self._head = "text", 0, 0
        self._scanner: _ArgumentsScanner | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    # ---- as tokens come -----------------------------------------------------------------------------------

    def feed(self, ids: Sequence[int]) -> list[Event]:
        if self.stopped:
            return []
        seen = len(self.decoded.text)
        if not self.decoded.add(list(ids)) or not self.incremental:
            return []
        text = self.decoded.text
        if (found := self.stops.find(text, seen)) is not None:
            self.stopped = True
            return self._advance(text[: found[0]])
        return self._advance(text[: len(text) - self.stops.held(text)])

    def finish(self, text: str) -> list[Event]:
        """The turn is over and its text is `text`: the rest of it as events."""
        if not self.incremental:
            return self._whole(text)
        events = self._advance(text)
        if self._state == "text":
            events += self._say(text[self._pos :])
        elif self._state == "head":
            events += self._judge(text[self._head :])
        self._close_arguments()
        return events

    # ---- presenting ---------------------------------------------------------------------------------------

    def _say(self, text: str) -> list[Event]:
        if not text:
            return []
        self.pieces.append(text)
        return [TextDelta(self.index, text)]

    def _start(self, name: str) -> list[Event]:
        k = len(self.calls)
        self.calls.append(FunctionCall(f"{self.id_prefix}_{k}", name, ""))
        self._arguments.append("")
        return [CallStarted(self.index, k, self.calls[-1].id, name)]

    def _arguments_delta(self, text: str) -> list[Event]:
        text = text.lstrip() if not self._arguments[-1] else text
        if not text:
            return []
        self._arguments[-1] += text
        return [ArgumentsDelta(self.index, len(self.calls) - 1, text)]

    def _whole_call(self, call: ToolCall) -> list[Event]:
        events = self._start(call.name)
        return events + self._arguments_delta(arguments_text(call.arguments))

    def _close_arguments(self) -> None:
        for call, raw in zip(self.calls, self._arguments, strict=True):
            call.arguments = raw
            try:
                value = json.loads(raw)
            except ValueError:
                value = None
            call.call = ToolCall(call.name, value) if isinstance(value, dict) else None

    def _judge(self, block: str) -> list[Event]:
        """A framed span that did not stream as a call: its calls when it parses whole; dropped (and counted) when
        the turn's end cut it or its calls are past max_calls; else (a malformed call) its text."""
        assert self.framing is not None
        if self.framing.closing not in block:
            self.cut_calls += 1
            return []
        parsed = self.syntax(block, self.tools)
        if parsed.calls and not parsed.errors:
            room = max(self.max_calls - len(self.calls), 0)
            self.calls_past_limit += max(len(parsed.calls) - room, 0)
            return [event for call in parsed.calls[:room] for event in self._whole_call(call)]
        return self._say(block)

    def _advance(self, visible: str) -> list[Event]:
        """Present `visible` (the text that may be shown so far) from where the last call stopped."""
        framing = self.framing
        if framing is None:
            events = self._say(visible[self._pos :])
            self._pos = len(visible)
            return events
        events: list[Event] = []
        while True:
            if self._state == "text":
                at = visible.find(framing.opening, self._pos)
                if at < 0:
                    end = len(visible) - _pending_prefix(visible[self._pos :], framing.opening)
                    events += self._say(visible[self._pos : end])
                    self._pos = max(self._pos, end)
                    return events
                events += self._say(visible[self._pos : at])
                self._head, self._pos, self._state = at, at + len(framing.opening), "head"
            elif self._state == "head":
                head = _HEAD.match(visible, self._pos)
                name = _json_string(head.group(1)) if head else None
                if (head and name in (self.tools or {}) and head.group(2) in framing.argument_keys
                        and len(self.calls) < self.max_calls):  # fmt: skip
                    events += self._start(name)
                    self._pos, self._state, self._scanner = head.end(), "arguments", _ArgumentsScanner()
                    continue
                close = visible.find(framing.closing, self._pos)
                if close < 0:
                    return events
                end = close + len(framing.closing)
                events += self._judge(visible[self._head : end])
                self._pos, self._state = end, "text"
            elif self._state == "arguments":
                assert self._scanner is not None
                taken = self._scanner.feed(visible[self._pos :])
                events += self._arguments_delta(visible[self._pos : self._pos + taken])
                self._pos += taken
                if self._scanner.broken:
                    self.format_breaks += 1
                    self._state = "after"
                elif self._scanner.done:
                    self._state = "after"
                else:
                    return events
            else:  # after a streamed call's arguments: up to its closing
                close = visible.find(framing.closing, self._pos)
                if close < 0:
                    return events
                self._pos, self._state = close + len(framing.closing), "text"

    def _whole(self, text: str) -> list[Event]:
        """The turn judged at once: its calls when it has any (the text outside them beside, where the syntax
        frames them; all of it when a call is malformed), else its text."""
        framing = self.framing
        if framing is not None and (at := text.rfind(framing.opening)) >= 0 and framing.closing not in text[at:]:
            self.cut_calls += 1  # the turn's end cut its last call: dropped, not shown as text
            text = text[:at].rstrip()
        parsed = self.syntax(text, self.tools) if self.tools else None
        if parsed is not None:
            self.calls_past_limit += max(len(parsed.calls) - self.max_calls, 0)
            parsed = parsed.within(self.max_calls)
        if parsed is None or not parsed.calls:
            events = self._say(text)
        else:
            if framing is not None:  # the parsed calls' markup never reaches the text
                events = self._say(_outside(text, framing).strip())
            elif parsed.errors:
                events = self._say(text)
            else:
                events = []
            for call in parsed.calls:
                events += self._whole_call(call)
        self._close_arguments()
        return events


def _json_string(body: str) -> str | None:
    try:
        return json.loads(f'"{body}"')
    except ValueError:
        return None


def _outside(text: str, framing: CallFraming) -> str:
    """`text` without its framed calls."""
    out, pos = [], 0
    while (at := text.find(framing.opening, pos)) >= 0:
        out.append(text[pos:at])
        close = text.find(framing.closing, at)
        if close < 0:
            return "".join(out)
        pos = close + len(framing.closing)
    return "".join(out) + text[pos:]
