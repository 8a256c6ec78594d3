"""`toolrl env check` on a faithful port of a benchmark (issue 51, items 1 and 2): an environment declares the
idle success it expects (per task, "passes without action", or as a bound) and the check judges the idle policy
against it, printing both; every rollout limit that cut a reference is named, one line each, with the value that
would fit. The port is a plug-in environment outside the package (tests/fixtures/airline_env.py)."""

import json
import re
from types import SimpleNamespace

import pytest

from tests.test_cli_usage import run
from toolrl.envs.check import IdleExpectation, PolicyScore, limits_cut, problems, use_of

PORT = ["--set", "plugins=[tests.fixtures.airline_env]", "--set", "env.name=airline-port"]


@pytest.fixture
def check(tiny_model_dir, monkeypatch, capsys):
    """`toolrl env check` on the port, in this process (as a user's shell runs it, without the start-up cost)."""

    def run_check(*extra):
        argv = ["env", "check", "--set", f"model.name={tiny_model_dir}", *PORT, "--set", "rollout.max_new_tokens=128"]
        code, out, err = run([*argv, *extra], monkeypatch, capsys)
        assert "Traceback" not in err, err[-2000:]
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run_check


@pytest.mark.slow
def test_a_port_whose_idle_policy_passes_some_tasks_by_design(check):
    marked = check()  # 2 of 5 tasks expect no change: the env marks them
    assert marked.returncode == 0, marked.stdout
    assert ("idle policy: 40.0% of 5 tasks; 2 pass without action by design (the env marks them; 2 of them "
            "passed), the other 3: 0.0% (want <= 5%: the default bound)") in marked.stdout  # fmt: skip

    unmarked = check("--set", "env.options.mark=false")  # the same port, saying nothing
    assert unmarked.returncode == 1
    assert "env airline-port is wrong: idle policy success 40.0% (want <= 5%: the default bound)" in unmarked.stdout

    declared = check("--set", "env.options.mark=false", "--set", "env.options.declared=0.5")
    assert declared.returncode == 0, declared.stdout
    assert "idle policy: 40.0% of 5 tasks (want <= 50%: the env's bound (max_idle_success))" in declared.stdout
    overridden = check("--set", "env.options.mark=false", "--set", "env.options.declared=0.5",
                       "--max-idle", "0.1", "--json")  # fmt: skip
    verdict = json.loads(overridden.stdout)
    assert overridden.returncode == 1 and not verdict["ok"]
    idle = next(p for p in verdict["policies"] if p["policy"] == "idle")
    assert idle["problems"] == ["idle policy success 40.0% (want <= 10%: --max-idle)"]


@pytest.mark.slow
def test_each_limit_that_cut_a_reference_is_named_with_the_value_that_fits(check):
    """A long booking call cut by rollout.max_new_tokens (it had shown only as a format error) and three
    cancellations in one turn past rollout.max_calls_per_turn: one line each, with what would fit; raised to
    those values, the reference passes."""
    cut = check("--set", "env.options.passengers=20", "--set", "rollout.max_calls_per_turn=2",
                "--json")  # fmt: skip
    verdict = json.loads(cut.stdout)
    assert cut.returncode == 1 and len(verdict["limits_cut"]) == 2, verdict
    tokens, calls = verdict["limits_cut"]
    assert tokens.startswith("rollout.max_new_tokens 128 cut 1 of 5 reference trajectories: ")
    assert (
        calls
        == "rollout.max_calls_per_turn 2 cut 1 of 5 reference trajectories: 3 would fit (the most calls in one turn)"
    )
    fits = int(tokens.split(": ")[1].split()[0])
    raised = check("--set", "env.options.passengers=20", "--set", f"rollout.max_new_tokens={fits}",
                   "--set", "rollout.max_calls_per_turn=3", "--json")  # fmt: skip
    assert raised.returncode == 0 and json.loads(raised.stdout)["limits_cut"] == [], raised.stdout


def trajectory(turns, texts, results, response):
    spans = [("prompt", 0, 10)] + [("model", 10, 10 + n) for n in turns]
    segment = SimpleNamespace(spans=spans, token_ids=[0] * (10 + response))
    results = [SimpleNamespace(content=c) for c in results]
    return SimpleNamespace(spans=spans, num_turns=len(turns), texts=texts, response_length=response, results=results,
                           sequences=lambda: [segment])  # fmt: skip


