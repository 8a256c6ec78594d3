"""A small sample of bench/turn_credit.py: the tiny model, a calculator step of 2 tasks x 2; each way of scoring
the boundaries gives the same scores, and the step's shared cache feeds the model fewest tokens."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_shared_read_scores_as_reading_whole_and_reads_fewest_tokens(tmp_path):
    out = tmp_path / "turn_credit.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "turn_credit.py"), "--quick", "--recipe", "calculator",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    ways = result["ways"]
    assert result["trajectories"] == 4 and set(ways) == {"whole", "per_trajectory", "shared"}
    assert ways["shared"]["tokens_read"] < ways["per_trajectory"]["tokens_read"] < ways["whole"]["tokens_read"]
    # the group's prompt is read once: the per-trajectory reads read it once more for every other sample
    assert ways["per_trajectory"]["tokens_read"] - ways["shared"]["tokens_read"] >= 2 * (result["prompt_tokens"] - 1)
    assert ways["shared"]["max_score_gap"] < 1e-3 and ways["per_trajectory"]["max_score_gap"] < 1e-3
    assert ways["shared"]["vs_shared"] == 1.0 and result["machine"]["cores"] > 0
    assert "x shared" in done.stdout
