"""Benchmark: training ahead of the trainer (train.async_steps, partial rollouts) against lock-step, on tools whose
latencies are heavy-tailed; success after 20 steps of calculator.yaml ahead; each off-policy correction's metrics.

Speed: bench/rollout.py's slow calculator (registered from outside the package) with heavy-tailed latencies
(--latency): `tail20`, log-normal with median 0.5 s and sigma 1.35 (p99 23x the median), or `tail20slow`, the same
tail with median 2 s (tools that wait on the world: a sandbox, a search), handed out in call order from one seeded
list, so that every run waits on the same latencies. Runs of --steps steps (4 prompts x 6 samples at temperature
0.6, no evaluations): lock-step (async_steps 0) and ahead (async_steps 3, partial_rollouts continue), alternated
(lockstep, ahead, ahead, lockstep, ...); steps per hour from the summed wall times, `speedup_vs_lockstep` their
ratio. The bound of one stream: with one engine and one trainer sharing the cores, a step ahead costs at least the
larger of its rollout and its update, so the lock-step runs' rollout and update seconds give what overlap alone can
win ((R + U) / max(R, U)); rollouts of several steps at once (partial rollouts) also overlap one step's tool waits
with another's, and nothing overlaps compute with compute on cores that are all busy.

Success (--learning FILE RUNS): the calculator recipe of bench/learning.py (20 steps, 3 seeds) run ahead, read
from its results and runs:

    python bench/learning.py --recipes calculator --set train.async_steps=3 \\
        --set train.partial_rollouts=continue --out FILE --runs RUNS

Corrections: each registered correction on the ahead setting (--correction-steps steps, 2 prompts x 6 samples),
with what it logged (correction/masked_fraction, mean_weight, capped_fraction, the ratio's range) and the
staleness seen. Prints tables and writes bench/results/async.json (a part not run keeps its earlier results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import machine, write_results

from rollout import slow_calculator_env

AHEAD = ("train.async_steps=3", "train.partial_rollouts=continue")
CORRECTION_KEYS = ("correction/masked_fraction", "correction/mean_weight", "correction/capped_fraction",
                   "mismatch/max_ratio", "mismatch/min_ratio", "mismatch/kl")  # fmt: skip


EXTRA: list[str] = []
"""--set overrides, for every run (a smaller model in the suite's sample)."""


LATENCIES = {
    "tail20": "log-normal, median 0.5 s, sigma 1.35 (p99 23x the median), seeded, in call order",
    "tail20slow": "log-normal, median 2 s, sigma 1.35 (p99 23x the median), seeded, in call order",
    "zero": "none: the tools answer at once (the bound's lock-step runs)",
}


def train(name: str, out: str, steps: int, settings: tuple[str, ...], latency: str = "tail20") -> dict:
    """One training run on the heavy-tailed calculator; its wall time (steps and the final checkpoint) and rows."""
    from toolrl.config import load_config
    from toolrl.train import RunDir, Trainer, Workbench

    slow_calculator_env()
    config = load_config(overrides=[
        "env.name=bench_slow_calculator", f"env.options.latency={latency}", f"train.steps={steps}",
        "eval.at_start=false", "eval.at_end=false", f"output_dir={out}", f"run_name={name}", "device=cpu",
        "rollout.sampling.temperature=0.6", *settings, *EXTRA,
    ])  # fmt: skip
    bench = Workbench.load(config)
    trainer = Trainer(bench, RunDir.create(config))
    rows: list[dict] = []
    started, cpu = time.perf_counter(), time.process_time()
    trainer.train(on_step=rows.append)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    latencies = bench.env.latencies
    bench.close()
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),  # the process's CPU seconds, every thread: the compute both ways must do
        "steps_per_hour": round(steps * 3600 / wall, 1),
        "rollout_s": round(sum(r["rollout_s"] for r in rows), 1),
        "update_s": round(sum(r["train_s"] for r in rows), 1),
        "waited_s": round(sum(r.get("offpolicy/rollout_wait_s", r["rollout_s"]) for r in rows), 1),
        "tool_latency_sum_s": round(sum(latencies.values[: latencies.next]), 1),
        "tool_latency_max_s": round(max(latencies.values[: latencies.next], default=0.0), 2),
        "generated_tokens": sum(r["generated_tokens"] for r in rows),
        "success": round(statistics.mean(r.get("success", 0.0) for r in rows), 4),
        "max_staleness": max((r.get("offpolicy/staleness", 0) for r in rows), default=0),
        "partial_fraction": round(statistics.mean(r.get("offpolicy/partial_fraction", 0.0) for r in rows), 4),
        "metrics": {
            k: round(statistics.mean(r[k] for r in rows if k in r), 5)
            for k in CORRECTION_KEYS
            if any(k in r for r in rows)
        },
    }


