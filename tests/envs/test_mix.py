"""Several environments in one run (`env` as a list: envs/mix): each step's prompts drawn by the environments'
weights, each task played by its own environment (its prompt, tools, reference and rubric), metrics and eval per
environment, an exact resume; what cannot be mixed is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from toolrl.config import load_config
from toolrl.envs.base import Task, make_env
from toolrl.train.collect import TaskOrder

ROOT = Path(__file__).parents[2]


def mix_tasks(sizes: dict[str, int]) -> list[Task]:
    return [Task(f"{key}/{i}", "q", "a", {"env": key}) for key, n in sizes.items() for i in range(n)]


def test_prompts_are_drawn_by_weight_each_environment_through_its_own_shuffle():
    order = TaskOrder(mix_tasks({"big": 50, "small": 5}), run_seed=7, mix={"big": 1.0, "small": 3.0})
    drawn = [t.meta["env"] for t in order.next(4000)]
    share = Counter(drawn)["small"] / len(drawn)
    assert 0.72 < share < 0.78  # 3 of 4 by weight, although it holds a tenth of the tasks
    first = TaskOrder(mix_tasks({"big": 50, "small": 5}), run_seed=7, mix={"big": 1.0, "small": 3.0})
    small = [t.id for t in first.next(40) if t.meta["env"] == "small"]
    assert sorted(small[:5]) == [f"small/{i}" for i in range(5)]  # an epoch of its own: each task once, then again


def test_a_resumed_mix_order_draws_as_the_uninterrupted_one():
    tasks = mix_tasks({"a": 7, "b": 3})
    whole = TaskOrder(tasks, run_seed=3, mix={"a": 1.0, "b": 1.0})
    head = [t.id for t in whole.next(25)]
    first = TaskOrder(tasks, run_seed=3, mix={"a": 1.0, "b": 1.0})
    part = [t.id for t in first.next(11)]
    state = json.loads(json.dumps(first.state()))  # as a checkpoint writes and reads it
    resumed = TaskOrder(tasks, run_seed=3, mix={"a": 1.0, "b": 1.0})
    resumed.load(state)
    assert part + [t.id for t in resumed.next(14)] == head
    plain = TaskOrder(tasks, run_seed=3)
    assert "orders" not in plain.state()  # a run of one environment keeps the checkpoint it always had


def config(tmp_path, *more: str, environments=None):
    environments = environments or [{"name": "calculator", "weight": 3}, {"name": "files", "weight": 1}]
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"env": environments}))
    return load_config(path, overrides=list(more))


def test_each_task_is_played_by_its_own_environment(tmp_path):
    env = make_env(config(tmp_path).env)
    try:
        tasks = env.tasks("test")
        by_env = Counter(t.meta["env"] for t in tasks)
        assert set(by_env) == {"calculator", "files"} and all(t.id.startswith(t.meta["env"] + "/") for t in tasks)
        calc = next(t for t in tasks if t.meta["env"] == "calculator")
        files = next(t for t in tasks if t.meta["env"] == "files")
        assert env.offered(calc) == ["calculator"] and "calculator" not in (env.offered(files) or [])
        episode = env.reset(files)
        assert episode.task is files and "calculator" not in episode.offered  # never another member's tools
        assert env.messages(files)[0]["content"].startswith("You are an assistant that manages the user's files")
        assert env.reference(calc) is not None
    finally:
        env.close()


def test_env_check_plays_every_environment_of_a_mix(tmp_path):
    path = tmp_path / "mix.yaml"
    harbor = {"name": "harbor", "weight": 2, "options": {"tasks": ["count-lines"]}}
    path.write_text(json.dumps({"env": [{"name": "calculator"}, harbor]}))
    done = subprocess.run([sys.executable, "-m", "toolrl", "env", "check", str(path), "--json"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    reference, idle = json.loads(done.stdout)["policies"]
    assert reference["success"] == 1.0 and idle["success"] == 0.0
    command = [sys.executable, "-m", "toolrl", "eval", str(path), "--policy", "reference", "--num-tasks", "6", "--json"]
    evaluated = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    summary = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert summary["env/calculator/success"] == summary["env/harbor/success"] == 1.0  # the sample spans both


@pytest.mark.parametrize(
    ("environments", "message"),
    [
        ([{"name": "calculator"}, {"name": "calculator"}], "two environments are labelled 'calculator'"),
        ([{"name": "calculator"}, {"name": "search"}], "different syntaxes"),
        ([{"name": "calculator", "weight": 0}], "weight"),
        ([{"name": "calculator", "label": "a/b"}], "without '/'"),
        ([{"name": "nope"}], "nope"),
        (
            [{"name": "calculator"}, {"name": "calculator", "label": "b", "options": {"max_valu": 3}}],
            "env[1] (b): env.options of calculator: unknown key",
        ),
    ],
)
def test_what_cannot_be_mixed_is_one_line(tmp_path, environments, message):
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"env": environments}))
    done = subprocess.run([sys.executable, "-m", "toolrl", "env", "check", str(path)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode != 0 and message in done.stderr, done.stderr[-1500:]
    assert "Traceback" not in done.stderr


def train(tmp_path, tiny_model_dir, name: str, steps: int, *more: str) -> subprocess.CompletedProcess:
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"env": [{"name": "calculator", "weight": 1}, {"name": "calculator", "label": "big",
                                         "weight": 2, "options": {"max_value": 1000}}]}))  # fmt: skip
    command = [sys.executable, "-m", "toolrl", "train", str(path), "--set", f"model.name={tiny_model_dir}",
               "--set", "device=cpu", "--set", f"output_dir={tmp_path}", "--set", f"run_name={name}",
               "--set", f"train.steps={steps}", "--set", "train.prompts_per_step=2", "--set", "train.group_size=2",
               "--set", "rollout.max_new_tokens=8", "--set", "train.save_every=1", "--set", "eval.at_start=false",
               "--set", "eval.num_tasks=4", *more]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


def test_a_mix_trains_with_metrics_per_environment_and_resumes_exactly(tmp_path, tiny_model_dir):
    whole = train(tmp_path, tiny_model_dir, "whole", 3)
    assert whole.returncode == 0, whole.stderr[-2000:]
    half = train(tmp_path, tiny_model_dir, "half", 2, "--set", "eval.at_end=false")
    assert half.returncode == 0, half.stderr[-2000:]
    resumed = subprocess.run([sys.executable, "-m", "toolrl", "train", "--resume", str(tmp_path / "half"),
                              "--set", "train.steps=3", "--set", "eval.at_end=false"], capture_output=True, text=True,
                             timeout=900, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    def steps(name: str) -> list[dict]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [s for s in map(json.loads, lines) if "step" in s and "eval" not in s]

    a, b = steps("whole"), steps("half")
    assert [s["step"] for s in b] == [1, 2, 3]
    keys = ("reward", "generated_tokens", "env/calculator/share", "env/big/share", "env/big/reward")
    for x, y in zip(a, b, strict=True):
        assert all(x.get(k, 0) == pytest.approx(y.get(k, 0), rel=1e-4) for k in keys), (x["step"], x, y)
    shares = [s.get("env/big/share", 0) for s in a]  # a step that drew one environment only logs that one
    assert all(abs(s.get("env/big/share", 0) + s.get("env/calculator/share", 0) - 1) < 1e-9 for s in a)
    assert 0 < sum(shares) / 3 < 1
    evaluation = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
                  if '"eval"' in line][-1]  # fmt: skip
    assert "env/calculator/success" in evaluation and "env/big/success" in evaluation
