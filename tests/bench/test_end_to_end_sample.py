"""A small sample of bench/rollout.py --end-to-end (training runs whose tools answer after a seeded latency):
the tiny model, one step ahead and lock-step, with the heavy-tailed latencies; the bench's environment is
registered from outside the package."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"


@pytest.fixture
def rollout_bench():
    sys.path.insert(0, str(BENCH))
    try:
        import rollout
    finally:
        sys.path.remove(str(BENCH))
    return rollout


@pytest.mark.parametrize("async_steps", [0, 1])
def test_a_training_run_with_heavy_tailed_tools_reports_its_wall_time_and_staleness(
    rollout_bench, tiny_model_dir, tmp_path, async_steps
):
    extra = (f"model.name={tiny_model_dir}", "train.prompts_per_step=2", "train.group_size=2",
             "rollout.max_new_tokens=8", "env.options.in_context=true")  # fmt: skip
    run = rollout_bench.train_run("heavy", async_steps, 2, str(tmp_path), extra)
    assert run["wall_s"] > 0 and run["generated_tokens"] > 0
    assert run["staleness_max"] == async_steps  # one step ahead: the second step sampled by the first's weights
    from toolrl.envs.base import ENVIRONMENTS

    assert "bench_slow_calculator" in ENVIRONMENTS
    latencies = rollout_bench.Latencies("heavy", 200)
    assert sorted(latencies.values)[100] == pytest.approx(0.5, rel=0.35)  # the median of the heavy tail
