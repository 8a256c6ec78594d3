"""Benchmark: the environment builder at the size of a real multi-hop set (`--scaling`), and the default model
on an environment built by `toolrl env build --source synthetic --seed 0 --all` (no model, no network), per
scenario, before and after `--steps` GRPO steps of recipes/built.yaml.

Measures, for each scenario (single_hop, parallel_single_hop, multi_hop, parallel_multi_hop), `success` and
`solve_f1` on the whole test split, greedy and sampled (temperature 1), before and after training; the build's
`tools_validated` / `tools_dropped`; the reference engine's success (1.0 when tasks and scoring are sound).
Prints a table and writes bench/results/env_builder.json.

`--scaling`: `source: decompositions` over 40/80/160/310 questions of the hand-made multi-hop set
(tests/harness/multihop.py: chains, comparisons, fan-outs; one relation named several ways by its annotators),
each size in a fresh process: seconds per stage, peak memory, tools, merge precision and recall against the
set's truth, tasks dropped; the growth exponent of the build's time. Writes bench/results/env_builder_scaling.json.

`--real`: a real multi-hop set, FanOutQA's dev set as the `fanoutqa` package ships it (310 questions with their
decompositions; data CC BY-SA 4.0), read with `tasks.format: fanoutqa`, at 40/80/160/310 questions beside the
synthetic world, each build in a fresh process (seconds per stage, peak memory, tools, widest functional tool,
tasks kept, true conflicts); integration's precision and recall on bench/data/relation_pairs.jsonl per no-LLM
method; then, on the 310-question build, `toolrl env check`, `toolrl eval` and a 2-step `toolrl train` on the
default model, each a process of its own (wall time, peak memory). Writes bench/results/env_builder_real.json
with the load average before and after (run it beside `make test` to measure a busy machine).
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
FANOUT_RECIPE = Path(__file__).parents[1] / "recipes" / "fanoutqa.yaml"


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


def timed_build(spec, folder: Path) -> tuple[dict, dict]:
    """Build `spec` into `folder` in this process: its build.json and what a size's row measures of it."""
    import resource

    from toolrl.build import ORDER

    started = time.perf_counter()
    manifest = build(spec, Workspace(folder))
    return manifest, {
        "subproblems": manifest["documents"]["documents"],
        "seconds": round(time.perf_counter() - started, 2),
        "stage_seconds": {name: manifest[name]["seconds"] for name in ORDER},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def one_size(size: int, work: Path, argument: str | None = None) -> dict:
    """Build the first `size` questions of the hand-made set (this process: its peak memory is the build's)."""
    import json
    import shutil

    from tests.harness import multihop

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    path = work / "decompositions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in multihop.questions(size, argument=argument)))
    spec = load_spec(None, {"source": "decompositions", "tasks": {"path": str(path)}})
    manifest, measured = timed_build(spec, work / "env")
    tools = [json.loads(line) for line in (work / "env" / "3_tools.jsonl").read_text().splitlines()]
    return {
        "questions": size,
        **measured,
        "tools": manifest["integrate"]["tools"],
        "tools_deployed": manifest["deploy"]["tools_validated"],
        "by_scenario": manifest["decompose"]["by_scenario"],
        "tasks_dropped": manifest["scale"]["tasks_dropped"] + manifest["deploy"]["tasks_dropped"],
        **multihop.merge_quality(tools),
    }


WORKLOADS = {"entity names": None, "one argument name": "entity"}
"""How the calls' arguments are named: by their entity (person, film), or all alike (a set wrapped with one name:
every document in one signature, the case where integration has the most pairs to weigh)."""


def scaling(sizes: list[int], out: str, work: Path) -> None:
    results = {name: workload(sizes, work, argument) for name, argument in WORKLOADS.items()}
    write_results(out, {"machine": machine(), "workload": "tests/harness/multihop.py, source decompositions, "
                        "default spec", **results})  # fmt: skip


def workload(sizes: list[int], work: Path, argument: str | None) -> dict:
    import json
    import math
    import subprocess
    import sys

    rows = []
    print(f"arguments named: {argument or 'by entity'}")
    for size in sizes:
        command = [sys.executable, __file__, "--one", str(size), "--work", str(work / f"scaling-{size}")]
        command += ["--argument", argument] if argument else []
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        row = rows[-1]
        print(f"{size} questions: {row['seconds']} s, {row['tools']} tools, precision {row['merge_precision']}, "
              f"recall {row['merge_recall']}", flush=True)  # fmt: skip
    head = f"{'questions':>9}{'subprobs':>9}{'total s':>9}{'integr. s':>10}{'peak MiB':>9}{'tools':>7}"
    print(head + f"{'precision':>10}{'recall':>8}{'dropped':>8}")
    for r in rows:
        print(f"{r['questions']:>9}{r['subproblems']:>9}{r['seconds']:>9.1f}{r['stage_seconds']['integrate']:>10.1f}"
              f"{r['peak_rss_mib']:>9}{r['tools']:>7}{r['merge_precision']:>10.3f}{r['merge_recall']:>8.3f}"
              f"{r['tasks_dropped']:>8}")  # fmt: skip
    first, last = rows[0], rows[-1]
    growth = math.log(last["seconds"] / first["seconds"]) / math.log(last["questions"] / first["questions"])
    print(f"time grows as questions^{growth:.2f} from {first['questions']} to {last['questions']} questions")
    return {"sizes": rows, "growth_exponent": round(growth, 3)}


def fanout_subset(size: int, path: Path) -> Path:
    """The first `size` questions of FanOutQA's dev set, in its own format."""
    import json

    from toolrl.build.formats import fanoutqa_dev

    dev = fanoutqa_dev()
    if dev is None:
        raise SystemExit("the fanoutqa package is not installed: make install-test installs it (pip install --no-deps "
                         "fanoutqa==1.1.1)")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json.loads(dev.read_text(encoding="utf-8"))[:size]), encoding="utf-8")
    return path


