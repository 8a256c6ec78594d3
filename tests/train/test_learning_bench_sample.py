"""A small sample of bench/learning.py (the README's table of success before and after training, greedy and
sampled, over seeds): the tiny model, one seed, two steps; the results file has the shape the table reads."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
BENCH = ROOT / "bench" / "learning.py"


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
    assert seed["train_s"] > 0 and demo["peak_rss_mb"] > 0 and demo["machine"]["cores"] >= 1
    assert seed["test_tasks"] == 4  # --quick's 4 tasks, what the README's "test tasks" column shows
    log = (tmp_path / "learning.demo.log").read_text()
    assert "demo seed 0: before greedy" in log and "demo seed 0: step 2" in log and "demo seed 0: after" in log
    assert "greedy before" in done.stdout  # the table


def test_recipes_and_seeds_measured_by_separate_runs_are_merged_into_one_entry_each(tmp_path):
    """Recipes and seeds are measured by separate runs (side by side on the cores, or one after another): each
    run updates its recipe's entry, keeps the other recipes', and a seed of the same measurement adds a row."""
    out = tmp_path / "learning.json"
    out.write_text(json.dumps({"built": {"greedy_before": 0.1, "seeds": []}, "stale": 3}))
    for seed in ("0", "1"):
        command = [sys.executable, str(BENCH), "--quick", "--out", str(out), "--runs", str(tmp_path / "runs"),
                   "--recipes", "calculator-zero", "--seeds", seed]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == {"built", "calculator-zero"} and result["built"]["greedy_before"] == 0.1
    zero = result["calculator-zero"]
    assert zero["args"]["seeds"] == [0, 1] and len(zero["seeds"]) == 2
    assert all(row["sft"]["sft_kept"] > 0 for row in zero["seeds"])  # the recipe's warm start ran


def test_the_readmes_table_is_the_one_the_committed_results_make():
    """No figure of the README's results table is typed by hand: `bench/learning.py --readme` writes it."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        import learning
    finally:
        sys.path.remove(str(BENCH.parent))
    results = json.loads((ROOT / "bench" / "results" / "learning.json").read_text())
    assert {"demo", "built", "files"} <= set(results)
    table = learning.table(results)
    assert f"{learning.BEGIN}\n{table}\n{learning.END}" in (ROOT / "README.md").read_text()
    assert "| `calculator-zero.yaml` (`make demo`): warm start + " in table and len(results["demo"]["seeds"]) == 3


def test_seeds_of_an_edited_recipe_replace_the_entry_rather_than_merge(tmp_path):
    """A seed measured after the recipe file changed is another measurement: merged with the old recipe's seeds,
    the mean would mix two recipes."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        import learning
    finally:
        sys.path.remove(str(BENCH.parent))
    out = tmp_path / "learning.json"

    def entry(seed: int, after: float, recipe: str) -> dict:
        row = {"greedy_before": 0.1, "greedy_after": after, "sampled_before": 0.0, "sampled_after": after}
        args = {"seeds": [seed], "steps": None, "num_tasks": 48, "set": [], "quick": False, "recipe": recipe}
        return {**learning.summary([row]), "wall_s": 1.0, "peak_rss_mb": 1.0, "machine": {}, "args": args}

    learning.merged(str(out), "built", entry(0, 0.2, "aaa"))
    learning.merged(str(out), "built", entry(1, 0.4, "aaa"))
    assert json.loads(out.read_text())["built"]["greedy_after"] == 0.3  # the same recipe: merged
    learning.merged(str(out), "built", entry(1, 0.5, "bbb"))
    built = json.loads(out.read_text())["built"]
    assert built["args"]["seeds"] == [1] and built["greedy_after"] == 0.5  # the edited recipe's seed alone
    digests = {learning.recipe_digest(name) for name in ("built", "demo")}
    assert len(digests) == 2 and all(len(d) == 12 for d in digests)
