"""The grammar a gateway turn samples under: a forced tool call (`tool_choice` required, any, or a named
function) in the run's call syntax, a structured reply (a JSON schema from `response_format`, `text.format` or
`output_config.format`), or either; checked by llguidance before any sampling (in a worker process, within the
gateway's compile budget), so a schema it cannot follow, or cannot compile in time, is a one-line 400 naming the
field."""

from __future__ import annotations

import json
from typing import Any

from toolrl.gateway.turns import GatewayError, TurnRequest
from toolrl.parsers.base import JSON_STYLE, CallSyntax
from toolrl.rollout.engine import Engine


def turn_grammar(
    req: TurnRequest, schemas: list[dict[str, Any]], syntax: CallSyntax, engine: Engine
) -> tuple[str, str] | None:
    """The grammar the turn samples under, and the field that asked for it: a forced call (tool_choice required /
    a named function), a structured reply (a JSON schema), or a call or such a reply; None when nothing
    constrains it. Not compiled here: the gateway checks it within its compile budget (server.py)."""
    choice = req.tool_choice
    if choice.forced and not schemas:
        raise GatewayError("tool_choice: a call is required but no function tools are offered", param="tool_choice")
    if not req.constrained:
        return None
    param = "tool_choice" if choice.forced else req.format_param
    if not engine.follows_grammars:
        raise GatewayError(f"{param}: the policy's engine ({type(engine).__name__}) cannot constrain a turn; "
                           "use rollout.engine hf or vllm", param=param)  # fmt: skip
    alternatives, rules = [], []
    if schemas and (choice.forced or req.json_schema is not None):
        tools = [(t["function"]["name"], t["function"].get("parameters") or {"type": "object"}) for t in schemas
                 if choice.name is None or t["function"]["name"] == choice.name]  # fmt: skip
        if not tools:
            raise GatewayError(f"tool_choice: no offered function is named {choice.name!r}", param="tool_choice")
        if syntax.grammar is None:
            raise GatewayError(f"{param}: rollout.parser {syntax.name} has no grammar of its calls, so a "
                               "call cannot be forced; use hermes, llama3-json or search-r1",
                               param=param)  # fmt: skip
        try:
            several = req.parallel_tool_calls and (req.parallel_asked or not choice.forced)  # a forced call: one,
            rules.append(syntax.grammar(tools, several))  # unless several are asked for (a second one cut at the cap)
        except ValueError as exc:
            raise GatewayError(f"tool_choice: {exc}", param="tool_choice") from None
        alternatives.append("calls")
    if req.json_schema is not None and not choice.forced:
        schema = {**req.json_schema, "x-guidance": {**JSON_STYLE, **req.json_schema.get("x-guidance", {})}}
        rules.append(f"answer: %json {json.dumps(schema)}")
        alternatives.append("answer")
    return f"start: {' | '.join(alternatives)}\n" + "\n".join(rules), param
