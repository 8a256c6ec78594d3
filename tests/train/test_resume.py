"""Checkpoints and exact resume: a training process killed with SIGKILL and resumed gives the run an
uninterrupted process gives (same steps once each, same metrics, same weights)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).parents[1] / "fixtures" / "even_env.py"


def train_command(model_dir, out, name, steps=5):
    return [
        sys.executable,
        str(SCRIPT),
        "train",
        "--set", f"model.name={model_dir}",
        "--set", "env.name=even-tokens",
        "--set", "device=cpu",
        "--set", f"output_dir={out}",
        "--set", f"run_name={name}",
        "--set", "rollout.max_turns=1",
        "--set", "rollout.max_new_tokens=6",
        "--set", f"train.steps={steps}",
        "--set", "train.prompts_per_step=2",
        "--set", "train.group_size=4",
        "--set", "train.lr=0.01",
        "--set", "train.lr_scheduler=cosine",
        "--set", "train.warmup_steps=1",
        "--set", "train.save_every=1",
        "--set", "eval.at_start=false",
        "--set", "eval.at_end=false",
    ]  # fmt: skip


def run(command, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, **kwargs)


def steps_of(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tiny_model_dir, tmp_path):
    reference = run(train_command(tiny_model_dir, tmp_path, "whole"))
    assert reference.returncode == 0, reference.stderr[-2000:]

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    killed_dir = tmp_path / "killed"
    process = subprocess.Popen(
        train_command(tiny_model_dir, tmp_path, "killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 300
    while time.time() < deadline:  # kill as soon as the step-2 checkpoint is the last one
        last = killed_dir / "last"
        if last.is_symlink() and last.resolve().name == "step-000002":
            process.send_signal(signal.SIGKILL)
            break
        if process.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {process.stderr.read()[-2000:]}")
        time.sleep(0.005)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (killed_dir / "final").exists()

    resumed = run([*train_command(tiny_model_dir, tmp_path, "killed")[:3], "--resume", str(killed_dir)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    whole, pieced = steps_of(tmp_path / "whole"), steps_of(killed_dir)
    assert [m["step"] for m in pieced] == [1, 2, 3, 4, 5]  # none lost, none repeated
    for a, b in zip(whole, pieced, strict=True):
        for key in ("reward", "loss", "grad_norm", "lr", "generated_tokens", "clip_frac"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    final_a = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    final_b = load_file(str(killed_dir / "final" / "model.safetensors"))
    for name, tensor in final_a.items():
        assert torch.allclose(tensor, final_b[name], atol=1e-6), name
    # only the checkpoints the links point at are kept
    assert [p.name for p in (killed_dir / "checkpoints").iterdir()] == ["step-000005"]
    assert (killed_dir / "plot.png").is_file()


def test_resume_without_a_checkpoint_is_a_one_line_error(tmp_path):
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    result = run([sys.executable, str(SCRIPT), "train", "--resume", str(tmp_path)])
    assert result.returncode == 2
    assert "no checkpoint to resume from" in result.stderr + result.stdout


def test_resume_removes_interrupted_writes_and_skips_a_torn_last_line(tiny_model_dir, tmp_path, caplog):
    """What a kill in the middle of a write leaves (a temporary checkpoint folder, a link being replaced, half a
    JSON line) is cleaned up on resume; the report reads a torn file with a warning."""
    from typer.testing import CliRunner

    from tests.train.test_features import tiny_config
    from toolrl.cli import app
    from toolrl.train import RunDir, Trainer, Workbench

    config = tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "train.save_every=1")
    bench = Workbench.load(config)
    Trainer(bench, RunDir.create(config)).train()
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / ".step-000003-x1y2").mkdir()
    (run_dir / "checkpoints" / ".step-000003-x1y2" / "trainable.safetensors").write_bytes(b"\0" * 10)
    (run_dir / ".last.tmp").symlink_to("checkpoints/step-000002")
    for name in ("metrics.jsonl", "samples.jsonl"):
        with (run_dir / name).open("a") as f:
            f.write('{"step": 3, "reward": 0.')  # the kill came mid-line

    report = CliRunner().invoke(app, ["report", str(run_dir)])
    assert report.exit_code == 0 and "run: 2 steps" in report.output
    assert "skipped its last line" in caplog.text

    config.train.steps = 3
    trainer = Trainer(Workbench.load(config), RunDir.existing(run_dir))
    assert trainer.resume() == 2
    assert not list((run_dir / "checkpoints").glob(".*")) and not (run_dir / ".last.tmp").exists()
    trainer.train()
    assert [m["step"] for m in steps_of(run_dir) if "eval" not in m] == [1, 2, 3]
    samples = [json.loads(line)["step"] for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples == [1] * 8 + [2] * 8 + [3] * 8  # every trajectory of each step, once


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_cannot_run_code_on_resume(tiny_model_dir, tmp_path):
    """Checkpoints hold safetensors and JSON; an old-style optimizer.pt is read with weights_only=True, so a
    pickle that would run a command is refused with a one-line error."""
    from tests.train.test_features import tiny_config
    from toolrl.errors import ConfigError
    from toolrl.train import RunDir, Trainer, Workbench

    config = tiny_config(tiny_model_dir, tmp_path, "train.steps=1", "train.save_every=1")
    Trainer(Workbench.load(config), RunDir.create(config)).train()
    last = (tmp_path / "run" / "last").resolve()
    assert {p.name for p in last.iterdir()} >= {"optimizer.safetensors", "optimizer.json", "trainable.safetensors"}
    exploit, marker = _Exploit(), tmp_path / "pwned"
    exploit.marker = marker
    torch.save({"optimizer": exploit}, last / "optimizer.pt")
    config.train.steps = 2
    trainer = Trainer(Workbench.load(config), RunDir.existing(tmp_path / "run"))
    with pytest.raises(ConfigError, match="refused, it is not plain training state"):
        trainer.resume()
    assert not marker.exists()


def test_training_state_round_trips_exactly_without_pickle(tmp_path):
    from toolrl.runs.state_io import load_state, save_state

    shared = torch.arange(6.0)
    tree = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": shared}, 1: {"view": shared[:3]}},
        "param_groups": [{"betas": (0.9, 0.99), "lr": 1e-5, "params": [0, 1], "fused": None}],
        "rng": torch.ByteTensor([1, 2, 3]),
        "__odd": "key",
    }
    save_state(tmp_path / "state", tree)
    back = load_state(tmp_path / "state")
    assert back["param_groups"] == tree["param_groups"] and back["__odd"] == "key"
    assert set(back["state"]) == {0, 1} and isinstance(back["param_groups"][0]["betas"], tuple)
    assert torch.equal(back["state"][0]["exp_avg"], shared) and torch.equal(back["state"][1]["view"], shared[:3])
    assert torch.equal(back["rng"], tree["rng"]) and back["state"][0]["step"].item() == 3.0


@pytest.mark.slow
def test_resuming_a_finished_run_is_refused_in_one_line_unless_it_is_given_more_steps(tiny_model_dir, tmp_path):
    """A finished run resumed as it is would repeat its end (evaluation records twice): refused, one line, files
    untouched. Given more steps it continues, each step once; reached through a symlink, the same."""
    first = run(train_command(tiny_model_dir, tmp_path, "done", steps=2))
    assert first.returncode == 0, first.stderr[-2000:]
    run_dir = tmp_path / "done"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    again = run([sys.executable, str(SCRIPT), "train", "--resume", str(run_dir)])
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr[-2000:]
    assert "finished all its 2 steps" in again.stderr and "train.steps" in again.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    link = tmp_path / "link"
    link.symlink_to(run_dir, target_is_directory=True)
    more = run([sys.executable, str(SCRIPT), "train", "--resume", str(link), "--set", "train.steps=3"])
    assert more.returncode == 0, more.stderr[-2000:]
    assert [m["step"] for m in steps_of(run_dir) if "eval" not in m] == [1, 2, 3]
