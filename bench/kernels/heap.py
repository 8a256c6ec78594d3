"""Benchmark: what the heap policy for long sequences costs a long-prompt GRPO step (bench/long_context.py's
checkpointed step, 4.9k-token prompt, 8 samples) or warm start (two 6.5k-token conversations, full weights,
checkpointed): page faults and kernel time against peak memory, per glibc mmap threshold and block cache size.

From LONG_SEQUENCE tokens (toolrl/memory.py) blocks above MMAP_THRESHOLD (1 MiB) are mapped for each allocation:
the heap does not fragment (a LoRA warm start at 6.5k tokens peaked at 8.2 GB without it), but every fresh block's
pages are faulted in and zeroed again, unless the block cache (models/native/block_cache.py,
model.cpu_block_cache_mb) keeps PyTorch's freed blocks for the next request of their size. Each configuration,
`THRESHOLD_MIB:CACHE_MB[:AGE]` (AGE: the cache's MAX_AGE), runs the part in its own process (the configurations
in turn, `--rounds` times) and records its minor page faults, user and kernel CPU seconds, wall time and peaks.
Writes `--out` (by default bench/results/heap_<part>.json) with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys

import _parent  # noqa: F401  (bench/ on the import path)
from common import machine, write_results
from long_context import run_part

MIB = 1 << 20


def block_age() -> int:
    from toolrl.models.native.block_cache import MAX_AGE

    return MAX_AGE


def measure(part: str, mib: int, cache_mb: int, age: int) -> dict:
    extra = [f"--mmap-threshold={mib * MIB}", f"--set=model.cpu_block_cache_mb={cache_mb}", f"--block-age={age}"]
    if part == "step":
        got = run_part("step", sys.executable, [*extra, "--set=train.gradient_checkpointing=true"])
        return {"seconds": round(got["step_s"], 1), **got["cpu"], "peaks_gb": [got["rollout_peak_gb"],
                got["update_peak_gb"]]}  # fmt: skip
    got = run_part("sft", sys.executable, [*extra, "--checkpointing"])
    return {"seconds": round(got["seconds"], 1), **got["cpu"], "peaks_gb": [got["peak_gb"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["step", "sft"], default="step")
    parser.add_argument("--configs", default="1:0,1:512", help="THRESHOLD_MIB:CACHE_MB[:AGE], comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: list[dict] = []
    print(f"{'MiB':>4} {'cache MB':>8} {'age':>5} {'faults':>10} {'sys s':>6} {'user s':>7} {'seconds':>7}  peaks GB")
    for _ in range(args.rounds):
        for config in args.configs.split(","):
            mib, cache_mb, *rest = map(int, config.split(":"))
            age = rest[0] if rest else block_age()
            row = {"threshold_mib": mib, "cache_mb": cache_mb, "age": age, **measure(args.part, mib, cache_mb, age),
                   "load_avg": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
            runs.append(row)
            peaks = " / ".join(f"{p:.2f}" for p in row["peaks_gb"])
            print(
                f"{mib:>4} {cache_mb:>8} {age:>5} {row['minor_faults']:>10} {row['sys_s']:>6.1f} {row['user_s']:>7.1f} "
                f"{row['seconds']:>7.1f}  {peaks}",
                flush=True,
            )
    write_results(args.out or f"bench/results/heap_{args.part}.json", {"machine": machine(), "part": args.part,
                  "load_avg_before": [round(x, 2) for x in load_before],
                  "load_avg_after": [round(x, 2) for x in os.getloadavg()], "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()
