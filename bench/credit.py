"""Benchmark: dense turn credit (train.turn_credit) against outcome-only GRPO. For each recipe, the same training
in each arm over the same seeds: `outcome` (the recipe as it is), `dense` (train.turn_credit.model: reference, the
run's initial policy, on a warm-started recipe the warm-started one, scoring log p(gold | context) at each tool
boundary), `dense_coef0.1` (the same credits weighed a tenth), `dense_prob` (changes of IGPO's p(gold | context),
bounded: train.turn_credit.measure prob) and `igpo` (those credits per turn, through IGPO's estimator:
train.advantage igpo).
Greedy and sampled success on the test split before and after, per seed, from bench/learning.py (one process per
arm, so each arm's results and log are its own); reported whether dense credit helps or not.

    python bench/credit.py                                     # search-r1 and built, seeds 0 1 2, 20 steps
    python bench/credit.py --recipes search-r1 --seeds 0       # one recipe, one seed (seeds merge across runs)
    python bench/credit.py --recipes search-r1 --seeds 1 --side-by-side   # the arms at once, 1 thread each
    python bench/credit.py --quick                             # the tiny model, 1 seed, 2 steps: the suite's sample

Writes bench/results/credit.json: {recipe: {vs_outcome: {ARM: {seeds, outcome: {...}, ARM: {...},
greedy_after_delta, sampled_after_delta}}, machine, steps, runs: [{seeds, arms, commit, load_before, load_after}]}},
each arm's entry learning.py's (means over seeds, each seed's values, spread) over the seeds it and outcome hold.
A seed run again, or in another process, merges by seed as learning.py does. With --side-by-side the arms run at
once, one torch thread each (2 cores: about the time of one arm, and both arms see the same load); each arm's lines
come to stdout prefixed with its name. --arms runs some arms (an arm's seeds merge into credit.ARM.json); each arm is
compared with outcome on the seeds both hold, and each run's seeds, arms, commit and load are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from common import ROOT, git_head, locked, machine, write_results
from learning import summary

CREDIT, PROB = "train.turn_credit.model=reference", "train.turn_credit.measure=prob"
ARMS = {"outcome": [], "dense": [CREDIT], "dense_coef0.1": [CREDIT, "train.turn_credit.coef=0.1"],
        "dense_prob": [CREDIT, PROB], "igpo": [CREDIT, PROB, "train.advantage=igpo"]}  # fmt: skip
"""Each arm's overrides of the recipe. `dense` credits turns at coef 1 (a turn's log-probability change is several
nats, the outcome reward at most 1); `dense_coef0.1` weighs them a tenth as much; `dense_prob` credits changes of
the answer's per-token probability (each in [-1, 1]; a trajectory's sum p_T - p_0, under GRPO a bonus of p_T in
[0, 1] beside the outcome reward, which the group's std then scales up where the outcomes tie); `igpo` gives the
same bounded credits to IGPO's turn-level estimator (train.advantage: igpo: each turn its own credit, the last turn
the outcome, standardized over the group's turns, summed to go)."""


def arm_command(arm: str, recipes: list[str], args, out: Path) -> list[str]:
    """bench/learning.py's command line for one arm, writing its results to `out`."""
    command = [sys.executable, str(ROOT / "bench" / "learning.py"), "--recipes", *recipes,
               "--seeds", *map(str, args.seeds), "--out", str(out), "--runs", str(Path(args.runs) / arm)]  # fmt: skip
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    if args.quick:
        command.append("--quick")
    if args.side_by_side:
        command += ["--threads", "1"]
    for override in [*ARMS[arm], *args.set]:
        command += ["--set", override]
    print(f"credit: {arm}: {' '.join(command[1:])}", flush=True)
    return command


def relay(arm: str, stream) -> None:
    """An arm's output, line by line, prefixed with its name (arms side by side share the terminal)."""
    for line in stream:
        print(f"[{arm}] {line}", end="", flush=True)


def run_arms(recipes: list[str], args, out: Path) -> dict[str, dict]:
    """Each arm's results: one after the other, or (--side-by-side) at once; an arm that fails stops the bench
    with its exit status after the other has finished (what it measured is kept in its own results file)."""
    files = {arm: out.with_name(f"{out.stem}.{arm}.json") for arm in ARMS}
    commands = {arm: arm_command(arm, recipes, args, files[arm]) for arm in args.arms}
    if not args.side_by_side:
        for command in commands.values():
            subprocess.run(command, check=True, cwd=ROOT)
    else:
        procs = {arm: subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for arm, c in commands.items()}  # fmt: skip
        relays = [threading.Thread(target=relay, args=(arm, p.stdout), daemon=True) for arm, p in procs.items()]
        for thread in relays:
            thread.start()
        codes = {arm: p.wait() for arm, p in procs.items()}
        for thread in relays:
            thread.join()
        for arm, code in codes.items():
            if code:
                raise subprocess.CalledProcessError(code, commands[arm])
    return {arm: json.loads(path.read_text()) if path.is_file() else {} for arm, path in files.items()}


