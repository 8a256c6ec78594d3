"""Benchmark: does training move the numbers that matter? For each recipe, success on its test split, greedy
(temperature 0) and sampled, before and after the recipe's training (its warm start, if it sets one, and its RL
steps), over several seeds, with the spread. One script makes the README's table.

    python bench/learning.py                                   # demo, built, files; seeds 0 1 2
    python bench/learning.py --recipes demo --seeds 0 --steps 5 --num-tasks 20
    python bench/learning.py --recipes built --seeds 1 --threads 1   # a seed as a process of its own
    python bench/learning.py --readme                           # README.md's table from the results
    python bench/learning.py --quick                            # the tiny model, 1 seed, 2 steps: the suite's sample

`demo` is recipes/calculator-zero.yaml (what `make demo` trains); every other name is recipes/NAME.yaml. Writes
bench/results/learning.json as {recipe: {greedy_before, greedy_after, sampled_before, sampled_after, seeds,
spread, ...}}: means over seeds, each seed's values, and their standard deviation. Greedy before is the same
model for every seed (computed once per process); sampled evaluations draw with the seed, at eval.sampling's
temperature (rollout.sampling's where the recipe evaluates greedily). Each run updates its recipes' entries and
keeps the others; seeds of the same measurement from another run are merged in, so recipes and seeds can run as
separate processes (`--threads 1` each, side by side on 2 cores). Progress goes to stdout and is appended to the
results' log (learning.RECIPES.log); each entry records its arguments, wall time and peak resident memory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from common import ROOT, locked, machine, quick_setup, write_results

from toolrl.config import load_config
from toolrl.train import RunDir, Trainer, Workbench

RECIPES = {"demo": "calculator-zero"}
METRICS = ("greedy_before", "greedy_after", "sampled_before", "sampled_after")
SAME_MEASUREMENT = ("steps", "num_tasks", "set", "quick", "recipe")  # what must agree for seeds to be merged:
# the arguments and the recipe file's digest (seeds of an edited recipe are another measurement)
log = logging.getLogger("bench.learning")


def recipe_path(name: str) -> Path:
    path = ROOT / "recipes" / f"{RECIPES.get(name, name)}.yaml"
    if not path.is_file():
        raise SystemExit(f"--recipes: no recipe {name!r} (recipes/{RECIPES.get(name, name)}.yaml)")
    return path


def success(
    bench: Workbench, temperature: float, num_tasks: int, by_category: dict | None = None, stops: dict | None = None
) -> float:
    """The success rate (the reward's mean without a success criterion); each task category's, if the tasks
    have categories (a built environment's scenarios), into `by_category`; the share of each stop reason into
    `stops`."""
    stats = bench.evaluate(num_tasks=num_tasks, temperature=temperature)
    if stops is not None:
        stops.update({k.removeprefix("stop/"): round(v, 4) for k, v in stats.items() if k.startswith("stop/") and v})
    if by_category is not None:
        by_category.update(
            {k.removeprefix("success/"): round(v, 4) for k, v in stats.items() if k.startswith("success/")}
        )
    return round(stats.get("success", stats["reward"]), 4)


def one_seed(name: str, seed: int, args, out_dir: Path, greedy_before: dict[str, float]) -> dict[str, float]:
    overrides = [f"seed={seed}", "eval.at_start=false", "eval.at_end=false", f"output_dir={out_dir}",
                 f"run_name={name}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}", *args.set]  # fmt: skip
    # (a seed measured again is a new run: a run directory is never written over)
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    config = load_config(recipe_path(name), overrides)
    sampled_t = config.eval.sampling.temperature or config.rollout.sampling.temperature
    bench = Workbench.load(config)
    try:
        started = time.perf_counter()
        if name not in greedy_before:
            greedy_before[name] = success(bench, 0.0, args.num_tasks, BEFORE_BY_CATEGORY.setdefault(name, {}))
        row = {"greedy_before": greedy_before[name], "sampled_before": success(bench, sampled_t, args.num_tasks)}
        row["test_tasks"] = len(bench.eval_tasks(args.num_tasks)[0])  # --num-tasks, or the split where smaller
        say(f"{name} seed {seed}: before greedy {row['greedy_before']:.2f} sampled {row['sampled_before']:.2f} "
            f"({time.perf_counter() - started:.0f} s); training {config.train.steps} steps"
            + (" after a warm start" if config.train.warm_start else ""))  # fmt: skip
        started = time.perf_counter()
        trainer = Trainer(bench, RunDir.create(config))
        trainer.on_note = say
        step_s: list[float] = []

        def on_step(m: dict) -> None:
            step_s.append(m["step_s"])
            say(f"{name} seed {seed}: step {m['step']} reward {m['reward']:.3f} success {m.get('success', 0):.3f} "
                f"({m['step_s']:.0f} s)")  # fmt: skip

        summary = trainer.train(on_step)
        row["train_s"] = round(time.perf_counter() - started, 1)
        row["rl_s"] = round(sum(step_s), 1)
        if config.train.warm_start:  # what the warm start played and kept; its time is the rest of train_s
            row["sft"] = {k: v for k, v in summary.items() if k.startswith("sft_")}
        after: dict[str, float] = {}
        stops: dict[str, float] = {}
        row["greedy_after"] = success(bench, 0.0, args.num_tasks, after, stops)
        row["greedy_stops_after"] = stops  # why the greedy test trajectories ended (length: a token limit)
        row["peak_gb"] = summary["memory"]["peak_gb"]
        if after:  # greedy success per task category, before and after: which kinds of task were learned
            row["greedy_by_category"] = {k: [BEFORE_BY_CATEGORY[name].get(k), v] for k, v in after.items()}
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
BEFORE_BY_CATEGORY: dict[str, dict[str, float]] = {}  # recipe -> greedy success per task category before training
README = ROOT / "README.md"
BEGIN, END = "<!-- learning table: python bench/learning.py --readme -->", "<!-- /learning table -->"


def pct(value: float, spread: float | None = None) -> str:
    """'94% ± 4%' (the spread over seeds; None for one seed: no spread to show)."""
    return f"{value:.0%}" + (f" ± {spread:.0%}" if spread is not None else "")


def test_tasks(entry: dict) -> int:
    """How many test tasks each evaluation played: --num-tasks, or the test split where it is smaller (recorded
    per seed; rows measured before it was recorded evaluated --num-tasks tasks, chosen within their splits)."""
    counted = {row["test_tasks"] for row in entry["seeds"] if "test_tasks" in row}
    return max(counted) if counted else entry["args"]["num_tasks"]


def table(results: dict) -> str:
    """The README's table, from the results file: each recipe's mean and spread over its seeds."""
    lines = ["| recipe | test tasks | seeds | greedy before | greedy after | sampled before | sampled after |"
             " train per seed |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, r in results.items():
        recipe = load_config(recipe_path(name)).train
        steps = r["args"].get("steps") or recipe.steps
        label = f"`{RECIPES.get(name, name)}.yaml`" + (" (`make demo`)" if name == "demo" else "")
        distilled = recipe.kl.coef > 0 and (recipe.kl.teacher or recipe.kl.teacher_endpoint)
        label += f": {'warm start + ' if recipe.warm_start else ''}{steps} "
        label += "on-policy distillation steps" if distilled else "GRPO steps"
        cells = [pct(r[k], r["spread"][k] if len(r["seeds"]) > 1 else None) for k in METRICS]
        cells[1] = f"**{cells[1]}**" if r["gain_greedy"] > 0 else cells[1]
        minutes = statistics.fmean(s["train_s"] for s in r["seeds"]) / 60
        lines.append(f"| {label} | {test_tasks(r)} | {len(r['seeds'])} | " + " | ".join(cells)
                     + f" | {minutes:.0f} min |")  # fmt: skip
    return "\n".join(lines)


def write_readme(results_path: str) -> None:
    """Replace the README's table (between its markers) with the one the results file makes."""
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"--readme: README.md lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    README.write_text(head + BEGIN + "\n" + table(json.loads(Path(results_path).read_text())) + "\n" + END
                      + rest.split(END, 1)[1])  # fmt: skip


def recipe_digest(name: str) -> str:
    """The recipe file's sha256 (12 hex digits): seeds measured with different recipes are not merged."""
    return hashlib.sha256(recipe_path(name).read_bytes()).hexdigest()[:12]


def merged(path: str, name: str, entry: dict) -> dict:
    """The results file with `name`'s entry updated (written back); other recipes' entries are kept. Seeds of
    the same measurement (same steps, tasks and overrides) measured by another run are merged in, a seed measured
    again replaced, so seeds can run as separate processes; a different measurement replaces the entry. A lock
    file keeps two runs that finish together from losing one's entry."""
    with locked(path):
        try:
            results = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            results = {}
        results = {k: v for k, v in results.items() if isinstance(v, dict) and "seeds" in v}  # recipes only
        old = results.get(name)
        if old and all(old["args"].get(k) == entry["args"].get(k) for k in SAME_MEASUREMENT):
            rows = dict(zip(old["args"]["seeds"], old["seeds"], strict=True))
            rows |= dict(zip(entry["args"]["seeds"], entry["seeds"], strict=True))
            seeds = sorted(rows)
            entry = {**summary([rows[s] for s in seeds]), "wall_s": round(old["wall_s"] + entry["wall_s"], 1),
                     "peak_rss_mb": max(old["peak_rss_mb"], entry["peak_rss_mb"]), "machine": entry["machine"],
                     "args": {**entry["args"], "seeds": seeds}}  # fmt: skip
        results[name] = entry
        write_results(path, results)
    return results


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
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--readme", action="store_true", help="only rewrite README.md's table from --out's results")
    args = parser.parse_args()
    if args.readme:
        write_readme(args.out or "bench/results/learning.json")
        return
    if (tiny := quick_setup(args, "learning")) is not None:
        args.recipes, args.seeds, args.steps, args.num_tasks = args.recipes[:1], args.seeds[:1], 2, 4
        args.set += [f"model.name={tiny}", "device=cpu", "train.prompts_per_step=2", "train.group_size=2",
                     "rollout.max_new_tokens=16"]  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.runs or ROOT / "runs" / "learning").resolve()
    names = "-".join(args.recipes)
    LOG = Path(args.out).with_name(f"{Path(args.out).stem}.{names}.log").open("a", encoding="utf-8")  # seeds may
    # run as separate processes: each appends its lines
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for name in args.recipes:
        recipe_path(name)
    greedy_before: dict[str, float] = {}
    for name in args.recipes:
        started = time.perf_counter()
        rows = [one_seed(name, seed, args, out_dir, greedy_before) for seed in args.seeds]
        entry = summary(rows)
        entry["wall_s"] = round(time.perf_counter() - started, 1)
        entry["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        entry["machine"] = {**machine(), "torch_threads": torch.get_num_threads()}
        entry["args"] = {k: v for k, v in vars(args).items() if k not in ("out", "recipes")}
        entry["args"]["recipe"] = recipe_digest(name)
        results = merged(args.out, name, entry)  # after each recipe: a long run keeps what it measured
    print(f"\n{'recipe':<10}{'greedy before':>15}{'greedy after':>14}{'sampled before':>16}{'sampled after':>15}")
    for name in args.recipes:
        r = results[name]
        cells = [f"{r[k]:.2f}±{r['spread'][k]:.2f}" for k in METRICS]
        print(f"{name:<10}{cells[0]:>15}{cells[1]:>14}{cells[2]:>16}{cells[3]:>15}")
        print(f"  wall {r['wall_s']:.0f} s, peak RSS {r['peak_rss_mb']:.0f} MiB")
    print(args.out)


if __name__ == "__main__":
    main()
