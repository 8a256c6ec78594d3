"""Benchmark: this checkout against an earlier revision, side by side in one run (ratios), so that a redesign
that should change nothing for users is shown to change nothing.

The earlier revision is checked out as a git worktree; each benchmark script of this checkout runs twice, once
importing each revision's `src/` (PYTHONPATH), the order alternating between benchmarks so that a machine
getting slower or faster during the run does not favour one side. Benchmarks: train_vs_trl.py's toolrl half (a
GRPO step: generation, log-probs, forward and backward, optimizer) and rollout.py (per-trajectory scheduling,
lock-step ways, the engine's generation speed). Prints a table (before, after, after / before) and writes
bench/results/before_after.json.

    python bench/before_after.py --rev 812e3d6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, machine, write_results

BENCHES = {
    "train_step": (["bench/train_vs_trl.py", "--only-toolrl"], {
        "step_s": ("toolrl", "step_s"),
        "tokens_per_s": ("toolrl", "tokens_per_s"),
        "generation_s": ("toolrl", "generation_s"),
        "forward_backward_s": ("toolrl", "forward_backward_s"),
        "optimizer_s": ("toolrl", "optimizer_s"),
    }),
    "rollout": (["bench/rollout.py", "--skip-transformers-cb"], {
        "limit_tokens_per_s": ("limit", "tokens_per_s"),
        "fixed_1s_ours_wall_s": ("fixed_1s", "ours", "wall_s"),
        "lognormal_ours_wall_s": ("lognormal_median_0.5s_p99_5s", "ours", "wall_s"),
        "lockstep_concurrent_fixed_1s_wall_s": ("fixed_1s", "lockstep_concurrent", "wall_s"),
        "generation_batch_8_tokens_per_s": ("generation", 1, "ours_tokens_per_s"),
        "generation_batch_32_tokens_per_s": ("generation", 2, "ours_tokens_per_s"),
    }),
}  # fmt: skip


def dig(data, path):
    for key in path:
        data = data[key]
    return data


def run(script: list[str], src: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, *script, "--out", str(out)], cwd=ROOT, env=env, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(script)} with {src} failed (exit {done.returncode})")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the earlier revision (a commit, tag or branch)")
    parser.add_argument("--only", choices=sorted(BENCHES), action="append", help="run only these benchmarks")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, the order alternating")
    parser.add_argument("--out", default="bench/results/before_after.json")
    args = parser.parse_args()

    commit = subprocess.run(["git", "rev-parse", args.rev], cwd=ROOT, capture_output=True, text=True, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    result: dict = {
        "machine": machine(),
        "before": commit.stdout.strip(),
        "after": head.stdout.strip(),
        "benchmarks": {},
    }
    with tempfile.TemporaryDirectory(prefix="toolrl-before-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.rev], cwd=ROOT, check=True)
        try:
            sides = {"before": tree / "src", "after": ROOT / "src"}
            for i, name in enumerate(args.only or BENCHES):
                script, metrics = BENCHES[name]
                orders, runs = [], {"before": [], "after": []}
                for r in range(args.rounds):
                    order = ["before", "after"] if (i + r) % 2 == 0 else ["after", "before"]
                    orders.append(order)
                    for side in order:
                        runs[side].append(run(script, sides[side], Path(tmp) / f"{name}-{side}-{r}.json"))
                rows = {}
                for metric, path in metrics.items():
                    before = sum(dig(o, path) for o in runs["before"]) / args.rounds
                    after = sum(dig(o, path) for o in runs["after"]) / args.rounds
                    rows[metric] = {
                        "before": round(before, 3),
                        "after": round(after, 3),
                        "ratio": round(after / before, 3),
                    }
                    if args.rounds > 1:
                        rows[metric]["per_round"] = [
                            [dig(b, path), dig(a, path)] for b, a in zip(runs["before"], runs["after"], strict=True)
                        ]
                result["benchmarks"][name] = {"orders": orders, "metrics": rows}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    print(f"{'metric':>40} {'before':>10} {'after':>10} {'after/before':>13}")
    for name, bench in result["benchmarks"].items():
        for metric, row in bench["metrics"].items():
            print(f"{name + ' ' + metric:>40} {row['before']:>10.3f} {row['after']:>10.3f} {row['ratio']:>13.3f}")
    write_results(args.out, result)


if __name__ == "__main__":
    main()
