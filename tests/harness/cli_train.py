"""`toolrl train` as a user runs it from a terminal, in a subprocess: its step records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def train_steps(tmp_path: Path, tiny_model_dir: Path, *sets: str, steps: int = 2) -> list[dict]:
    """Train the tiny model for `steps` steps with the `--set` overrides `sets` (no evaluations); the steps' metrics."""
    command = [sys.executable, "-m", "toolrl", "train", f"--set=model.name={tiny_model_dir}", "--set=device=cpu",
               f"--set=train.steps={steps}", "--set=eval.at_start=false", "--set=eval.at_end=false",
               f"--set=output_dir={tmp_path / 'runs'}", "--set=run_name=run",
               *(f"--set={s}" for s in sets)]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()
    return [s for s in map(json.loads, lines) if "step" in s and "eval" not in s]
