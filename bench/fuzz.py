"""Benchmark: every registered parser on >= 100,000 hostile inputs (toolrl.parsers.fuzz), plus each 100 KB
adversarial construction timed on its own.

Goals: no exception and no malformed result for any input; every 100 KB adversarial input parsed in under
0.1 s. Prints a table and writes bench/results/fuzz.json (`inputs`, `exceptions`, `slowest_ms` per parser).
"""

from __future__ import annotations

import argparse
import os
import time

from common import machine, write_results

from toolrl.parsers import PARSERS
from toolrl.parsers.fuzz import adversarial_inputs, fuzz_parser

GOAL_S = 0.1


def adversarial_times(parse) -> dict[str, float]:
    """Seconds per named 100 KB input, the best of three (the machine is shared and noisy)."""
    times = {}
    for name, text in adversarial_inputs().items():
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            parse(text, None)
            best = min(best, time.perf_counter() - started)
        times[name] = best
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="random inputs per parser")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/fuzz.json")
    args = parser.parse_args()
    rows = {}
    for name in sorted(PARSERS):
        started = time.perf_counter()
        report = fuzz_parser(PARSERS[name], inputs=args.inputs, seed=args.seed)
        timed = adversarial_times(PARSERS[name])
        worst = max(timed, key=timed.get)
        rows[name] = {
            "inputs": report.inputs,
            "exceptions": report.exceptions,
            "bad_results": report.bad_results,
            "slowest_ms": round(report.slowest_s * 1000, 2),
            "slowest_input": report.slowest_input,
            "adversarial_100kb_worst_ms": round(timed[worst] * 1000, 2),
            "adversarial_100kb_worst_input": worst,
            "adversarial_100kb_ms": {k: round(v * 1000, 3) for k, v in timed.items()},
            "failures": report.failures,
            "wall_s": round(time.perf_counter() - started, 1),
        }
    print(f"{'parser':<14}{'inputs':>9}{'exceptions':>12}{'bad':>6}{'slowest ms':>12}  worst 100 KB input")
    for name, row in rows.items():
        print(
            f"{name:<14}{row['inputs']:>9}{row['exceptions']:>12}{row['bad_results']:>6}{row['slowest_ms']:>12.2f}"
            f"  {row['adversarial_100kb_worst_input']} ({row['adversarial_100kb_worst_ms']:.2f} ms)"
        )
    met = all(
        r["exceptions"] == 0 and r["bad_results"] == 0 and r["adversarial_100kb_worst_ms"] < GOAL_S * 1000
        for r in rows.values()
    )
    verdict = "met" if met else "NOT met"
    print(f"goal (0 exceptions, every 100 KB adversarial input < {GOAL_S * 1000:.0f} ms): {verdict}")
    write_results(
        args.out,
        {
            "machine": machine(),
            "workload": {
                "random_inputs": args.inputs,
                "seed": args.seed,
                "adversarial_inputs": len(adversarial_inputs()),
            },
            "goal_met": met,
            "load_average": [round(x, 2) for x in os.getloadavg()],  # at the end: a busy machine's numbers
            "parsers": rows,
        },
    )


if __name__ == "__main__":
    main()
