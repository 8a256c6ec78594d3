"""Benchmark: self-play on Nim. For each seed, recipes/nim.yaml trains the default model against itself (both seats
of each game, each with its role); the policy then plays the test split's games (both seats over every pile) against
its frozen step-0 copy, a model opponent (env.options.eval_opponent: {path: the base model}) shown what the policy
would be shown in its seat, both sampling at the recipe's temperature (0.7). The same games before training (the
step-0 policy against its own copy) are the control: what the seats and the opponent's handling give untrained.

    python bench/selfplay.py                        # seeds 0 1 2, 30 steps, 200 games
    python bench/selfplay.py --seeds 1 --threads 1  # a seed as a process of its own (seeds merge into the results)
    python bench/selfplay.py --quick                # the tiny model, 2 steps, 8 games: the suite's sample

Writes bench/results/selfplay.json: {win_rate_after, win_rate_before (means over seeds), goal, seeds: {seed:
{win_rate_before, win_rate_after, by_seat, opponent_gave_up, ...}}, machine, load_before, load_after, steps,
games}; progress to stdout and bench/results/selfplay.log.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, machine, write_results

from toolrl.config import load_config
from toolrl.train import RunDir, Trainer, Workbench

GOAL = 0.6
LOG: Path | None = None


def say(text: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {text}"
    print(line, flush=True)
    if LOG is not None:
        with LOG.open("a") as f:
            f.write(line + "\n")


def games(bench: Workbench, num: int, temperature: float) -> dict:
    """The policy against the eval opponent over `num` test games: its win rate, per seat, how games ended."""
    env = bench.env
    gave_up = env.counts.get("opponent_gave_up", 0)
    trajs = bench.evaluation(num_tasks=num, temperature=temperature)
    won = [t.rewards.get("win", 0.0) for t in trajs]
    seats = {role: [t.rewards["win"] for t in trajs if t.role == role] for role in ("first", "second")}
    return {
        "win_rate": round(statistics.fmean(won), 4),
        "by_seat": {role: round(statistics.fmean(w), 4) for role, w in seats.items() if w},
        "policy_gave_up": round(statistics.fmean(1 - t.rewards.get("played", 1.0) for t in trajs), 4),
        "opponent_gave_up": env.counts.get("opponent_gave_up", 0) - gave_up,
        "games": len(trajs),
    }


def one_seed(seed: int, args) -> dict:
    recipe = load_config(ROOT / "recipes" / "nim.yaml", args.set)
    base, temperature = recipe.model.name, recipe.rollout.sampling.temperature
    opponent = {"path": base, "temperature": temperature}  # the step-0 policy, sampling as the policy samples
    overrides = [f"seed={seed}", "eval.at_start=false", "eval.at_end=false", f"output_dir={args.runs}",
                 f"run_name=nim-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}", f"env.options.num_test={args.games}",
                 f"env.options.eval_opponent={json.dumps(opponent)}", *args.set]  # fmt: skip
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    config = load_config(ROOT / "recipes" / "nim.yaml", overrides)
    bench = Workbench.load(config)
    try:
        started = time.perf_counter()
        before = games(bench, args.games, temperature)
        say(f"seed {seed}: step 0 against itself: wins {before['win_rate']:.3f} {before['by_seat']} "
            f"({time.perf_counter() - started:.0f} s); training {config.train.steps} steps")  # fmt: skip
        trainer = Trainer(bench, RunDir.create(config))
        trainer.on_note = say

        def on_step(m: dict) -> None:
            roles = {r: round(m.get(f"role/{r}/success", 0.0), 3) for r in ("first", "second")}
            say(f"seed {seed}: step {m['step']} reward {m['reward']:.3f} wins by seat {roles} "
                f"calls/traj {m.get('tool_calls', 0):.2f} trained {m.get('trained_trajectories', 0)} "
                f"({m['step_s']:.0f} s)")  # fmt: skip

        started = time.perf_counter()
        summary = trainer.train(on_step)
        train_s = round(time.perf_counter() - started, 1)
        after = games(bench, args.games, temperature)
        say(f"seed {seed}: after {config.train.steps} steps against step 0: wins {after['win_rate']:.3f} "
            f"{after['by_seat']}")  # fmt: skip
        return {"win_rate_before": before["win_rate"], "win_rate_after": after["win_rate"], "before": before,
                "after": after, "train_s": train_s, "peak_gb": summary["memory"]["peak_gb"]}  # fmt: skip
    finally:
        bench.close()


def main() -> None:
    global LOG
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="train.steps (default: the recipe's 30)")
    parser.add_argument("--games", type=int, default=200)
    parser.add_argument("--set", action="append", default=[], help="a config override")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 1 seed, 2 steps, 8 games")
    parser.add_argument("--out", default=None, help="default: bench/results/selfplay.json (--quick: a temporary one)")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "selfplay"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.out is None:
        args.out = str(Path(tempfile.mkdtemp()) / "selfplay.json") if args.quick else "bench/results/selfplay.json"
    if args.quick:
        from tests.harness.tiny import make_tiny_model

        tiny = make_tiny_model(Path(args.out).parent / "tiny-model")
        args.seeds, args.steps, args.games = args.seeds[:1], 2, 8
        args.set += [f"model.name={tiny}", "device=cpu", "train.prompts_per_step=2", "rollout.max_new_tokens=8"]
    if args.threads:
        torch.set_num_threads(args.threads)
    LOG = Path(args.out).with_suffix(".log")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    say(f"selfplay: seeds {args.seeds}, {args.games} games, load {load_before}")
    rows = {str(seed): one_seed(seed, args) for seed in args.seeds}
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.is_file() else {}
    same = (
        previous.get("steps") == args.steps and previous.get("games") == args.games and previous.get("set") == args.set
    )
    seeds = {**(previous.get("seeds", {}) if same else {}), **rows}  # seeds of the same measurement merge
    result = {
        "win_rate_after": round(statistics.fmean(r["win_rate_after"] for r in seeds.values()), 4),
        "win_rate_before": round(statistics.fmean(r["win_rate_before"] for r in seeds.values()), 4),
        "goal": GOAL,
        "goal_met_every_seed": all(r["win_rate_after"] >= GOAL for r in seeds.values()),
        "seeds": seeds,
        "steps": args.steps,
        "games": args.games,
        "set": args.set,
        "machine": machine(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "argv": sys.argv[1:],
    }
    write_results(args.out, result)
    say(f"selfplay: wins after {result['win_rate_after']:.3f} (before {result['win_rate_before']:.3f}); {args.out}")


if __name__ == "__main__":
    main()
