"""DSPy's ReAct with its defaults (its JSON and chat adapters, its structured output), the model an
OpenAI-compatible endpoint through LiteLLM (`openai/policy`: OPENAI_BASE_URL and OPENAI_API_KEY from the
environment); the answer is ReAct's `answer` field."""

import dspy
from common import calculate, finish, question


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


dspy.configure(lm=dspy.LM("openai/policy", cache=False))
react = dspy.ReAct("question -> answer", tools=[calculator], max_iters=5)
finish(react(question=question()).answer)
