"""Benchmark: a served teacher (`train.kl.teacher_endpoint`, a real vLLM server) against the same teacher loaded
locally (`train.kl.teacher`): do they give the same log-probs of the policy's sampled tokens, and what does each
cost per scored token?

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \\
        --model ~/.cache/toolrl/models/smollm2-135m-instruct --served-model-name smol --port 8011 \\
        --dtype float32 --return-tokens-as-token-ids --enforce-eager &
    python bench/teacher_endpoint.py --base-url http://127.0.0.1:8011/v1 --model smol

The policy and the teacher are both the default model (so the KL is ~0 and any difference is the endpoint's):
the policy samples `--tasks` calculator tasks x `--group` at temperature 1, then both teachers score the
trajectories' trained tokens through the trainer's own Scorer, alternately, `--repeats` times. Prints a table and
writes bench/results/teacher_endpoint.json (max and mean absolute difference of the log-probs, seconds per 1000
scored tokens each, the server's version).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import machine, write_results

from toolrl.config import load_config
from toolrl.train import Trainer, Workbench

MODEL = "smollm2-135m-instruct"


def server_version(base_url: str) -> str:
    """The server's own report of its version (vLLM's GET /version), or why there is none."""
    import httpx

    try:
        return (
            "vllm "
            + httpx.get(base_url.removesuffix("/").removesuffix("/v1") + "/version", timeout=10).json()["version"]
        )
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return f"unknown ({type(exc).__name__})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8011/v1")
    parser.add_argument("--model", default="smol", help="the model name the server serves")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--note", default="", help="what else ran on the machine (recorded with the results)")
    parser.add_argument("--out", default="bench/results/teacher_endpoint.json")
    args = parser.parse_args()
    common = ["env.name=calculator", f"model.name={MODEL}", "device=cpu", "train.kl.coef=1.0",
              "train.kl.estimator=k1", "train.kl.mode=reward", "train.advantage=reinforce_pp",
              "rollout.max_new_tokens=96", "eval.at_start=false", "eval.at_end=false"]  # fmt: skip
    local = Workbench.load(load_config(overrides=[*common, f"train.kl.teacher={MODEL}"]))
    served = Workbench.load(load_config(overrides=[
        *common, f"train.kl.teacher_endpoint.base_url={args.base_url}", f"train.kl.teacher_endpoint.model={args.model}"
    ]))  # fmt: skip
    try:
        tasks = [t for t in local.env.tasks("train")[: args.tasks] for _ in range(args.group)]
        trajs = local.rollout(local.config.rollout.sampling, seed=3).run(tasks, seed=3)
        tokens = sum(sum(t.loss_mask) for t in trajs)
        trainers = {"local": Trainer(local), "endpoint": Trainer(served)}
        seconds: dict[str, list[float]] = {name: [] for name in trainers}
        scores: dict[str, list[torch.Tensor]] = {}
        for _ in range(args.repeats):
            for name, trainer in trainers.items():
                started = time.perf_counter()
                scores[name], _ = trainer.scorer.before_update(trainer.model, None, trajs, True)
                seconds[name].append(time.perf_counter() - started)
        diff = torch.cat([(a - b).abs() for a, b in zip(scores["local"], scores["endpoint"], strict=True)])
        per_k = {name: round(statistics.median(s) / tokens * 1000, 3) for name, s in seconds.items()}
    finally:
        local.close()
        served.close()
    print(f"{len(trajs)} trajectories, {tokens} scored tokens")
    print(f"{'teacher':<10}{'s / 1000 tokens':>17}")
    for name, value in per_k.items():
        print(f"{name:<10}{value:>17.3f}")
    print(f"log-prob difference: max {diff.max():.2e}, mean {diff.mean():.2e}")
    write_results(args.out, {
        "trajectories": len(trajs), "scored_tokens": tokens, "seconds_per_1000_tokens": per_k,
        "max_abs_logprob_diff": float(diff.max()), "mean_abs_logprob_diff": float(diff.mean()),
        "args": vars(args), "machine": {**machine(), "server": server_version(args.base_url)},
    })  # fmt: skip
    print(args.out)


if __name__ == "__main__":
    main()
