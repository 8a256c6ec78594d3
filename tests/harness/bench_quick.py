"""Run a seeded benchmark's `--quick` sample (the tiny model) as a user would, and read what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run_quick(name: str, tmp_path: Path) -> tuple[dict, list[dict], str]:
    """`python bench/NAME.py --quick` writing under tmp_path: (its results, the training steps' metrics, its log)."""
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", "--out", str(out),
                           "--runs", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = next((tmp_path / "runs").rglob("metrics.jsonl")).read_text().splitlines()
    steps = [s for s in map(json.loads, metrics) if "step" in s and "eval" not in s]
    return json.loads(out.read_text()), steps, out.with_suffix(".log").read_text()
