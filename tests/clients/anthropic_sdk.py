"""The anthropic SDK's Messages API, the tool loop its docs show, streamed (ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY
from the environment)."""

import anthropic
from common import calculate, finish, question

TOOLS = [{"name": "calculator", "description": "Evaluate arithmetic.",
          "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]}}]  # fmt: skip

client = anthropic.Anthropic()
messages = [{"role": "user", "content": question()}]
for _ in range(4):
    with client.messages.stream(model="policy", max_tokens=256, messages=messages, tools=TOOLS) as stream:
        message = stream.get_final_message()
    messages.append({"role": "assistant", "content": message.content})
    uses = [block for block in message.content if block.type == "tool_use"]
    if not uses:
        break
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": calculate(use.input.get("expression", ""))}
        for use in uses]})  # fmt: skip
finish("".join(block.text for block in message.content if block.type == "text"))
