"""`toolrl env check`'s verdict: a correct environment scores about 100% under its reference policy (success,
and Solve-F1 where tasks have sub-problems: every sub-problem solved by its call) and about 0 under the idle
policy (rollout/scripted.py plays both), except where the environment says otherwise: a benchmark whose own
reward passes some tasks with no action at all declares it (`Environment.max_idle_success`, and per task
`Environment.passes_without_action`), and the idle policy is judged on the other tasks.

A reference that succeeds is still wrong where it stumbled on the way (`flaws`): a format error (a call cut by a
token limit), a failed call, fewer calls than its reference planned. An environment whose success reads only the
final answer had passed such a reference at 100% (2 of 60 calls cut by rollout.max_new_tokens, unsaid).

When the reference falls short or stumbles because of the run's limits, the check names each limit that cut it and
the value that would have fit, from those tasks played again with room (`limits_cut`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PolicyScore:
    """One policy's means over the tasks it played."""

    policy: str
    tasks: int
    left_out: int
    """Tasks it could not play (no reference): counted, not scored."""
    success: float
    reward: float
    tool_calls: float
    format_errors: float
    solve_f1: float | None = None
    limits: dict[str, float] | None = None
    """Share of its trajectories stopped by each limit: max_turns, length (token limits)."""
    by_design: tuple[int, int] | None = None
    """Idle policy: (tasks the environment marks as passing without action, how many of them it passed)."""
    others: tuple[int, float] | None = None
    """Idle policy: (the other tasks, its success on them): what the idle bound judges."""
    stumbled: int = 0
    """Reference policy: trajectories with one flaw or more (FLAWS)."""
    flaw_counts: dict[str, int] | None = None
    """Reference policy: trajectories with each flaw."""
    observations_cut: tuple[int, int] | None = None
    """Reference policy: (tool results cut by rollout.max_observation_tokens, tool results): a result shown in part
    may have lost what the task needs, and a reference that answers from its own knowledge still succeeds."""


@dataclass(frozen=True)
class IdleExpectation:
    """What an environment expects of the idle policy: success on its unmarked tasks at most `bound`."""

    bound: float
    declared_by: str
    """Where the bound comes from: "the env's bound (max_idle_success)", "--max-idle", or "the default bound"."""


def problems(score: PolicyScore, min_reference: float = 0.95, idle: IdleExpectation | float = 0.05) -> list[str]:
    """What is wrong with an environment given one policy's score (empty: nothing)."""
    if score.policy == "reference":
        found = [("success", score.success), ("Solve-F1", score.solve_f1)]
        low = [f"reference policy {n} {v:.1%} (want >= {min_reference:.0%})" for n, v in found
               if v is not None and v < min_reference]  # fmt: skip
        if score.stumbled:
            kinds = ", ".join(f"{kind} in {n}" for kind, n in (score.flaw_counts or {}).items())
            low.append(f"reference policy stumbled in {score.stumbled} of {score.tasks} tasks ({kinds}; want none)")
        return low
    if score.policy != "idle":
        return []
    expect = idle if isinstance(idle, IdleExpectation) else IdleExpectation(idle, "the default bound")
    marked = bool(score.by_design and score.by_design[0])
    judged = score.others[1] if marked and score.others else score.success
    if judged <= expect.bound + 1e-9:
        return []
    where = f" on the {score.others[0]} tasks not marked to pass without action" if marked and score.others else ""
    return [f"idle policy success {judged:.1%}{where} (want <= {expect.bound:.0%}: {expect.declared_by})"]


def idle_line(score: PolicyScore, idle: IdleExpectation) -> str:
    """The idle policy judged against what the environment declares, in words: both numbers."""
    line = f"idle policy: {score.success:.1%} of {score.tasks} tasks"
    if score.by_design and score.by_design[0]:
        marked, passed = score.by_design
        others, success = score.others or (0, 0.0)
        line += (f"; {marked} pass without action by design (the env marks them; {passed} of them passed), "
                 f"the other {others}: {success:.1%}")  # fmt: skip
    return f"{line} (want <= {idle.bound:.0%}: {idle.declared_by})"


FLAWS = ("format errors", "failed calls", "fewer calls than planned", "observations cut")


