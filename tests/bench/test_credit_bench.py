"""A small sample of bench/credit.py: the tiny model, one seed, two steps, both arms (outcome-only and dense turn
credit) on the calculator recipe; the results hold each arm's before and after and their difference."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_both_arms_train_and_the_difference_is_reported(tmp_path):
    out = tmp_path / "credit.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "credit.py"), "--quick", "--recipes", "demo",
                           "--out", str(out), "--runs", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    entry = json.loads(out.read_text())["demo"]
    for arm in ("outcome", "dense"):
        assert {"greedy_before", "greedy_after", "sampled_after", "seeds"} <= set(entry[arm])
    assert entry["greedy_after_delta"] == round(entry["dense"]["greedy_after"] - entry["outcome"]["greedy_after"], 4)
    assert entry["machine"]["cores"] > 0 and entry["seeds"] == [0] and "load_before" in entry["runs"][0]
    dense_runs = list((tmp_path / "runs" / "dense").rglob("metrics.jsonl"))
    steps = [json.loads(line) for line in dense_runs[0].read_text().splitlines()]
    assert any("credit/scored" in s for s in steps)  # the dense arm did credit turns
    assert "dense - outcome, greedy after" in done.stdout
