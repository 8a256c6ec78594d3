"""The console script end to end, on the tiny model."""

import json
import shutil
import subprocess
import sys

import pytest

from toolrl.memory import PeakMeter


def toolrl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def test_config_show_prints_the_resolved_config():
    out = toolrl("config", "show", "--set", "train.steps=3")
    assert out.returncode == 0
    assert "name: smollm2-135m-instruct" in out.stdout and "steps: 3" in out.stdout


def test_config_error_is_one_line_and_exit_code_2(tmp_path):
    out = toolrl("config", "show", "--set", "train.lrr=1")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("error: config: unknown key 'train.lrr'")
    missing = toolrl("train", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml does not exist" in missing.stderr
    deep = tmp_path / ("d" * 150) / ("e" * 150) / "nope.yaml"  # a long path: cut in the middle, its name kept
    far = toolrl("train", str(deep))
    assert far.returncode == 2 and len(far.stderr.strip().splitlines()) == 1, far.stderr
    assert f"{str(deep)[:60]}" in far.stderr and " ... " in far.stderr and "/nope.yaml does not exist" in far.stderr


def test_a_path_in_a_message_is_cut_in_the_middle_keeping_its_name():
    from toolrl.text import clip_path

    assert clip_path("/short/path.yaml") == "/short/path.yaml"
    cut = clip_path("/" + "a" * 300 + "/config.yaml", 80)
    assert len(cut) == 80 and cut.startswith("/aaa") and cut.endswith("a/config.yaml") and " ... " in cut


def test_a_run_that_cannot_start_says_failed_in_its_status(tmp_path, tiny_model_dir):
    """A model folder that passes the checks before loading (config, tokenizer, a weights file) but whose weights
    are corrupt: the run folder exists by then, and its status says why it failed. (A missing folder or one
    without weights leaves no run folder: tests/test_cli_preflight.py.)"""
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_model_dir, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    sets = [f"model.name={corrupt}", f"output_dir={tmp_path}", "run_name=r"]
    out = toolrl("train", *(arg for s in sets for arg in ("--set", s)))
    assert out.returncode != 0 and out.stderr.startswith("error: "), out.stderr[-2000:]
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["state"] == "failed" and status["error"] == out.stderr.removeprefix("error: ").strip()


@pytest.mark.slow
def test_train_writes_the_run_directory_and_a_loadable_checkpoint(tiny_model_dir, tmp_path):
    out = toolrl(
        "train",
        "--set", f"model.name={tiny_model_dir}",
        "--set", f"output_dir={tmp_path}",
        "--set", "run_name=run",
        "--set", "train.steps=2",
        "--set", "train.prompts_per_step=2",
        "--set", "train.group_size=2",
        "--set", "rollout.max_new_tokens=8",
        "--set", "eval.num_tasks=4",
        "--set", "eval.batch_size=4",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    assert "success rate" in out.stdout and str(run / "final") in out.stdout
    assert "steps: 2" in (run / "config.yaml").read_text()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(m.get("eval"), m["step"]) for m in metrics] == [("start", 0), (None, 1), (None, 2), ("end", 2)]
    assert (run / "plot.png").is_file() and (run / "last").resolve().name == "step-000002"
    assert {"reward", "success", "tool_calls", "loss", "gen_tokens_per_s", "reward/correct"} <= set(metrics[1])
    stops = {"stop/answer", "stop/no_tool_call", "stop/max_turns", "stop/length"}
    assert all(stops <= set(m) for m in metrics)  # the same columns every step, whichever reasons occurred
    steps = metrics[1:3]
    assert sum(m.get("tools/calls", 0) for m in steps) == sum(m["tool_calls"] * 4 for m in steps)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and samples[0]["segments"][0] == {  # every trajectory of both steps
        **samples[0]["segments"][0],
        "kind": "model",
        "loss": True,
    }
    assert [(s["step"], s["sample"], s["group"]) for s in samples[:4]] == [(1, 0, 0), (1, 1, 0), (1, 2, 1), (1, 3, 1)]
    assert all(s["prompt"] and s["success"] in (0.0, 1.0) for s in samples)
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [(e["eval"], e["step"]) for e in evals] == [("start", 0)] * 4 + [("end", 2)] * 4
    assert [e["task_id"] for e in evals[:4]] == [e["task_id"] for e in evals[4:]]  # the same tasks, compared
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 2 and status["steps"] == 2
    if PeakMeter().available:  # each phase's peak resident memory: in each step's metrics, the run's file, the end
        assert all(m["memory/update_peak_gb"] >= m["memory/rss_gb"] * 0.5 > 0 for m in steps)
        memory = json.loads((run / "memory.json").read_text())
        assert {"rollout", "update", "eval", "checkpoint"} <= set(memory["phases_peak_gb"])
        assert memory["peak_gb"] >= max(memory["phases_peak_gb"].values()) > 0.1
        assert f"peak memory {memory['peak_gb']:.1f} GB (max RSS of this process" in out.stdout
        assert memory["measure"].startswith("the toolrl process's max resident set (VmHWM)")

    from transformers import AutoModelForCausalLM

    assert (run / "final" / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    assert model.config.hidden_size == 64


@pytest.mark.slow
def test_eval_prints_success_tool_calls_and_turns(tiny_model_dir):
    out = toolrl("eval", "--model", str(tiny_model_dir), "--num-tasks", "3", "--set", "eval.batch_size=3")
    assert out.returncode == 0, out.stderr
    for label in ("success rate", "tool calls / task", "turns / task"):
        assert label in out.stdout


def one_line_error(out, exit_code=2):
    """The command failed with `exit_code` and said why in one bounded line."""
    text = out.stderr.strip()
    assert out.returncode == exit_code, out.stderr[-2000:]
    assert text.startswith("error: ") and "\n" not in text and "Traceback" not in text, text
    assert len(text) < 400, len(text)
    return text


@pytest.mark.parametrize(
    ("content", "args", "expected"),
    [
        ("env:\n  name: calc\x00ulator\n", (), "control character U+0000 at offset 17 is not allowed"),
        ("train:\n  steps: " + "1" * 5000 + "\n", (), "a number has more than 4,300 digits"),
        ("train:\n  lr: 1e999\n", (), "train.lr must be a finite number"),
        ("{}\n", ("--set", "train.lr=.nan"), "train.lr must be a finite number"),
        ("{}\n", ("--set", "env.name=" + "x" * 5000), "env.name: unknown environment 'xxxx"),
    ],
)
def test_bad_config_values_are_one_bounded_line(tmp_path, content, args, expected):
    path = tmp_path / "run.yaml"
    path.write_text(content)
    text = one_line_error(toolrl("config", "show", str(path), *args))
    assert expected in text


def test_a_tool_file_with_a_dotted_server_name_is_refused_and_a_failing_server_fails_tools_list(tmp_path):
    dotted = tmp_path / "dotted.json"
    dotted.write_text(json.dumps({"mcpServers": {"calc.v2": {"python": "toolrl.envs.calculator.tool:calculator"}}}))
    text = one_line_error(toolrl("tools", "list", str(dotted)))
    assert "'calc.v2' is not a server name" in text and "no dot" in text
    mixed = tmp_path / "mixed.json"
    servers = {"calc": {"python": "toolrl.envs.calculator.tool:calculator"}, "gone": {"command": "/no/such/server"}}
    mixed.write_text(json.dumps({"mcpServers": servers}))
    listed = toolrl("tools", "list", str(mixed))
    assert listed.returncode == 1 and "calc.calculator" in listed.stdout
    assert "server gone: error" in listed.stdout and "1 of 2 servers failed: gone" in listed.stdout


def test_a_model_folder_whose_weights_are_a_pickle_is_refused(tmp_path, tiny_model_dir):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    text = one_line_error(toolrl("eval", "--model", str(folder), "--num-tasks", "1"))
    assert "holds its weights as a pickle (pytorch_model.bin)" in text and "safetensors" in text


def test_train_ahead_with_partial_rollouts_from_the_command_line(tiny_model_dir, tmp_path):
    out = toolrl(
        "train",
        "--set", f"model.name={tiny_model_dir}", "--set", f"output_dir={tmp_path}", "--set", "run_name=ahead",
        "--set", "train.steps=3", "--set", "train.prompts_per_step=2", "--set", "train.group_size=2",
        "--set", "rollout.max_new_tokens=8", "--set", "eval.at_start=false", "--set", "eval.at_end=false",
        "--set", "env.name=even-tokens", "--set", "env.module=tests.fixtures.even_env", "--set", "rollout.max_turns=1",
        "--set", "train.async_steps=2", "--set", "train.partial_rollouts=cut", "--set", "train.correction=icepop",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    metrics = [json.loads(line) for line in (tmp_path / "ahead" / "metrics.jsonl").read_text().splitlines()]
    assert [m["offpolicy/staleness"] for m in metrics][:2] == [0, 1]
    assert all(m["offpolicy/staleness"] <= 2 for m in metrics)
    trained = [m for m in metrics if m["trained_trajectories"]]  # a group of equal rewards trains nothing
    assert trained and all("correction/masked_fraction" in m for m in trained)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--set", "train.async_steps=9"), "train.async_steps"),
        (("--set", "train.partial_rollouts=later"), "train.partial_rollouts"),
    ],
)
def test_bad_async_settings_are_one_line(tmp_path, args, expected):
    text = one_line_error(toolrl("config", "show", *args))
    assert expected in text


def test_partial_rollouts_without_async_steps_are_refused_before_anything_runs(tiny_model_dir, tmp_path):
    out = toolrl("train", "--set", f"model.name={tiny_model_dir}", "--set", f"output_dir={tmp_path}",
                 "--set", "train.partial_rollouts=continue")  # fmt: skip
    text = one_line_error(out, exit_code=out.returncode or 2)
    assert "train.partial_rollouts: continue" in text and "train.async_steps" in text


def test_partial_rollouts_off_as_yaml_and_set_write_it(tmp_path):
    """YAML reads an unquoted `off` as false: the value the docs give must still be taken, from a file and a --set."""
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  partial_rollouts: off\n")
    for args in ((str(path),), ("--set", "train.partial_rollouts=off")):
        out = toolrl("config", "show", *args)
        assert out.returncode == 0, out.stderr
        assert "partial_rollouts: 'off'" in out.stdout
    text = one_line_error(toolrl("config", "show", "--set", "train.partial_rollouts=on"))
    assert "train.partial_rollouts must be one of 'off', 'continue' or 'cut'" in text
