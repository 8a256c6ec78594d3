"""`toolrl eval` as a harness: success per category and per request of multi-turn tasks, Solve-P/R/F1 where tasks
carry sub-problems, every trajectory written out; and a served model scored on the same tasks through an
OpenAI-compatible endpoint."""

import json
import re

import pytest
from typer.testing import CliRunner

from tests.fixtures.http_server import LocalHTTPServer
from tests.rollout.test_openai_engine import token_reply
from toolrl.cli import app


def run(*args):
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 0, result.output
    return result.output


def arithmetic(tokenizer, solves=lambda expression: True):
    """A stand-in for a served model that knows arithmetic: it reads the prompt ids it is sent, calls the calculator
    on the question, then answers with the tool's result; where `solves(expression)` says no, it answers a wrong
    number at once."""

    def complete(body):
        text = tokenizer.decode(body["prompt"])
        last = text.rsplit("<|im_start|>", 2)[-2]
        if last.startswith("user"):
            expression = re.search(r"What is (.*)\?", last).group(1)
            call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
            reply = f"<tool_call>\n{call}\n</tool_call>" if solves(expression) else "<answer>-12345</answer>"
        else:
            reply = f"<answer>{last.split(chr(10))[1]}</answer>"
        ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        return token_reply(ids, [-0.1] * len(ids))

    return complete


def test_multi_turn_breakdowns_and_the_trajectories_are_written(tiny_model_dir, tmp_path):
    output = run(
        "--model", str(tiny_model_dir), "--num-tasks", "4", "--out", str(tmp_path),
        "--set", "env.name=files", "--set", "device=cpu", "--set", "rollout.max_new_tokens=6",
    )  # fmt: skip
    assert "success by request" in output and "success by kind of request" in output and "success by category" in output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == 4 and set(summary["by_request"]) >= {"1", "2"}
    assert summary["by_request"]["1"]["tasks"] == 4 and 0.0 <= summary["success"] <= 1.0
    assert sum(row["tasks"] for row in summary["by_category"].values()) == 4
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all({"segments", "rewards", "infos", "turn_rewards"} <= set(r) for r in records)


def test_a_served_model_is_scored_on_the_same_tasks_with_solve_scores(tokenizer, tmp_path):
    """The server is a stand-in for a served model that knows arithmetic: it reads the prompt ids it is sent,
    calls the calculator on the question, then answers with the tool's result."""

    with LocalHTTPServer(complete=arithmetic(tokenizer)) as server:
        output = run(
            "--num-tasks", "5", "--out", str(tmp_path),
            "--set", "rollout.engine=openai", "--set", f"rollout.openai.base_url={server.url}/v1",
            "--set", "device=cpu",
        )  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["success"] == 1.0 and summary["tool_calls"] == 1.0
    assert summary["solve"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert "Solve-P 1.000  Solve-R 1.000  Solve-F1 1.000" in output


def scored(task_id: str, successes: list[int]):
    from toolrl.envs import Task
    from toolrl.rollout.trajectory import Trajectory

    trajs = []
    for s in successes:
        traj = Trajectory.start(Task(task_id, "q", "a"), [1])
        traj.rewards = {"correct": float(s)}
        trajs.append(traj)
    return trajs


def test_pass_at_k_and_pass_hat_k_by_hand():
    """Four trials of three tasks, with 2, 4 and 0 successes. pass@k = mean of 1 - C(n-c, k)/C(n, k); pass^k (all k
    succeed, tau-bench) = mean of C(c, k)/C(n, k)."""
    from toolrl.train.evaluate import pass_at_k, pass_ks, summarize

    trajs = scored("a", [1, 0, 1, 0]) + scored("b", [1, 1, 1, 1]) + scored("c", [0, 0, 0, 0])
    got = pass_at_k(trajs, "correct")
    expected = {"pass@1": 0.5, "pass^1": 0.5, "pass@2": (5 / 6 + 1) / 3, "pass^2": (1 / 6 + 1) / 3,
                "pass@3": (1 + 1) / 3, "pass^3": 1 / 3, "pass@4": 2 / 3, "pass^4": 1 / 3}  # fmt: skip
    assert got == pytest.approx(expected)
    assert summarize(trajs, "correct")["pass^2"] == pytest.approx(7 / 18)  # in every evaluation's summary
    assert pass_at_k(scored("a", [1]) + scored("b", [0]), "correct") == {}  # one trial: success says it all
    uneven = pass_at_k(scored("a", [1, 1, 0]) + scored("b", [1, 0]), "correct")  # k up to the fewest trials
    assert set(uneven) == {"pass@1", "pass^1", "pass@2", "pass^2"} and uneven["pass^2"] == pytest.approx((1 / 3) / 2)
    assert pass_ks(20) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 20] and pass_ks(3) == [1, 2, 3]


def test_eval_trials_report_pass_at_k_and_pass_hat_k_in_the_table_and_the_json(tokenizer, tmp_path):
    """A served stand-in that solves each task on its 1st and 3rd try (its own count per question) and answers
    without the tool on the 2nd: 3 trials of each task give 2 of 3 successes, so pass@2 = 1, pass^2 = 1/3, pass^3 = 0,
    whatever order the trials run in."""
    tries: dict[str, int] = {}

    def every_other_try(expression: str) -> bool:
        tries[expression] = tries.get(expression, 0) + 1
        return tries[expression] % 2 == 1

    with LocalHTTPServer(complete=arithmetic(tokenizer, every_other_try)) as server:
        output = run(
            "--num-tasks", "4", "--trials", "3", "--out", str(tmp_path),
            "--set", "rollout.engine=openai", "--set", f"rollout.openai.base_url={server.url}/v1",
            "--set", "device=cpu",
        )  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == 4 and summary["trials"] == 3 and summary["trajectories"] == 12
    assert summary["success"] == pytest.approx(2 / 3) and summary["pass@1"] == pytest.approx(2 / 3)
    assert summary["pass@2"] == 1.0 and summary["pass^2"] == pytest.approx(1 / 3) and summary["pass^3"] == 0.0
    assert "4 tasks x 3 trials" in output and "pass^3 (all of 3 succeed)" in output, output
    assert re.search(r"pass\^2 \(all of 2 succeed\)\s*│\s*33\.3%", output), output


def test_a_scripted_policy_has_no_temperature():
    result = CliRunner().invoke(app, ["eval", "--policy", "reference", "--num-tasks", "2", "--json",
                                      "--set", "device=cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["temperature"] is None and summary["success"] == 1.0
