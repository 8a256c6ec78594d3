"""A small sample of bench/async.py: the tiny model on the heavy-tailed calculator (registered from outside the
package), lock-step and ahead runs of two steps, the bound's run with tools that answer at once, and each correction;
the result keys the issue names."""

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"


def load_bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("async_bench", BENCH / "async.py")  # `async` is a keyword
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_the_async_bench_compares_steps_per_hour_and_reports_staleness_and_corrections(tiny_model_dir, tmp_path):
    bench = load_bench()
    out = tmp_path / "async.json"
    argv = ["async.py", "--steps", "2", "--repeats", "1", "--correction-steps", "1", "--bound", "--out", str(out),
            "--set", f"model.name={tiny_model_dir}", "--set", "rollout.max_new_tokens=6",
            "--set", "train.group_size=2"]  # fmt: skip
    saved, sys.argv = sys.argv, argv
    try:
        bench.main()
    finally:
        sys.argv = saved
    result = json.loads(out.read_text())
    speed = result["speed"]["tail20"]
    assert [len(speed["runs"][m]) for m in ("lockstep", "ahead")] == [2, 2]
    assert result["speedup_vs_lockstep"]["tail20"] > 0 and speed["steps_per_hour"]["ahead"] > 0
    assert all(r["max_staleness"] == 0 for r in speed["runs"]["lockstep"]) and 0 <= result["max_staleness"] <= 3
    assert speed["latency_bound"] > 0 and all(r["cpu_s"] > 0 for r in result["zero_latency_lockstep"]["runs"])
    from toolrl.algos.registries import CORRECTIONS

    assert set(result["corrections"]) == set(CORRECTIONS)
