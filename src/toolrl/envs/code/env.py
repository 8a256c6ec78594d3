"""Code environment: numeric questions a small model cannot do in its head, answered by running Python.

The `python` tool runs the model's code in a sandbox (`sandbox.py`: Linux namespaces through bubblewrap or
unshare, and limits), in a folder of its own (a tmpfs, empty at each call). Rewards: the final <answer>
equals the computed value (`correct`, 1), a program ran without error (`ran_code`, 0.1, shaping), format
(logged only: paid, it taught the default model to answer without running anything), and tool verification
(`verified`, logged): the trajectory's last successful code is run again in a fresh sandbox and must print
the expected value.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from toolrl.envs.base import Environment, Episode, Task, register_env, tool_call_example
from toolrl.envs.calculator.env import correct
from toolrl.envs.code.memory import CgroupBound
from toolrl.envs.code.sandbox import Sandbox, SandboxLimits, resolve_isolation, run_python
from toolrl.envs.reference import ReferenceRequest, answered
from toolrl.envs.tasks import GeneratedTasks, TaskSplits, unique_seeded_tasks
from toolrl.errors import ConfigError
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.rewards.rules import common_criteria
from toolrl.tools.call import ToolCall
from toolrl.tools.function import tool_from_function

log = logging.getLogger(__name__)

SYSTEM = (
    "You are a careful assistant. Use the python tool to compute answers: write a short program that prints "
    "the result. When you have the result, reply with the final answer as <answer>NUMBER</answer>."
)
EXAMPLES = (
    ("What is the sum of the squares of the integers from 1 to 10?", "print(sum(i * i for i in range(1, 11)))", "385"),
    ("How many integers from 1 to 100 are divisible by 7?", "print(sum(1 for i in range(1, 101) if i % 7 == 0))", "14"),
)
"""In-context exchanges (as for the calculator, the default model needs two)."""


def python(code: str, sandbox: Sandbox) -> str:
    """Run a Python program and return what it prints (stdout and stderr).

    Args:
        code: The program; print the values you need.
    """
    if sandbox is None:
        raise RuntimeError("python runs inside an episode")
    return run_python(code, sandbox)


Drawn = tuple[str, int, str]
"""A question, its value, and a program that computes the value."""


def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    return [i for i in range(n) if sieve[i]]


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _prime_sum(rng: random.Random) -> Drawn:
    n = rng.randint(100, 5000)
    program = f"print(sum(p for p in range(2, {n}) if all(p % d for d in range(2, int(p ** 0.5) + 1))))"
    return f"What is the sum of all prime numbers below {n}?", sum(_primes_below(n)), program


def _divisible(rng: random.Random) -> Drawn:
    n, a, b = rng.randint(200, 9000), rng.randint(3, 9), rng.randint(10, 19)
    count = sum(1 for i in range(1, n + 1) if i % a == 0 or i % b == 0)
    program = f"print(sum(1 for i in range(1, {n + 1}) if i % {a} == 0 or i % {b} == 0))"
    return f"How many integers from 1 to {n} are divisible by {a} or by {b}?", count, program


def _fibonacci(rng: random.Random) -> Drawn:
    n, m = rng.randint(30, 200), rng.randint(1000, 99999)
    question = f"What is F({n}) modulo {m}, where F is the Fibonacci sequence with F(0) = 0 and F(1) = 1?"
    return question, _fib(n) % m, f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a % {m})"


def _factorial_digits(rng: random.Random) -> Drawn:
    k = rng.randint(20, 90)
    program = f"import math\nprint(sum(int(d) for d in str(math.factorial({k}))))"
    return f"What is the sum of the digits of {k} factorial?", sum(map(int, str(math.factorial(k)))), program


def _digit_count(rng: random.Random) -> Drawn:
    n, d = rng.randint(100, 5000), rng.randint(1, 9)
    count = sum(str(i).count(str(d)) for i in range(1, n + 1))
    program = f"print(sum(str(i).count('{d}') for i in range(1, {n + 1})))"
    return f"How many times does the digit {d} appear when writing every integer from 1 to {n}?", count, program


def _sum_of_squares(rng: random.Random) -> Drawn:
    n = rng.randint(20, 3000)
    program = f"print(sum(i * i for i in range(1, {n + 1})))"
    return f"What is the sum of the squares of the integers from 1 to {n}?", n * (n + 1) * (2 * n + 1) // 6, program


def _multiples(rng: random.Random) -> Drawn:
    n, k = rng.randint(200, 9000), rng.randint(3, 19)
    program = f"print(sum(1 for i in range(1, {n + 1}) if i % {k} == 0))"
    return f"How many integers from 1 to {n} are divisible by {k}?", n // k, program


def _sum_of_cubes(rng: random.Random) -> Drawn:
    n = rng.randint(20, 500)
    program = f"print(sum(i ** 3 for i in range(1, {n + 1})))"
    return f"What is the sum of the cubes of the integers from 1 to {n}?", (n * (n + 1) // 2) ** 2, program


QUESTIONS: list[Callable[[random.Random], Drawn]] = [
    _sum_of_squares,
    _prime_sum,
    _multiples,
    _divisible,
    _sum_of_cubes,
    _fibonacci,
    _factorial_digits,
    _digit_count,
]
"""Kinds of question, taken in turn; each draws its numbers from the seeded generator. The first of each
pair varies an in-context example (a small model can adapt the example's program), the others need a
program of their own. Each comes with a program that computes its value (the reference's, and the warm start's:
a reference that printed the value itself taught the model to print a number it made up)."""


class CodeOptions(GeneratedTasks):
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one run; CPU time is limited to the same."""
    memory_mb: int = Field(512, ge=16)
    """Memory of all the code's processes together (a cgroup per call, else the host's watch: memory.py)."""
    memory_bound: Literal["auto", "cgroup", "watch"] = "auto"
    """How memory_mb is held: auto takes a cgroup where this machine lets toolrl make one, else the watch."""
    max_output_chars: int = Field(2000, ge=10)
    max_file_mb: int = Field(10, ge=1)
    """Largest file the code may write, and most output it may print (past it the program is stopped)."""
    disk_mb: int = Field(64, ge=1)
    """Size of the code's folder (a tmpfs made for each call, empty at its start)."""
    max_processes: int = Field(64, ge=2)
    """Processes and threads the code may have at once."""
    isolation: Literal["auto", "bubblewrap", "unshare", "none"] = "auto"
    """How model code is isolated (sandbox.py): auto takes bubblewrap, else unshare, and refuses to start
    without either; none runs it with limits only, which code written to escape gets around (unsafe)."""


def generate_tasks(seed: int, options: CodeOptions) -> dict[str, list[Task]]:
    def draw(rng: random.Random, i: int) -> tuple[str, str, dict]:
        question, value, program = QUESTIONS[i % len(QUESTIONS)](rng)
        return question, str(value), {"program": program}

    return unique_seeded_tasks(seed, options, draw, "code", [question for question, _, _ in EXAMPLES])


class CodeEpisode(Episode):
    def __init__(self, task: Task, messages, sandbox: Sandbox):
        super().__init__(task, messages, [tool_from_function(python, inject={"sandbox": sandbox})])
        self.sandbox = sandbox

    def close(self) -> None:
        self.sandbox.close()


class CodeVerifier:
    """Tool verification, batched: re-run each trajectory's last successful code in a fresh sandbox and check
    that it prints the expected value."""

    def __init__(self, limits: SandboxLimits, max_concurrency: int = 4):
        self.limits, self.max_concurrency = limits, max_concurrency

    def _verify(self, trajectory) -> float:
        codes = [r.call.arguments.get("code") for r in trajectory.results if r.call and not r.error]
        if not codes or not isinstance(codes[-1], str):
            return 0.0
        sandbox = Sandbox(self.limits)
        try:
            status, output = sandbox.run(codes[-1])
        finally:
            sandbox.close()
        printed = re.findall(r"-?\d+(?:\.\d+)?", output) if status == 0 else []
        return float(any(correct_value(p, trajectory.task.answer) for p in printed))

    async def score_batch(self, trajectories) -> list[float]:
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(traj) -> float:
            async with gate:
                return await asyncio.to_thread(self._verify, traj)

        return list(await asyncio.gather(*(one(t) for t in trajectories)))


def ran_code(trajectory, task: Task) -> float:
    """Shaping: 1 when some program ran without error, so that running code is explored; the correct answers
    come from such runs. (With a format reward instead, the default model learned within 10 steps to answer
    at once without running anything.)"""
    return float(any(r.call is not None and r.call.name == "python" and not r.error for r in trajectory.results))


def correct_value(printed: str, gold: str) -> bool:
    try:
        return abs(float(printed) - float(gold)) < 1e-6
    except ValueError:
        return False


@register_env("code")
class CodeEnv(Environment):
    name = "code"

    Options = CodeOptions

    def __init__(self, config, options: CodeOptions):
        super().__init__(config, options)
        o = options
        isolation = resolve_isolation(o.isolation)  # no sandbox, no code environment (unless asked for none)
        if isolation == "none":
            log.warning("env.options.isolation is none: model code runs unisolated, with limits only (unsafe)")
        if o.memory_bound == "cgroup":
            try:
                CgroupBound(o.memory_mb << 20, o.max_processes).close()
            except OSError as exc:
                raise ConfigError(f"env.options.memory_bound: no cgroup can be made here ({exc}); use auto (the "
                                  "host's watch where there is none) or watch") from None  # fmt: skip
        self.limits = SandboxLimits(
            timeout_s=o.timeout_s,
            memory_mb=o.memory_mb,
            max_output_chars=o.max_output_chars,
            max_file_mb=o.max_file_mb,
            max_processes=o.max_processes,
            isolation=isolation,
            disk_mb=o.disk_mb,
            memory_bound=o.memory_bound,
        )
        self.splits = TaskSplits(config, generate_tasks(config.seed, options))
        self.rubric = Rubric(
            [
                Criterion("correct", correct, 1.0),
                Criterion("ran_code", ran_code, 0.1),
                Criterion("verified", CodeVerifier(self.limits), 0.0),
                *common_criteria(format_weight=0.0),
            ],
            success="correct",
        )

    def tools(self):
        return [tool_from_function(python, inject={"sandbox": None})]

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """The task's program (one that computes the value), then the value as the answer; a task from a file
        without a `program` field gets one that prints the value, so that `env check` still plays it."""
        program = task.meta.get("program")
        if not isinstance(program, str):
            program = f"print({task.answer})"
        return answered(task.answer, ToolCall("python", {"code": program}))

    def messages(self, task: Task) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": SYSTEM}]
        for question, code, output in EXAMPLES:
            messages += tool_call_example(question, "python", {"code": code}, output, output, self.syntax)
        return [*messages, {"role": "user", "content": task.question}]

    def reset(self, task: Task) -> CodeEpisode:
        return CodeEpisode(task, self.messages(task), Sandbox(self.limits))
