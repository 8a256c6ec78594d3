"""The openai SDK's chat completions, the tool loop its docs show (OPENAI_BASE_URL, OPENAI_API_KEY from the
environment)."""

import json

from common import calculate, finish, question
from openai import OpenAI

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                         "required": ["expression"]}}}]  # fmt: skip

client = OpenAI()
messages = [{"role": "user", "content": question()}]
for _ in range(4):
    message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        break
    for call in message.tool_calls:
        result = calculate(json.loads(call.function.arguments).get("expression", ""))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
finish(message.content)