def test_the_limits_named_and_the_values_that_fit():
    """Every limit a reference needs more of than the run gives (turns, tokens per turn, calls per turn, tool
    result tokens, response tokens) is one line with the largest need among the failed references."""
    count_calls = lambda text: text.count("call")  # noqa: E731
    count_tokens = lambda text: len(text.split())  # noqa: E731
    uses = [
        use_of(trajectory([40, 300], ["call call call", "done"], ["a " * 700], 1500), count_calls, count_tokens),
        use_of(trajectory([20] * 5, ["call"] * 5, ["b"], 200), count_calls, count_tokens),
    ]
    assert uses[0] == {"max_turns": 2, "max_new_tokens": 300, "max_calls_per_turn": 3, "max_observation_tokens": 700,
                       "max_response_tokens": 1500, "max_context_tokens": 1510}  # fmt: skip
    limits = {"max_turns": 3, "max_new_tokens": 256, "max_calls_per_turn": 2, "max_observation_tokens": 512,
              "max_response_tokens": 1024, "max_context_tokens": None}  # fmt: skip
    assert limits_cut(uses, limits, played=10) == [
        "rollout.max_turns 3 cut 1 of 10 reference trajectories: 5 would fit (the most model turns one plays)",
        "rollout.max_new_tokens 256 cut 1 of 10 reference trajectories: 300 would fit (its longest turn, in tokens)",
        "rollout.max_calls_per_turn 2 cut 1 of 10 reference trajectories: 3 would fit (the most calls in one turn)",
        "rollout.max_observation_tokens 512 cut 1 of 10 reference trajectories: 700 would fit (its longest tool "
        "result, in tokens)",
        "rollout.max_response_tokens 1024 cut 1 of 10 reference trajectories: 1500 would fit (its longest response "
        "after the prompt, in tokens)",
    ]
    assert limits_cut(uses, {k: 10**6 for k in limits}, played=10) == []
    assert limits_cut(uses, {**{k: 10**6 for k in limits}, "max_context_tokens": 1000}, played=10) == [
        "rollout.max_context_tokens 1000 cut 1 of 10 reference trajectories: 1510 would fit (its longest segment, "
        "prompt included, in tokens; or let rollout.context compact it: sliding_window, summarize, fold)"
    ]


def test_the_idle_verdict_judges_the_unmarked_tasks_against_the_declared_bound():
    idle = PolicyScore("idle", 10, 0, 0.5, 0.5, 0.0, 0.0, by_design=(4, 4), others=(6, 1 / 6))
    assert problems(idle, idle=IdleExpectation(0.2, "the env's bound (max_idle_success)")) == []
    assert problems(idle, idle=IdleExpectation(0.05, "the default bound")) == [
        "idle policy success 16.7% on the 6 tasks not marked to pass without action (want <= 5%: the default bound)"
    ]
    unmarked = PolicyScore("idle", 10, 0, 0.5, 0.5, 0.0, 0.0, by_design=(0, 0), others=(10, 0.5))
    assert problems(unmarked, idle=0.05) == ["idle policy success 50.0% (want <= 5%: the default bound)"]


STUMBLE = ["--set", "plugins=[tests.fixtures.stumble_env]", "--set", "env.name=stumble"]


def test_a_reference_that_succeeds_but_stumbles_fails_the_check_naming_the_limit(tiny_model_dir, monkeypatch, capsys):
    """Issue 73: with the default 48-token turn, reference calls were cut (format errors) while success, which reads
    the final answer alone, showed 100%, and the check said ok. Format errors, calls past the turn's limit (fewer
    calls than planned) and failed calls fail it, naming the limit to raise where one explains them."""

    def check(*extra):
        argv = ["env", "check", "--set", f"model.name={tiny_model_dir}", *STUMBLE, "--json", *extra]
        code, out, err = run(argv, monkeypatch, capsys)
        assert "Traceback" not in err, err[-2000:]
        verdict = json.loads(out)
        reference = next(p for p in verdict["policies"] if p["policy"] == "reference")
        return code, verdict, reference

    code, verdict, reference = check()
    assert code == 0 and reference["success"] == 1.0 and reference["stumbled"] == 0, verdict

    code, verdict, reference = check("--set", "env.options.note_chars=400", "--set", "rollout.max_new_tokens=48")
    assert code == 1 and reference["success"] == 1.0, verdict  # it succeeded: the answer alone is read
    assert reference["problems"] == ["reference policy stumbled in 6 of 6 tasks (format errors in 6, fewer calls "
                                     "than planned in 6; want none)"]  # fmt: skip
    assert verdict["limits_cut"][0].startswith("rollout.max_new_tokens 48 cut 6 of 6 reference trajectories: ")

    code, verdict, reference = check(
        "--set", "env.options.calls=3", "--set", "rollout.max_calls_per_turn=2", "--set", "rollout.max_new_tokens=128"
    )
    assert code == 1 and reference["flaw_counts"]["fewer calls than planned"] == 6, verdict
    assert verdict["limits_cut"] == ["rollout.max_calls_per_turn 2 cut 6 of 6 reference trajectories: 3 would fit "
                                     "(the most calls in one turn)"]  # fmt: skip

    code, verdict, reference = check("--set", "env.options.fail=true")
    assert code == 1 and reference["flaw_counts"] == {"failed calls": 6} and verdict["limits_cut"] == [], verdict


