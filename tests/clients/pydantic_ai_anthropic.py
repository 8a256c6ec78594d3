"""pydantic-ai with an `anthropic:` model (the Messages API; ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY from the
environment)."""

from common import calculate, finish, question
from pydantic_ai import Agent

agent = Agent("anthropic:policy", instructions="Use the calculator.")


@agent.tool_plain
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


finish(agent.run_sync(question()).output)
