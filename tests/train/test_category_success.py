"""Success by task category in every step's metrics (`success/<category>`, from the tasks' meta["category"]):
a step's mean success moves with the mix of tasks it drew (a built environment's single-hop tasks against its
multi-hop ones), so a run shows, per kind of task, whether it is learned. Also what torchrun's ranks reduce."""

import json

from toolrl.distributed import Dist, reduce_metrics
from toolrl.envs import Environment, Task, register_env
from toolrl.rewards import Criterion, Rubric


def solved_if_easy(trajectory, task) -> float:
    return float(task.meta["category"] == "easy")


@register_env("test-two-kinds")
class TwoKindsEnv(Environment):
    """Easy tasks every answer solves, hard ones none does, and one task without a category."""

    name = "test-two-kinds"

    def __init__(self, config, options):
        super().__init__(config, options)
        self.rubric = Rubric([Criterion("solved", solved_if_easy)], success="solved")

    def tools(self):
        return []

    def tasks(self, split):
        kinds = ["easy", "hard", "easy", "hard", "hard", "easy"]
        return [Task(f"t{i}", f"Say something, {i}.", "", {"category": kind}) for i, kind in enumerate(kinds)]

    def messages(self, task):
        return [{"role": "user", "content": task.question}]


def test_every_step_logs_success_per_category_and_evaluation_too(tmp_path, tiny_model_dir):
    from toolrl.config import load_config
    from toolrl.runs.rundir import RunDir
    from toolrl.train import Trainer, Workbench

    config = load_config(overrides=[
        "env.name=test-two-kinds", f"model.name={tiny_model_dir}", "device=cpu", "rollout.max_new_tokens=4",
        "train.steps=2", "train.prompts_per_step=3", "train.group_size=2", "eval.num_tasks=6",
        "eval.at_start=false", "eval.at_end=true", f"output_dir={tmp_path}", "run_name=k",
    ])  # fmt: skip
    bench = Workbench.load(config)
    try:
        Trainer(bench, RunDir.create(config)).train(lambda m: None)
    finally:
        bench.close()
    records = [json.loads(line) for line in (tmp_path / "k" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "eval" not in r and "step" in r]
    assert len(steps) == 2
    for r in steps:
        samples = [json.loads(line) for line in (tmp_path / "k" / "samples.jsonl").read_text().splitlines()]
        drawn = {s["task_id"] for s in samples if s["step"] == r["step"]}
        kinds = {("easy", "hard", "easy", "hard", "hard", "easy")[int(t[1:])] for t in drawn}
        assert {k.removeprefix("success/") for k in r if k.startswith("success/")} == kinds
        assert r.get("success/easy", 1.0) == 1.0 and r.get("success/hard", 0.0) == 0.0
        assert 0.0 < r["success"] < 1.0 or len(kinds) == 1  # the mean moves with the mix
    (evaluation,) = [r for r in records if "eval" in r]
    assert evaluation["success/easy"] == 1.0 and evaluation["success/hard"] == 0.0 and evaluation["success"] == 0.5


def test_ranks_average_a_category_over_the_ranks_that_drew_it(monkeypatch):
    every = [
        {"step": 3, "success": 1.0, "success/easy": 1.0, "loss": 0.5, "note": "rank 0"},
        {"step": 3, "success": 0.0, "success/hard": 0.0, "loss": 0.25, "note": "rank 1"},
        {"step": 3, "success": 0.5, "success/easy": 0.5, "success/hard": 0.5, "loss": 0.25, "note": "rank 2"},
    ]
    monkeypatch.setattr("toolrl.distributed.gather", lambda ctx, value: every)
    out = reduce_metrics(Dist(rank=0, world=3), every[0])
    assert out["success/easy"] == 0.75 and out["success/hard"] == 0.25  # not diluted by ranks without it
    assert out["success"] == 0.5 and out["loss"] == 1.0 and out["step"] == 3 and out["note"] == "rank 0"
    assert list(out)[: len(every[0])] == list(every[0])  # rank 0's order, then the keys it lacked


def test_plot_png_draws_each_category_with_one_never_solved(tmp_path, monkeypatch):
    """plot.png (`toolrl report`, the end of a run) has the UI's panel: a line per category, one at 0 too."""
    import matplotlib.axes

    from toolrl.runs.report import write_plot

    lines = [{"step": 1, "success": 0.75, "success/single_hop": 1.0, "success/multi_hop": 0.0},
             {"step": 2, "success": 0.0, "success/multi_hop": 0.0, "stop/answer": 1.0, "stop/length": 0.0}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    drawn = []
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes, "plot", lambda ax, *a, **k: drawn.append(k.get("label")) or plot(ax, *a, **k)
    )
    assert write_plot(tmp_path) == tmp_path / "plot.png" and (tmp_path / "plot.png").stat().st_size > 1000
    assert {"single_hop", "multi_hop"} <= set(drawn) and "answer" in drawn and "length" not in drawn


def test_a_data_set_of_many_or_hostile_categories_keeps_a_readable_metrics_line():
    """Categories are a data set's text: names are clipped, and past MAX_CATEGORIES the smallest are pooled as
    `success/(other categories)`, every trajectory still counted once."""
    from types import SimpleNamespace

    from toolrl.train.evaluate import MAX_CATEGORIES, category_success

    def traj(category, solved):
        return SimpleNamespace(task=Task("t", "q", "", {"category": category}), rewards={"ok": float(solved)})

    trajs = [traj(f"kind-{k}", k % 2) for k in range(100)] + [traj("big", 1) for _ in range(5)]
    trajs += [traj("x" * 5000 + "<script>", 0)]
    out = category_success(trajs, "ok")
    assert len(out) == MAX_CATEGORIES and out["success/big"] == 1.0
    assert all(len(key) <= len("success/") + 60 for key in out)
    pooled = out["success/(other categories)"]
    named = [k for k in out if k not in ("success/big", "success/(other categories)")]
    assert len(named) == MAX_CATEGORIES - 2 and 0.0 < pooled < 1.0
