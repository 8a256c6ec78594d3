"""What a gateway request may ask before any work is done for it: its body's size and time to arrive, its stop
strings, its tools (function tools whose parameters are an object's schema), its conversation's characters
against the model's context, and the time its grammar takes to compile (in a worker process killed past the
budget, so that no other client waits on it and no core keeps burning). Each refusal is a one-line GatewayError
naming the field."""

from __future__ import annotations

import json
from typing import Any

from toolrl.gateway.capture import text_of
from toolrl.gateway.turns import GatewayError, TurnRequest
from toolrl.text import clip
from toolrl.tools.runners import DeadlineExceeded, ProcessRunner

MAX_BODY_BYTES = 16 << 20
"""The largest request body (counted as it arrives, chunked or not): a conversation the default model's context
holds is a few hundred KB; Claude Code's first request is 85 KB."""
BODY_TIMEOUT_S = 30.0
"""How long a request's body may take to arrive once its headers have."""
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
GRAMMAR_BUDGET_S = 5.0
"""The longest a request's grammar may take to compile, a worker's start included (a JSON schema of 200
patternProperties: 0.5 s; of 500: 35 s before this budget); per token, llguidance's own step limits bound it."""
GRAMMAR_CHECK = "toolrl.rollout.grammar_check:grammar_check"


def check_stop(stop: tuple[str, ...] | list[str]) -> None:
    if len(stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise GatewayError(f"stop: at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} characters",
                           param="stop")  # fmt: skip


def check_tools(tools: list[Any]) -> None:
    """Function tools (in the chat shape every protocol's become) whose name is a string and whose parameters, when
    given, are a JSON schema of an object: anything else is one line naming the tool, not a fault later."""
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise GatewayError(f"tools[{i}]: a function tool needs a name (a string)", param=f"tools[{i}]")
        if function.get("parameters", 0) is None:
            del function["parameters"]  # null: no parameters, as when left out
        schema = function.get("parameters")
        kind = schema.get("type", "object") if isinstance(schema, dict) else type(schema).__name__
        if schema is not None and kind != "object":
            name = clip(function["name"], 40)
            raise GatewayError(f"tools[{i}] ({name}): its parameters must be a JSON schema of an object (type "
                               f"object), not {clip(str(kind), 20)}", param=f"tools[{i}]")  # fmt: skip


def check_request(req: TurnRequest, context_length: int, max_token_chars: int) -> int:
    """What can be refused before any work: stop strings, tools, and a conversation with more characters than the
    model's context can hold as tokens (`max_token_chars` a token at most). Returns the conversation's
    characters."""
    check_stop(req.stop)
    check_tools(req.tools)
    chars = sum(len(text_of(m)) for m in req.messages) + sum(len(json.dumps(t)) for t in req.tools)
    if chars > context_length * max_token_chars:
        raise GatewayError(
            f"the prompt is {chars:,} characters, more than the model's context of {context_length:,} tokens can "
            f"hold (a token is at most {max_token_chars} characters); send a shorter conversation or serve a model "
            "with a longer context (docs/agents.md)",
            param="messages",
            code="context_length_exceeded",
        )
    return chars


class GrammarCheck:
    """Compiles each request's grammar in a worker process (tools/runners.py), killed past `budget_s`."""

    def __init__(self, budget_s: float = GRAMMAR_BUDGET_S):
        self.budget_s = budget_s
        self.worker: ProcessRunner | None = None
        self.over_budget = 0

    async def __call__(self, grammar: str, param: str) -> str:
        """`grammar` once llguidance compiles it within the budget; else a one-line 400 naming `param`."""
        if self.worker is None:
            self.worker = ProcessRunner()
        try:
            problem = await self.worker.run(GRAMMAR_CHECK, {"grammar": grammar}, self.budget_s)
        except DeadlineExceeded:
            self.over_budget += 1
            raise GatewayError(f"{param}: the schema takes more than {self.budget_s:g} s to compile (the server's "
                               "budget for a grammar); give a simpler one (fewer patternProperties or alternatives, "
                               "shorter patterns)", param=param) from None  # fmt: skip
        if problem:
            raise GatewayError(f"{param}: the schema cannot be followed: {problem}", param=param)
        return grammar

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
