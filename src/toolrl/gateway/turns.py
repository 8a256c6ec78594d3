"""What every wire protocol's request becomes and what its reply is made from: a `TurnRequest` (a conversation in
chat-completions messages, the tools, how a call may be forced, the sampling), a `Turn` per choice (its text, its
calls, why it ended), and the events of a turn as it is sampled. The protocol adapters (chat.py, responses.py,
messages.py) translate to and from these; the gateway core (server.py) knows no protocol."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from toolrl.tools.call import ToolCall


class GatewayError(Exception):
    """A request the gateway refuses: one line, the HTTP status and the field it is about. Each protocol writes
    it in its own error shape."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.param, self.kind, self.code = status, param, kind, code


@dataclass(frozen=True)
class ToolChoice:
    """How the model may call the offered tools: `auto` (it decides), `none` (the tools are not shown),
    `required` (the turn is one or more calls, of `name` only when given)."""

    mode: Literal["auto", "none", "required"] = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode == "required"


@dataclass
class TurnRequest:
    """One request for a model turn, whatever protocol it came in."""

    messages: list[dict[str, Any]]
    """Chat-completions messages: role, content (text), an assistant's tool_calls, a tool message's tool_call_id."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Function tools in the chat-completions shape ({"type": "function", "function": {name, description,
    parameters}})."""
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    parallel_asked: bool = False
    """The client asked for several calls in so many words (parallel_tool_calls: true; Anthropic's
    disable_parallel_tool_use: false): only then may a forced call's grammar go on past its first call."""
    json_schema: dict[str, Any] | None = None
    """The reply must be JSON under this schema (response_format / text.format / output_config.format)."""
    format_param: str = "response_format"
    """The field that asked for `json_schema` (for errors)."""
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    top_k: int | None = None
    model: str | None = None
    stream: bool = False
    ignored: list[str] = field(default_factory=list)
    """What the request holds that the gateway does not do and left out (hosted tools it cannot run, reasoning
    items the chat template cannot show): told in the reply's x-toolrl-ignored header and counted."""

    @property
    def constrained(self) -> bool:
        """Whether the turn samples under a grammar: a forced call or a structured reply."""
        return self.tool_choice.forced or self.json_schema is not None

    def shown_tools(self) -> list[dict[str, Any]]:
        """The tools the model sees: none with tool_choice none."""
        if self.tool_choice.mode == "none":
            return []
        return [t for t in self.tools if t.get("type", "function") == "function" and "function" in t]


@dataclass
class FunctionCall:
    """A call as a client receives it: the id the gateway gave it, the function, its arguments as JSON text."""

    id: str
    name: str
    arguments: str
    call: ToolCall | None = None
    """The parsed call (None when its arguments did not come out as a JSON object: a streamed call that broke)."""

    def chat(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


Finish = Literal["stop", "length", "tool_calls", "stop_sequence"]


@dataclass
class Turn:
    """One choice's sampled turn as the client receives it."""

    index: int
    text: str
    calls: list[FunctionCall]
    finish: Finish
    """stop: the end-of-turn token; stop_sequence: a stop string (`stop_sequence` holds it); length: the token
    budget ran out; tool_calls: it called tools."""
    completion_tokens: int
    stop_sequence: str | None = None

    def chat_message(self) -> dict[str, Any]:
        """The turn as a chat-completions assistant message (what a later request sends back)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.calls:
            message["tool_calls"] = [c.chat() for c in self.calls]
        elif not self.text:
            message["content"] = ""
        return message


# ---- the events of a turn as it is sampled -----------------------------------------------------------------


@dataclass
class TextDelta:
    index: int
    text: str


@dataclass
class CallStarted:
    index: int
    call: int
    """The call's position in the turn."""
    id: str
    name: str


@dataclass
class ArgumentsDelta:
    index: int
    call: int
    text: str


@dataclass
class TurnDone:
    turn: Turn


Event = TextDelta | CallStarted | ArgumentsDelta | TurnDone


def arguments_text(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False)


T = TypeVar("T")
INLINE_CHARS = 64 << 10
"""Work on at most this many characters (or bytes) of a request runs on the event loop (a few ms: a hop to a thread
costs more, and 64 agents' requests queued on the thread pool reach the engine late, splitting its batch); more
goes to a worker thread, so one large request never holds up the other clients."""


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, in a worker thread when it works on more than INLINE_CHARS of the request."""
    return fn(*args) if size <= INLINE_CHARS else await asyncio.to_thread(fn, *args)
