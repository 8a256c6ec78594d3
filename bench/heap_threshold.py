"""Benchmark: what glibc's mmap threshold costs a long-prompt GRPO step (bench/long_context.py's checkpointed
step, 4.9k-token prompt, 8 samples): page faults and kernel time against peak memory, per threshold.

From LONG_SEQUENCE tokens (toolrl/memory.py) blocks above MMAP_THRESHOLD (1 MiB) are mapped for each allocation
and unmapped when freed: the heap does not fragment (a LoRA warm start at 6.5k tokens peaked at 8.2 GB without it),
but every fresh block's pages are faulted in and zeroed again. Each threshold runs the step part in its own process
(the second step of each; the thresholds in turn, `--rounds` times) and records its minor page faults, user and
kernel CPU seconds, wall time and phase peaks. Writes bench/results/heap_threshold.json with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys

from common import machine, write_results
from long_context import run_part

MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thresholds", default="1,8,16", help="MiB, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default="bench/results/heap_threshold.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: list[dict] = []
    print(f"{'MiB':>4} {'faults':>10} {'sys s':>6} {'user s':>7} {'step s':>7} {'rollout GB':>10} {'update GB':>9}")
    for _ in range(args.rounds):
        for mib in (int(x) for x in args.thresholds.split(",")):
            extra = ["--set=train.gradient_checkpointing=true", f"--mmap-threshold={mib * MIB}"]
            step = run_part("step", sys.executable, extra)
            runs.append({"threshold_mib": mib, "step_s": round(step["step_s"], 1), **step["cpu"],
                         "rollout_peak_gb": step["rollout_peak_gb"], "update_peak_gb": step["update_peak_gb"],
                         "load_avg": [round(x, 2) for x in os.getloadavg()]})  # fmt: skip
            row = runs[-1]
            print(
                f"{mib:>4} {row['minor_faults']:>10} {row['sys_s']:>6.1f} {row['user_s']:>7.1f} "
                f"{row['step_s']:>7.1f} {row['rollout_peak_gb']:>10.2f} {row['update_peak_gb']:>9.2f}",
                flush=True,
            )
    write_results(args.out, {"machine": machine(), "load_avg_before": [round(x, 2) for x in load_before],
                             "load_avg_after": [round(x, 2) for x in os.getloadavg()], "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()
