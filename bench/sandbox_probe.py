"""Benchmark: escape attempts against the code sandbox, in every isolation this machine has, and what a run
costs in each (the time to run `print(1)`).

Goal: `escaped` 0 for the isolation `auto` picks (and for each of bubblewrap and unshare), and no host call
(an attempt's own or the next call in the same sandbox) over its deadline + 1 s. `none` is run too, to show
what the isolation stops. Prints a table and writes bench/results/sandbox.json. The attempts are
bench/sandbox_escapes.py; tests/envs/test_code.py makes each of them a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import machine, write_results
from sandbox_escapes import probe

from toolrl.envs.code.sandbox import Sandbox, SandboxLimits, resolve_isolation
from toolrl.errors import ConfigError

ISOLATIONS = ("bubblewrap", "unshare", "none")


def run_ms(isolation: str, runs: int = 20) -> float:
    box = Sandbox(SandboxLimits(isolation=isolation))
    try:
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            box.run("print(1)")
            times.append(time.perf_counter() - started)
    finally:
        box.close()
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/sandbox.json")
    args = parser.parse_args()
    rows = {}
    for isolation in ISOLATIONS:
        try:
            resolve_isolation(isolation)
        except ConfigError as exc:
            rows[isolation] = {"available": False, "why": str(exc)}
            continue
        attempts = probe(isolation)
        rows[isolation] = {
            "available": True,
            "escaped": sum(a.escaped for a in attempts),
            "attempts": [
                {"name": a.name, "escaped": a.escaped, "seconds": a.seconds, "detail": a.detail} for a in attempts
            ],
            "slowest_call_s": max(a.seconds for a in attempts),
            "run_print_ms": round(run_ms(isolation), 1),
        }
    chosen = resolve_isolation("auto")
    names = [a["name"] for a in next(r for r in rows.values() if r["available"])["attempts"]]
    available = [i for i in ISOLATIONS if rows[i]["available"]]
    print(f"{'attempt':<50}" + "".join(f"{i:>12}" for i in available))
    for n, name in enumerate(names):
        marks = ["ESCAPED" if rows[i]["attempts"][n]["escaped"] else "held" for i in available]
        print(f"{name[:49]:<50}" + "".join(f"{m:>12}" for m in marks))
    print(f"{'escaped':<50}" + "".join(f"{rows[i]['escaped']:>12}" for i in available))
    print(f"{'slowest host call, s (deadline 5)':<50}" + "".join(f"{rows[i]['slowest_call_s']:>12}" for i in available))
    print(f"{'run print(1), ms (median of 20)':<50}" + "".join(f"{rows[i]['run_print_ms']:>12}" for i in available))
    isolating = [i for i in available if i != "none"]
    met = all(rows[i]["escaped"] == 0 and rows[i]["slowest_call_s"] <= 5.0 + 1 for i in isolating)
    print(f"auto picks {chosen}: escaped {rows[chosen]['escaped']} (goal 0); goals {'met' if met else 'NOT met'}")
    write_results(
        args.out,
        {
            "machine": {**machine(), "user": "root" if os.geteuid() == 0 else "unprivileged"},
            "isolation": chosen,
            "escaped": rows[chosen]["escaped"],
            "goals_met": met,
            "isolations": rows,
        },
    )


if __name__ == "__main__":
    main()