def one_real(size: int, work: Path) -> dict:
    """Build the first `size` FanOutQA questions (size 0: the synthetic world) in this process."""
    import json
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    if size:
        source = {"source": "decompositions", "tasks": {"path": str(fanout_subset(size, work / "dev.json")),
                  "format": "fanoutqa"}}  # fmt: skip
    else:
        source = {"source": "synthetic", "seed": 0}
    manifest, measured = timed_build(load_spec(None, source), work / "env")
    tools = [json.loads(line) for line in (work / "env" / "4_tools.jsonl").read_text().splitlines()]
    return {
        "questions": size or "synthetic world",
        **measured,
        "kinds": manifest["decompose"]["kinds"],
        "tools": manifest["deploy"]["tools_validated"],
        "tools_dropped": manifest["deploy"]["tools_dropped"],
        "widest_functional_tool": max((len(t["impl"]["fields"]) for t in tools), default=0),
        "tasks": manifest["deploy"]["tasks"],
        "tasks_dropped": manifest["decompose"]["tasks"] - manifest["deploy"]["tasks"],
        "true_conflicts": manifest["decompose"].get("fact_conflicts", 0),
        "tasks_with_own_facts": manifest["deploy"].get("tasks_with_own_facts", 0),
        "needs": manifest["deploy"].get("needs", {}),
    }


def timed(command: list[str], log: Path) -> dict:
    """Run a command in a process of its own: wall time and its peak resident memory, sampled from /proc every
    0.2 s (written when toolrl's PeakMeter reset the kernel's mark, which it no longer does outside benchmarks)."""
    import subprocess

    started = time.perf_counter()
    peak_kb = 0
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while child.poll() is None:
            try:
                status = Path(f"/proc/{child.pid}/status").read_text()
                sizes = [int(line.split()[1]) for line in status.splitlines() if line.startswith(("VmRSS:", "VmHWM:"))]
                peak_kb = max([peak_kb, *sizes])
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
    return {
        "command": " ".join(command[2:]),
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mib": round(peak_kb / 1024),
        "exit": child.returncode,
        "log": str(log),
    }


