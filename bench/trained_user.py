"""Benchmark: a trained simulated user on `support` (issue 76 item 6). For each seed, recipes/support.yaml (its warm
start on the reference's conversations, then GRPO) trains the default model with `env.options.user: policy`: each
task's samples are seated in pairs, an agent and its user, both the policy, the user rewarded for agreement with its
scenario (the errand done and nothing else, nothing made up). Then the trained policy, as the agent (greedy), talks
with the test split's customers played two ways through one harness, `env.options.user: simulated` (the prompt and
the view the user seat was shown), the user's replies greedy: by the fixed prompt user (the base model) and by the
trained user (the trained weights). Each conversation is scored on its agreement with the scenario: the errand done
(the database is the scenario's and the user heard what it wanted to know: the agent's `correct`) and no email, id or
zip made up by the user (`faithful`); and on what the user told: the share of
its scenario's email, zip and ids it said, 0 where it made one up (`told`, the dense part of the seat's reward).

    python bench/trained_user.py                 # seeds 0 1 2
    python bench/trained_user.py --seeds 1       # a seed at a time (seeds merge into the results)
    python bench/trained_user.py --quick         # the tiny model, 1 seed, 2 steps, 4 tasks: the suite's sample

Writes bench/results/trained_user.json: {agreement: {fixed_user, trained_user} (means over seeds), seeds: {seed:
{fixed_user: {agreement, told, db, faithful, outcomes, user_turns}, trained_user: {...}, training: {...}}}, machine,
load_before, load_after}; progress to stdout and bench/results/trained_user.log.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter

from common import ROOT, SeedLog, machine, merged_seeds, quick_setup, seeded_arguments, start, write_results

from toolrl.config import load_config
from toolrl.envs.support.env import told
from toolrl.train import RunDir, Trainer, Workbench

RECIPE = ROOT / "recipes" / "support.yaml"
USERS = ("fixed_user", "trained_user")
"""Who plays the customers the trained agent talks with: the base model under the user prompt, the trained weights."""
say = SeedLog()


def mean(values) -> float:
    values = list(values)
    return round(statistics.fmean(values), 4) if values else 0.0


def conversations(agent: str, user: str, seed: int, args, max_tokens: int) -> dict:
    """The agent `agent` (greedy) with the customers of the first `args.tasks` test tasks played by `user`."""
    backend = {"path": user, "max_tokens": max_tokens, "temperature": 0.0}
    overrides = [f"seed={seed}", f"model.name={agent}", "env.options.user=simulated",
                 f"env.options.user_model={json.dumps(backend)}", f"eval.batch_size={args.batch}",
                 *args.set]  # fmt: skip
    bench = Workbench.load(load_config(RECIPE, overrides))
    try:
        trajs = bench.evaluation(num_tasks=args.tasks, temperature=0.0)
    finally:
        bench.close()
    agreed = [t.rewards["correct"] == 1.0 and t.rewards["faithful"] == 1.0 for t in trajs]
    outcomes = Counter(next((i["user_outcome"] for i in t.infos if "user_outcome" in i), t.stop_reason) for t in trajs)
    return {
        "agreement": mean(agreed),
        "db": mean(t.rewards["db"] for t in trajs),
        "faithful": mean(t.rewards["faithful"] for t in trajs),
        "told": mean(told(t.user_messages, t.task.meta["instructions"]) for t in trajs),
        "agent_correct": mean(t.rewards["correct"] for t in trajs),
        "outcomes": dict(sorted(outcomes.items())),
        "user_turns": mean(len(t.user_messages) for t in trajs),
        "conversations": len(trajs),
    }


def one_seed(seed: int, args) -> dict:
    run_name = f"user-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    overrides = [f"seed={seed}", "env.options.user=policy", "eval.at_start=false", "eval.at_end=false",
                 f"output_dir={args.runs}", f"run_name={run_name}", *args.set]  # fmt: skip
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    config = load_config(RECIPE, overrides)
    bench = Workbench.load(config)
    steps: list[dict] = []
    try:
        trainer = Trainer(bench, RunDir.create(config))
        trainer.on_note = say

        def on_step(m: dict) -> None:
            steps.append(m)
            say(f"seed {seed}: step {m['step']} agent {m.get('role/agent/success', 0.0):.3f} user "
                f"{m.get('role/user/success', 0.0):.3f} user reward {m.get('role/user/reward', 0.0):.3f} trained "
                f"{m.get('trained_trajectories', 0)} ({m['step_s']:.0f} s)")  # fmt: skip

        started = time.perf_counter()
        summary = trainer.train(on_step)
        train_s = round(time.perf_counter() - started, 1)
    finally:
        bench.close()
    trained, base = summary["checkpoint"], config.model.name
    max_tokens = config.rollout.max_new_tokens  # what a user seat could write in a turn
    row = {}
    for name, user in zip(USERS, (base, trained), strict=True):
        started = time.perf_counter()
        row[name] = got = conversations(trained, user, seed, args, max_tokens)
        say(f"seed {seed}: {name}: agreement {got['agreement']:.3f} told {got['told']:.3f} db {got['db']:.3f} "
            f"faithful {got['faithful']:.3f} {got['outcomes']} ({time.perf_counter() - started:.0f} s)")  # fmt: skip
    half = max(len(steps) // 2, 1)
    row["training"] = {
        "steps": len(steps),
        "user_success_first_half": mean(s.get("role/user/success", 0.0) for s in steps[:half]),
        "user_success_second_half": mean(s.get("role/user/success", 0.0) for s in steps[half:]),
        "user_reward_first_half": mean(s.get("role/user/reward", 0.0) for s in steps[:half]),
        "user_reward_second_half": mean(s.get("role/user/reward", 0.0) for s in steps[half:]),
        "agent_success_first_half": mean(s.get("role/agent/success", 0.0) for s in steps[:half]),
        "agent_success_second_half": mean(s.get("role/agent/success", 0.0) for s in steps[half:]),
        "unpaired": sum(s.get("support/unpaired", 0) for s in steps),
        "train_s": train_s,
        "peak_gb": summary["memory"]["peak_gb"],
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    seeded_arguments(parser, "trained_user", "4 tasks")
    parser.add_argument("--tasks", type=int, default=40, help="test conversations per user")
    parser.add_argument("--batch", type=int, default=20, help="eval.batch_size")
    args = parser.parse_args()
    if (tiny := quick_setup(args, "trained_user")) is not None:
        args.seeds, args.steps, args.tasks = args.seeds[:1], 2, 4
        args.set += [f"model.name={tiny}", "device=cpu", "sft.num_tasks=4", "rollout.max_new_tokens=8"]
    load_before = start(args, say)
    say(f"trained_user: seeds {args.seeds}, {args.tasks} test conversations a user, load {load_before}")
    rows = {str(seed): one_seed(seed, args) for seed in args.seeds}
    seeds = merged_seeds(args.out, rows, args, ("steps", "tasks", "set"))  # seeds of one measurement merge
    result = {
        "agreement": {name: mean(r[name]["agreement"] for r in seeds.values()) for name in USERS},
        "told": {name: mean(r[name]["told"] for r in seeds.values()) for name in USERS},
        "faithful": {name: mean(r[name]["faithful"] for r in seeds.values()) for name in USERS},
        "seeds": seeds,
        "steps": args.steps,
        "tasks": args.tasks,
        "set": args.set,
        "machine": machine(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "argv": sys.argv[1:],
    }
    write_results(args.out, result)
    say(f"trained_user: agreement {result['agreement']} told {result['told']} faithful {result['faithful']}; "
        f"{args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
