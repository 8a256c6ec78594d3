"""smolagents' ToolCallingAgent with its default settings (it sends stop strings and tool_choice "required" on
every step, and ends by calling its final_answer tool), on an OpenAI-compatible server."""

import os

from common import calculate, finish, question
from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, with numbers and + - * /.
    """
    return calculate(expression)


model = OpenAIServerModel(
    model_id="policy", api_base=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
)
finish(ToolCallingAgent(tools=[calculator], model=model, verbosity_level=0).run(question()))
