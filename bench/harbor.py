"""Benchmark: Harbor tasks in local sandbox boxes: the reference's and the idle policy's success on toolrl's fixture
tasks (`toolrl env check`), and 32 episodes at once on this machine's cores: each box started, the reference
solution run (not timed), the task's tests copied in, run and their reward read; the seconds from start to verdict
per episode without the agent's own work (start + verify), and what is left on the host after (box folders,
cgroups, sandbox processes, mounts).

Keys: `reference_success` (goal 1.0), `idle_success` (0.0), `p95_start_verify_s` (goal < 1 at 32 concurrent; the
largest of the rounds' p95, as a lock-step rollout schedules them: 32 boxes started together, then after the agents'
work 32 verified together; `p95_start_verify_s_median` the rounds' median; `..._overlapped` each box solved and
verified as soon as it starts, a stress figure), `leftovers` (0), `tasks` (>= 12), `rounds` (each round's
p50/p95/max of start, verify and their sum, and its wall seconds), `cold` (the first round, which builds each task's
template once).
Prints a table and writes bench/results/harbor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, write_results

from toolrl.config.schema import EnvConfig
from toolrl.envs.base import make_env
from toolrl.envs.harbor.env import verify


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def env_check() -> tuple[float, float, int]:
    done = subprocess.run([sys.executable, "-m", "toolrl", "env", "check", "--set", "env.name=harbor", "--json"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)  # fmt: skip
    if done.returncode not in (0, 1):
        raise SystemExit(f"bench/harbor.py: env check failed:\n{done.stderr[-2000:]}")
    reference, idle = json.loads(done.stdout)["policies"]
    return reference["success"], idle["success"], reference["tasks"]


async def since(t0: float, work) -> float:
    """Seconds from `t0` (when the batch was launched) until `work` is done: the latency an episode sees, its wait
    for the others' work included."""
    await work
    return time.perf_counter() - t0


async def phased(env, tasks) -> list[dict]:
    """As a lock-step rollout does it: every box started at once (the episodes open together), the agents' work
    (the reference solution, not timed), then every box verified at once (the rubric scores the batch together)."""
    episodes = [env.reset(task) for task in tasks]
    verdicts: dict[int, object] = {}

    async def check(i: int, ep) -> None:
        verdicts[i] = await verify(ep.box, ep.harbor)

    try:
        t0 = time.perf_counter()
        starts = await asyncio.gather(*(since(t0, ep.open()) for ep in episodes))
        solved = await asyncio.gather(*(ep.box.exec(ep.harbor.solve.read_text()) for ep in episodes))
        assert all(s.ok for s in solved), [s for s in solved if not s.ok][:1]
        t0 = time.perf_counter()
        verifies = await asyncio.gather(*(since(t0, check(i, ep)) for i, ep in enumerate(episodes)))
    finally:
        for ep in episodes:
            ep.close()
    return [{"start_s": s, "verify_s": v, "start_verify_s": s + v, "reward": verdicts[i].reward,
             "error": verdicts[i].error} for i, (s, v) in enumerate(zip(starts, verifies, strict=True))]  # fmt: skip


async def overlapped(env, task, t0: float) -> dict:
    """One episode of a burst in which each box is solved and verified as soon as it starts (every episode's work
    lands in the same second: a stress figure, not a rollout's schedule)."""
    ep = env.reset(task)
    opened = await since(t0, ep.open())
    try:
        assert (await ep.box.exec(ep.harbor.solve.read_text())).ok
        started = time.perf_counter()
        verdict = await verify(ep.box, ep.harbor)
        checked = time.perf_counter() - started
    finally:
        ep.close()
    return {"start_s": opened, "verify_s": checked, "start_verify_s": opened + checked, "reward": verdict.reward,
            "error": verdict.error}  # fmt: skip


async def round_(env, tasks, concurrent: int, schedule: str) -> dict:
    started = time.perf_counter()
    chosen = [tasks[i % len(tasks)] for i in range(concurrent)]
    if schedule == "phased":
        rows = await phased(env, chosen)
    else:
        rows = await asyncio.gather(*(overlapped(env, task, started) for task in chosen))
    wall = time.perf_counter() - started
    summary = {"schedule": schedule, "wall_s": round(wall, 3), "episodes": concurrent,
               "passed": sum(r["reward"] == 1.0 for r in rows),
               "errors": [r["error"] for r in rows if r["error"]]}  # fmt: skip
    for key in ("start_s", "verify_s", "start_verify_s"):
        values = [r[key] for r in rows]
        summary[key] = {"p50": round(statistics.median(values), 3), "p95": round(quantile(values, 0.95), 3),
                        "max": round(max(values), 3)}  # fmt: skip
    return summary


def mounts() -> int:
    return len(Path("/proc/self/mountinfo").read_text().splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beside", default=os.environ.get("TOOLRL_BENCH_BESIDE", ""), help="what else ran")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "harbor.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    reference, idle, tasks_count = env_check()
    print(f"env check: reference {reference:.0%}, idle {idle:.0%} on {tasks_count} tasks", flush=True)
    boxes_before = set(Path(tempfile.gettempdir()).glob("toolrl-box-*"))
    mounts_before = mounts()
    env = make_env(EnvConfig(name="harbor"))
    tasks = env.tasks("train")
    rounds: dict[str, list] = {"phased": [], "overlapped": []}
    try:
        for number in range(args.rounds + 1):
            for schedule in rounds:
                summary = asyncio.run(round_(env, tasks, args.concurrent, schedule))
                rounds[schedule].append(summary)
                sv = summary["start_verify_s"]
                print(f"round {number}{' (cold)' if number == 0 else ''} {schedule:>10}: {args.concurrent} at once, "
                      f"start+verify p50 {sv['p50']:.3f} s  p95 {sv['p95']:.3f} s  max {sv['max']:.3f} s  (start p95 "
                      f"{summary['start_s']['p95']:.3f} s, verify p95 {summary['verify_s']['p95']:.3f} s)  wall "
                      f"{summary['wall_s']:.2f} s  passed {summary['passed']}/{summary['episodes']}",
                      flush=True)  # fmt: skip
        left = env.provider.leftovers()
    finally:
        env.close()
    left += [f"box folder {p}" for p in set(Path(tempfile.gettempdir()).glob("toolrl-box-*")) - boxes_before]
    left += [f"{mounts() - mounts_before} mounts"] if mounts() != mounts_before else []
    warm = rounds["phased"][1:]
    result = {
        "reference_success": reference, "idle_success": idle,
        "p95_start_verify_s": max(r["start_verify_s"]["p95"] for r in warm),
        "p95_start_verify_s_median": statistics.median(r["start_verify_s"]["p95"] for r in warm),
        "p95_start_verify_s_overlapped": max(r["start_verify_s"]["p95"] for r in rounds["overlapped"][1:]),
        "leftovers": len(left), "leftovers_seen": left, "tasks": tasks_count, "concurrent": args.concurrent,
        "rounds": {k: v[1:] for k, v in rounds.items()}, "cold": {k: v[0] for k, v in rounds.items()},
        "provider": "local", "isolation": env.provider.isolation,
        "goal": "reference 1.0, idle 0.0, p95 start+verify < 1 s at 32 concurrent, no leftovers, >= 12 tasks",
        "beside": args.beside, "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()], "machine": machine(),
    }  # fmt: skip
    print(f"p95 start+verify {result['p95_start_verify_s']:.3f} s at {args.concurrent} concurrent; leftovers "
          f"{len(left)}; tasks {tasks_count}")  # fmt: skip
    write_results(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