def on_seeds(entry: dict, seeds: list[int]) -> dict:
    """An arm's entry (learning.py's) summarized over `seeds` alone: arms are compared on the seeds both hold."""
    rows = dict(zip(entry["args"]["seeds"], entry["seeds"], strict=True))
    return {**entry, **summary([rows[s] for s in seeds]), "args": {**entry["args"], "seeds": seeds}}


def repeats(run: dict, args) -> bool:
    """Whether this run measures again every seed and arm an earlier run (a `runs` entry) measured."""
    return set(run["seeds"]) <= set(args.seeds) and set(run.get("arms", ARMS)) <= set(args.arms)


def delta(dense: dict, outcome: dict, key: str) -> float | None:
    if key not in dense or key not in outcome:
        return None
    return round(dense[key] - outcome[key], 4)


def comparisons(arms: dict[str, dict], recipe: str) -> dict[str, dict]:
    """Each dense arm against outcome-only on `recipe`, on the seeds both hold (an arm holding none is named)."""
    pairs, outcome = {}, arms["outcome"].get(recipe)
    for arm in [a for a in ARMS if a != "outcome"]:
        held = arms[arm].get(recipe)
        seeds = sorted(set(outcome["args"]["seeds"]) & set(held["args"]["seeds"])) if outcome and held else []
        if not seeds:
            missing = " and ".join(f"--arms {a}" for a, e in (("outcome", outcome), (arm, held)) if not e)
            print(f"credit: {recipe}: {arm} and outcome hold no seed in common (run {missing or 'a seed'})")
            continue
        treated, control = on_seeds(held, seeds), on_seeds(outcome, seeds)
        pairs[arm] = {"seeds": seeds, "outcome": control, arm: treated,
                      "greedy_after_delta": delta(treated, control, "greedy_after"),
                      "sampled_after_delta": delta(treated, control, "sampled_after")}  # fmt: skip
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["search-r1", "built"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], help="a config override for both arms")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 1 seed, 2 steps (learning.py --quick)")
    parser.add_argument("--out", default=None, help="default: bench/results/credit.json (--quick: a temporary one)")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "credit"))
    parser.add_argument("--side-by-side", action="store_true", help="the arms at once, one torch thread each")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                        help="the arms to run (an arm's seeds merge into its own results; the comparison is made on "
                             "the seeds both arms hold)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.recipes, args.seeds, args.steps = args.recipes[:1], args.seeds[:1], 2
        args.out = args.out or str(Path(tempfile.mkdtemp()) / "credit.json")
    out = Path(args.out or ROOT / "bench" / "results" / "credit.json")
    load_before, commit = os.getloadavg()[0], git_head()
    arms = run_arms(args.recipes, args, out)
    with locked(out):  # arms run as separate invocations side by side may finish together
        results = json.loads(out.read_text()) if out.is_file() else {}
        compared = []
        for recipe in args.recipes:
            kept = results.get(recipe, {})  # its runs and comparisons; machine and steps are written anew
            entry = results[recipe] = {"runs": kept.get("runs", []), "vs_outcome": kept.get("vs_outcome", {})}
            # each run's seeds, arms, commit and load: a run measured again replaces the one it repeats
            this_run = {"seeds": args.seeds, "arms": args.arms, "commit": commit, "load_before": round(load_before, 2),
                        "load_after": round(os.getloadavg()[0], 2), "side_by_side": args.side_by_side}  # fmt: skip
            entry["runs"] = [*(r for r in entry["runs"] if not repeats(r, args)), this_run]
            for arm, pair in comparisons(arms, recipe).items():
                entry["vs_outcome"][arm] = pair
                compared.append((recipe, arm))
            entry |= {"machine": machine(), "steps": args.steps}
        write_results(out, results)
    print(f"\n{'recipe':<12}{'arm':<15}{'seeds':>7}{'greedy before':>15}{'greedy after':>14}{'sampled after':>15}")
    for recipe, arm in compared:
        pair = results[recipe]["vs_outcome"][arm]
        for name in ("outcome", arm):
            row = pair[name]
            print(f"{recipe:<12}{name:<15}{len(pair['seeds']):>7}{row['greedy_before']:>15.3f}"
                  f"{row['greedy_after']:>14.3f}{row['sampled_after']:>15.3f}")  # fmt: skip
        print(f"{recipe:<12}{f'{arm} - outcome, greedy after':>51} {pair['greedy_after_delta']:+.3f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