def speed(steps: int, repeats: int, latency: str) -> dict:
    runs: dict[str, list[dict]] = {"lockstep": [], "ahead": []}
    order = [("lockstep", ()), ("ahead", AHEAD), ("ahead", AHEAD), ("lockstep", ())] * max(1, repeats // 2)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (mode, settings) in enumerate(order):
            run = train(f"{mode}-{i}", tmp, steps, settings, latency)
            runs[mode].append(run)
            print(f"{mode:>9}: {run['wall_s']:7.1f} s  {run['steps_per_hour']:6.1f} steps/h  rollout "
                  f"{run['rollout_s']:6.1f} s  update {run['update_s']:6.1f} s  staleness <= {run['max_staleness']}  "
                  f"partial {run['partial_fraction']:.2f}  load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip

    def total(mode: str, key: str) -> float:
        return sum(r[key] for r in runs[mode])

    rollout, update = total("lockstep", "rollout_s"), total("lockstep", "update_s")
    return {
        "steps": steps,
        "latency": LATENCIES[latency],
        "settings": {"ahead": list(AHEAD), "prompts_per_step": 4, "group_size": 6},
        "runs": runs,
        "steps_per_hour": {mode: round(len(runs[mode]) * steps * 3600 / total(mode, "wall_s"), 1) for mode in runs},
        "speedup_vs_lockstep": round(total("lockstep", "wall_s") / total("ahead", "wall_s"), 3),
        "overlap_bound": round((rollout + update) / max(rollout, update), 3),
        "max_staleness": max(r["max_staleness"] for r in runs["ahead"]),
    }


def zero_latency(steps: int, repeats: int) -> dict:
    """Lock-step runs whose tools answer at once: the compute alone. No overlap can make a step ahead cheaper than
    its compute where the trainer and the engine share the cores, so a setting's lock-step wall time over this one
    is the most that going ahead can win there (`latency_bound`)."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            runs.append(train(f"zero-{i}", tmp, steps, (), "zero"))
            print(f"lockstep, tools at once: {runs[-1]['wall_s']:7.1f} s  cpu {runs[-1]['cpu_s']:7.1f} s  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    return {"steps": steps, "runs": runs, "wall_s": round(statistics.mean(r["wall_s"] for r in runs), 1)}


def corrections(steps: int) -> dict:
    from toolrl.algos.registries import CORRECTIONS

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CORRECTIONS:
            settings = (*AHEAD, f"train.correction={name}", "train.prompts_per_step=2")
            run = train(f"correction-{name}", tmp, steps, settings)
            out[name] = {"max_staleness": run["max_staleness"], "wall_s": run["wall_s"], **run["metrics"]}
            print(f"{name:>14}: " + "  ".join(f"{k.split('/')[1]} {v:.4g}" for k, v in run["metrics"].items()),
                  flush=True)  # fmt: skip
    return out


def learning(file: str, runs: str) -> dict:
    """success_after per seed from bench/learning.py's results, with each run's largest staleness."""
    import yaml

    result = json.loads(Path(file).read_text())["calculator"]
    stale, settings = {}, list(AHEAD)
    for metrics in sorted(Path(runs).glob("calculator-seed*/metrics.jsonl")):
        train = yaml.safe_load((metrics.parent / "config.yaml").read_text())["train"]
        settings = [f"train.{k}={train[k]}" for k in ("async_steps", "partial_rollouts", "correction")]
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        seed = int(metrics.parent.name.split("-seed")[1].split("-")[0])
        stale[seed] = max((r.get("offpolicy/staleness", 0) for r in rows if "eval" not in r), default=0)
    seeds = result["args"]["seeds"]
    return {
        "recipe": "recipes/calculator.yaml (20 steps of 4 prompts x 6 samples)",
        "settings": settings,
        "success_after": {str(s): row["sampled_after"] for s, row in zip(seeds, result["seeds"], strict=True)},
        "greedy_after": {str(s): row["greedy_after"] for s, row in zip(seeds, result["seeds"], strict=True)},
        "sampled_after_mean": result["sampled_after"],
        "max_staleness": {str(s): stale.get(s) for s in seeds},
        "train_s": {str(s): row["train_s"] for s, row in zip(seeds, result["seeds"], strict=True)},
        "lockstep_reference": "bench/results/learning.json calculator: sampled 0.99, 0.98, 0.99 after 20 steps",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per speed run")
    parser.add_argument("--latency", choices=sorted(LATENCIES), default="tail20", help="the tools' latencies")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode (alternated)")
    parser.add_argument("--correction-steps", type=int, default=3)
    parser.add_argument("--learning", nargs=2, metavar=("FILE", "RUNS"), help="bench/learning.py's results and runs")
    parser.add_argument("--skip", nargs="*", default=[], choices=["speed", "corrections"])
    parser.add_argument("--bound", action="store_true", help="also lock-step runs with tools that answer at once")
    parser.add_argument("--set", action="append", default=[], help="a config override for every run")
    parser.add_argument("--out", default="bench/results/async.json")
    args = parser.parse_args()
    EXTRA.extend(args.set)
    result = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    result["machine"] = machine()
    result["load_avg_before"] = [round(x, 2) for x in os.getloadavg()]
    if "speed" in result and "runs" in result["speed"]:  # a result of one latency setting, before there were two
        result["speed"] = {"tail20": result["speed"]}
    if "speed" not in args.skip:
        measured = result.setdefault("speed", {})[args.latency] = speed(args.steps, args.repeats, args.latency)
        print(f"\nsteps/hour: lock-step {measured['steps_per_hour']['lockstep']}, ahead "
              f"{measured['steps_per_hour']['ahead']}: x{measured['speedup_vs_lockstep']} "
              f"(overlap bound of one stream x{measured['overlap_bound']})")  # fmt: skip
    if args.bound:
        result["zero_latency_lockstep"] = zero_latency(args.steps, args.repeats)
    if "speed" in result:
        result["speedup_vs_lockstep"] = {k: v["speedup_vs_lockstep"] for k, v in result["speed"].items()}
    if "speed" in result and "zero_latency_lockstep" in result:
        zero = result["zero_latency_lockstep"]["wall_s"]
        for measured in result["speed"].values():
            lockstep = statistics.mean(r["wall_s"] for r in measured["runs"]["lockstep"])
            measured["latency_bound"] = round(lockstep / zero, 3)  # lock-step's wall over its compute alone
    if "corrections" not in args.skip:
        result["corrections"] = corrections(args.correction_steps)
    if args.learning:  # by the runs' correction: each setting's seeds
        measured = learning(*args.learning)
        correction = measured["settings"][-1].split("=", 1)[1]
        result.setdefault("learning", {})[correction] = measured
        result["success_after"] = {k: v["success_after"] for k, v in result["learning"].items()}
    stale = [s["max_staleness"] for s in result.get("speed", {}).values()]
    stale += [v for m in result.get("learning", {}).values() for v in m["max_staleness"].values() if v is not None]
    stale += [c["max_staleness"] for c in result.get("corrections", {}).values()]
    result["max_staleness"] = max(stale)
    write_results(args.out, result)


if __name__ == "__main__":
    main()