def real(sizes: list[int], out: str, work: Path, eval_tasks: int, train_steps: int) -> None:
    import json
    import math
    import os
    import subprocess
    import sys

    from toolrl.build.pairs import load_pairs, pair_scores

    load_before = os.getloadavg()
    rows = []
    for size in [*sizes, 0]:
        command = [sys.executable, __file__, "--one-real", str(size), "--work", str(work / f"real-{size}")]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{r['questions']}: {r['seconds']} s, peak {r['peak_rss_mib']} MiB, {r['tools']} tools, "
              f"{r['tasks']} tasks ({r['tasks_dropped']} dropped)", flush=True)  # fmt: skip
    real_rows = [r for r in rows if isinstance(r["questions"], int)]
    first, last = real_rows[0], real_rows[-1]
    growth = math.log(last["seconds"] / first["seconds"]) / math.log(last["questions"] / first["questions"])
    pairs = load_pairs(Path(__file__).parent / "data" / "relation_pairs.jsonl")
    merges = {method: pair_scores(pairs, method, 0.8) for method in ("name", "embedding")}
    merges["llm"] = {"measured": False, "why": "no model that can judge is reachable from this machine: set "
                     "integrate.method llm with llm.base_url to a 7B+ instruction model to measure it"}  # fmt: skip
    env = work / f"real-{sizes[-1]}" / "env"
    run = f"train-{time.strftime('%Y%m%d-%H%M%S')}"
    toolrl = [sys.executable, "-m", "toolrl"]
    where = ["--set", "env.name=built", "--set", f"env.options.path={env}"]
    runs = {
        "check": timed([*toolrl, "env", "check", *where], work / "check.log"),
        "eval": timed([*toolrl, "eval", *where, "--num-tasks", str(eval_tasks)], work / "eval.log"),
        "train": timed([*toolrl, "train", str(FANOUT_RECIPE), "--set", f"env.options.path={env}", "--set",
                        f"train.steps={train_steps}", "--set", f"output_dir={work}", "--set", f"run_name={run}",
                        "--set", "eval.at_start=false", "--set", "eval.at_end=false"], work / "train.log"),
    }  # fmt: skip
    steps = [json.loads(line) for line in (work / run / "metrics.jsonl").read_text().splitlines()]
    runs["train"]["steps"] = [
        {
            k: round(m[k], 3)
            for k in ("step_s", "rollout_s", "train_s", "memory/rollout_peak_gb", "memory/update_peak_gb")
            if k in m
        }
        for m in steps
    ]
    load_after = os.getloadavg()
    head = f"{'questions':>16}{'subprobs':>9}{'build s':>8}{'deploy s':>9}{'peak MiB':>9}{'tools':>6}{'widest':>7}"
    print(head + f"{'tasks':>6}{'dropped':>8}{'conflicts':>10}")
    for r in rows:
        print(f"{r['questions']!s:>16}{r['subproblems']:>9}{r['seconds']:>8.1f}{r['stage_seconds']['deploy']:>9.1f}"
              f"{r['peak_rss_mib']:>9}{r['tools']:>6}{r['widest_functional_tool']:>7}{r['tasks']:>6}"
              f"{r['tasks_dropped']:>8}{r['true_conflicts']:>10}")  # fmt: skip
    print(f"build time grows as questions^{growth:.2f} from {first['questions']} to {last['questions']} questions")
    for method in ("name", "embedding"):
        m = merges[method]
        print(f"integration ({method}) on {m['pairs']} labeled pairs: precision {m['precision']}, recall "
              f"{m['recall']}")  # fmt: skip
    for name, r in runs.items():
        print(f"{name}: {r['seconds']} s, peak {r['peak_rss_mib']} MiB, exit {r['exit']}")
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    write_results(out, {
        "machine": machine(),
        "data": "FanOutQA dev set (fanoutqa 1.1.1 on PyPI; data CC BY-SA 4.0), tasks.format fanoutqa",
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
        "sizes": rows,
        "growth_exponent": round(growth, 3),
        "merges": merges,
        "on_310": {**runs, "eval_tasks": eval_tasks, "train_steps": train_steps},
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out", default=None)
    parser.add_argument("--work", default="runs/bench-built")
    parser.add_argument("--scaling", action="store_true", help="the build's time and merges at 40-310 questions")
    parser.add_argument("--sizes", default="40,80,160,310,1240")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--argument", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--real", action="store_true", help="FanOutQA's dev set at 40-310 questions, check/eval/train")
    parser.add_argument("--eval-tasks", type=int, default=16)
    parser.add_argument("--train-steps", type=int, default=2)
    parser.add_argument("--one-real", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_real is not None:
        import json

        print(json.dumps(one_real(args.one_real, Path(args.work))))
        return
    if args.real:
        sizes = [int(s) for s in (args.sizes if args.sizes != "40,80,160,310,1240" else "40,80,160,310").split(",")]
        real(sizes, args.out or "bench/results/env_builder_real.json", Path(args.work), args.eval_tasks,
             args.train_steps)  # fmt: skip
        return
    if args.one:
        import json

        print(json.dumps(one_size(args.one, Path(args.work), args.argument)))
        return
    if args.scaling:
        sizes = [int(s) for s in args.sizes.split(",")]
        scaling(sizes, args.out or "bench/results/env_builder_scaling.json", Path(args.work))
        return
    args.out = args.out or "bench/results/env_builder.json"
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
        f"run_name=run-{time.strftime('%Y%m%d-%H%M%S')}",  # a new run each time: run directories are not reused
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
