"""`toolrl eval` as a harness: success per category and per request of multi-turn tasks, Solve-P/R/F1 where tasks
carry sub-problems, every trajectory written out; and a served model scored on the same tasks through an
OpenAI-compatible endpoint."""

import json
import re

from typer.testing import CliRunner

from tests.fixtures.http_server import LocalHTTPServer
from tests.rollout.test_openai_engine import token_reply
from toolrl.cli import app


def run(*args):
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 0, result.output
    return result.output


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

    def complete(body):
        text = tokenizer.decode(body["prompt"])
        last = text.rsplit("<|im_start|>", 2)[-2]
        if last.startswith("user"):
            expression = re.search(r"What is (.*)\?", last).group(1)
            call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
            reply = f"<tool_call>\n{call}\n</tool_call>"
        else:
            reply = f"<answer>{last.split(chr(10))[1]}</answer>"
        ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        return token_reply(ids, [-0.1] * len(ids))

    with LocalHTTPServer(complete=complete) as server:
        output = run(
            "--num-tasks", "5", "--out", str(tmp_path),
            "--set", "rollout.engine=openai", "--set", f"rollout.openai.base_url={server.url}/v1",
            "--set", "device=cpu",
        )  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["success"] == 1.0 and summary["tool_calls"] == 1.0
    assert summary["solve"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert "Solve-P 1.000  Solve-R 1.000  Solve-F1 1.000" in output
