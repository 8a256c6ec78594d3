"""Every reply and every stream event of the gateway's Anthropic Messages API validated against the anthropic SDK's
own types (strictly: pydantic validation of its models): messages, their stream events, count_tokens and the error
body. The gateway's policy calls a tool on a first request and answers the next (tests/gateway/test_protocols.py).
Prints one line per checked object kind."""

import json
import os
from collections import Counter

try:
    import httpx
except ImportError:  # anthropic 2 ships its own fork of it
    import httpx2 as httpx
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

BASE, KEY = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
EVENTS = TypeAdapter(RawMessageStreamEvent)
TOOLS = [{"name": "calculator", "description": "Arithmetic.",
          "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}}}]  # fmt: skip
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
checked: Counter[str] = Counter()


def post(path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{BASE}/v1{path}", json=body, headers=HEADERS, timeout=60)


question = {"role": "user", "content": "What is 2 + 2?"}
first = post("/messages", {"model": "m", "max_tokens": 256, "messages": [question], "tools": TOOLS}).json()
Message.model_validate(first)
use = next(block for block in first["content"] if block["type"] == "tool_use")
result = {"type": "tool_result", "tool_use_id": use["id"], "content": "4"}
messages = [question, {"role": "assistant", "content": first["content"]}, {"role": "user", "content": [result]}]
answer = post("/messages", {"model": "m", "max_tokens": 256, "messages": messages, "tools": TOOLS})
Message.model_validate(answer.json())
checked["message"] += 2
for history in ([question], messages):
    body = {"model": "m", "max_tokens": 256, "messages": history, "tools": TOOLS, "stream": True}
    with httpx.stream("POST", f"{BASE}/v1/messages", json=body, headers=HEADERS, timeout=60) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    kinds = []
    for line in lines:
        event = json.loads(line)
        EVENTS.validate_python(event)
        kinds.append(event["type"])
        checked[event["type"]] += 1
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
MessageTokensCount.model_validate(
    post("/messages/count_tokens", {"model": "m", "messages": messages, "tools": TOOLS}).json()
)
checked["count_tokens"] += 1
error = post("/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "x"}]}]})
assert error.status_code == 400, error.text
ErrorResponse.model_validate(error.json())
checked["error"] += 1
print("\n".join(f"{kind}: {n}" for kind, n in sorted(checked.items())))
