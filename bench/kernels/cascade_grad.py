"""Benchmark: the update's suffix pass with the shared prefix read once for all rows (scoring/cascade_grad.py) against
every row attending over its own copy of the prefix (scoring/packed.py's CASCADE off), in one process, alternating.

Workloads (the default model, random token ids; what matters is the shape): `short`, train_vs_trl's GRPO step (a
400-token shared prompt, 2 tasks x 8 samples of a 40-token task and 20-64 generated tokens); `long`,
long_context's (a 4,879-token prompt, 1 task x 8 samples), with gradient checkpointing as long_context's step runs.
The prefix pass is computed once (StepPrefix) and not timed: it is the same in both; each timed call is the
suffix pass, its output-layer log-probs and its backward into the prefix's keys and values and the weights. The
log-probs and gradients of both are checked equal. Prints a table, writes bench/results/cascade_grad.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import _parent  # noqa: F401  (bench/ on the import path)
import torch
from common import measured_here, save_with_load

import toolrl.scoring.packed as packed
from toolrl.envs import Task
from toolrl.models import load_model
from toolrl.rollout import Trajectory
from toolrl.scoring import StepPrefix, score_tokens

WORKLOADS = {"short": (400, 2, 40), "long": (4879, 1, 0)}  # shared prompt, tasks, task tokens
GROUP = 8


def workload(name: str, seed: int = 0) -> list[Trajectory]:
    prompt, tasks, task_tokens = WORKLOADS[name]
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(100, 40000, (n,), generator=gen).tolist()

    shared, trajs = ids(prompt), []
    for t in range(tasks):
        task = ids(task_tokens)
        for _ in range(GROUP):
            traj = Trajectory.start(Task(f"t{t}", "q", "a"), shared + task)
            response = ids(int(torch.randint(20, 65, (1,), generator=gen)))
            traj.add_model_turn(response, [0.0] * len(response), "")
            trajs.append(traj)
    return trajs


def suffix_pass(model, trajs, prefix: StepPrefix, cascade: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
    packed.CASCADE = cascade
    model.zero_grad()
    for leaf in (x for pair in prefix.leaves for x in pair):
        leaf.grad = None
    started = time.perf_counter()
    scores = score_tokens(model, trajs, 1.0, step_prefix=prefix)
    scores.logprobs.sum().backward()
    seconds = time.perf_counter() - started
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return seconds, scores.logprobs.detach(), grads


def run(name: str, repeats: int) -> dict:
    model = load_model("smollm2-135m-instruct", torch.device("cpu")).train()
    if name == "long":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trajs = workload(name)
    prefix = StepPrefix(model, trajs[0].token_ids[: WORKLOADS[name][0]])
    times: dict[bool, list[float]] = {True: [], False: []}
    outputs = {}
    for i in range(repeats + 1):  # the first round warms up, and its outputs are compared
        for cascade in (True, False) if i % 2 else (False, True):
            seconds, logprobs, grads = suffix_pass(model, trajs, prefix, cascade)
            if i:
                times[cascade].append(seconds)
            else:
                outputs[cascade] = logprobs, grads
    packed.CASCADE = True
    (cascade_lp, cascade_grads), (copy_lp, copy_grads) = outputs[True], outputs[False]
    max_logprob_diff = (cascade_lp - copy_lp).abs().max().item()
    grad_rel_diff = ((cascade_grads - copy_grads).norm() / copy_grads.norm()).item()
    copy_s, cascade_s = statistics.median(times[False]), statistics.median(times[True])
    return {
        "prompt_tokens": WORKLOADS[name][0], "rows": len(trajs), "suffix_tokens": sum(len(t.token_ids) for t in trajs)
        - len(trajs) * WORKLOADS[name][0], "gradient_checkpointing": name == "long", "prefix_copy_s": copy_s,
        "cascade_s": cascade_s, "speedup": copy_s / cascade_s, "times": {"copy": times[False], "cascade": times[True]},
        "max_logprob_diff": max_logprob_diff, "grad_rel_diff": grad_rel_diff,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/cascade_grad.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    load_before = os.getloadavg()
    rows = {name: run(name, args.repeats) for name in WORKLOADS}
    result = measured_here(load_before, rows)
    print(
        f"{'workload':>8} {'prompt':>7} {'rows':>5} {'prefix copied':>14} {'cascade':>9} {'speedup':>8} "
        f"{'grad diff':>10}"
    )
    for name, row in rows.items():
        print(f"{name:>8} {row['prompt_tokens']:>7} {row['rows']:>5} {row['prefix_copy_s']:>13.3f}s "
              f"{row['cascade_s']:>8.3f}s {row['speedup']:>7.2f}x {row['grad_rel_diff']:>10.1e}")  # fmt: skip
    save_with_load(args.out, result)


if __name__ == "__main__":
    main()
