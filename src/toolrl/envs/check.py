"""`toolrl env check`'s verdict: a correct environment scores about 100% under its reference policy (success,
and Solve-F1 where tasks have sub-problems: every sub-problem solved by its call) and about 0 under the idle
policy (rollout/scripted.py plays both)."""

from __future__ import annotations

from dataclasses import dataclass


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


def problems(score: PolicyScore, min_reference: float = 0.95, max_idle: float = 0.05) -> list[str]:
    """What is wrong with an environment given one policy's score (empty: nothing)."""
    if score.policy == "reference":
        found = [("success", score.success), ("Solve-F1", score.solve_f1)]
        return [f"reference policy {n} {v:.1%} (want >= {min_reference:.0%})" for n, v in found
                if v is not None and v < min_reference]  # fmt: skip
    if score.policy == "idle" and score.success > max_idle:
        return [f"idle policy success {score.success:.1%} (want <= {max_idle:.0%})"]
    return []


LIMIT_HINTS = {
    "max_turns": "reached rollout.max_turns",
    "length": "were cut by a token limit (rollout.max_new_tokens, max_response_tokens)",
}


def limit_hint(score: PolicyScore) -> str:
    """Why a reference may fall short that is the run's limits, not the environment: '' when none."""
    said = [f"{share:.0%} of its trajectories {LIMIT_HINTS[k]}" for k, share in (score.limits or {}).items() if share]
    return f"; the reference policy is held to the run's limits: {', '.join(said)}" if said else ""
