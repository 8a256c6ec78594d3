"""The `built` environment (what `toolrl env build` deploys): the reference calls score 100% and doing nothing 0%
in every call syntax, with Solve-F1 per scenario; sub-problem accounting; multi-turn requests; injected noise
seen by the model and counted apart; one-line errors; built and trained from the command line."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolrl.build import build, load_spec
from toolrl.build.artifacts import SubProblem, Workspace
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.envs.built.notes import notes, plan_of
from toolrl.envs.built.scoring import arguments_match, solved_subproblems
from toolrl.errors import ConfigError
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.scripted import scripted_engine
from toolrl.tools import ToolExecutor
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.train.evaluate import breakdown, summarize

ROOT = Path(__file__).parents[2]
SMALL = {"train_per_scenario": 2, "test_per_scenario": 2}


@pytest.fixture(scope="module")
def built_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("built")
    build(load_spec(None, SMALL), Workspace(folder))
    return folder


@pytest.fixture(scope="module")
def multi_turn_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("built-mt")
    build(load_spec(None, {**SMALL, "scale": {"multi_turn": 1.0}}), Workspace(folder))
    return folder


def built_env(path, *overrides, parser=None):
    config = load_config(overrides=["env.name=built", f"env.options.path={path}", *overrides])
    return make_env(config.env, parser=parser)


def play(env, chat, tasks, idle=False, seed=None, first=0):
    # Each call of a built tool runs its code in a fresh sandbox process; 80 trajectories' calls at once on a
    # loaded 2-core machine took 4-10 s each, and the default 10 s timeout failed reference calls. What these
    # tests check is the scoring, not the latency: a timeout no shared CI machine reaches.
    executor = ToolExecutor(env.tools(), timeout_s=300.0)
    rollout = Rollout(env, None, chat, env.syntax, executor, RolloutLimits(8, 256, 4000, 200))
    rollout.engine = scripted_engine("idle" if idle else "reference", chat, env.syntax, env)
    return rollout.run(tasks, seed, first)


@pytest.mark.parametrize("parser", ["hermes", "pythonic", "llama3-json"])
def test_the_reference_calls_score_everything_and_doing_nothing_scores_nothing(built_dir, chat, parser):
    env = built_env(built_dir, parser=parser)
    tasks = env.tasks("test")
    assert {t.meta["category"] for t in tasks} == {
        "single_hop",
        "parallel_single_hop",
        "multi_hop",
        "parallel_multi_hop",
    }
    trajs = play(env, chat, tasks)
    assert summarize(trajs, "correct")["success"] == 1.0
    report = breakdown(trajs, "correct")
    assert all(c["success"] == 1.0 and c["solve_f1"] == 1.0 for c in report["by_category"].values())
    for t in trajs:  # FTRL's reward with every sub-problem solved by exactly its calls: 2n/(n+1) + 1
        n = len(t.task.meta["subproblems"])
        assert t.rewards["ftrl"] == pytest.approx(2 * n / (n + 1) + 1)
    idle = play(env, chat, tasks, idle=True)
    assert summarize(idle, "correct")["success"] == 0.0 and all(t.rewards["solve_f1"] == 0 for t in idle)


def test_calls_match_sub_problems_by_their_arguments():
    assert arguments_match({"city": " ost ", "verbose": True}, {"city": "Ost"})  # optional extras are fine
    assert arguments_match({"city": ["Wey", "Ost"]}, {"city": ["Ost"]})  # a list containing the name
    assert arguments_match({"city": {"name": "Ost"}}, {"city": {"name": "ost"}})
    assert not arguments_match({"city": "Wey"}, {"city": "Ost"})
    assert not arguments_match({"town": "Ost"}, {"city": "Ost"})
    calls = [{"name": "pop", "arguments": {"city": ["Ost"]}}, {"name": "pop", "arguments": {"city": ["Wey"]}}]
    both = ToolResult(ToolCall("pop", {"city": ["Ost", "Wey"]}), "{}")
    failed = ToolResult(ToolCall("pop", {"city": ["Ost"]}), "error", "tool_error")
    assert solved_subproblems([both], calls) == 2 and solved_subproblems([failed], calls) == 0


def test_multi_turn_tasks_ask_one_sub_problem_per_request(multi_turn_dir, chat):
    env = built_env(multi_turn_dir)
    tasks = [t for t in env.tasks("test") if t.meta.get("requests")]
    assert tasks and all(len(t.meta["requests"]) == len(t.meta["subproblems"]) for t in tasks)
    trajs = play(env, chat, tasks)
    assert summarize(trajs, "correct")["success"] == 1.0
    for t in trajs:
        assert t.user_messages == t.task.meta["requests"][1:]
        assert [i["solved"] for i in t.infos if "solved" in i] == [True] * len(t.task.meta["requests"])
    assert breakdown(trajs, "correct")["by_request"]["2"]["success"] == 1.0


def test_injected_noise_is_seen_by_the_model_and_not_counted_as_its_calls(built_dir, chat):
    always = built_env(built_dir, "env.options.noise=1.0")
    trajs = play(always, chat, always.tasks("test"))
    for t in trajs:
        assert t.results and all(r.error or "not the one asked for" in r.content for r in t.results)
        assert t.rewards["injected_faults"] == len(t.results)
        assert t.rewards["solve_p"] == 0.0  # p excludes the injected results, none of which solves anything
    assert any("try the call again" in r.content for t in trajs for r in t.results)
    half = built_env(built_dir, "env.options.noise=0.5")
    trajs = play(half, chat, half.tasks("test"))
    injected = sum(t.rewards["injected_faults"] for t in trajs)
    calls = sum(len(t.results) for t in trajs)
    assert 0 < injected < calls
    again = play(half, chat, half.tasks("test"))  # faults are drawn per episode: another draw, same rate
    assert [t.rewards["injected_faults"] for t in again] != [t.rewards["injected_faults"] for t in trajs] or injected


def test_a_seeded_trajectory_meets_the_same_injected_faults_whatever_runs_beside_it(built_dir, chat):
    """Faults draw from the trajectory's own stream (seeds.episode): the same in a batch of one, in the whole
    split, and in a fresh environment (a resumed run), not from a count of the episodes started before."""
    env = built_env(built_dir, "env.options.noise=0.5")
    tasks = env.tasks("test")
    whole = play(env, chat, tasks, seed=11)
    faults = [[r.content for r in t.results] for t in whole]
    assert 0 < sum(t.rewards["injected_faults"] for t in whole) < sum(len(t.results) for t in whole)
    fresh = built_env(built_dir, "env.options.noise=0.5")
    last = play(fresh, chat, tasks[-1:], seed=11, first=len(tasks) - 1)
    assert [r.content for r in last[0].results] == faults[-1]
    assert [[r.content for r in t.results] for t in play(env, chat, tasks, seed=11)] == faults
    other = play(env, chat, tasks, seed=12)
    assert [[r.content for r in t.results] for t in other] != faults


def test_a_missing_build_is_one_line_saying_how_to_make_it(tmp_path):
    with pytest.raises(
        ConfigError, match=r"env\.options\.path: .* has no deploy/deploy\.json; build it first: toolrl env build"
    ):
        built_env(tmp_path)
    with pytest.raises(ConfigError, match=r"env\.options of built: env\.options\.path is required"):
        make_env(load_config(overrides=["env.name=built"]).env)


@pytest.mark.slow
def test_built_from_the_command_line_and_trained_two_steps(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def toolrl(*args):
        return subprocess.run(
            [sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, cwd=tmp_path, env=env
        )

    spec = tmp_path / "spec.yaml"
    spec.write_text("train_per_scenario: 4\ntest_per_scenario: 2\nscale:\n  noise: 0.2\n  multi_turn: 0.5\n")
    made = toolrl("env", "build", str(spec), "--source", "synthetic", "--seed", "0", "--all", "--out", "built")
    assert made.returncode == 0, made.stderr
    assert "stage deploy: done" in made.stderr and "train on it" in made.stdout
    scenarios = "single_hop 6, parallel_single_hop 6, multi_hop 6, parallel_multi_hop 6"
    assert f"tasks per scenario: {scenarios}" in made.stdout
    manifest = json.loads((tmp_path / "built" / "build.json").read_text())
    assert manifest["deploy"]["tools_dropped"] == 0 and manifest["decompose"]["tasks"] == 24
    trained = toolrl(
        "train", str(ROOT / "recipes" / "built.yaml"),
        "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=2",
        "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=8",
        "--set", "sft.keep=all",  # 8-token turns cut the reference's warm start short of success: learn from all
        "--set", "eval.at_start=false", "--set", "eval.at_end=false", "--set", f"output_dir={tmp_path / 'runs'}",
        "--set", "run_name=run",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step" in s and "eval" not in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert all("reward/ftrl" in s and "reward/solve_f1" in s and "reward/injected_faults" in s for s in steps)


def test_in_context_examples_show_the_tasks_tool_on_another_entity(built_dir):
    env = built_env(built_dir)
    tasks = [t for t in env.tasks("test") if env._own_example(t) is not None]  # a train task uses its tool
    assert len(tasks) >= len(env.tasks("test")) // 2
    for task in tasks:
        messages = env.messages(task)
        shown = [m["content"] for m in messages[1:-1] if m["role"] == "assistant" and "tool_call" in m["content"]]
        first = task.meta["subproblems"][0]
        assert first["name"] in shown[-1]  # the exchange just before the question calls the task's first tool
        entity = json.dumps(first["arguments"])
        assert all(entity not in m["content"] for m in messages[:-1])  # never on the task's own arguments
    generic = built_env(built_dir, "env.options.examples=generic")
    task = generic.tasks("test")[0]
    assert task.meta["subproblems"][0]["name"] not in json.dumps(generic.messages(task)[:-1])


def test_a_real_shaped_multi_hop_set_is_solved_by_its_reference_and_by_nothing_else(tmp_path, chat):
    """Decompositions as published sets give them: comparisons whose answer is neither sub-problem's, fan-outs
    over a list answer (several sinks, every answer required), chains of up to four hops."""
    from tests.harness import multihop

    rows = multihop.questions(80)
    path = tmp_path / "decompositions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = build(load_spec(None, {"source": "decompositions", "tasks": {"path": str(path)}}), Workspace(tmp_path))
    assert manifest["deploy"]["tasks"] == 80
    env = built_env(tmp_path)
    tasks = env.tasks("train") + env.tasks("test")
    by_id = {t.id: t for t in tasks}
    compared = [r for r in rows if "answer" in r]
    fans = [r for r in rows if r["subproblems"][0]["kind"] == "band.members"]
    assert compared and fans
    assert by_id[compared[0]["id"]].meta["answers"] == [compared[0]["answer"]]
    assert len(by_id[fans[0]["id"]].meta["answers"]) == len(fans[0]["subproblems"]) - 1
    trajs = play(env, chat, tasks)
    assert summarize(trajs, "correct")["success"] == 1.0
    assert breakdown(trajs, "correct")["solve"]["f1"] == 1.0
    assert summarize(play(env, chat, tasks, idle=True), "correct")["success"] == 0.0


def test_a_splits_first_tasks_cover_every_scenario(built_dir):
    """The builder writes tasks scenario by scenario; a warm start on the train split's first 96 of 240 had been
    single-hop and parallel single-hop only, and the second hop was never taught. The splits take the scenarios in
    turn, so that any first N (sft.num_tasks, eval.num_tasks) covers each, and the warm start says what it kept."""
    from toolrl.train.sft import progress_line

    env = built_env(built_dir)
    for split in ("train", "test"):
        tasks = env.tasks(split)
        assert len({t.meta["category"] for t in tasks[:4]}) == 4
        assert sorted(t.id for t in tasks) == sorted(json.loads(line)["id"] for line in
                                                     (built_dir / "4_tasks.jsonl").read_text().splitlines()
                                                     if json.loads(line)["split"] == split)  # fmt: skip
    line = {"sft_round": 1, "source": "reference", "played": 4, "kept": 4, "play_s": 1.0,
            "kept_by_category": {"single_hop": 2, "multi_hop": 2}}  # fmt: skip
    assert progress_line(line) == "sft round 1: reference played 4, kept 4 (single_hop 2, multi_hop 2) (1.0 s)"


def test_a_countdown_opens_every_turn_and_the_reference_still_scores_everything(built_dir, multi_turn_dir, chat):
    """env.options.countdown: each turn of the reference, of the in-context exchanges and (asked by the
    instructions) of the model opens with the rounds of calls still needed; the calls after it score as before,
    and each turn's token budget grows by the note's tokens."""
    env = built_env(built_dir, "env.options.countdown=true")
    tasks = env.tasks("test")
    trajs = play(env, chat, tasks)
    assert summarize(trajs, "correct")["success"] == 1.0 and all(t.num_format_errors == 0 for t in trajs)
    for t in trajs:
        needed = len(t.task.meta["rounds"])
        assert [text.split("\n")[0] for text in t.texts] == [f"Steps left: {n}" for n in range(needed, -1, -1)]
    assert {len(t.task.meta["rounds"]) for t in trajs} >= {1, 2}  # single and multi-hop both counted down
    messages = env.messages(tasks[0])
    assert "Begin every reply with `Steps left: N`" in messages[0]["content"]
    shown = [m["content"] for m in messages[1:-1] if m["role"] == "assistant"]
    firsts = "|".join(s.split("\n")[0] for s in shown)  # one call (1, 0) and the chain of two (2, 1, 0)
    assert all(s.startswith("Steps left: ") for s in shown) and "Steps left: 2|Steps left: 1|Steps left: 0" in firsts
    plain = built_env(built_dir)
    assert "Steps left" not in json.dumps(plain.messages(tasks[0]))  # off by default: the prompt as before
    run = RolloutLimits(8, 256, 4000, 200)
    with_notes, without = env.limits_for(tasks[0], run), plain.limits_for(tasks[0], run)
    assert with_notes.max_new_tokens == without.max_new_tokens + 8
    assert with_notes.max_response_tokens == without.max_response_tokens + 8 * with_notes.max_turns
    multi = built_env(multi_turn_dir, "env.options.countdown=true")
    (mt,) = [t for t in play(multi, chat, multi.tasks("test")) if t.task.meta.get("requests")][:1]
    assert mt.rewards["correct"] == 1.0
    assert [text.split("\n")[0] for text in mt.texts] == ["Steps left: 1", "Steps left: 0"] * len(mt.texts[::2])


def test_facts_left_copy_the_question_s_words_and_drop_one_fact_a_round(built_dir, multi_turn_dir, chat):
    """env.options.countdown: facts: each turn opens with the facts still to look up in the question's own words
    (its parts separated by semicolons), one fact fewer per part each round, `Left: nothing` before the answer;
    the reference still scores everything, and the budget grows by the longest note."""
    env = built_env(built_dir, "env.options.countdown=facts")
    tasks = env.tasks("test")
    trajs = play(env, chat, tasks)
    assert summarize(trajs, "correct")["success"] == 1.0 and all(t.num_format_errors == 0 for t in trajs)
    for t in trajs:
        firsts = [text.split("\n")[0] for text in t.texts]
        assert len(firsts) == len(t.task.meta["rounds"]) + 1 and firsts[-1] == "Left: nothing"
        parts = firsts[0].removeprefix("Left: ").split("; ")
        assert all(f"the {part} of the " in t.task.question for part in parts)  # a copy of the question's words
        for before, after in itertools.pairwise(firsts[:-1]):  # each part loses its innermost fact
            left = [p.rpartition(" of the ")[0] for p in before.removeprefix("Left: ").split("; ")]
            assert after == "Left: " + "; ".join(p for p in left if p)
    by_shape = {t.task.meta["category"]: [x.split("\n")[0] for x in t.texts] for t in trajs}
    assert len(by_shape["multi_hop"]) >= 3 and " of the " in by_shape["multi_hop"][0]
    assert "; " in by_shape["parallel_single_hop"][0] and len(by_shape["parallel_single_hop"]) == 2
    messages = env.messages(tasks[0])
    assert "Begin every reply with `Left:`" in messages[0]["content"]
    shown = "|".join(m["content"].split("\n")[0] for m in messages[1:-1] if m["role"] == "assistant")
    assert "Left: colour of the favourite fruit|Left: colour|Left: nothing" in shown
    run = RolloutLimits(8, 256, 4000, 200)
    multi_hop = next(t for t in tasks if t.meta["category"] == "multi_hop")
    grown = (
        env.limits_for(multi_hop, run).max_new_tokens - built_env(built_dir).limits_for(multi_hop, run).max_new_tokens
    )
    assert grown >= len("Left: population of the headquarters of the employer") // 4  # the longest note fits
    multi = built_env(multi_turn_dir, "env.options.countdown=facts")
    (mt,) = [t for t in play(multi, chat, multi.tasks("test")) if t.task.meta.get("requests")][:1]
    assert mt.rewards["correct"] == 1.0
    firsts = [text.split("\n")[0] for text in mt.texts]
    assert firsts[1::2] == ["Left: nothing"] * len(firsts[1::2]) and all(f != "Left: nothing" for f in firsts[::2])
    with pytest.raises(ConfigError, match=r"env\.options\.countdown"):
        built_env(built_dir, "env.options.countdown=plan")


def test_a_plan_follows_each_part_back_to_its_entity():
    """The chains behind the notes: a part per sub-problem nothing depends on, its facts by round."""
    subs = [SubProblem(id=i, question="", kind=k, arguments={}, answer="", depends_on=d) for i, k, d in [
        ("a1", "company.founder", []), ("a2", "person.employer", ["a1"]), ("a3", "company.headquarters", ["a2"]),
        ("b1", "person.birth year", []),
    ]]  # fmt: skip
    plan = plan_of(subs)
    assert plan == [[("founder", 0), ("employer", 1), ("headquarters", 2)], [("birth year", 0)]]
    assert notes("facts", plan) == (
        "Left: headquarters of the employer of the founder; birth year\n",
        "Left: headquarters of the employer\n",
        "Left: headquarters\n",
        "Left: nothing\n",
    )
    assert notes("steps", plan) == tuple(f"Steps left: {n}\n" for n in (3, 2, 1, 0))
