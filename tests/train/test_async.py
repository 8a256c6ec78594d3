"""One-step off-policy training (train.async_steps: 1): the rollout of step k+1 runs on a copy of the policy
while step k trains, so it is sampled by the weights from before step k's update (one update stale)."""

import copy
import json
import os
import threading
import time

import pytest
import torch

from tests.train.test_features import tiny_config
from toolrl.train import RunDir, Trainer, Workbench


def fingerprint(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten()[:64] for p in model.parameters()]).clone()


def test_the_next_rollout_runs_during_the_update_on_weights_one_step_old(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "train.async_steps=1")
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    assert trainer.generator is not trainer.model
    sampled_by, spans, weights = {}, {}, {0: fingerprint(trainer.model)}
    roll_out, update = trainer.collector.roll_out, trainer.update

    def traced_roll_out(step, tasks=None):
        sampled_by[step] = (fingerprint(trainer.generator), threading.current_thread().name)
        started = time.perf_counter()
        part = roll_out(step, tasks)
        spans[("rollout", step)] = (started, time.perf_counter())
        return part

    def traced_update(trajs, leave_out=()):
        started = time.perf_counter()
        stats = update(trajs, leave_out)
        spans[("update", trainer.state.step + 1)] = (started, time.perf_counter())
        return stats

    trainer.collector.roll_out, trainer.update = traced_roll_out, traced_update
    metrics = []

    def on_step(m):
        metrics.append(m)
        weights[m["step"]] = fingerprint(trainer.model)

    trainer.train(on_step)
    assert [m["offpolicy/staleness"] for m in metrics] == [0, 1, 1]
    assert torch.equal(sampled_by[1][0], weights[0]) and torch.equal(sampled_by[2][0], weights[0])
    assert torch.equal(sampled_by[3][0], weights[1]) and not torch.equal(weights[1], weights[0])
    assert sampled_by[2][1].startswith("rollout") and sampled_by[3][1].startswith("rollout")
    for k in (1, 2):  # rollout k+1 started before update k ended
        assert spans[("rollout", k + 1)][0] < spans[("update", k)][1]
    assert all("mismatch/kl" in m for m in metrics)


def test_a_checkpoint_with_a_rollout_in_flight_resumes_on_the_same_tasks(tiny_model_dir, tmp_path):
    whole = tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "train.async_steps=1", "run_name=whole")
    bench = Workbench.load(whole)
    trainer = Trainer(bench, RunDir.create(whole))
    trainer.train()
    expected = copy.deepcopy(trainer.collector.order.order), trainer.collector.order.rng.getstate()

    cut = tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "train.async_steps=1", "run_name=cut")
    cut_trainer = Trainer(Workbench.load(cut), RunDir.create(cut))
    cut_trainer.config.train.steps = 3  # a pending rollout for step 3 exists when step 2's checkpoint is written
    cut_trainer.step(1)
    cut_trainer.state.step = 1
    cut_trainer.step(2)
    cut_trainer.state.step = 2
    assert list(cut_trainer.collector.pending) == [3]
    cut_trainer.save_checkpoint()
    cut_trainer.settle()

    resumed = Trainer(Workbench.load(cut), RunDir.existing(cut_trainer.run.path))
    resumed.config.train.steps = 3
    assert resumed.resume() == 2
    resumed.step(3)
    assert (resumed.collector.order.order, resumed.collector.order.rng.getstate()) == expected


LOCKSTEP_BEFORE = "8103cf9"
"""The last commit before train.async_steps went past one step (issue 74)."""


@pytest.mark.slow
def test_lockstep_writes_the_metrics_file_of_the_commit_before_async_steps_past_one(tiny_model_dir, tmp_path):
    """`async_steps: 0` (the default) trains and logs exactly as before: every metric that is not a time, a rate or a
    memory is equal, step by step, at this checkout and at the commit before (tests/harness/lockstep_metrics.py)."""
    import io
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    root = Path(__file__).parents[2]
    archive = subprocess.run(["git", "-C", str(root), "archive", LOCKSTEP_BEFORE, "src/toolrl"], capture_output=True,
                             timeout=120)  # fmt: skip
    assert archive.returncode == 0, (
        f"git archive {LOCKSTEP_BEFORE}: {archive.stderr.decode()[-500:]} (a clone with history)"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path / "before", filter="data")

    def metrics(src: Path, name: str) -> list[dict]:
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{root}"}
        command = [sys.executable, str(root / "tests/harness/lockstep_metrics.py"), str(tiny_model_dir),
                   str(tmp_path / name), str(tmp_path / f"{name}.json")]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads((tmp_path / f"{name}.json").read_text())

    before, now = metrics(tmp_path / "before" / "src", "before"), metrics(root / "src", "now")
    assert len(now) == 3 and now == before
    assert not any(k.startswith("offpolicy/") for row in now for k in row)
