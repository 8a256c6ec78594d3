"""The pass-rate curriculum (`train.curriculum.mode: pass_rate`): tasks are drawn by their recent pass rate, so
that groups that all succeed or all fail (no GRPO signal) come rarely; the per-task pass rates are in the run
files (RUN/pass_rates.json), the step metrics (curriculum/*) and the UI."""

import json
import random
from collections import Counter

from toolrl.config.schema import CurriculumConfig
from toolrl.envs.base import Task
from toolrl.train.collect import TaskOrder

TASKS = [Task(name, name, "", {}) for name in ("solved", "hopeless", "learnable", "new")]


def curriculum_order(seed=0, **kwargs):
    return TaskOrder(list(TASKS), seed, curriculum=CurriculumConfig(mode="pass_rate", **kwargs))


def play(order, steps, rng):
    """Steps of 2 draws, each task succeeding at its own rate: always, never, half the time."""
    rate = {"solved": 1.0, "hopeless": 0.0, "learnable": 0.5, "new": 0.5}
    drawn = []
    for _ in range(steps):
        tasks = order.next(2)
        drawn += [t.id for t in tasks]
        order.record([(t.id, int(rng.random() < rate[t.id])) for t in tasks for _ in range(4)])
    return drawn


def test_tasks_with_signal_are_drawn_and_solved_or_hopeless_ones_come_back_rarely():
    order = curriculum_order(window=8, floor=0.05)
    assert order.weight(TASKS[0]) == 1.0  # never tried: drawn first
    drawn = Counter(play(order, 400, random.Random(1)))
    assert drawn["learnable"] + drawn["new"] > 0.85 * 800
    assert 0 < drawn["solved"] < 0.08 * 800 and 0 < drawn["hopeless"] < 0.08 * 800  # the floor brings them back
    rates = order.pass_rates()
    assert rates["solved"] == {"pass_rate": 1.0, "attempts": 8, "weight": 0.05}
    assert rates["hopeless"]["pass_rate"] == 0.0 and all(r["attempts"] <= 8 for r in rates.values())


def test_the_shuffle_is_unchanged_and_keeps_no_history():
    plain = TaskOrder(list(TASKS), 0)
    again = TaskOrder(list(TASKS), 0, curriculum=CurriculumConfig())
    assert [t.id for t in plain.next(12)] == [t.id for t in again.next(12)]
    again.record([("solved", 1)])
    assert again.history == {} and again.pass_rates() == {}


def test_a_resumed_order_draws_as_the_uninterrupted_one():
    rng_a, rng_b = random.Random(5), random.Random(5)
    whole = curriculum_order(seed=3)
    first = curriculum_order(seed=3)
    head = play(whole, 10, rng_a) + play(whole, 10, rng_a)
    part = play(first, 10, rng_b)
    state = json.loads(json.dumps(first.state()))  # as a checkpoint writes and reads it
    resumed = curriculum_order(seed=3)
    resumed.load(state)
    assert part + play(resumed, 10, rng_b) == head


def test_a_run_writes_pass_rates_and_curriculum_metrics(tmp_path, tiny_model_dir):
    from toolrl.config import load_config
    from toolrl.runs.rundir import RunDir
    from toolrl.train import Trainer, Workbench

    config = load_config(overrides=[
        "env.name=calculator", f"model.name={tiny_model_dir}", "device=cpu", "rollout.max_new_tokens=8",
        "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.curriculum.mode=pass_rate",
        "eval.at_start=false", "eval.at_end=false", f"output_dir={tmp_path}", "run_name=c",
    ])  # fmt: skip
    bench = Workbench.load(config)
    try:
        metrics = []
        Trainer(bench, RunDir.create(config)).train(metrics.append)
    finally:
        bench.close()
    rates = json.loads((tmp_path / "c" / "pass_rates.json").read_text())
    assert rates["step"] == 2 and 2 <= len(rates["tasks"]) <= 4
    assert all(r["attempts"] in (2, 4) and r["pass_rate"] == 0.0 for r in rates["tasks"].values())  # tiny model
    assert metrics[-1]["curriculum/unsolved"] == 1.0 and metrics[-1]["curriculum_tasks_tried"] == len(rates["tasks"])


def test_the_ui_shows_pass_rates_and_ignores_a_hostile_file(tmp_path):
    from tests.ui.test_api import make_run, ui_client

    root = tmp_path / "runs"
    run = make_run(root, "good", status={"state": "finished", "step": 3, "steps": 3})
    (run / "pass_rates.json").write_text(json.dumps({"step": 3, "tasks": {
        "t1": {"pass_rate": 0.5, "attempts": 4, "weight": 1.0, "extra": "x" * 10},
        "t2": {"pass_rate": "<script>", "attempts": 4, "weight": 1.0},
    }}))  # fmt: skip
    bad = make_run(root, "bad", status={"state": "finished", "step": 3, "steps": 3})
    (bad / "pass_rates.json").write_text("[1, 2")
    with ui_client(root) as client:
        good = client.get("/api/run", params={"run": "good"}).json()["pass_rates"]
        assert good == {"step": 3, "tasks": {"t1": {"pass_rate": 0.5, "attempts": 4, "weight": 1.0}}}
        assert client.get("/api/run", params={"run": "bad"}).json()["pass_rates"] == {}


def test_a_resumed_run_keeps_the_pass_rate_windows(tmp_path, tiny_model_dir):
    """The checkpoint's task order comes back whole on resume: the pass-rate windows too (resume had kept only the
    shuffle and the generator, so a resumed curriculum started from no history)."""
    from toolrl.config import load_config
    from toolrl.runs.rundir import RunDir
    from toolrl.train import Trainer, Workbench

    config = load_config(overrides=[
        "env.name=calculator", f"model.name={tiny_model_dir}", "device=cpu", "rollout.max_new_tokens=8",
        "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.curriculum.mode=pass_rate",
        "train.save_every=1", "eval.at_start=false", "eval.at_end=false", f"output_dir={tmp_path}", "run_name=c",
    ])  # fmt: skip
    bench = Workbench.load(config)
    try:
        Trainer(bench, RunDir.create(config)).train(lambda metrics: None)
        saved = json.loads((tmp_path / "c" / "last" / "trainer_state.json").read_text())
        assert saved["history"]  # two steps' outcomes
        again = Trainer(bench, RunDir.existing(tmp_path / "c"))
        assert again.resume() == 2
        assert again.collector.order.history == saved["history"]
    finally:
        bench.close()
