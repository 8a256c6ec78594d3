"""Where a running step is (RUN/live.json): written as the step moves through its rollout, scoring and update, read
by the UI for a running run only, and a hostile live.json is not shown (issue 50, item 6)."""

import json

from toolrl.runs.live import LiveStep


def test_a_step_says_its_phase_and_counts_at_most_every_two_seconds():
    now, written = [100.0], []
    live = LiveStep(lambda name, value: written.append((name, dict(value))), steps=3, trajectories=4,
                    clock=lambda: now[0])  # fmt: skip
    live.begin(2)
    for t in (100.5, 101.0, 103.0, 103.5):  # four trajectories end; the last starts scoring
        now[0] = t
        live.finished_one()
    now[0] = 110.0
    scores = live.counted(lambda batch: batch * 2, micro_batches=2)
    assert [scores(1), scores(2)] == [2, 4]  # the update's own forward passes, counted
    phases = [(v["phase"], v["done"], v["total"]) for _, v in written]
    assert phases[0] == ("rollout", 0, 4) and ("rollout", 3, 4) in phases and ("rollout", 1, 4) not in phases
    assert ("scoring", 0, 0) in phases and phases[-1][0] == "update"
    assert all(name == "live.json" and v["step"] == 2 and v["steps"] == 3 for name, v in written)
    rollout = next(v for _, v in written if v["phase"] == "rollout" and v["done"] == 3)
    assert rollout["phase_eta_s"] == 1.0  # 3 trajectories in 3 s: 1 s for the last


def test_a_training_run_leaves_its_last_step_in_live_json(tmp_path, tiny_model_dir):
    from toolrl.config import load_config
    from toolrl.runs.rundir import RunDir
    from toolrl.train import Trainer, Workbench

    config = load_config(overrides=[
        "env.name=calculator", f"model.name={tiny_model_dir}", "device=cpu", "rollout.max_new_tokens=8",
        "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.micro_batch_tokens=64",
        "eval.at_start=false", "eval.at_end=false", f"output_dir={tmp_path}", "run_name=l",
    ])  # fmt: skip
    bench = Workbench.load(config)
    try:
        run = RunDir.create(config)
        seen = []
        write = run.write_json
        run.write_json = lambda name, value: (seen.append(dict(value)) if name == "live.json" else None,
                                              write(name, value))  # fmt: skip
        Trainer(bench, run).train()
    finally:
        bench.close()
    live = json.loads((tmp_path / "l" / "live.json").read_text())
    assert live["step"] == 2 and live["phase"] == "update" and live["done"] == live["total"]  # (0: nothing to learn)
    assert [v["phase"] for v in seen if v["step"] == 1][:1] == ["rollout"] and seen[0]["total"] == 4
    assert {"rollout", "scoring", "update"} <= {v["phase"] for v in seen}


def test_the_ui_shows_a_running_steps_phase_and_nothing_from_a_hostile_file(tmp_path):
    from tests.ui.test_api import fake_run_process, make_run, running_status, ui_client

    root = tmp_path / "runs"
    process = fake_run_process()
    try:
        run = make_run(root, "live", steps=1, status=running_status(process.pid))
        done = make_run(root, "done", steps=1, status={"state": "finished", "step": 1, "steps": 1})
        now = __import__("time").time()
        good = {"step": 2, "steps": 3, "phase": "rollout", "done": 5, "total": 8, "unit": "trajectories",
                "started_at": now - 40, "phase_started_at": now - 40, "updated_at": now,
                "phase_eta_s": 24.0}  # fmt: skip
        (run / "live.json").write_text(json.dumps(good))
        (done / "live.json").write_text(json.dumps(good))
        with ui_client(root) as client:
            runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
            assert runs["live"]["live"] == good and runs["done"]["live"] is None  # a finished run runs no step
            for hostile in ({**good, "step": 1}, {**good, "done": -1}, {**good, "phase": "x" * 500}, [1, 2], "{"):
                (run / "live.json").write_text(json.dumps(hostile) if not isinstance(hostile, str) else hostile)
                shown = client.get("/api/runs").json()["runs"]
                live = {r["name"]: r for r in shown}["live"]["live"]
                assert live is None or len(live["phase"]) <= 40, hostile  # a logged step, a bad count: nothing
            (run / "live.json").unlink()
            (run / "live.json").symlink_to("/etc/passwd")
            assert {r["name"]: r for r in client.get("/api/runs").json()["runs"]}["live"]["live"] is None
    finally:
        process.kill()
        process.wait()
