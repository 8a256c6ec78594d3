"""Benchmark: does training move the numbers that matter? For each recipe, success on its test split, greedy
(temperature 0) and sampled (eval.sampling), before and after the recipe's training (its warm start, if it sets
one, and its RL steps), over several seeds, with the spread. One script makes the README's table.

    python bench/learning.py                                   # demo, built, files; seeds 0 1 2
    python bench/learning.py --recipes demo --seeds 0 --steps 5 --num-tasks 20
    python bench/learning.py --quick                            # the tiny model, 1 seed, 2 steps: the suite's sample

`demo` is recipes/calculator.yaml (what `make demo` trains); every other name is recipes/NAME.yaml. Writes
bench/results/learning.json as {recipe: {greedy_before, greedy_after, sampled_before, sampled_after, seeds,
spread, ...}}: means over seeds, each seed's values, and their standard deviation. Greedy before is the same
model for every seed (computed once); sampled evaluations draw with the seed. Progress goes to stdout and
bench/results/learning.log; peak resident memory is recorded.
"""

from __future__ import annotations

import argparse
import logging
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, write_results

from toolrl.config import load_config
from toolrl.train import RunDir, Trainer, Workbench

RECIPES = {"demo": "calculator"}
METRICS = ("greedy_before", "greedy_after", "sampled_before", "sampled_after")
log = logging.getLogger("bench.learning")


def recipe_path(name: str) -> Path:
    path = ROOT / "recipes" / f"{RECIPES.get(name, name)}.yaml"
    if not path.is_file():
        raise SystemExit(f"--recipes: no recipe {name!r} (recipes/{RECIPES.get(name, name)}.yaml)")
    return path


def success(bench: Workbench, temperature: float, num_tasks: int) -> float:
    stats = bench.evaluate(num_tasks=num_tasks, temperature=temperature)
    return round(stats.get("success", stats["reward"]), 4)


def one_seed(name: str, seed: int, args, out_dir: Path, greedy_before: dict[str, float]) -> dict[str, float]:
    overrides = [f"seed={seed}", "eval.at_start=false", "eval.at_end=false", f"output_dir={out_dir}",
                 f"run_name={name}-seed{seed}", *args.set]  # fmt: skip
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    config = load_config(recipe_path(name), overrides)
    sampled_t = config.eval.sampling.temperature
    bench = Workbench.load(config)
    try:
        started = time.perf_counter()
        if name not in greedy_before:
            greedy_before[name] = success(bench, 0.0, args.num_tasks)
        row = {"greedy_before": greedy_before[name], "sampled_before": success(bench, sampled_t, args.num_tasks)}
        say(f"{name} seed {seed}: before greedy {row['greedy_before']:.2f} sampled {row['sampled_before']:.2f} "
            f"({time.perf_counter() - started:.0f} s); training {config.train.steps} steps"
            + (" after a warm start" if config.train.warm_start else ""))  # fmt: skip
        started = time.perf_counter()
        trainer = Trainer(bench, RunDir.create(config))
        trainer.on_note = say
        trainer.train(lambda m: say(f"{name} seed {seed}: step {m['step']} reward {m['reward']:.3f} "
                                    f"success {m.get('success', 0):.3f} ({m['step_s']:.0f} s)"))  # fmt: skip
        row["train_s"] = round(time.perf_counter() - started, 1)
        row["greedy_after"] = success(bench, 0.0, args.num_tasks)
        row["sampled_after"] = success(bench, sampled_t, args.num_tasks)
        say(f"{name} seed {seed}: after greedy {row['greedy_after']:.2f} sampled {row['sampled_after']:.2f}")
        return row
    finally:
        bench.close()


def summary(rows: list[dict[str, float]]) -> dict:
    out: dict = {k: round(statistics.fmean(r[k] for r in rows), 4) for k in METRICS}
    out["seeds"] = rows
    out["spread"] = {k: round(statistics.pstdev([r[k] for r in rows]), 4) for k in METRICS}
    out["gain_greedy"] = round(out["greedy_after"] - out["greedy_before"], 4)
    out["gain_sampled"] = round(out["sampled_after"] - out["sampled_before"], 4)
    return out


LOG = None


def say(text: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {text}"
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


def main() -> None:
    global LOG
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["demo", "built", "files"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="train.steps (default: the recipe's)")
    parser.add_argument("--num-tasks", type=int, default=100, help="test tasks per evaluation (at most the split)")
    parser.add_argument("--set", action="append", default=[], help="a config override for every run")
    parser.add_argument("--quick", action="store_true", help="the tiny test model, 1 seed, 2 steps, 4 tasks")
    parser.add_argument("--out", default=None, help="default: bench/results/learning.json (--quick: a temporary one)")
    parser.add_argument("--runs", default=None, help="where the runs go (default: runs/learning)")
    args = parser.parse_args()
    if args.out is None:
        args.out = str(Path(tempfile.mkdtemp()) / "learning.json") if args.quick else "bench/results/learning.json"
    if args.quick:
        from tests.harness.tiny import make_tiny_model

        tiny = make_tiny_model(Path(args.out).parent / "tiny-model")
        args.recipes, args.seeds, args.steps, args.num_tasks = args.recipes[:1], args.seeds[:1], 2, 4
        args.set += [f"model.name={tiny}", "device=cpu", "train.prompts_per_step=2", "train.group_size=2",
                     "rollout.max_new_tokens=16"]  # fmt: skip
    out_dir = Path(args.runs or ROOT / "runs" / "learning").resolve()
    LOG = Path(args.out).with_suffix(".log").open("w", encoding="utf-8")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    results: dict = {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k != "out"}}
    greedy_before: dict[str, float] = {}
    started = time.perf_counter()
    for name in args.recipes:
        recipe_path(name)
        rows = [one_seed(name, seed, args, out_dir, greedy_before) for seed in args.seeds]
        results[name] = summary(rows)
        write_results(args.out, results)  # after each recipe: a long run keeps what it measured
    results["wall_s"] = round(time.perf_counter() - started, 1)
    results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    write_results(args.out, results)
    print(f"\n{'recipe':<10}{'greedy before':>15}{'greedy after':>14}{'sampled before':>16}{'sampled after':>15}")
    for name in args.recipes:
        r = results[name]
        cells = [f"{r[k]:.2f}±{r['spread'][k]:.2f}" for k in METRICS]
        print(f"{name:<10}{cells[0]:>15}{cells[1]:>14}{cells[2]:>16}{cells[3]:>15}")
    print(f"wall {results['wall_s']:.0f} s, peak RSS {results['peak_rss_mb']:.0f} MiB; {args.out}")


if __name__ == "__main__":
    main()
