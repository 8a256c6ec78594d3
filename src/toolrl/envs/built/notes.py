"""The notes that open each turn of a built task under `env.options.countdown`: what the question still needs,
written by the reference (what a warm start imitates), the in-context exchanges and, asked by the instructions,
the model. Each style is a function of the task's plan and the round about to be played.

A plan is the question's parts, each a chain of (fact, round) from the entity outwards: "the population of the
headquarters of the employer of the person X" is one chain [(employer, 0), (headquarters, 1), (population, 2)].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.build.artifacts import levels

Plan = list[list[tuple[str, int]]]


def fact(kind: str) -> str:
    """The fact a sub-problem looks up, as its question names it: `city.population` -> `population`."""
    return kind.rpartition(".")[2]


def plan_of(subproblems: Sequence[Any]) -> Plan:
    """The chains of a task's sub-problems (each with id, kind, depends_on): one per sub-problem nothing depends
    on, followed back through its first dependency; a sub-problem's round is one past its dependencies'."""
    by_id, level = {s.id: s for s in subproblems}, levels(subproblems)
    needed = {d for s in subproblems for d in s.depends_on}
    plan = []
    for last in (s for s in subproblems if s.id not in needed):
        chain, sub = [], last
        while sub is not None:
            chain.append((fact(sub.kind), level[sub.id]))
            sub = by_id.get(sub.depends_on[0]) if sub.depends_on else None
        plan.append(chain[::-1])
    return plan


def chain_plan(facts: Sequence[str]) -> Plan:
    """One chain, a fact a round (the in-context exchanges)."""
    return [[(f, k) for k, f in enumerate(facts)]]


def rounds_of(plan: Plan) -> int:
    """The rounds of calls the plan takes."""
    return 1 + max((r for chain in plan for _, r in chain), default=-1)


def steps_left(plan: Plan, round_: int) -> str:
    """`Steps left: N`: the rounds of calls still needed, this one included (0: the answer)."""
    return f"Steps left: {rounds_of(plan) - round_}\n"


def facts_left(plan: Plan, round_: int) -> str:
    """`Left: population of the headquarters of the employer`: the facts still to look up, each part in the
    question's own words (outermost first, so the next call's fact is last), parts separated by semicolons;
    `Left: nothing` when the answer is due."""
    parts = [" of the ".join(f for f, r in reversed(chain) if r >= round_) for chain in plan]
    return f"Left: {'; '.join(p for p in parts if p) or 'nothing'}\n"


@dataclass(frozen=True)
class NoteStyle:
    note: Callable[[Plan, int], str]
    instruction: str


NOTE_STYLES: dict[str, NoteStyle] = {
    "steps": NoteStyle(
        steps_left,
        " Begin every reply with `Steps left: N`, N the rounds of tool calls the question still needs, this one "
        "included (0 when you answer).",
    ),
    "facts": NoteStyle(
        facts_left,
        " Begin every reply with `Left:` and the facts the question still needs looked up, in its own words"
        " (for the colour of the favourite fruit of a person: `Left: colour of the favourite fruit`); the last"
        " one is what you call a tool for now. After each result drop what it found, and write `Left: nothing`"
        " when you answer.",
    ),
}
"""`env.options.countdown`'s styles (`true` is `steps`)."""


def notes(style: str, plan: Plan) -> tuple[str, ...]:
    """The notes of every turn: each round of calls, then the answer."""
    return tuple(NOTE_STYLES[style].note(plan, k) for k in range(rounds_of(plan) + 1))


def note_tokens(style: str, plan: Plan) -> int:
    """What a turn's note may add to its token budget: the longest note at 3 characters a token (SmolLM2's
    tokenizer makes `Steps left: 3` and its newline 6 tokens, `Left: population of the headquarters of the
    employer` 10), at least 8."""
    return max(8, max(math.ceil(len(n) / 3) for n in notes(style, plan)))
