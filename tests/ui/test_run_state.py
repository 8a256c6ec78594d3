"""The run's state as the page shows it is true (issue 50, item 8): a stop asked during the last step says the run
finished first; resume is refused up front, with its reason, where it cannot work; a torn metrics line is named."""

import json

import pytest

from tests.ui.test_api import make_run, ui_client


def test_resume_is_blocked_with_its_reason_and_torn_metrics_lines_are_named(tmp_path):
    root = tmp_path / "runs"
    done = make_run(root, "done", steps=3, status={"state": "finished", "step": 3, "steps": 3})
    (done / "checkpoints").mkdir()
    (done / "checkpoints" / "step-000003").mkdir()
    (done / "last").symlink_to("checkpoints/step-000003")
    stopped = make_run(root, "stopped", steps=2, status={"state": "stopped", "step": 2, "steps": 5})
    (stopped / "checkpoints").mkdir()
    (stopped / "checkpoints" / "step-000002").mkdir()
    (stopped / "last").symlink_to("checkpoints/step-000002")
    make_run(root, "bare", steps=1, status={"state": "failed", "step": 1, "steps": 5, "error": "boom"})
    late = {
        "state": "finished",
        "step": 3,
        "steps": 3,
        "note": "the stop came during the last step: the run finished first",
    }
    make_run(root, "late", steps=3, status=late)
    with (stopped / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward": \n')  # torn by a kill mid-write
        f.write(json.dumps({"step": 4, "reward": 0.5}) + "\n")
        f.write("[1, 2]\n")  # JSON, not a record
        f.write('{"step": 5, "reward": NaN, "kl": Infinity, "note": "NaN in a string"}\n')
    with (stopped / "metrics.jsonl").open("ab") as f:  # JSON Python reads from bytes and a browser would not
        f.write(b"\xef\xbb\xbf" + json.dumps({"step": 6}).encode() + b"\n")  # a byte order mark
        f.write(json.dumps({"step": 7}).encode("utf-16-le") + b"\n")
    with ui_client(root) as client:
        runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
        assert runs["done"]["resume_blocked"].startswith("the run finished all its 3 steps")
        assert runs["stopped"]["resume_blocked"] is None  # a stopped run with a checkpoint: resumable
        assert runs["bare"]["resume_blocked"] == "no checkpoint to resume from (train.save_every writes them)"
        assert runs["late"]["note"] == late["note"] and runs["late"]["state"] == "finished"
        answer = client.get("/api/metrics", params={"run": "stopped", "since": 0})
        metrics = json.loads(
            answer.text, parse_constant=lambda word: pytest.fail(f"{word} is not JSON a browser reads")
        )
        torn = [4, 6, 8, 9]
        assert metrics["problems"] == [f"metrics.jsonl:{n}: not a JSON object, skipped" for n in torn]
        assert [r.get("step") for r in metrics["records"]] == [0, 1, 2, None, 4, None, 5, None, None]  # in place
        assert metrics["records"][6] == {"step": 5, "reward": None, "kl": None, "note": "NaN in a string"}
        assert client.get("/api/metrics", params={"run": "stopped", "since": 9}).json()["problems"] == []


def test_a_stop_asked_during_the_last_step_says_the_run_finished_first(tmp_path, tiny_model_dir):
    from toolrl.config import load_config
    from toolrl.runs.rundir import STOP_FILE, RunDir
    from toolrl.train import Trainer, Workbench

    config = load_config(overrides=[
        "env.name=calculator", f"model.name={tiny_model_dir}", "device=cpu", "rollout.max_new_tokens=8",
        "train.steps=2", "train.prompts_per_step=1", "train.group_size=2",
        "eval.at_start=false", "eval.at_end=false", f"output_dir={tmp_path}", "run_name=s",
    ])  # fmt: skip
    bench = Workbench.load(config)
    try:
        run = RunDir.create(config)
        trainer = Trainer(bench, run)
        trainer.train(lambda m: (run.path / STOP_FILE).touch() if m["step"] == 2 else None)  # asked in the last
    finally:
        bench.close()
    status = run.read_status()
    assert status["state"] == "finished" and status["step"] == 2
    assert status["note"] == "the stop came during the last step: the run finished first"
    assert not (run.path / STOP_FILE).exists()  # a later resume is not stopped by it


def test_metrics_polls_read_on_from_their_byte_offset(tmp_path):
    """Each poll reads from where the last one ended (the page keeps the offset): an empty poll reads nothing, a new
    line comes alone, a line still being written waits, and a file rewritten shorter (a resume) starts over."""
    root = tmp_path / "runs"
    run = make_run(root, "r", steps=2)
    with ui_client(root) as client:
        first = client.get("/api/metrics", params={"run": "r"}).json()
        assert [r["step"] for r in first["records"]] == [0, 1, 2] and first["offset"] == (
            run / "metrics.jsonl"
        ).stat().st_size
        again = client.get("/api/metrics", params={"run": "r", "since": 3, "offset": first["offset"]}).json()
        assert again["records"] == [] and again["offset"] == first["offset"]
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 3, "reward": 0.3}) + "\n" + '{"step": 4')  # the next line half written
        grown = client.get("/api/metrics", params={"run": "r", "since": 3, "offset": first["offset"]}).json()
        assert [r["step"] for r in grown["records"]] == [3] and grown["since"] == 3
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.0}) + "\n")  # rewritten shorter
        restarted = client.get("/api/metrics", params={"run": "r", "since": 4, "offset": grown["offset"]}).json()
        assert restarted["since"] == 0 and [r["step"] for r in restarted["records"]] == [1]
