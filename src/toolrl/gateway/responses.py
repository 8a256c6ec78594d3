"""The OpenAI Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`): what the OpenAI Agents
SDK, pydantic-ai's `openai:` models and Codex CLI speak.

`input` (a string, or items: messages with text parts, `function_call`, `function_call_output`) becomes chat
messages: the items of one assistant turn (its message, its calls) are one assistant message, so that a
conversation sent back continues its captured segment. `instructions` is the system message (not carried by
`previous_response_id`, as the API says); function tools (and the function tools of a `namespace`, named
`namespace.name` to the model and returned with their namespace) are offered; hosted tools (web search, file
search, ...) are not run here: they are left out, counted and told in the `x-toolrl-ignored` header. Responses
with `store` (the default) are kept in memory, per sample and bounded, for `previous_response_id`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolrl.gateway.chat import json_format, stream_error, tool_choice
from toolrl.gateway.protocols import Protocol, parts_text, register_protocol, sse, unsupported
from toolrl.gateway.turns import (
    ArgumentsDelta,
    CallStarted,
    Event,
    FunctionCall,
    GatewayError,
    TextDelta,
    Turn,
    TurnDone,
    TurnRequest,
)
from toolrl.text import clip

IGNORED = ("metadata", "user", "include", "reasoning", "prompt_cache_key", "prompt_cache_retention",
           "safety_identifier", "service_tier", "stream_options", "truncation", "client_metadata", "top_logprobs",
           "max_tool_calls", "context_management")  # fmt: skip
"""Fields that change nothing here (reasoning effort and summaries: the policy writes no reasoning items)."""
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
"""The API's own limits on `metadata` (echoed in the response, and kept with it)."""
READABLE = {"input_text": "text", "output_text": "text", "text": "text", "summary_text": "text", "refusal": "refusal"}
"""The content parts read as text, and the key of each one's text."""


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=10)
    top_p: float | None = Field(None, gt=0, le=1)
    previous_response_id: str | None = None
    store: bool = True
    text: dict[str, Any] | None = None
    stream: bool = False
    background: bool | None = None


@dataclass
class ResponsesTurn(TurnRequest):
    """A TurnRequest with what the Responses API echoes and keeps."""

    body: ResponsesRequest | None = None
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The messages without the instructions (what previous_response_id carries)."""
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    """A namespaced function's name as the model sees it -> (namespace, name)."""


