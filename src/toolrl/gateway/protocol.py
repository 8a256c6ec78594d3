"""The OpenAI chat-completions wire format the gateway speaks: requests checked into typed values, replies and
stream chunks shaped as the `openai` SDK and the frameworks built on it read them."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolrl.tools.call import ToolCall

IGNORED = ("frequency_penalty", "presence_penalty", "logit_bias", "user", "metadata", "store", "service_tier",
           "parallel_tool_calls", "stream_options", "logprobs", "top_logprobs", "reasoning_effort")  # fmt: skip
"""Fields a client may send that change nothing here (the engine samples with temperature, top-p and top-k)."""


class GatewayError(Exception):
    """A request the gateway refuses: one line, the HTTP status and the field."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


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

    @field_validator("stop")
    @classmethod
    def no_stop_strings(cls, value):
        if value:
            raise ValueError("stop strings are not supported: the policy's turn ends at its end-of-turn token")
        return value

    def unsupported(self) -> list[str]:
        """Extra fields that are neither known here nor harmless to ignore."""
        return sorted(k for k in (self.model_extra or {}) if k not in IGNORED)


class ChatRequest(Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
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
                arguments = function.get("arguments") or "{}"
                try:
                    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
                except ValueError:
                    parsed = None
                if not isinstance(parsed, dict):
                    raise ValueError(f"messages[{i}].tool_calls[{k}].function.arguments must be a JSON object")
        return value

    @field_validator("response_format")
    @classmethod
    def text_only(cls, value):
        if value and value.get("type") not in (None, "text"):
            raise ValueError("only text replies are supported (no constrained json_schema decoding)")
        return value

    def schemas(self) -> list[dict[str, Any]]:
        """The tools to show the model: none with tool_choice "none"."""
        if self.tool_choice == "none":
            return []
        return [t for t in self.tools or [] if t.get("type", "function") == "function" and "function" in t]


class CompletionRequest(Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    """The sampled token's log-prob comes back (top alternatives are not given)."""
    return_tokens_as_token_ids: bool = False
    """vLLM's extension: each token as `token_id:N`, exact."""
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True


def tool_calls_json(calls: list[ToolCall], prefix: str) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{prefix}_{k}", "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for k, c in enumerate(calls)
    ]  # fmt: skip


def chat_response(rid: str, model: str, choices: list[dict[str, Any]], prompt: int, completion: int) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


class Chunks:
    """Server-sent events of one chat completion, shaped as the `openai` SDK reads a stream."""

    def __init__(self, rid: str, model: str, created: int | None = None):
        self.rid, self.model, self.created = rid, model, created if created is not None else int(time.time())

    def event(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        chunk = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": choices, **extra}  # fmt: skip
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    def delta(self, index: int, delta: dict[str, Any], finish_reason: str | None = None) -> str:
        return self.event([{"index": index, "delta": delta, "finish_reason": finish_reason}])

    def opening(self, index: int) -> str:
        return self.delta(index, {"role": "assistant", "content": ""})

    def ending(self, choice: dict[str, Any], sent: str = "") -> list[str]:
        """A choice's last events: what of its text `sent` does not hold yet, its calls, its finish reason."""
        i, message = choice["index"], choice["message"]
        events = []
        content = message.get("content") or ""
        if content.startswith(sent) and len(content) > len(sent):
            events.append(self.delta(i, {"content": content[len(sent) :]}))
        for k, call in enumerate(message.get("tool_calls") or []):
            events.append(self.delta(i, {"tool_calls": [{"index": k, **call}]}))
        events.append(self.delta(i, {}, choice["finish_reason"]))
        return events

    def closing(self, usage: dict[str, Any]) -> list[str]:
        return [self.event([], usage=usage), "data: [DONE]\n\n"]


def stream_chunks(response: dict[str, Any]) -> list[str]:
    """A finished reply as server-sent events: per choice the role, its text, its calls, then the finish; then
    the usage and [DONE] (a turn that may call tools: its calls are known once the turn is parsed)."""
    chunks = Chunks(response["id"], response["model"], response["created"])
    events = []
    for choice in response["choices"]:
        events += [chunks.opening(choice["index"]), *chunks.ending(choice)]
    return events + chunks.closing(response["usage"])
