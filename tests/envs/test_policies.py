"""The reference and idle policies (rollout/scripted.py) and `toolrl env check`: the reference is keyed by task
and turn (two tasks with one prompt each play their own; a request without calls puts nothing a turn behind),
calls past a turn's token budget go in the next turn, both work from the command line on a plug-in environment,
and a wrong environment fails the check."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import notes_env
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.scripted import POLICIES, playable, scripted_engine
from toolrl.tools import ToolExecutor
from toolrl.train.evaluate import summarize

ROOT = Path(__file__).parents[2]


def notes(*overrides, parser=None):
    config = load_config(overrides=["env.name=notes", "plugins=[tests.fixtures.notes_env]", *overrides])
    return make_env(config.env, parser=parser)


def play(env, chat, policy, tasks=None, max_new_tokens=256):
    tasks = tasks or env.tasks("test")
    limits = RolloutLimits(12, max_new_tokens, 4000, 200)
    rollout = Rollout(env, scripted_engine(policy, chat, env.syntax, env), chat, env.syntax, ToolExecutor([]), limits)
    return rollout.run(tasks)


@pytest.mark.parametrize("parser", ["hermes", "pythonic", "llama3-json"])
def test_the_reference_is_played_by_task_and_turn_and_idle_does_nothing(chat, parser):
    env = notes(parser=parser)
    tasks = env.tasks("test")
    assert tasks[0].question == tasks[1].question  # one prompt, two references
    trajs = play(env, chat, "reference", tasks + tasks[::-1])  # and each task twice, in another order
    assert [t.rewards["kept"] for t in trajs] == [1.0] * 10, [t.episode for t in trajs]
    assert all(t.num_format_errors == 0 for t in trajs)
    by_id = {t.task.id: t for t in trajs}
    assert by_id["chat-then-note"].user_messages == ["Now note gamma and delta."]  # the user spoke again
    idle = play(env, chat, "idle")
    assert summarize(idle, "kept")["success"] == 0.0 and all(t.num_tool_calls == 0 for t in idle)


def test_calls_past_a_turns_token_budget_go_in_the_next_turns(chat):
    env = notes()
    three = [t for t in env.tasks("test") if t.id == "three"]
    (traj,) = play(env, chat, "reference", three, max_new_tokens=40)
    assert traj.rewards["kept"] == 1.0 and traj.num_format_errors == 0 and traj.num_turns >= 3


def test_a_policy_plays_only_the_tasks_it_has_a_script_for(chat):
    env = notes()
    first = env.tasks("test")[0]
    bare = type(first)("bare", "No reference here.", "", {"requests": [], "notes": []})
    played, left = playable(env, [first, bare], "reference")
    assert played == [first] and left == [bare]
    assert playable(env, [first, bare], "idle") == ([first, bare], [])
    assert "first-request" in POLICIES  # registered from outside the package
    (traj,) = play(env, chat, "first-request", [t for t in env.tasks("test") if t.id == "chat-then-note"])
    assert traj.rewards["kept"] == 0.0 and traj.num_tool_calls == 0  # it stops after the first request's reply


def test_text_before_a_turns_calls_is_written_once_and_the_calls_still_run(chat):
    """A policy from outside the package writes a thought before its calls (envs.reference.Said): the calls are
    parsed and run as without it, and calls split over turns by the token budget keep the text on the first."""
    env = notes()
    trajs = play(env, chat, "thinking")
    assert [t.rewards["kept"] for t in trajs] == [1.0] * 5 and all(t.num_format_errors == 0 for t in trajs)
    three = next(t for t in trajs if t.task.id == "three")
    written = three.texts
    assert written[0].startswith("Thinking: 3 to write.\n<tool_call>") and written[0].count("<tool_call>") == 3
    (split,) = play(env, chat, "thinking", [t for t in env.tasks("test") if t.id == "three"], max_new_tokens=40)
    turns = split.texts
    assert split.rewards["kept"] == 1.0 and len(turns) >= 3 and turns[0].startswith("Thinking: 3 to write.")
    assert not any("Thinking" in turn for turn in turns[1:])


def test_a_reference_in_task_data_may_open_its_turns_with_notes():
    from toolrl.envs.reference import Said, reference_from_meta
    from toolrl.errors import DataError

    call = {"name": "note", "arguments": {"text": "a"}}
    entry = {"rounds": [[call], [call]], "reply": "<answer>a</answer>", "notes": ["Two steps.\n", "One more.\n"]}
    (request,) = reference_from_meta("t", {"reference": [entry]})
    first, second, reply = request.turns()
    assert isinstance(first, Said) and first.text == "Two steps.\n" and second.text == "One more.\n"
    assert reply == "<answer>a</answer>"  # past the notes: no text added
    glued = reference_from_meta("t", {"reference": [{**entry, "notes": ["Two steps.", "Done:"]}]})[0].turns()
    assert glued[0].text == "Two steps.\n" and glued[1].text == "Done:\n"  # a line of its own before its calls
    with pytest.raises(DataError, match=r"task t, reference of request 1: 'notes' is a list of strings"):
        reference_from_meta("t", {"reference": [{**entry, "notes": "Two steps."}]})


def toolrl(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    command = [sys.executable, "-m", "toolrl", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_env_check_passes_a_sound_plug_in_environment_and_fails_a_wrong_one(tiny_model_dir):
    common = ["--set", f"model.name={tiny_model_dir}", "--set", "plugins=[tests.fixtures.notes_env]"]
    tight = toolrl("env", "check", *common, "--set", "env.name=notes")  # the default limits: 3 turns of 48 tokens
    assert tight.returncode == 1, tight.stdout  # the calls split over turns of 48 tokens ran out of turns
    assert "rollout.max_new_tokens 48 cut 2 of 5 reference trajectories: " in tight.stdout, tight.stdout
    common += ["--set", "rollout.max_turns=8", "--set", "rollout.max_new_tokens=128"]
    sound = toolrl("env", "check", *common, "--set", "env.name=notes")
    assert sound.returncode == 0, sound.stdout + sound.stderr[-2000:]
    rows = {line.split("│")[1].strip(): line for line in sound.stdout.splitlines() if line.startswith("│")}
    assert "100.0%" in rows["reference"] and "ok" in rows["reference"]
    assert "0.0%" in rows["idle"] and "ok" in rows["idle"]

    wrong = toolrl("env", "check", *common, "--set", "env.name=notes", "--set", "env.options.lenient=true")
    assert wrong.returncode == 1
    assert "env notes is wrong: idle policy success 100.0% (want <= 5%: the default bound)" in wrong.stdout
    assert "Traceback" not in wrong.stderr


@pytest.mark.slow
def test_eval_plays_a_policy_without_loading_a_model_and_names_an_unknown_one(tiny_model_dir, tmp_path):
    no_weights = tmp_path / "model"  # the tokenizer and config alone: loading the weights would fail
    shutil.copytree(tiny_model_dir, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    common = ["--set", f"model.name={no_weights}", "--set", "plugins=[tests.fixtures.notes_env]"]
    common += ["--set", "rollout.max_turns=8", "--set", "rollout.max_new_tokens=128"]
    done = toolrl("eval", *common, "--set", "env.name=notes", "--policy", "reference", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["policy"] == "reference" and summary["success"] == 1.0 and summary["left_out"] == 0
    assert "reference policy" in done.stdout
    mine = toolrl("eval", *common, "--set", "env.name=notes", "--policy", "first-request")
    assert mine.returncode == 0, mine.stderr[-2000:]
    unknown = toolrl("eval", *common, "--set", "env.name=notes", "--policy", "oracle")
    assert unknown.returncode != 0
    last = unknown.stderr.strip().splitlines()[-1]
    assert "oracle" in last and "reference" in last and "idle" in last
    assert notes_env.TASKS  # the fixture module is the one the command imported
