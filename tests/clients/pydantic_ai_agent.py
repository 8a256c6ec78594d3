"""pydantic-ai with the model its argument names: `openai:policy` (its default for openai: the Responses API;
OPENAI_BASE_URL, OPENAI_API_KEY from the environment) or `anthropic:policy` (the Messages API;
ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY from the environment)."""

import sys

from common import calculate, finish, question
from pydantic_ai import Agent

agent = Agent(sys.argv[1], instructions="Use the calculator.")


@agent.tool_plain
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


finish(agent.run_sync(question()).output)
