"""A run's summary from its metrics.jsonl: a table of where the metrics started and ended, and a PNG plot of
reward, success, tool calls per trajectory and KL over steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolrl.train.rundir import RunDir

PLOT = "plot.png"
PANELS = [
    ("reward", "reward"),
    ("success", "success"),
    ("tool_calls", "tool calls / trajectory"),
    ("kl", "KL to the reference"),
]
SUMMARY_KEYS = ["reward", "success", "tool_calls", "turns", "response_tokens", "loss", "grad_norm", "kl", "step_s"]


def split_records(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training steps and evaluations."""
    steps = [r for r in records if "eval" not in r and "step" in r]
    evals = [r for r in records if "eval" in r]
    return steps, evals


def summary_rows(records: list[dict[str, Any]]) -> list[tuple[str, float, float, float]]:
    """(metric, first step, last step, mean over steps) for the metrics that were logged."""
    steps, _ = split_records(records)
    rows = []
    for key in SUMMARY_KEYS:
        values = [r[key] for r in steps if key in r]
        if values:
            rows.append((key, values[0], values[-1], sum(values) / len(values)))
    return rows


def write_plot(run_path: Path) -> Path | None:
    """(Re)write run/plot.png; None when the run has no training steps yet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, evals = split_records(RunDir(run_path).read_metrics())
    if not steps:
        return None
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        points = [(r["step"], r[key]) for r in steps if key in r]
        if points:
            ax.plot(*zip(*points, strict=True), label="train", linewidth=1.2)
        ev = [(r["step"], r[key]) for r in evals if key in r and key != "kl"]
        if ev:
            ax.plot(*zip(*ev, strict=True), "o-", label="eval (test split)", markersize=4)
        if not points and not ev:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if points and ev:
            ax.legend(fontsize=7)
    fig.suptitle(run_path.name, fontsize=9)
    fig.tight_layout()
    target = run_path / PLOT
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
