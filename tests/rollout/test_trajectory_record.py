"""A trajectory's written record (samples.jsonl, `toolrl eval --out`) holds what a viewer needs without a
re-run: each model turn token by token with its sampling log-probs, and every tool call with its arguments,
result (cut to a bound), outcome and latency."""

from toolrl.envs import Task
from toolrl.rollout.trajectory import RECORD_RESULT_CHARS, Trajectory
from toolrl.tools.call import ToolCall, ToolResult


def test_the_record_holds_tokens_log_probs_and_tool_calls(tokenizer):
    prompt = tokenizer("What is 2 + 3?")["input_ids"]
    turn = tokenizer("<tool_call>add</tool_call>", add_special_tokens=False)["input_ids"]
    traj = Trajectory.start(Task(id="t1", question="What is 2 + 3?", answer="5"), prompt)
    traj.add_model_turn(turn, [-0.25] * len(turn), "<tool_call>add</tool_call>")
    traj.add_observation(tokenizer("5", add_special_tokens=False)["input_ids"])
    traj.results = [
        ToolResult(ToolCall("add", {"a": 2, "b": 3}), "5", "ok", 0.123456),
        ToolResult(ToolCall("read", {"path": "big"}), "x" * 10_000, "tool_error", 2.0),
    ]
    record = traj.to_record(tokenizer)
    model, observation = record["segments"]
    assert model["kind"] == "model" and model["loss"] and model["ids"] == turn
    assert len(model["tokens"]) == len(turn) and model["logprobs"] == [-0.25] * len(turn)
    assert observation["kind"] == "observation" and not observation["loss"] and "ids" not in observation
    first, second = record["calls"]
    assert first == {
        "name": "add", "arguments": {"a": 2, "b": 3}, "outcome": "ok", "latency_s": 0.1235, "result": "5", "images": 0
    }  # fmt: skip
    assert second["outcome"] == "tool_error" and len(second["result"]) <= RECORD_RESULT_CHARS
    assert second["result"].endswith("[cut]")
