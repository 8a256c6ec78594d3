"""pydantic-ai with an `openai:` model (its default: the Responses API; OPENAI_BASE_URL, OPENAI_API_KEY from the
environment)."""

from common import calculate, finish, question
from pydantic_ai import Agent

agent = Agent("openai:policy", instructions="Use the calculator.")


@agent.tool_plain
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


finish(agent.run_sync(question()).output)
