"""The OpenAI Agents SDK with its defaults: its default model (the Responses API) and client (OPENAI_BASE_URL,
OPENAI_API_KEY from the environment)."""

from agents import Agent, Runner, function_tool
from common import calculate, finish, question


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


agent = Agent(name="calculator", instructions="Use the calculator.", tools=[calculator])
finish(Runner.run_sync(agent, question()).final_output)
