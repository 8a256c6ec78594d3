"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): what the anthropic SDK,
pydantic-ai's `anthropic:` models and Claude Code speak (`ANTHROPIC_BASE_URL` is the gateway without `/v1`; the
key goes as `x-api-key` or a bearer token).

`system` (text or text blocks) is the system message; a message's text, `tool_use` and `tool_result` blocks
become chat messages (an assistant's text and tool uses one message, each tool result a tool message, the text
beside results a user message after them; `is_error` results start with "Error: "). Thinking blocks are left
out and counted (the policy writes none); server tools (web search, code execution, ...) are not run here: left
out, counted and told in the `x-toolrl-ignored` header. `tool_choice` any / tool is enforced by the engine,
`output_config.format` (a JSON schema) likewise; `stop_sequences` end the turn.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolrl.gateway.chat import json_format, stream_error
from toolrl.gateway.protocols import Protocol, parts_text, register_protocol, sse, unsupported
from toolrl.gateway.turns import (
    ArgumentsDelta,
    CallStarted,
    Event,
    GatewayError,
    TextDelta,
    ToolChoice,
    Turn,
    TurnDone,
    TurnRequest,
)
from toolrl.text import clip

IGNORED = ("metadata", "thinking", "service_tier", "context_management", "cache_control", "speed", "inference_geo",
           "diagnostics", "container")  # fmt: skip
"""Fields that change nothing here (thinking: the policy writes no thinking blocks)."""
STOP_REASONS = {"stop": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error"}  # fmt: skip


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=10)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    stream: bool = False
    mcp_servers: list[dict[str, Any]] | None = None


def _blocks_text(blocks: Any, where: str) -> str:
    return parts_text(blocks, where, {"text": "text"})


def chat_messages(messages: list[dict[str, Any]], ignored: list[str], reasoning: bool) -> list[dict[str, Any]]:
    """Anthropic messages as chat messages; thinking blocks as the turn's `reasoning_content` where the chat
    template shows it (`reasoning`), else left out and told."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role, content, where = message.get("role"), message.get("content"), f"messages[{i}].content"
        if role not in ("user", "assistant", "system"):
            raise GatewayError(f"messages[{i}].role must be user or assistant", param=f"messages[{i}].role")
        if isinstance(content, str) or role == "system":
            out.append({"role": role, "content": _blocks_text(content, where)})
            continue
        if not isinstance(content, list):
            raise GatewayError(f"{where}: must be text or a list of blocks", param=where)
        texts, calls, results, thoughts = [], [], [], []
        for k, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise GatewayError(f"{where}[{k}]: a tool_use block needs id and name", param=f"{where}[{k}]")
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
            elif kind == "tool_result" and role == "user":
                text = _blocks_text(block.get("content") or "", f"{where}[{k}].content")
                if block.get("is_error"):
                    text = f"Error: {text}"
                results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")), "content": text})
            elif kind == "thinking" and reasoning and role == "assistant":
                thoughts.append(str(block.get("thinking", "")))
            elif kind in ("thinking", "redacted_thinking"):
                ignored.append("thinking blocks (the chat template does not show them)")
            else:
                raise GatewayError(f"{where}[{k}].type: {clip(str(kind), 40)} is not supported by this gateway (text, "
                                   "tool_use and tool_result are)", param=f"{where}[{k}]")  # fmt: skip
        if role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                turn["tool_calls"] = calls
            if thoughts:
                turn["reasoning_content"] = "\n".join(thoughts)
            out.append(turn)
        else:
            out += results
            if texts or not results:
                out.append({"role": "user", "content": "".join(texts)})
    return out


def chat_tools(tools: list[dict[str, Any]], ignored: list[str]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") in (None, "custom") and isinstance(tool.get("name"), str):
            spec = {"name": tool["name"], "description": tool.get("description") or "",
                    "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}  # fmt: skip
            out.append({"type": "function", "function": spec})
        else:
            ignored.append(f"tools[{i}] {clip(str(tool.get('type')), 40)} (a server tool the gateway does not run)")
    return out


def tool_choice(value: dict[str, Any] | None) -> tuple[ToolChoice, bool]:
    """Anthropic's tool_choice as a ToolChoice, and whether several calls are allowed."""
    if not value:
        return ToolChoice(), True
    several = not value.get("disable_parallel_tool_use", False)
    kind = value.get("type")
    if kind in ("auto", "none"):
        return ToolChoice(kind), several
    if kind == "any":
        return ToolChoice("required"), several
    if kind == "tool" and isinstance(value.get("name"), str):
        return ToolChoice("required", value["name"]), several
    raise GatewayError("tool_choice.type: give auto, any, tool (with a name) or none", param="tool_choice")


def content_blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text or not turn.calls else []
    for call in turn.calls:
        value = call.call.arguments if call.call is not None else {}
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": value})
    return blocks


