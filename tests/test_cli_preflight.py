"""A run fails fast: what can be checked before a model loads (the model folder, the files the config names, the
output folder, the context length) is checked first, as one line naming the key, before torch is imported and
before a run folder exists."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolrl.cli import main

ROOT = Path(__file__).parents[1]


def bad_configs(tmp_path: Path) -> list[tuple[list[str], str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    weightless, tokenizerless = tmp_path / "weightless", tmp_path / "tokenizerless"
    for folder in (weightless, tokenizerless):
        folder.mkdir()
        (folder / "config.json").write_text('{"model_type": "llama"}')
    (weightless / "tokenizer.json").write_text("{}")
    (tokenizerless / "model.safetensors").write_bytes(b"")
    return [
        ([f"model.name={weightless}"], "model.name: " + str(weightless) + " holds no weights"),
        ([f"model.name={tokenizerless}"], "holds no tokenizer"),
        (["model.name=/no/such/model"], "model folder /no/such/model does not exist"),
        (["tools.file=/no/such/tools.yaml"], "tools.file: /no/such/tools.yaml does not exist"),
        (["env.train_file=/no/such/tasks.jsonl"], "env.train_file: /no/such/tasks.jsonl does not exist"),
        (["env.test_file=" + str(tmp_path)], "is a folder"),
        ([f"output_dir={a_file}/runs"], "output_dir: "),
        (["rollout.max_response_tokens=9000"], "rollout.max_response_tokens: 9000 leaves no room"),
        (["train.kl.teacher=/no/such/teacher", "train.kl.coef=0.1"], "train.kl.teacher: model folder"),
        (["train.warm_start=true", "sft.source=file"], "sft.file: sft.source is file"),
        (["train.warm_start=true", "sft.source=file", "sft.file=/no/such.jsonl"], "sft.file: /no/such.jsonl"),
        (["model.name=" + "m" * 5000], "is not a folder that can be looked up (File name too long)"),  # was an OSError
    ]


@pytest.mark.parametrize("case", range(12))
def test_a_bad_config_fails_in_one_line_before_loading_and_leaves_no_run_folder(case, tmp_path, monkeypatch, capsys):
    overrides, expected = bad_configs(tmp_path)[case]
    out = tmp_path / "runs" / "nested"
    if not any(o.startswith("output_dir=") for o in overrides):
        overrides = [f"output_dir={out}", *overrides]
    monkeypatch.setattr(sys, "argv", ["toolrl", "train", *[a for o in overrides for a in ("--set", o)]])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert exited.value.code == 2 and line.startswith("error: ") and expected in line, line
    assert not (tmp_path / "runs").exists()  # no folder left behind, not even an empty one (issue 72)


def test_the_checks_come_before_torch_is_imported(tmp_path):
    """The import set, not the time: a run that cannot start never imports torch or transformers."""
    script = (
        "import sys\nfrom toolrl.cli import main\n"
        f"sys.argv = ['toolrl', 'train', '--set', 'model.name=/no/such/model', '--set', 'output_dir={tmp_path}']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n"
        "    print(__import__('json').dumps({'code': exc.code, 'torch': 'torch' in sys.modules, "
        "'transformers': 'transformers' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 2, "torch": False, "transformers": False}, done.stderr[-2000:]


def test_a_check_registered_from_outside_runs_before_loading(tmp_path, monkeypatch, capsys):
    from toolrl.config.preflight import CHECKS, register_preflight
    from toolrl.errors import ConfigError

    @register_preflight("licence")
    def licence(cfg):
        if cfg.env.name == "calculator":
            raise ConfigError("env.name: the calculator needs a licence file (licence.txt); write one")

    try:
        monkeypatch.setattr(sys, "argv", ["toolrl", "train", "--set", f"output_dir={tmp_path}"])
        with pytest.raises(SystemExit) as exited:
            main()
    finally:
        dict.pop(CHECKS, "licence")
    assert exited.value.code == 2 and "needs a licence file" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_new_run_is_refused_a_folder_that_holds_a_run_and_the_old_run_is_kept(
    tmp_path, monkeypatch, capsys, tiny_model_dir
):
    """`toolrl train` twice with one run_name: the second would append its metrics to the first run's and replace
    its checkpoints; it stops in one line that says how to continue the old run instead."""
    from toolrl.config import load_config
    from toolrl.errors import ConfigError
    from toolrl.runs.rundir import RunDir

    old = tmp_path / "runs" / "mine"
    old.mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    overrides = [f"output_dir={tmp_path / 'runs'}", "run_name=mine", f"model.name={tiny_model_dir}", "device=cpu",
                 "train.steps=1", "eval.at_start=false", "eval.at_end=false"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["toolrl", "train", *[a for o in overrides for a in ("--set", o)]])
    with pytest.raises(SystemExit) as exited:
        main()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and "run_name 'mine'" in line and f"toolrl train --resume {old}" in line, line
    assert sorted(p.name for p in old.iterdir()) == ["metrics.jsonl"]  # nothing written over, no config.yaml
    assert (old / "metrics.jsonl").read_text() == '{"step": 1, "reward": 0.5}\n'
    (old / "metrics.jsonl").unlink()
    (old / "last").symlink_to(old / "gone")  # a checkpoint link, even a dangling one, marks a run
    with pytest.raises(ConfigError, match="already holds a run \\(last\\)"):
        RunDir.create(load_config(overrides=overrides))
    (old / "last").unlink()
    (old / "config.yaml").write_text("run_name: mine\n")  # a run that stopped before its first step: reused
    assert RunDir.create(load_config(overrides=overrides)).path == old


@pytest.mark.parametrize(
    "name", ["../escaped", "{tmp}/absolute", "a/b", "..", ".", ".hidden", "x" * 101, "a\nb", "trailing\n"]
)
def test_a_run_name_that_is_not_one_folder_name_is_refused_and_nothing_is_written(name, tmp_path, monkeypatch, capsys):
    """run_name comes from a config file (someone else's, a recipe, a run directory's config.yaml): a path in it
    would put the run, its checkpoints and its logs outside output_dir, over whatever is there."""
    name = name.format(tmp=tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"run_name": name, "output_dir": str(tmp_path / "runs" / "inner")}))
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.setattr(sys, "argv", ["toolrl", "train", str(config)])
    with pytest.raises(SystemExit) as exited:
        main()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and line.startswith(f"error: {config}: run_name: ") and "one folder name" in line
    assert sorted(tmp_path.rglob("*")) == before  # no run folder, inside output_dir or out of it


@pytest.mark.parametrize("command", [["env", "check"], ["train"], ["eval"]])
def test_a_config_name_the_system_cannot_look_up_is_one_line(command, monkeypatch, capsys):
    """Issue 72: `toolrl env check` with a 10,000-character name printed an OSError traceback."""
    monkeypatch.setattr(sys, "argv", ["toolrl", *command, "a" * 10_000])
    with pytest.raises(SystemExit) as exited:
        main()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and line.startswith("error: config file aaaa") and "File name too long" in line
    assert len(line) < 300
