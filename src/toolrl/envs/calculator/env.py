"""Calculator environment: seeded arithmetic too hard for a small model's head, solved with a tool."""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from toolrl.envs.base import Environment, Task, final_answer, register_env, tool_call_example
from toolrl.envs.calculator.tool import calculator, evaluate
from toolrl.envs.reference import ReferenceRequest, answered
from toolrl.envs.tasks import GeneratedTasks, TaskSplits, unique_seeded_tasks
from toolrl.rewards.ftrl import ftrl_criteria
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.rewards.rules import common_criteria
from toolrl.tools.call import ToolCall
from toolrl.tools.function import tool_from_function

SYSTEM = (
    "You are a careful assistant. Use the calculator tool for arithmetic. "
    "When you have the result, reply with the final answer as <answer>NUMBER</answer>."
)
EXAMPLE_EXPRESSIONS = ("23 * 41 + 7", "512 - 38 * 3")


def example_exchange(syntax=None) -> list[dict[str, str]]:
    """In-context exchanges, calls written in `syntax` (Hermes by default). Measured on the default model:
    with one, greedy decoding never calls the tool; with two, greedy solves the test tasks and sampling at
    temperature 1 solves about a quarter."""
    messages = []
    for expression in EXAMPLE_EXPRESSIONS:
        value = evaluate(expression)
        question, arguments = f"What is {expression}?", {"expression": expression}
        messages += tool_call_example(question, "calculator", arguments, value, value, syntax)
    return messages


class CalculatorOptions(GeneratedTasks):
    min_operands: int = Field(3, ge=2)
    max_operands: int = Field(3, ge=2)
    min_value: int = Field(11, ge=0)
    max_value: int = Field(999, ge=1)
    reward: Literal["rules", "ftrl"] = "rules"
    """rules: correct answer plus format; ftrl: FTRL's 2q/(p+1) reward over the tasks' sub-problems."""
    in_context: bool = True
    """Show two worked exchanges (a call, its result, the answer) before the question; without them the base
    model must learn the tool loop from the system prompt and the schema alone (a task to learn from zero)."""


def generate_tasks(seed: int, options: CalculatorOptions) -> dict[str, list[Task]]:
    """Unique expressions from one seeded stream; the first `num_test` are the test split."""

    def draw(rng: random.Random, _: int) -> tuple[str, str, dict]:
        count = rng.randint(options.min_operands, options.max_operands)
        numbers = [rng.randint(options.min_value, options.max_value) for _ in range(count)]
        ops = [rng.choice("+-*") for _ in range(count - 1)]
        expression = str(numbers[0]) + "".join(f" {op} {n}" for op, n in zip(ops, numbers[1:], strict=True))
        value = evaluate(expression)
        sub = {"name": "calculator", "result": value}  # FTRL: one sub-problem, solved by a call that computes it
        return f"What is {expression}?", value, {"expression": expression, "subproblems": [sub]}

    examples = [f"What is {e}?" for e in EXAMPLE_EXPRESSIONS]
    return unique_seeded_tasks(seed, options, draw, "calc", examples)


def _numbers_equal(predicted: str | None, gold: str) -> bool:
    if predicted is None:
        return False
    try:
        return abs(float(predicted.replace(",", "")) - float(gold)) < 1e-6
    except ValueError:
        return False


def correct(trajectory, task: Task) -> float:
    return float(_numbers_equal(final_answer(trajectory.final_text), task.answer))


@register_env("calculator")
class CalculatorEnv(Environment):
    name = "calculator"
    Options = CalculatorOptions

    def __init__(self, config, options: CalculatorOptions):
        super().__init__(config, options)
        self.splits = TaskSplits(config, generate_tasks(config.seed, options))
        if options.reward == "ftrl":
            self.rubric = Rubric([*ftrl_criteria(correct), Criterion("correct", correct, 0.0)], success="correct")
        else:
            self.rubric = Rubric([Criterion("correct", correct, 1.0), *common_criteria()], success="correct")

    def tools(self):
        return [tool_from_function(calculator, idempotent=True, isolation="thread")]  # pure and bounded

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """The calculator on the task's expression, then its value."""
        return answered(task.answer, ToolCall("calculator", {"expression": task.meta["expression"]}))

    def messages(self, task: Task) -> list[dict[str, str]]:
        examples = example_exchange(self.syntax) if self.options.in_context else []
        return [{"role": "system", "content": SYSTEM}, *examples, {"role": "user", "content": task.question}]
