"""Benchmark: what dense turn credit (train.turn_credit) costs a step, three ways over the same trajectories, side
by side in one run. A recipe's step is played once (its tasks x group size, the recipe's rollout); then each way
scores every trajectory's boundaries with the frozen model, in turn, the best of --rounds:
`whole` reads each context whole (logits at every position: the check), `per_trajectory` reads each trajectory
through a cache of its own with logits at every position it reads (as train.turn_credit did until the group
shared its prompt, which also read each boundary's answer in a second forward), `shared` is TurnCredit.assign
(one cache for the step, a group's prompt read once, one forward a boundary, logits only where the answer is
predicted). Prints seconds, the tokens each way fed the model, the ratio to `shared`
and the largest difference of a score from `whole`; writes bench/results/turn_credit.json.

    python bench/turn_credit.py                      # search-r1: 4 tasks x 6 samples
    python bench/turn_credit.py --recipe built --tasks 2
    python bench/turn_credit.py --quick              # the tiny model, 2 tasks x 2: the suite's sample
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from common import ROOT, SeedLog, machine, quick_setup, side_by_side, write_results

from toolrl.config import load_config
from toolrl.train import Workbench
from toolrl.train.turn_credit import PrefixReader, TurnCredit, naive_answer_logprobs


class EveryLogit(PrefixReader):
    """A reader computing logits at every position it reads (as the per-trajectory reads did)."""

    def _logits(self, ids: list[int], positions: torch.Tensor) -> torch.Tensor:
        return super()._logits(ids, 0)[positions]  # logits_to_keep=0: all of them


def boundaries(credit: TurnCredit, trajs) -> list[tuple[list[list[int]], list[int], list[int]]]:
    """(contexts, probe, target) of each trajectory with a gold answer, as TurnCredit.assign scores them."""
    probe = credit.chat.encode(credit.prefix) if credit.prefix else []
    return [(job[0], probe, job[1]) for traj in trajs if (job := credit.boundaries(traj)) is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="search-r1")
    parser.add_argument("--tasks", type=int, default=4, help="tasks in the step (train.prompts_per_step)")
    parser.add_argument("--group", type=int, default=None, help="samples per task (default: the recipe's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="a config override")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 tasks x 2, 1 round")
    parser.add_argument("--out", default=None, help="default: bench/results/turn_credit.json (--quick: temporary)")
    args = parser.parse_args()
    overrides = list(args.set)
    if args.quick:
        args.tasks, args.group, args.rounds = 2, 2, 1
        overrides += [f"model.name={quick_setup(args, 'turn_credit')}", "device=cpu", "rollout.max_new_tokens=16"]
    out = args.out or str(ROOT / "bench" / "results" / "turn_credit.json")
    say = SeedLog()
    say.open_beside(out)
    load_before = os.getloadavg()
    config = load_config(ROOT / "recipes" / f"{args.recipe}.yaml", overrides)
    group = args.group or config.train.group_size
    bench = Workbench.load(config)
    try:
        tasks = bench.sample("train", args.tasks, "credit tasks")
        started = time.perf_counter()
        trajs = bench.rollout(config.rollout.sampling, seed=0).run([t for t in tasks for _ in range(group)], seed=0)
        rollout_s = time.perf_counter() - started
        say(f"{args.recipe}: played {len(trajs)} trajectories in {rollout_s:.0f} s; scoring {args.rounds} rounds")
        frozen = bench.model.eval()
        credit = TurnCredit(frozen, bench.chat, config.train.turn_credit.template, 1.0)
        jobs = boundaries(credit, trajs)
        scores: dict[str, list[float]] = {}
        read: dict[str, int] = {}

        def whole() -> None:
            with torch.no_grad():
                scores["whole"] = [s for c, p, t in jobs for s in naive_answer_logprobs(frozen, c, p, t)]
            read["whole"] = sum(len(c) + len(p) + len(t) for cs, p, t in jobs for c in cs)

        def per_trajectory() -> None:
            readers = [EveryLogit(frozen) for _ in jobs]
            pairs = zip(readers, jobs, strict=True)
            scores["per_trajectory"] = [r.score(c, p, t) for r, (cs, p, t) in pairs for c in cs]
            read["per_trajectory"] = sum(r.tokens_read for r in readers)

        def shared() -> None:
            metrics = credit.assign(trajs)  # its scores are the credits it sets: traj.turn_credit
            read["shared"] = int(metrics["credit/tokens_read"])

        def told(name, fn):
            def way() -> None:
                started = time.perf_counter()
                fn()
                say(f"{name}: {time.perf_counter() - started:.1f} s, {read[name]} tokens read")

            return way

        ways = {"whole": whole, "per_trajectory": per_trajectory, "shared": shared}
        seconds = side_by_side({name: told(name, fn) for name, fn in ways.items()}, args.rounds)
    finally:
        bench.close()
    # each way against the whole reads: per_trajectory's scores, shared's credits (the changes of the scores)
    wholes, k = [], 0
    for cs, _, _ in jobs:
        wholes.append(scores["whole"][k : k + len(cs)])
        k += len(cs)
    credited = [traj.turn_credit for traj in trajs if traj.turn_credit is not None]
    gaps = {"per_trajectory": max(abs(a - b) for a, b in zip(scores["per_trajectory"], scores["whole"], strict=True)),
            "shared": max(abs(w[i + 1] - w[i] - x) for w, c in zip(wholes, credited, strict=True)
                          for i, x in enumerate(c))}  # fmt: skip
    rows = {way: {"seconds": round(s, 3), "tokens_read": read[way], "vs_shared": round(s / seconds["shared"], 2),
                  "max_score_gap": round(gaps.get(way, 0.0), 6)} for way, s in seconds.items()}  # fmt: skip
    result = {"recipe": args.recipe, "tasks": args.tasks, "group": group, "trajectories": len(trajs),
              "boundaries": sum(len(cs) for cs, _, _ in jobs),
              "trajectory_tokens": sum(len(traj.token_ids) for traj in trajs),
              "prompt_tokens": sum(traj.prompt_length for traj in trajs) // len(trajs),
              "rollout_s": round(rollout_s, 1), "rounds": args.rounds, "ways": rows, "machine": machine(),
              "torch_threads": torch.get_num_threads(), "load_before": [round(x, 2) for x in load_before],
              "load_after": [round(x, 2) for x in os.getloadavg()], "quick": args.quick}  # fmt: skip
    write_results(out, result)
    print(f"\n{args.recipe}: {len(trajs)} trajectories ({args.tasks} tasks x {group}), {result['boundaries']} "
          f"boundaries, prompt {result['prompt_tokens']} tokens")  # fmt: skip
    print(f"{'way':<16}{'seconds':>9}{'tokens read':>13}{'x shared':>10}{'max gap':>10}")
    for way, row in rows.items():
        print(f"{way:<16}{row['seconds']:>9.2f}{row['tokens_read']:>13}{row['vs_shared']:>10.2f}"
              f"{row['max_score_gap']:>10.1e}")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
