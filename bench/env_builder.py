"""Benchmark: an environment built by `toolrl env build --source synthetic --seed 0 --all` (no model, no network)
and the default model on it, per scenario, before and after `--steps` GRPO steps of recipes/built.yaml.

Measures, for each scenario (single_hop, parallel_single_hop, multi_hop, parallel_multi_hop), `success` and
`solve_f1` on the whole test split, greedy and sampled (temperature 1), before and after training; the build's
`tools_validated` / `tools_dropped`; the reference engine's success (1.0 when tasks and scoring are sound).
Prints a table and writes bench/results/env_builder.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import machine, write_results

from toolrl.build import SCENARIOS, build, load_spec
from toolrl.build.artifacts import Workspace
from toolrl.config import load_config
from toolrl.rollout.scripted import scripted_engine
from toolrl.train import RunDir, Trainer, Workbench
from toolrl.train.evaluate import breakdown, summarize

RECIPE = Path(__file__).parents[1] / "recipes" / "built.yaml"


def measure(bench: Workbench, temperature: float) -> dict:
    started = time.perf_counter()
    trajs = bench.evaluation(temperature=temperature)
    stats, details = summarize(trajs, "correct"), breakdown(trajs, "correct")
    row = {
        scenario: {k: round(details["by_category"][scenario][k], 4) for k in ("success", "solve_f1", "tasks")}
        for scenario in SCENARIOS
    }
    row["all"] = {"success": round(stats["success"], 4), "solve_f1": round(details["solve"]["f1"], 4)}
    row["tool_calls"] = round(stats["tool_calls"], 3)
    row["format_errors"] = round(stats["format_errors"], 3)
    row["eval_s"] = round(time.perf_counter() - started, 1)
    return row


def reference_success(bench: Workbench) -> float:
    tasks = bench.env.tasks("test")
    rollout = bench.rollout(bench.config.eval.sampling, seed=0, purpose="oracle")
    rollout.engine = scripted_engine("reference", bench.chat, bench.env.syntax, bench.env)
    return summarize(rollout.run(tasks), "correct")["success"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out", default="bench/results/env_builder.json")
    parser.add_argument("--work", default="runs/bench-built")
    args = parser.parse_args()
    work = Path(args.work)
    started = time.perf_counter()
    manifest = build(load_spec(None, {"source": "synthetic", "seed": 0}), Workspace(work / "env"))
    build_s = round(time.perf_counter() - started, 1)
    deploy = manifest["deploy"]
    print(f"built in {build_s} s: {deploy['tools_validated']} tools validated, {deploy['tools_dropped']} dropped")
    overrides = [
        f"env.options.path={work / 'env'}",
        f"train.steps={args.steps}",
        "eval.at_start=false",
        "eval.at_end=false",
        "run_name=run",
        f"output_dir={work}",
    ]
    config = load_config(RECIPE, overrides)
    bench = Workbench.load(config)
    try:
        result = {"reference_success": reference_success(bench)}
        result["before"] = {"greedy": measure(bench, 0.0), "sampled": measure(bench, 1.0)}
        print(f"before: {result['before']}", flush=True)
        started = time.perf_counter()
        trainer = Trainer(bench, RunDir.create(config))
        steps = []

        def progress(m: dict) -> None:
            steps.append({k: round(m[k], 4) for k in ("reward", "success", "tool_calls") if k in m})
            print(f"step {m['step']}: reward {m['reward']:.3f} success {m['success']:.2f} calls {m['tool_calls']:.2f}")

        trainer.train(progress)
        result["train"] = {"steps": args.steps, "wall_s": round(time.perf_counter() - started, 1), "per_step": steps}
        result["after"] = {"greedy": measure(bench, 0.0), "sampled": measure(bench, 1.0)}
    finally:
        bench.close()
    print(
        f"{'scenario':<22}{'':>8}{'before greedy':>16}{'before sampled':>16}{'after greedy':>16}{'after sampled':>16}"
    )
    for scenario in (*SCENARIOS, "all"):
        for key in ("success", "solve_f1"):
            cells = [result[w][m][scenario][key] for w in ("before", "after") for m in ("greedy", "sampled")]
            print(f"{scenario:<22}{key:>8}" + "".join(f"{c:>16.3f}" for c in cells))
    print(f"reference success {result['reference_success']:.2f}; build {build_s} s")
    build_report = {
        "tools_validated": deploy["tools_validated"],
        "tools_dropped": deploy["tools_dropped"],
        "tasks": deploy["tasks"],
        "integrate": {k: manifest["integrate"][k] for k in ("documents", "distinct_documents", "tools")},
        "scale": {
            k: manifest["scale"][k] for k in ("tools", "functional_tools", "type_changes", "distractors_per_task")
        },
        "seconds": build_s,
    }
    scenarios = {
        s: {
            w: {m: {k: result[w][m][s][k] for k in ("success", "solve_f1")} for m in ("greedy", "sampled")}
            for w in ("before", "after")
        }
        for s in (*SCENARIOS, "all")
    }
    workload = {
        "recipe": "recipes/built.yaml",
        "build": "--source synthetic --seed 0",
        "train_steps": args.steps,
        "train_temperature": config.rollout.sampling.temperature,
        "trajectories_per_step": config.train.prompts_per_step * config.train.group_size,
    }
    write_results(
        args.out,
        {
            "machine": machine(),
            "workload": workload,
            "build": build_report,
            **build_report,
            "scenarios": scenarios,
            **result,
        },
    )


if __name__ == "__main__":
    main()
