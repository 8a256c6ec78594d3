"""A small sample of bench/credit.py: the tiny model, one seed, two steps, both arms (outcome-only and dense turn
credit) on the calculator recipe (a warm start, then RL: the dense arms' credit is scored by the warm-started
policy); the results hold each arm's before and after and their difference."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]


def credit(tmp_path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "credit.py"), "--quick", "--recipes", "demo",
                           "--out", str(tmp_path / "credit.json"), "--runs", str(tmp_path / "runs"), *args],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_arms_train_side_by_side_and_each_difference_is_reported(tmp_path):
    out = tmp_path / "credit.json"
    done = credit(tmp_path, "--side-by-side")
    arms = ["outcome", "dense", "dense_coef0.1", "dense_prob", "igpo"]
    assert all(f"[{arm}] " in done.stdout for arm in arms)  # each arm's lines
    entry = json.loads(out.read_text())["demo"]
    assert set(entry["vs_outcome"]) == set(arms[1:])
    for arm, pair in entry["vs_outcome"].items():
        assert pair["seeds"] == [0] and {"greedy_before", "greedy_after", "sampled_after"} <= set(pair[arm])
        assert pair["greedy_after_delta"] == round(pair[arm]["greedy_after"] - pair["outcome"]["greedy_after"], 4)
        assert f"{arm} - outcome, greedy after" in done.stdout
    assert entry["machine"]["cores"] > 0 and entry["steps"] == 2
    outcome = next((tmp_path / "runs" / "outcome").rglob("metrics.jsonl")).parent
    assert not (outcome / "warm_start").exists()  # no KL, no credit: nothing to score with, nothing kept
    runs = [(r["seeds"], r["arms"], r["side_by_side"]) for r in entry["runs"]]
    assert runs == [([0], arms, True)]
    assert "load_before" in entry["runs"][0] and entry["runs"][0]["commit"]
    for arm, coef, measure, advantage in (
        ("dense", 1.0, "logprob", "grpo"),
        ("dense_coef0.1", 0.1, "logprob", "grpo"),
        ("dense_prob", 1.0, "prob", "grpo"),
        ("igpo", 1.0, "prob", "igpo"),
    ):
        run = next((tmp_path / "runs" / arm).rglob("metrics.jsonl")).parent
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert any("credit/scored" in s for s in steps)  # the dense arms did credit turns
        assert (run / "warm_start" / "trainable.safetensors").is_file()  # scored by the warm-started policy
        train = yaml.safe_load((run / "config.yaml").read_text())["train"]
        assert (train["turn_credit"]["coef"], train["turn_credit"]["measure"], train["advantage"]) == (
            coef,
            measure,
            advantage,
        )


def test_an_arm_run_alone_waits_for_the_other_and_runs_are_kept(tmp_path):
    first = credit(tmp_path, "--arms", "outcome")
    assert "credit: demo: dense and outcome hold no seed in common (run --arms dense)" in first.stdout
    entry = json.loads((tmp_path / "credit.json").read_text())["demo"]
    assert entry["vs_outcome"] == {} and [r["arms"] for r in entry["runs"]] == [["outcome"]]
    credit(tmp_path, "--arms", "dense")
    entry = json.loads((tmp_path / "credit.json").read_text())["demo"]
    assert set(entry["vs_outcome"]) == {"dense"}  # the other dense arms not run: not compared
    pair = entry["vs_outcome"]["dense"]
    assert pair["seeds"] == [0] and pair["outcome"]["args"]["seeds"] == pair["dense"]["args"]["seeds"] == [0]
    assert [r["arms"] for r in entry["runs"]] == [["outcome"], ["dense"]]  # both runs' load and commit kept
    credit(tmp_path, "--arms", "dense")  # measured again: its run replaces the earlier one
    runs = json.loads((tmp_path / "credit.json").read_text())["demo"]["runs"]
    assert [r["arms"] for r in runs] == [["outcome"], ["dense"]]


def test_arms_are_compared_on_the_seeds_both_hold():
    sys.path.insert(0, str(ROOT / "bench"))
    from credit import on_seeds

    def row(g: float) -> dict:
        return {"greedy_before": 0.2, "greedy_after": g, "sampled_before": 0.0, "sampled_after": g / 2}

    outcome = {"args": {"seeds": [0, 1], "steps": 20}, "seeds": [row(0.5), row(0.9)], "greedy_after": 0.7}
    alone = on_seeds(outcome, [0])  # the dense arm holds seed 0 only so far
    assert alone["greedy_after"] == 0.5 and alone["sampled_after"] == 0.25 and alone["seeds"] == [row(0.5)]
    assert alone["args"] == {"seeds": [0], "steps": 20} and alone["spread"]["greedy_after"] == 0.0