def check_metadata(metadata: Any) -> None:
    """`metadata` as the API takes it: at most 16 pairs of strings, keys of at most 64 characters, values of 512."""
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > METADATA_PAIRS:
        raise GatewayError(f"metadata: at most {METADATA_PAIRS} key-value pairs (an object)", param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS or not isinstance(value, str) or len(value) > METADATA_VALUE_CHARS:
            raise GatewayError(f"metadata.{clip(key, 40)}: keys of at most {METADATA_KEY_CHARS} characters, values "
                               f"strings of at most {METADATA_VALUE_CHARS}", param="metadata")  # fmt: skip


def _text(parts: Any, where: str) -> str:
    return parts_text(parts, where, READABLE)


def input_messages(
    items: str | list[dict[str, Any]],
    ignored: list[str],
    reasoning: bool,
    issued: Callable[[str], dict[str, Any] | None] = lambda item_id: None,
) -> list[dict[str, Any]]:
    """Input items as chat messages; the consecutive items of an assistant turn (its message, reasoning and calls)
    as one assistant message. Reasoning items become the turn's `reasoning_content` when the chat template shows
    it (`reasoning`), else they are left out and told. An `item_reference` is the item the gateway issued under
    that id (`issued`: a kept response's output item, of the same key and sample), or a one-line 404."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    items = [_referenced(item, i, issued) for i, item in enumerate(items)]
    messages: list[dict[str, Any]] = []

    def assistant() -> dict[str, Any]:
        if not messages or messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "content": None})
        return messages[-1]

    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise GatewayError(f"{where}.role must be user, assistant, system or developer", param=f"{where}.role")
            text = _text(item.get("content", ""), f"{where}.content")
            if role == "assistant":
                turn = assistant()
                turn["content"] = (turn["content"] or "") + text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise GatewayError(f"{where}: a function_call needs name and call_id", param=where)
            if item.get("namespace"):
                name = f"{item['namespace']}.{name}"
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": item.get("arguments") or "{}"},
            }
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = _text(item.get("output", ""), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id")), "content": output})
        elif kind == "reasoning" and reasoning:
            parts = [*(item.get("summary") or []), *(item.get("content") or [])]
            text = "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
            turn = assistant()
            turn["reasoning_content"] = (turn.get("reasoning_content", "") + "\n" + text).strip()
        elif kind == "reasoning":
            ignored.append("reasoning items (the chat template does not show them)")
        else:
            raise GatewayError(f"{where}.type: {clip(str(kind), 40)} is not supported by this gateway (messages, "
                               "function_call, function_call_output and reasoning are)", param=where)  # fmt: skip
    return messages


def _referenced(item: Any, index: int, issued: Callable[[str], dict[str, Any] | None]) -> Any:
    if not isinstance(item, dict) or item.get("type") != "item_reference":
        return item
    item_id = item.get("id")
    found = issued(item_id) if isinstance(item_id, str) else None
    if found is None:
        raise GatewayError(f"input[{index}]: no item {clip(str(item_id), 60)!r} was issued to this agent (an "
                           "item_reference names an output item of a response kept with store: true)", 404,
                           param=f"input[{index}]", kind="not_found_error")  # fmt: skip
    return found


def chat_tools(tools: list[dict[str, Any]], ignored: list[str], namespaces: dict[str, tuple[str, str]]) -> list[dict]:
    """Function tools (those of a namespace too, as `namespace.name`) in the chat shape; hosted ones left out."""
    out = []

    def function(tool: dict[str, Any], name: str) -> dict[str, Any]:
        spec = {"name": name, "description": tool.get("description") or "",
                "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}  # fmt: skip
        return {"type": "function", "function": spec}

    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "function" and isinstance(tool.get("name"), str):
            out.append(function(tool, tool["name"]))
        elif kind == "namespace" and isinstance(tool.get("name"), str):
            for inner in tool.get("tools") or []:
                if inner.get("type") == "function" and isinstance(inner.get("name"), str):
                    qualified = f"{tool['name']}.{inner['name']}"
                    namespaces[qualified] = (tool["name"], inner["name"])
                    out.append(function(inner, qualified))
                else:
                    ignored.append(f"tools[{i}] {clip(str(inner.get('type')), 30)} inside a namespace")
        else:
            ignored.append(f"tools[{i}] {clip(str(kind), 30)} (a hosted tool the gateway does not run)")
    return out


def _ids(work) -> tuple[str, str]:
    return f"resp_{work.rid}", f"msg_{work.rid}"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": [part]}


def call_item(call: FunctionCall, req: ResponsesTurn, status: str) -> dict[str, Any]:
    item = {"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}  # fmt: skip
    if call.name in req.namespaces:
        item["namespace"], item["name"] = req.namespaces[call.name]
    return item


class Responses(Protocol):
    name, path = "responses", "/responses"

    def parse(self, body, gateway, sample) -> ResponsesTurn:
        req = ResponsesRequest.model_validate(body)
        unsupported(req.model_extra, IGNORED)
        check_metadata((req.model_extra or {}).get("metadata"))
        if req.background:
            raise GatewayError("background: not supported (each response is answered as it is sampled)",
                               param="background")  # fmt: skip
        ignored: list[str] = []
        conversation = []
        if req.previous_response_id:
            conversation = list(gateway.responses.get(req.previous_response_id, sample and sample.id)[1])
        owner = sample.id if sample is not None else None
        conversation += input_messages(req.input, ignored, gateway.chat.template_shows_reasoning,
                                       lambda item_id: gateway.responses.item(item_id, owner))  # fmt: skip
        namespaces: dict[str, tuple[str, str]] = {}
        tools = chat_tools(req.tools or [], ignored, namespaces)
        instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
        choice = req.tool_choice
        if isinstance(choice, dict) and choice.get("type") not in (None, "function"):
            raise GatewayError(f"tool_choice.type: {clip(str(choice.get('type')), 40)} is not supported (auto, none, "
                               "required or a function)", param="tool_choice")  # fmt: skip
        return ResponsesTurn(
            messages=instructions + conversation,
            tools=tools,
            tool_choice=tool_choice(choice),
            parallel_tool_calls=req.parallel_tool_calls is not False,
            parallel_asked=req.parallel_tool_calls is True,
            json_schema=json_format((req.text or {}).get("format"), "text.format"),
            format_param="text.format",
            max_tokens=req.max_output_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            model=req.model,
            stream=req.stream,
            ignored=ignored,
            body=req,
            conversation=conversation,
            namespaces=namespaces,
        )

    def response(self, gateway, work, output: list[dict[str, Any]], status: str, tokens: int) -> dict[str, Any]:
        req: ResponsesTurn = work.req
        body = req.body
        assert body is not None
        done = status in ("completed", "incomplete")
        prompt = work.prompt_tokens
        usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                 "output_tokens": tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": prompt + tokens}  # fmt: skip
        return {
            "id": _ids(work)[0],
            "object": "response",
            "created_at": work.created,
            "status": status,
            "completed_at": time.time() if done else None,
            "model": body.model or gateway.model_name,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "instructions": body.instructions,
            "previous_response_id": body.previous_response_id,
            "store": body.store,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "text": {"format": (body.text or {}).get("format") or {"type": "text"}},
            "metadata": metadata if isinstance(metadata := (body.model_extra or {}).get("metadata"), dict) else {},
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "usage": usage if done else None,
        }

    def _keep(self, gateway, work, turn: Turn, response: dict[str, Any]) -> None:
        req: ResponsesTurn = work.req
        if req.body is not None and req.body.store:
            sample = work.sample.id if work.sample is not None else None
            gateway.responses.keep(response["id"], sample, [*req.conversation, turn.chat_message()], response)

    def reply(self, gateway, work, turns: list[Turn]) -> dict[str, Any]:
        (turn,) = turns
        status = "incomplete" if turn.finish == "length" else "completed"
        output = [message_item(_ids(work)[1], turn.text, status)] if turn.text or not turn.calls else []
        output += [call_item(c, work.req, "completed") for c in turn.calls]
        response = self.response(gateway, work, output, status, turn.completion_tokens)
        self._keep(gateway, work, turn, response)
        return response

    async def stream(self, gateway, work, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        writer = _ResponseEvents(self, gateway, work)
        yield writer.event("response.created", response=self.response(gateway, work, [], "in_progress", 0))
        yield writer.event("response.in_progress", response=self.response(gateway, work, [], "in_progress", 0))
        try:
            async for event in events:
                for line in writer.on(event):
                    yield line
        except Exception as exc:  # after the headers: the stream's last event says why
            error = stream_error(gateway, exc)
            yield writer.event("error", code=error.code or error.kind, message=str(error), param=error.param)
            failed = self.response(gateway, work, writer.items, "failed", 0)
            failed["error"] = {"code": "server_error", "message": str(error)}
            yield writer.event("response.failed", response=failed)

    def error(self, error: GatewayError) -> dict[str, Any]:
        return {"error": {"message": str(error), "type": error.kind, "param": error.param, "code": error.code}}

    def endpoints(self) -> list[tuple[str, str, Any]]:
        async def retrieve(gateway, body, sample, params):
            return gateway.responses.get(params["rid"], sample and sample.id, "response_id")[2]

        async def delete(gateway, body, sample, params):
            gateway.responses.get(params["rid"], sample and sample.id, "response_id")
            gateway.responses.drop(sample and sample.id, params["rid"])
            return {"id": params["rid"], "object": "response.deleted", "deleted": True}

        return [("GET", "/responses/{rid}", retrieve), ("DELETE", "/responses/{rid}", delete)]


class _ResponseEvents:
    """The Responses event sequence of one streamed turn: output items opened and closed around its text and
    calls, every event numbered."""

    def __init__(self, protocol: Responses, gateway, work):
        self.protocol, self.gateway, self.work = protocol, gateway, work
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.texts = 0

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(data, kind)

    def _close(self, status: str = "completed") -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        index, lines = len(self.items), []
        item["status"] = status
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            lines += [self.event("response.output_text.done", **where, text=part["text"], logprobs=[]),
                      self.event("response.content_part.done", **where, part=part)]  # fmt: skip
        else:
            lines.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                    arguments=item["arguments"]))  # fmt: skip
        lines.append(self.event("response.output_item.done", output_index=index, item=item))
        self.items.append(item)
        return lines

    def on(self, event: Event) -> list[str]:
        index = len(self.items)
        if isinstance(event, TextDelta):
            lines = []
            if self.open is None or self.open["type"] != "message":
                lines += self._close()
                self.texts += 1
                item_id = _ids(self.work)[1] + (f"_{self.texts}" if self.texts > 1 else "")
                self.open = message_item(item_id, "", "in_progress")
                self.open["content"] = []
                lines.append(self.event("response.output_item.added", output_index=index, item=dict(self.open)))
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                self.open["content"] = [part]
                lines.append(self.event("response.content_part.added", item_id=item_id, output_index=index,
                                        content_index=0, part=dict(part)))  # fmt: skip
            self.open["content"][0]["text"] += event.text
            lines.append(self.event("response.output_text.delta", item_id=self.open["id"], output_index=index,
                                    content_index=0, delta=event.text, logprobs=[]))  # fmt: skip
            return lines
        if isinstance(event, CallStarted):
            lines = self._close()
            call = FunctionCall(event.id, event.name, "")
            self.open = call_item(call, self.work.req, "in_progress")
            return [
                *lines,
                self.event("response.output_item.added", output_index=len(self.items), item=dict(self.open)),
            ]
        if isinstance(event, ArgumentsDelta):
            assert self.open is not None and self.open["type"] == "function_call"
            self.open["arguments"] += event.text
            return [self.event("response.function_call_arguments.delta", item_id=self.open["id"], output_index=index,
                               delta=event.text)]  # fmt: skip
        assert isinstance(event, TurnDone)
        turn = event.turn
        status = "incomplete" if turn.finish == "length" else "completed"
        lines = self._close(status if self.open is not None and self.open["type"] == "message" else "completed")
        response = self.protocol.response(self.gateway, self.work, self.items, status, turn.completion_tokens)
        self.protocol._keep(self.gateway, self.work, turn, response)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return [*lines, self.event(kind, response=response)]


RESPONSES = register_protocol(Responses())