def flaws(traj: Any, planned: int, observations_cut: int = 0) -> list[str]:
    """How a reference trajectory stumbled (FLAWS), though it may have succeeded: `planned` is the number of calls
    its reference makes, `observations_cut` how many of its tool results rollout.max_observation_tokens cut."""
    found = [(traj.num_format_errors > 0, "format errors"), (traj.num_tool_errors > 0, "failed calls"),
             (traj.num_tool_calls < planned, "fewer calls than planned"),
             (observations_cut > 0, "observations cut")]  # fmt: skip
    return [kind for flawed, kind in found if flawed]


def observations_line(score: PolicyScore, limit: int) -> str | None:
    """The check's line on the reference's tool results cut by the observation limit (None: none was)."""
    cut, results = score.observations_cut or (0, 0)
    if not cut:
        return None
    return (f"rollout.max_observation_tokens {limit} cut {cut} of the {results} tool results the reference was "
            "shown: what a task needs may be in the part cut off")  # fmt: skip


STOP_LIMITS = ("max_turns", "length")
"""The stop reasons of a trajectory cut by a limit (max_turns; length: a token limit), counted in PolicyScore.limits."""


ROOM = {
    "max_turns": 256,
    "max_new_tokens": 16_384,
    "max_calls_per_turn": 1_024,
    "max_observation_tokens": 131_072,
    "max_response_tokens": 1 << 20,
    "max_context_tokens": 1 << 20,
}
"""The rollout limits a failed reference task is played again with, to measure what it needs of each."""

LIMIT_WORDS = {
    "max_turns": "the most model turns one plays",
    "max_new_tokens": "its longest turn, in tokens",
    "max_calls_per_turn": "the most calls in one turn",
    "max_observation_tokens": "its longest tool result, in tokens",
    "max_response_tokens": "its longest response after the prompt, in tokens",
    "max_context_tokens": "its longest segment, prompt included, in tokens; or let rollout.context compact it: "
    "sliding_window, summarize, fold",
}


def rollout_limits(rollout: Any) -> dict[str, dict[str, Any]]:
    """Each rollout limit a check plays under: its value and where it came from (config, the environment's
    rollout_defaults, or default)."""
    return {key: {"value": getattr(rollout, key), "from": rollout.source(key)} for key in LIMIT_WORDS}


def limits_line(rollout: Any) -> str:
    """rollout_limits in a line: 'rollout limits: max_turns 6 (environment), max_new_tokens 48 (default), ...'
    (an unbounded limit left out)."""
    said = [f"{key} {limit['value']} ({limit['from']})" for key, limit in rollout_limits(rollout).items()
            if limit["value"] is not None]  # fmt: skip
    return "rollout limits: " + ", ".join(said)


def use_of(traj: Any, count_calls: Callable[[str], int], count_tokens: Callable[[str], int]) -> dict[str, int]:
    """What one trajectory used of each rollout limit: its turns, its longest model turn (tokens), the most calls
    in one turn, its longest tool result (tokens, before any clipping), its tokens after the prompt."""
    turns = [end - start for segment in traj.sequences() for kind, start, end in segment.spans if kind == "model"]
    return {
        "max_turns": traj.num_turns,
        "max_new_tokens": max(turns, default=0),
        "max_calls_per_turn": max((count_calls(text) for text in traj.texts), default=0),
        "max_observation_tokens": max((count_tokens(r.content) for r in traj.results), default=0),
        "max_response_tokens": traj.response_length,
        "max_context_tokens": max(len(segment.token_ids) for segment in traj.sequences()),
    }


def limits_cut(uses: Sequence[dict[str, int]], limits: dict[str, int | None], played: int) -> list[str]:
    """One line per rollout limit below what some reference trajectory needs (`uses`: the failed tasks played
    again with room), with the value that would fit: 'rollout.max_new_tokens 48 cut 3 of 10 reference
    trajectories: 262 would fit (its longest turn, in tokens)'."""
    lines = []
    for limit, words in LIMIT_WORDS.items():
        if limits[limit] is None:  # unbounded (rollout.max_context_tokens unset)
            continue
        over = [use[limit] for use in uses if use[limit] > limits[limit]]
        if over:
            need = max(over)
            lines.append(f"rollout.{limit} {limits[limit]} cut {len(over)} of {played} reference trajectories: "
                         f"{need} would fit ({words})")  # fmt: skip
    return lines
