"""A small sample of bench/learning.py (the README's table of success before and after training, greedy and
sampled, over seeds): the tiny model, one seed, two steps; the results file has the shape the table reads."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "learning.py"


def test_the_learning_bench_writes_before_and_after_per_recipe_and_seed(tmp_path):
    out = tmp_path / "learning.json"
    command = [sys.executable, str(BENCH), "--quick", "--out", str(out), "--runs", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    demo = result["demo"]
    for key in ("greedy_before", "greedy_after", "sampled_before", "sampled_after"):
        assert 0.0 <= demo[key] <= 1.0 and demo["spread"][key] == 0.0  # one seed: no spread
    (seed,) = demo["seeds"]
    assert seed["train_s"] > 0 and result["peak_rss_mb"] > 0 and result["machine"]["cores"] >= 1
    log = out.with_suffix(".log").read_text()
    assert "demo seed 0: before greedy" in log and "demo seed 0: step 2" in log and "demo seed 0: after" in log
    assert "greedy before" in done.stdout  # the table
