"""Benchmark: `toolrl ui` on a run directory at the size bound (train.samples_max_mb, 200 MB of trajectory
records): how long the first look at a step takes (indexing the whole file), a look after the run wrote one
more step (the index reads only the new bytes), one trajectory's record, the runs list, and a long run's
metrics from a line on, against re-reading the file for each request as a viewer without an index would.

Records are real ones: a calculator trajectory of the default tokenizer (a tool call, its result, an answer;
~300 generated tokens with their log-probs, advantages and trainer log-probs) written by Trajectory.to_record.
The requests go through the app in process (Starlette's test client: the HTTP stack without a socket).
Prints a table and writes bench/results/ui.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from common import machine, timed, write_results


def a_record(tokenizer) -> dict:
    from toolrl.envs import Task
    from toolrl.rollout.trajectory import Trajectory, UpdateValues
    from toolrl.tools.call import ToolCall, ToolResult

    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = encode("You are a helpful assistant with a calculator tool. " * 20 + "What is 714 + 650 - 661?")
    traj = Trajectory.start(Task(id="calc-1", question="What is 714 + 650 - 661?", answer="703"), prompt)
    thought = "Let me work this out step by step with the calculator before I answer. " * 10
    call = thought + '<tool_call>{"name": "calculator", "arguments": {"expression": "714 + 650 - 661"}}</tool_call>'
    traj.add_model_turn(encode(call), [-0.5] * len(encode(call)), call)
    traj.add_observation(encode("<tool_response>703</tool_response>"))
    answer = "The result is <answer>703</answer>."
    traj.add_model_turn(encode(answer), [-0.1] * len(encode(answer)), answer)
    traj.results = [ToolResult(ToolCall("calculator", {"expression": "714 + 650 - 661"}), "703", "ok", 0.002)]
    traj.rewards, traj.reward, traj.stop_reason, traj.num_tool_calls = {"correct": 1.0}, 1.0, "answer", 1
    trained = sum(traj.loss_mask)
    update = UpdateValues([0.73] * trained, [-0.5001] * trained)
    return traj.to_record(tokenizer, success="correct", update=update)


def write_run(root: Path, record: dict, megabytes: float, per_step: int) -> tuple[Path, int, int]:
    from toolrl.runs.rundir import RunDir

    run = root / "big"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("env:\n  name: calculator\ntrain:\n  steps: 100000\n")
    line = len(json.dumps({"step": 1, **record})) + 1
    steps = max(1, int(megabytes * 1e6 / (line * per_step)))
    rundir = RunDir(run)
    for step in range(1, steps + 1):
        rundir.log_samples(step, [{**record, "sample": i, "group": i // 6} for i in range(per_step)])
        rundir.log_metrics({"step": step, "reward": 0.5, "success": 0.5, "step_s": 30.0})
    return run, steps, (run / "samples.jsonl").stat().st_size


def median_time(fn, repeat: int = 1) -> float:
    return statistics.median(timed(fn) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200.0)
    parser.add_argument("--out", default="bench/results/ui.json")
    args = parser.parse_args()
    from starlette.testclient import TestClient

    from toolrl.models import load_tokenizer
    from toolrl.runs.rundir import RunDir
    from toolrl.ui import build_app

    record = a_record(load_tokenizer("smollm2-135m-instruct"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run, steps, size = write_run(root, record, args.megabytes, per_step=24)
        client = TestClient(build_app(root, [], token=None), base_url="http://127.0.0.1")
        get = lambda path, **params: client.get(path, params={"run": "big", **params}).raise_for_status()  # noqa: E731
        first = median_time(lambda: get("/api/briefs", step=steps // 2))
        RunDir(run).log_samples(steps + 1, [{**record, "sample": i} for i in range(24)])
        grown = median_time(lambda: get("/api/briefs", step=steps + 1))
        again = median_time(lambda: get("/api/briefs", step=steps // 2), repeat=5)
        listed = median_time(lambda: get("/api/steps"), repeat=5)
        one = median_time(lambda: get("/api/record", step=steps // 2, index=3), repeat=20)
        runs = median_time(lambda: client.get("/api/runs").raise_for_status(), repeat=5)
        new_metrics = median_time(lambda: get("/api/metrics", since=steps - 1), repeat=5)

        def reread_step():  # what a viewer without an index does for each look at a step: parse, then filter
            with (run / "samples.jsonl").open() as f:
                return [r for r in map(json.loads, f) if r["step"] == steps // 2]

        rescan = median_time(reread_step)
    rows = [
        ("first look at a step (index the whole file)", first),
        ("look after one more step was written", grown),
        ("look again, nothing new", again),
        ("the list of steps", listed),
        ("one trajectory's record", one),
        ("runs list", runs),
        ("metrics from the last line on", new_metrics),
        ("without an index: re-read the file for one step", rescan),
    ]
    print(f"samples.jsonl {size / 1e6:.0f} MB: {steps} steps x 24 records of {len(json.dumps(record)) / 1e3:.1f} KB")
    print(f"{'request':<52} {'ms':>9}")
    for name, seconds in rows:
        print(f"{name:<52} {seconds * 1e3:>9.1f}")
    print(f"an indexed look at a grown run vs re-reading: {rescan / grown:.0f}x")
    write_results(
        args.out,
        {
            "machine": machine(),
            "workload": {"samples_mb": round(size / 1e6, 1), "steps": steps, "records_per_step": 24},
            "ms": {name: round(seconds * 1e3, 2) for name, seconds in rows},
            "indexed_vs_reread_ratio": round(rescan / grown, 1),
        },
    )


if __name__ == "__main__":
    main()
