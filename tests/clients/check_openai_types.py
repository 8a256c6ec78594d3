"""Every reply and every stream event of the gateway's OpenAI protocols validated against the openai SDK's own
types (strictly: pydantic validation of the SDK's models, not its lenient construction): chat completions and
their chunks, Responses and their events, the error bodies. The gateway's policy calls a tool on a first request
and answers the next (tests/gateway/test_protocols.py). Prints one line per checked object kind."""

import json
import os
import sys
from collections import Counter

try:
    import httpx
except ImportError:  # openai 3 ships its own fork of it
    import httpx2 as httpx
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.shared import ErrorObject
from pydantic import TypeAdapter

BASE, KEY = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
EVENTS = TypeAdapter(ResponseStreamEvent)
CALC = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
checked: Counter[str] = Counter()


def post(path: str, body: dict) -> httpx.Response:
    return httpx.post(BASE + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def stream(path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", BASE + path, json={**body, "stream": True}, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


chat_tools = [{"type": "function", "function": {"name": "calculator", "parameters": CALC}}]
for round_ in range(2):  # a call, then an answer
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    if round_:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
        }
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "4"}]  # fmt: skip
    ChatCompletion.model_validate(
        post("/chat/completions", {"model": "m", "messages": messages, "tools": chat_tools}).json()
    )
    checked["chat.completion"] += 1
    for chunk in stream("/chat/completions", {"model": "m", "messages": messages, "tools": chat_tools}):
        ChatCompletionChunk.model_validate(chunk)
        checked["chat.completion.chunk"] += 1

tools = [{"type": "function", "name": "calculator", "parameters": CALC, "strict": False}]
first = post("/responses", {"model": "m", "input": "What is 2 + 2?", "tools": tools}).json()
Response.model_validate(first)
call = next(item for item in first["output"] if item["type"] == "function_call")
second = {"model": "m", "previous_response_id": first["id"], "tools": tools,
          "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "4"}]}  # fmt: skip
Response.model_validate(post("/responses", second).json())
checked["response"] += 2
for body in ({"model": "m", "input": "What is 2 + 2?", "tools": tools}, {**second, "previous_response_id": None,
             "input": [{"role": "user", "content": "What is 2 + 2?"}, call, second["input"][0]]}):  # fmt: skip
    kinds = []
    for event in stream("/responses", body):
        EVENTS.validate_python(event)
        kinds.append(event["type"])
        checked[event["type"]] += 1
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed", kinds

for path, body in [("/chat/completions", {"messages": []}), ("/responses", {"input": [{"type": "nonsense"}]})]:
    error = post(path, body)
    assert error.status_code == 400, error.text
    ErrorObject.model_validate(error.json()["error"])
    checked["error"] += 1
print("\n".join(f"{kind}: {n}" for kind, n in sorted(checked.items())))
sys.exit(0)