class Messages(Protocol):
    name, path = "messages", "/messages"
    without_v1 = True  # ANTHROPIC_BASE_URL is printed without /v1: @ai-sdk/anthropic adds only /messages to it

    def request(self, body, reasoning: bool) -> tuple[MessagesRequest, TurnRequest]:
        req = MessagesRequest.model_validate(body)
        unsupported(req.model_extra, IGNORED)
        if req.mcp_servers:
            raise GatewayError("mcp_servers: not supported (the agent runs its own tools)", param="mcp_servers")
        ignored: list[str] = []
        messages = chat_messages(req.messages, ignored, reasoning)
        if req.messages[-1].get("role") == "assistant":
            raise GatewayError("messages: the last message is the assistant's (a prefill), which this gateway does not "
                               "continue; end with a user message", param="messages")  # fmt: skip
        system = _blocks_text(req.system, "system") if req.system is not None else ""
        choice, several = tool_choice(req.tool_choice)
        turn = TurnRequest(
            messages=([{"role": "system", "content": system}] if system else []) + messages,
            tools=chat_tools(req.tools or [], ignored),
            tool_choice=choice,
            parallel_tool_calls=several,
            parallel_asked=(req.tool_choice or {}).get("disable_parallel_tool_use") is False,
            json_schema=json_format((req.output_config or {}).get("format"), "output_config.format"),
            format_param="output_config.format",
            stop=tuple(req.stop_sequences or ()),
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            model=req.model,
            stream=req.stream,
            ignored=ignored,
        )
        return req, turn

    def parse(self, body, gateway, sample) -> TurnRequest:
        return self.request(body, gateway.chat.template_shows_reasoning)[1]

    def message(self, gateway, work, content: list[dict[str, Any]], turn: Turn | None) -> dict[str, Any]:
        return {
            "id": f"msg_{work.rid}",
            "type": "message",
            "role": "assistant",
            "model": work.req.model or gateway.model_name,
            "content": content,
            "stop_reason": STOP_REASONS[turn.finish] if turn else None,
            "stop_sequence": turn.stop_sequence if turn else None,
            "usage": {"input_tokens": work.prompt_tokens, "output_tokens": turn.completion_tokens if turn else 0},
        }

    def reply(self, gateway, work, turns: list[Turn]) -> dict[str, Any]:
        (turn,) = turns
        return self.message(gateway, work, content_blocks(turn), turn)

    async def stream(self, gateway, work, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        start = self.message(gateway, work, [], None)
        yield sse({"type": "message_start", "message": start}, "message_start")
        block, kind = -1, None  # the open content block and its type

        def stop() -> list[str]:
            return [sse({"type": "content_block_stop", "index": block}, "content_block_stop")] if kind else []

        def delta(body: dict[str, Any]) -> str:
            return sse({"type": "content_block_delta", "index": block, "delta": body}, "content_block_delta")

        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    if kind != "text":
                        for line in stop():
                            yield line
                        block, kind = block + 1, "text"
                        opened = {
                            "type": "content_block_start",
                            "index": block,
                            "content_block": {"type": "text", "text": ""},
                        }
                        yield sse(opened, "content_block_start")
                    yield delta({"type": "text_delta", "text": event.text})
                elif isinstance(event, CallStarted):
                    for line in stop():
                        yield line
                    block, kind = block + 1, "tool_use"
                    use = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
                    yield sse(
                        {"type": "content_block_start", "index": block, "content_block": use}, "content_block_start"
                    )
                elif isinstance(event, ArgumentsDelta):
                    yield delta({"type": "input_json_delta", "partial_json": event.text})
                elif isinstance(event, TurnDone):
                    for line in stop():
                        yield line
                    kind = None
                    turn = event.turn
                    body = {"stop_reason": STOP_REASONS[turn.finish], "stop_sequence": turn.stop_sequence}
                    used = {"output_tokens": turn.completion_tokens}
                    yield sse({"type": "message_delta", "delta": body, "usage": used}, "message_delta")
            yield sse({"type": "message_stop"}, "message_stop")
        except Exception as exc:  # after the headers: the stream's last event says why
            yield sse(self.error(stream_error(gateway, exc)), "error")

    def error(self, error: GatewayError) -> dict[str, Any]:
        message = str(error)
        if error.code == "context_length_exceeded":  # the words harnesses look for to compact a conversation
            message = f"prompt is too long: {message}"
        return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, error.kind), "message": message}}

    def endpoints(self) -> list[tuple[str, str, Any]]:
        async def count_tokens(gateway, body, sample, params):
            if isinstance(body, dict):
                body = {**body, "max_tokens": body.get("max_tokens") or 1}
            return {"input_tokens": gateway.prompt_tokens(self.request(body, gateway.chat.template_shows_reasoning)[1])}

        return [("POST", "/messages/count_tokens", count_tokens)]


MESSAGES = register_protocol(Messages())
