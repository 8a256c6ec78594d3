"""agno with the model its argument names, each with its defaults: `openai-chat` (OpenAIChat: chat completions),
`openai-responses` (OpenAIResponses: the Responses API), `anthropic` (Claude: the Messages API); OPENAI_BASE_URL,
ANTHROPIC_BASE_URL and their keys from the environment."""

import sys

from agno.agent import Agent
from common import calculate, finish, question


def model(name: str):
    if name == "openai-chat":
        from agno.models.openai import OpenAIChat

        return OpenAIChat(id="policy")
    if name == "openai-responses":
        from agno.models.openai import OpenAIResponses

        return OpenAIResponses(id="policy")
    from agno.models.anthropic import Claude

    return Claude(id="policy")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the arithmetic to evaluate, as + - * / of numbers.
    """
    return calculate(expression)


agent = Agent(model=model(sys.argv[1]), instructions="Use the calculator.", tools=[calculator])
finish(agent.run(question()).content)
