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
import time

from common import ROOT, SeedLog, machine, merged_seeds, quick_setup, seeded_arguments, start, write_results

from toolrl.config import load_config
from toolrl.train import RunDir, Trainer, Workbench

GOAL = 0.6
say = SeedLog()


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    seeded_arguments(parser, "selfplay", "8 games")
    parser.add_argument("--games", type=int, default=200)
    args = parser.parse_args()
    if (tiny := quick_setup(args, "selfplay")) is not None:
        args.seeds, args.steps, args.games = args.seeds[:1], 2, 8
        args.set += [f"model.name={tiny}", "device=cpu", "train.prompts_per_step=2", "rollout.max_new_tokens=8"]
    load_before = start(args, say)
    say(f"selfplay: seeds {args.seeds}, {args.games} games, load {load_before}")
    rows = {str(seed): one_seed(seed, args) for seed in args.seeds}
    seeds = merged_seeds(args.out, rows, args, ("steps", "games", "set"))  # seeds of one measurement merge
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