def test_a_reference_shown_its_results_in_part_fails_the_check_naming_the_limit(tiny_model_dir, monkeypatch, capsys):
    """Issue 77 item 2: with rollout.max_observation_tokens so low that the tool results lost what the task needs,
    the reference still answered (from its own knowledge) and the check passed. The results cut are counted, the
    check fails, and the limit is named with the value that fits; raised to it, the check passes."""
    argv = ["env", "check", "--set", f"model.name={tiny_model_dir}", *STUMBLE, "--set", "env.options.echo=true",
            "--set", "env.options.note_chars=200", "--set", "rollout.max_new_tokens=256"]  # fmt: skip
    code, out, err = run([*argv, "--set", "rollout.max_observation_tokens=8"], monkeypatch, capsys)
    assert code == 1 and "Traceback" not in err, out
    said = " ".join(out.split())
    assert ("rollout.max_observation_tokens 8 cut 6 of the 6 tool results the reference was shown: what a task needs "
            "may be in the part cut off") in said  # fmt: skip
    assert "reference policy stumbled in 6 of 6 tasks (observations cut in 6; want none)" in said
    fits = re.search(r"rollout.max_observation_tokens 8 cut 6 of 6 reference trajectories: (\d+) would fit", said)
    assert fits, said
    code, out, _ = run([*argv, "--set", f"rollout.max_observation_tokens={fits.group(1)}", "--json"], monkeypatch,
                       capsys)  # fmt: skip
    verdict = json.loads(out)
    reference = next(p for p in verdict["policies"] if p["policy"] == "reference")
    assert code == 0 and reference["observations_cut"] == [0, 6], verdict


def test_a_stumble_no_limit_explains_says_where_to_look(tiny_model_dir, monkeypatch, capsys):
    argv = ["env", "check", "--set", f"model.name={tiny_model_dir}", *STUMBLE, "--set", "env.options.fail=true"]
    code, out, _ = run(argv, monkeypatch, capsys)
    assert code == 1
    assert ("env stumble is wrong: reference policy stumbled in 6 of 6 tasks (failed calls in 6; want none); no "
            "rollout limit explains where it stumbled: read its trajectories (toolrl eval --policy reference --out "
            "DIR)") in " ".join(out.split())  # fmt: skip


def test_the_check_says_where_each_rollout_limit_came_from(tiny_model_dir, monkeypatch, capsys):
    """Issue 77 item 3: a config's rollout.max_turns had silently overridden the environment's rollout_defaults.
    The check names each limit it played under and where it came from: the config, the environment, or toolrl's
    default."""
    argv = ["env", "check", "--set", f"model.name={tiny_model_dir}", "--set", "env.name=support", "--num-tasks", "2",
            "--set", "rollout.max_observation_tokens=200"]  # fmt: skip
    code, out, _ = run(argv, monkeypatch, capsys)
    assert code == 0, out
    assert (
        "rollout limits: max_turns 6 (environment), max_new_tokens 96 (environment), max_calls_per_turn 16 "
        "(default), max_observation_tokens 200 (config), max_response_tokens 768 (environment)"
    ) in out
    code, out, _ = run([*argv, "--set", "rollout.max_turns=2", "--json"], monkeypatch, capsys)
    limits = json.loads(out)["rollout_limits"]
    assert limits["max_turns"] == {"value": 2, "from": "config"}  # the config's choice wins, and says so
    assert limits["max_new_tokens"] == {"value": 96, "from": "environment"}
    assert limits["max_context_tokens"] == {"value": None, "from": "default"}
