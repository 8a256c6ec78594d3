"""LangGraph's prebuilt ReAct agent on langchain-openai's ChatOpenAI (chat completions)."""

import os

from common import calculate, finish, question
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


model = ChatOpenAI(model="policy", base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
state = create_react_agent(model, [calculator]).invoke({"messages": [("user", question())]})
finish(state["messages"][-1].content)
