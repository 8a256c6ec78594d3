"""crewai with its defaults: one agent with the calculator in a one-task crew, its model `openai/policy` at the
endpoint OPENAI_BASE_URL names (crewai's native OpenAI provider, as its docs set up an OpenAI-compatible server;
OPENAI_API_KEY from the environment)."""

import os

from common import calculate, finish, question
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool


@tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


llm = LLM(model="openai/policy", base_url=os.environ["OPENAI_BASE_URL"])
agent = Agent(role="Calculator", goal="Answer arithmetic questions", backstory="Use the calculator.",
              tools=[calculator], llm=llm)  # fmt: skip
task = Task(description=question(), expected_output="The number", agent=agent)
finish(Crew(agents=[agent], tasks=[task]).kickoff().raw)
