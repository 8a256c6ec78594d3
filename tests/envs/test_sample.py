"""Which N tasks a run takes (sft.num_tasks, eval.num_tasks, --num-tasks): a seeded sample spread over the tasks'
categories, logged, the same in every process (issue 73: the first N of a split written category by category had
warm-started a user's run on one category only)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from toolrl.cli import app
from toolrl.envs import Task
from toolrl.envs.sample import spread_sample

ROOT = Path(__file__).resolve().parents[2]
GROUPED = ["--set", "env.module=tests.fixtures.grouped_env", "--set", "env.name=grouped"]


def grouped(sizes: dict[str, int]) -> list[Task]:
    return [Task(f"{k}{i}", "q", "a", {"category": k}) for k, n in sizes.items() for i in range(n)]


def test_a_sample_is_spread_over_categories_in_proportion_seeded_and_in_the_splits_order():
    tasks = grouped({"a": 50, "b": 30, "c": 20})
    taken = spread_sample(tasks, 10, seed=7)
    assert taken.counts == {"a": 5, "b": 3, "c": 2}
    assert [t.id for t in taken.tasks] == [t.id for t in tasks if t in taken.tasks]  # the split's order
    assert [t.id for t in spread_sample(tasks, 10, seed=7).tasks] == [t.id for t in taken.tasks]
    assert [t.id for t in spread_sample(tasks, 10, seed=8).tasks] != [t.id for t in taken.tasks]
    assert taken.line("eval") == "eval: 10 of 100 tasks, a sample with seed 7 over 3 categories (a 5, b 3, c 2)"


def test_every_category_is_taken_while_n_allows_and_all_tasks_when_n_covers_them():
    small = spread_sample(grouped({"a": 97, "b": 2, "c": 1}), 3, seed=0)
    assert small.counts == {"a": 1, "b": 1, "c": 1}  # c's share (0.03) rounds to nothing: one of each
    assert spread_sample(grouped({"a": 4, "b": 4, "c": 4, "d": 4}), 2, seed=0).counts.keys() < {"a", "b", "c", "d"}
    whole = spread_sample(grouped({"a": 3}), 5, seed=0)
    assert len(whole.tasks) == 3 and whole.line("eval") == "eval: all 3 tasks"
    plain = spread_sample([Task(str(i), "q", "a") for i in range(20)], 5, seed=0)
    assert len(plain.tasks) == 5 and not plain.counts and plain.line("sft").endswith("a sample with seed 0")
    assert [t.id for t in plain.tasks] != ["0", "1", "2", "3", "4"]


def test_eval_and_the_warm_start_of_a_users_environment_cover_its_categories(tmp_path):
    """A plug-in environment (outside src/) whose splits are written category by category: `toolrl eval
    --num-tasks 6` plays two of each category and says so; the warm start's sft.num_tasks does the same."""
    result = CliRunner().invoke(app, ["eval", "--policy", "reference", "--num-tasks", "6", "--out", str(tmp_path),
                                      *GROUPED])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {k: v["tasks"] for k, v in summary["by_category"].items()} == {"alpha": 2, "beta": 2, "gamma": 2}
    assert "eval (test split): 6 of 30 tasks, a sample with seed 1234 over 3 categories" in result.output


def test_the_warm_start_of_a_users_environment_covers_its_categories_and_says_what_it_took(tmp_path, tiny_model_dir):
    sft = [sys.executable, "-m", "toolrl", "sft", *GROUPED, "--set", f"model.name={tiny_model_dir}", "--set",
           "device=cpu", "--set", "sft.num_tasks=6", "--set", "sft.epochs=1", "--set", "eval.at_start=false",
           "--set", "eval.at_end=false", "--set", f"output_dir={tmp_path}", "--set", "run_name=warm"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(sft, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    taken = "warm start (train split): 6 of 30 tasks, a sample with seed 1234 over 3 categories (alpha 2, beta 2, "
    taken += "gamma 2)"
    assert taken in done.stdout
    assert "sft round 1: reference played 6, kept 6 (alpha 2, beta 2, gamma 2)" in done.stdout
    assert taken in (tmp_path / "warm" / "progress.log").read_text()  # in the run's log file too
