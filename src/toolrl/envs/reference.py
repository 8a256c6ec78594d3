"""What a perfect agent does on a task: the reference an environment is checked against.

`Environment.reference(task)` gives it request by request (the first request is the task's question; the later
ones are user turns): for each, the rounds of calls the agent makes (one model turn each, in order, so a
later round may use what an earlier one returned) and then its reply. `toolrl eval --policy reference` plays
it turn by turn and must score about 100%; `--policy idle` makes no call and must score about 0;
`toolrl env check` runs both (rollout/scripted.py plays them).

A task can carry its reference in `meta["reference"]`, one entry per request, each either a list of calls
(`{"name": ..., "arguments": {...}}`, one round) or `{"rounds": [[call, ...], ...], "reply": "...", "notes":
["...", ...]}` (notes: the text that opens each turn, a plan or a thought before its calls).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.errors import DataError
from toolrl.tools.call import ToolCall

REPLY = "Done."
"""The reply of a request whose reference does not say one (and the idle policy's every reply)."""


@dataclass(frozen=True)
class Said:
    """A model turn of calls with text written before them (a note, a plan, a thought): `text`, then `calls` in
    the run's call syntax."""

    text: str
    calls: tuple[ToolCall, ...]


Turn = tuple[ToolCall, ...] | Said | str
"""One model turn of a scripted policy: calls (written in the run's syntax), calls after text, or a reply."""


NOTE_END = "\n"
"""What follows a reference note that does not end in whitespace, before the turn's calls or reply."""


@dataclass(frozen=True)
class ReferenceRequest:
    """What a perfect agent does for one user request: rounds of calls, then the reply."""

    rounds: tuple[tuple[ToolCall, ...], ...] = ()
    """Each round is one model turn of calls; an empty round is never played (a request without calls is a
    reply alone)."""
    reply: str = REPLY
    notes: tuple[str, ...] = ()
    """Text that opens each of its turns, in order (each non-empty round, then the reply), on a line of its own
    (NOTE_END follows a note that does not end in whitespace); a turn past the notes has none."""

    @classmethod
    def of(cls, calls: Sequence[ToolCall] = (), reply: str = REPLY) -> ReferenceRequest:
        """One round of `calls` (none: the reply alone), then `reply`."""
        return cls((tuple(calls),) if calls else (), reply)

    def turns(self) -> list[Turn]:
        """The model turns it takes: each non-empty round, then the reply, each after its note."""
        turns: list[Turn] = [*(round_ for round_ in self.rounds if round_), self.reply]
        for k, note in enumerate(self.notes[: len(turns)]):
            turn = turns[k]
            if note and not note[-1].isspace():  # a line of its own: never glued to the call or reply after it
                note += NOTE_END
            turns[k] = note + turn if isinstance(turn, str) else Said(note, turn)
        return turns


def _call(value: Any, where: str) -> ToolCall:
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise DataError(f'{where}: a reference call is {{"name": str, "arguments": {{...}}}}, not {value!r:.80}')
    arguments = value.get("arguments", {})
    if not isinstance(arguments, Mapping):
        raise DataError(f"{where}: the arguments of reference call {value['name']} are not an object")
    return ToolCall(value["name"], dict(arguments))


def _request(entry: Any, where: str) -> ReferenceRequest:
    if isinstance(entry, Mapping):
        rounds = entry.get("rounds", [])
        if not isinstance(rounds, list) or not all(isinstance(r, list) for r in rounds):
            raise DataError(f"{where}: 'rounds' is a list of lists of calls")
        reply = entry.get("reply", REPLY)
        if not isinstance(reply, str):
            raise DataError(f"{where}: 'reply' is a string")
        notes = entry.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise DataError(f"{where}: 'notes' is a list of strings, the text that opens each turn")
        return ReferenceRequest(tuple(tuple(_call(c, where) for c in r) for r in rounds), reply, tuple(notes))
    if isinstance(entry, list):
        return ReferenceRequest.of([_call(c, where) for c in entry])
    raise DataError(f"{where}: each request's reference is a list of calls or {{'rounds': ..., 'reply': ...}}")


def reference_from_meta(task_id: str, meta: Mapping[str, Any]) -> list[ReferenceRequest] | None:
    """`meta["reference"]` read as above; None when the task has none. A malformed one is a DataError naming
    the task and the request."""
    entries = meta.get("reference")
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise DataError(f"task {task_id}: meta['reference'] is a list, one entry per request")
    return [_request(entry, f"task {task_id}, reference of request {k + 1}") for k, entry in enumerate(entries)]


def answered(answer: str, *calls: ToolCall) -> list[ReferenceRequest]:
    """A one-request reference: `calls` in one round, then `<answer>{answer}</answer>`."""
    return [ReferenceRequest.of(calls, f"<answer>{answer}</answer>")]
