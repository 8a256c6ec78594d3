"""The openai SDK's Responses API, the tool loop its docs show: the function calls' outputs sent with
previous_response_id, streamed (OPENAI_BASE_URL, OPENAI_API_KEY from the environment)."""

import json

from common import calculate, finish, question
from openai import OpenAI

TOOLS = [{"type": "function", "name": "calculator", "description": "Evaluate arithmetic.",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                         "required": ["expression"]}}]  # fmt: skip

client = OpenAI()
request = {"model": "policy", "input": question(), "tools": TOOLS}
for _ in range(4):
    with client.responses.stream(**request) as stream:
        response = stream.get_final_response()
    calls = [item for item in response.output if item.type == "function_call"]
    if not calls:
        break
    outputs = [{"type": "function_call_output", "call_id": call.call_id,
                "output": calculate(json.loads(call.arguments).get("expression", ""))} for call in calls]  # fmt: skip
    request = {"model": "policy", "previous_response_id": response.id, "input": outputs, "tools": TOOLS}
finish(response.output_text)
