"""OpenAI chat completions (`POST /v1/chat/completions`): requests checked into a TurnRequest, replies and
stream chunks shaped as the `openai` SDK and the frameworks built on it read them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolrl.gateway.protocols import Protocol, register_protocol, sse, unsupported
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

IGNORED = ("frequency_penalty", "presence_penalty", "logit_bias", "user", "metadata", "store", "service_tier",
           "stream_options", "logprobs", "top_logprobs", "reasoning_effort", "prompt_cache_key",
           "safety_identifier", "verbosity")  # fmt: skip
"""Fields a client may send that change nothing here (the engine samples with temperature, top-p and top-k)."""
FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


class Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=10)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stream: bool = False
    stop: str | list[str] | None = None

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatRequest(Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def roles(cls, value):
        for i, m in enumerate(value):
            if m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                raise ValueError(f"messages[{i}].role must be system, developer, user, assistant or tool")
            content = m.get("content")
            if isinstance(content, list):
                if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                    raise ValueError(f"messages[{i}].content: only text parts are supported (no images or audio)")
            elif content is not None and not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string, a list of text parts or null")
            for k, call in enumerate(m.get("tool_calls") or []):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise ValueError(f"messages[{i}].tool_calls[{k}].function needs a name")
                if not isinstance(function.get("arguments") or "", str | dict):
                    raise ValueError(f"messages[{i}].tool_calls[{k}].function.arguments must be JSON text")
        return value


def tool_choice(value: str | dict[str, Any] | None) -> ToolChoice:
    """OpenAI's tool_choice (the chat and Responses shapes) as a ToolChoice."""
    if value is None or value in ("auto", "none", "required"):
        return ToolChoice(value or "auto")
    if isinstance(value, dict) and value.get("type") == "function":
        name = (value.get("function") or {}).get("name") or value.get("name")
        if isinstance(name, str):
            return ToolChoice("required", name)
    raise GatewayError("tool_choice: give auto, none, required or a function by name", param="tool_choice")


def json_format(value: dict[str, Any] | None, param: str) -> dict[str, Any] | None:
    """The JSON schema a response format asks for (json_object: any object), or None for plain text."""
    if not value or value.get("type") in (None, "text"):
        return None
    if value["type"] == "json_object":
        return {"type": "object"}
    if value["type"] == "json_schema":
        spec = value.get("json_schema", value)  # chat nests it; Responses' text.format does not
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise GatewayError(f"{param}: json_schema needs a schema object", param=param)
        return schema
    raise GatewayError(f"{param}: type must be text, json_object or json_schema", param=param)


class ChatCompletions(Protocol):
    name, path = "chat", "/chat/completions"

    def parse(self, body, gateway, sample) -> TurnRequest:
        req = ChatRequest.model_validate(body)
        unsupported(req.model_extra, IGNORED)
        return TurnRequest(
            messages=req.messages,
            tools=list(req.tools or []),
            tool_choice=tool_choice(req.tool_choice),
            parallel_tool_calls=req.parallel_tool_calls is not False,
            parallel_asked=req.parallel_tool_calls is True,
            json_schema=json_format(req.response_format, "response_format"),
            stop=req.stops(),
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            n=req.n,
            model=req.model,
            stream=req.stream,
        )

    def reply(self, gateway, work, turns: list[Turn]) -> dict[str, Any]:
        completion = sum(t.completion_tokens for t in turns)
        return {
            "id": f"chatcmpl-{work.rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": work.req.model or gateway.model_name,
            "choices": [
                {"index": t.index, "message": t.chat_message(), "finish_reason": FINISH[t.finish], "logprobs": None}
                for t in turns
            ],
            "usage": usage(work.prompt_tokens, completion),
        }

    async def stream(self, gateway, work, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        rid, model, created = f"chatcmpl-{work.rid}", work.req.model or gateway.model_name, int(time.time())

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": choices, **extra})  # fmt: skip

        def delta(index: int, body: dict[str, Any], finish: str | None = None) -> str:
            return chunk([{"index": index, "delta": body, "finish_reason": finish}])

        for i in range(len(work.segments)):
            yield delta(i, {"role": "assistant", "content": ""})
        completion = 0
        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    yield delta(event.index, {"content": event.text})
                elif isinstance(event, CallStarted):
                    call = {"index": event.call, "id": event.id, "type": "function",
                            "function": {"name": event.name, "arguments": ""}}  # fmt: skip
                    yield delta(event.index, {"tool_calls": [call]})
                elif isinstance(event, ArgumentsDelta):
                    yield delta(
                        event.index, {"tool_calls": [{"index": event.call, "function": {"arguments": event.text}}]}
                    )
                elif isinstance(event, TurnDone):
                    completion += event.turn.completion_tokens
                    yield delta(event.turn.index, {}, FINISH[event.turn.finish])
        except Exception as exc:  # after the headers: the error is the stream's last event
            yield sse(self.error(stream_error(gateway, exc)))
            yield sse("[DONE]")
            return
        yield chunk([], usage=usage(work.prompt_tokens, completion))
        yield sse("[DONE]")

    def error(self, error: GatewayError) -> dict[str, Any]:
        return {"error": {"message": str(error), "type": error.kind, "param": error.param, "code": error.code}}


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def stream_error(gateway, exc: Exception) -> GatewayError:
    """A failure during a stream as the GatewayError its last event carries (logged and counted)."""
    import logging

    from toolrl.text import first_line

    if isinstance(exc, GatewayError):
        return exc
    logging.getLogger("toolrl.gateway.server").error("gateway: a streamed request failed: %s", first_line(exc),
                                                     exc_info=exc)  # fmt: skip
    gateway.stats["errors"] += 1
    return GatewayError(f"the gateway failed: {first_line(exc)}", 500, kind="server_error")


CHAT = register_protocol(ChatCompletions())
