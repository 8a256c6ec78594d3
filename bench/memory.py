"""Benchmark: peak resident memory per phase of a training run (load, rollout, train, checkpoint, eval).

Each workload runs in a fresh process; before each phase the kernel's peak-RSS mark is reset
(/proc/self/clear_refs, "5") and after it VmHWM is read, so each phase's peak is its own (memory an earlier
phase left allocated counts in it, as it does in a real run). Workloads:
- `demo`: `make demo`'s config (the calculator recipe on the default model, 4 prompts x 6 samples) for
  `--steps` steps, with its evaluation on 25 tasks at batch 25;
- `demo_gc`: the same with train.gradient_checkpointing;
- `qwen05b_full`, `qwen05b_lora`: a random-weight model shaped like Qwen2.5-0.5B (24 layers, hidden 896, 14
  heads, 2 key/value heads, intermediate 4864, tied embeddings; 0.4B parameters with the default model's
  49k-token vocabulary), 2 prompts x 4 samples, 32 new tokens per turn, full weights and LoRA (r 16); its
  rewards are set to 0 and 1 alternately so that every trajectory enters the loss.
- `demo_full` (`--full`): the real `make demo` run end to end, `toolrl train recipes/calculator-zero.yaml` as a
  user runs it (warm start, every step, every evaluation, the checkpoint): a sampler reads the resident set of
  the process tree every 20 ms, and the run's own meter (toolrl.memory, RUN/memory.json) gives the process's
  peak (the kernel's high-water mark) and each phase's sampled one; `demo_full_run_peak_gb` is the larger.
- `--breakdown`: where the demo's memory goes, in one process on the demo's config: the interpreter with torch
  and the tokenizer, the weights, gradients and AdamW states (their bytes), the KV cache of a training rollout
  and of an evaluation batch (the engine's buffers), the engine's packed copies of the linear weights while it
  generates (models/linear.py PackedWeights), the forward activations of the largest micro-batch and the
  output layer's scores (measured peaks of those calls), and what the allocator held after a step beyond the
  live tensors (fragmentation). With `--set` overrides, for comparisons.
Prints a table and writes bench/results/memory.json (`demo_peak_rss_gb` per phase and overall).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, measured_calls, write_results

PHASES = ("load", "rollout", "train", "checkpoint", "eval")


class Phases:
    """Peak and resident memory after each phase, and its seconds (the peak: toolrl.memory's meter, which the runs
    themselves report with)."""

    def __init__(self):
        from toolrl.memory import meter

        if not meter.available:
            raise SystemExit("bench/memory.py: needs Linux's /proc/self/status and /proc/self/clear_refs")
        meter.exact = True  # each phase's own exact peak (runs sample theirs and leave the OS's max RSS whole)
        self.rows: dict[str, dict[str, float]] = {}

    def run(self, name: str, fn):
        from toolrl.memory import meter, rss_gb

        started = time.perf_counter()
        with meter.phase(name):
            out = fn()
        peak, rss = meter.last[name], rss_gb()
        row = self.rows.setdefault(name, {"peak_gb": 0.0, "rss_after_gb": 0.0, "s": 0.0})
        row["peak_gb"] = round(max(row["peak_gb"], peak), 2)
        row["rss_after_gb"] = round(rss, 2)
        row["s"] = round(row["s"] + time.perf_counter() - started, 1)
        print(f"  {name:<11} peak {peak:6.2f} GB   after {rss:6.2f} GB", flush=True)
        return out


def qwen05b_folder(root: Path) -> Path:
    """A random-weight Qwen2.5-0.5B-shaped model with the default model's tokenizer, saved as a HF folder."""
    from tests.harness.tiny import save_random_model

    return save_random_model(
        root / "qwen05b-random",
        "qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    )


def workload(name: str, steps: int, tmp: Path) -> dict:
    from toolrl.config import load_config
    from toolrl.train import RunDir, Trainer, Workbench

    overrides = [f"output_dir={tmp}", f"run_name={name}", "device=cpu", "eval.num_tasks=25", "eval.batch_size=25"]
    if name == "demo_gc":
        overrides.append("train.gradient_checkpointing=true")
    if name.startswith("qwen05b"):
        overrides += [f"model.name={qwen05b_folder(tmp)}", "train.prompts_per_step=2", "train.group_size=4",
                      "rollout.max_new_tokens=32", "eval.num_tasks=8", "eval.batch_size=8"]  # fmt: skip
        if name.endswith("lora"):
            overrides.append("train.lora.r=16")
    config = load_config(overrides=overrides)
    phases = Phases()

    def load():
        bench = Workbench.load(config)
        run = RunDir.create(config)
        return bench, Trainer(bench, run), run

    bench, trainer, run = phases.run("load", load)
    params = sum(p.numel() for p in trainer.model.parameters())
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    for step in range(1, steps + 1):
        part = phases.run("rollout", lambda step=step: trainer.collector.roll_out(step))
        if name.startswith("qwen05b"):  # a random model's rewards are all 0: give every group two values to train on
            for i, traj in enumerate(part.trajs):
                traj.reward = float(i % 2)
        phases.run("train", lambda part=part: trainer.update(part.trajs))
        trainer.state.step = step

    def checkpoint():
        trainer.save_checkpoint()
        run.save("final", trainer.write_model)

    phases.run("checkpoint", checkpoint)
    phases.run("eval", bench.evaluate)
    bench.close()
    peaks = {k: v["peak_gb"] for k, v in phases.rows.items()}
    return {
        "parameters": params,
        "trainable_parameters": trainable,
        "steps": steps,
        "phases": phases.rows,
        "peak_rss_gb": round(max(peaks.values()), 2),
    }


def tree_rss_gb(proc) -> float:
    """The resident memory of a process and all its children, in GB (0 once it is gone)."""
    import psutil

    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
    except psutil.NoSuchProcess:
        return 0.0
    return total / 1024**3


def full_run(recipe: str, tmp: Path, overrides: list[str], interval: float = 0.02) -> dict:
    """`toolrl train RECIPE` as a user runs it, sampled from outside: the peak and a timeline (one point a
    second) of the process tree's resident memory, the run's per-phase peaks, and its wall time."""
    import threading

    import psutil

    args = ["--set", f"output_dir={tmp}", "--set", "run_name=full"] + [a for o in overrides for a in ("--set", o)]
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "toolrl", "train", recipe, *args],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    proc, samples, done = psutil.Process(child.pid), [], threading.Event()
    loads = [os.getloadavg()[0]]  # other work on the machine stretches the wall time (not the memory): recorded

    def sample():
        while not done.is_set():
            samples.append((time.perf_counter() - started, tree_rss_gb(proc)))
            if len(samples) % 250 == 0:  # every 5 s
                loads.append(os.getloadavg()[0])
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for line in child.stdout:
        now = samples[-1][1] if samples else 0.0
        print(f"  [{time.perf_counter() - started:6.0f} s {now:5.2f} GB] {line.rstrip()}", flush=True)
    code = child.wait()
    done.set()
    sampler.join()
    if code:
        raise SystemExit(f"toolrl train {recipe} failed (exit {code})")
    wall = time.perf_counter() - started
    own_file = tmp / "full" / "memory.json"  # absent from a version of toolrl before the meter (a "before" run)
    own = json.loads(own_file.read_text()) if own_file.exists() else {"peak_gb": 0.0, "phases_peak_gb": {}}
    peak = max(v for _, v in samples)
    timeline, second = [], -1
    for t, v in samples:
        if int(t) > second:
            second = int(t)
            timeline.append([round(t, 1), round(v, 3)])
    where = subprocess.run([sys.executable, "-c", "import toolrl; print(toolrl.__file__)"], capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    revision = subprocess.run(["git", "-C", str(Path(where).parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "-C", str(Path(where).parent), "status", "--porcelain", "--", "."],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return {
        "recipe": recipe,
        "revision": revision + (" with uncommitted changes" if dirty else ""),
        "overrides": overrides,
        "wall_s": round(wall, 1),
        "load_avg_max": round(max(loads), 2),
        "peak_sampled_gb": round(peak, 3),
        "peak_in_process_gb": own["peak_gb"],
        "phases_peak_gb": own["phases_peak_gb"],
        "peak_gb": round(max(peak, own["peak_gb"]), 3),
        "timeline": timeline,
    }


def breakdown(overrides: list[str], tmp: Path) -> dict:
    """The demo's memory by component (GB), in this process: see the module's docstring."""
    import torch

    from toolrl.config import load_config
    from toolrl.memory import meter, rss_gb
    from toolrl.train import Trainer, Workbench

    gb = 1024**3
    config = load_config("recipes/calculator-zero.yaml", overrides=[f"output_dir={tmp}", "device=cpu", *overrides])
    config.train.warm_start = False
    interpreter = rss_gb()  # torch, transformers and toolrl imported, nothing loaded
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    params = [p for p in trainer.model.parameters()]
    weights = sum(p.numel() * p.element_size() for p in params) / gb
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad) / gb
    peaks = measured_calls(["selected_hidden", "target_logprobs"])
    engine = bench.engine("train", 0)

    def cache_gb(eng) -> float:
        slots, capacity = eng._last_cache_size
        return slots * (capacity + 1) * eng.kv_bytes_per_token / gb

    with meter.phase("rollout"):
        part = trainer.collector.roll_out(1)
    rollout_peak = meter.last["rollout"]
    train_cache = cache_gb(engine)
    packed = engine.packed.peak_bytes / gb
    for i, traj in enumerate(part.trajs):  # every group carries signal: the update trains on every trajectory
        traj.reward = float(i % 2)
    started = time.perf_counter()
    with meter.phase("update"):
        trainer.update(part.trajs)
    update_s = time.perf_counter() - started
    update_peak = meter.last["update"]
    after_update = rss_gb()
    trainer.state.optimizer.zero_grad(set_to_none=True)
    with meter.phase("eval"):
        bench.evaluate()
    eval_peak = meter.last["eval"]
    eval_cache = cache_gb(bench.engine("eval", 0))
    live = weights + 2 * trainable  # after the step: weights and AdamW's two states (gradients freed)
    trainer.state.optimizer.zero_grad(set_to_none=True)
    settled = rss_gb()
    rows = {
        "interpreter, torch, transformers (before loading)": interpreter,
        "weights": weights,
        "gradients": trainable,
        "AdamW states": 2 * trainable,
        "KV cache, training rollout (engine buffers)": train_cache,
        "KV cache, evaluation batch (engine buffers)": eval_cache,
        "packed linear weights, while generating": packed,
        "forward activations, largest micro-batch": peaks.get("activations", 0.0),
        "output layer scores (largest micro-batch)": peaks.get("output_layer", 0.0),
        "allocator: held after the step beyond live tensors": max(
            settled - (interpreter + weights + 2 * trainable), 0.0
        ),
    }
    bench.close()
    return {
        "overrides": overrides,
        "components_gb": {k: round(v, 3) for k, v in rows.items()},
        "phase_peaks_gb": {"rollout": rollout_peak, "update": update_peak, "eval": eval_peak},
        "rss_after_update_gb": round(after_update, 3),
        "update_s": round(update_s, 1),
        "load_avg": round(os.getloadavg()[0], 2),  # the machine's other work stretches update_s, not the memory
        "micro_batch_tokens": config.train.micro_batch_tokens,
        "rss_settled_gb": round(settled, 3),
        "live_after_step_gb": round(live, 3),
        "trained_tokens": sum(sum(t.loss_mask) for t in part.trajs),
        "torch_threads": torch.get_num_threads(),
    }


def micro_batch_sweep(budgets: list[int], repeats: int, tmp: Path) -> dict:
    """The update's time and peak over the same trajectories (one rollout of the demo's config without its warm
    start, every trajectory in the loss) at each `train.micro_batch_tokens`, alternated `repeats` times from the
    same weights: the memory against the speed of the knob."""
    import copy

    from toolrl.config import load_config
    from toolrl.memory import meter
    from toolrl.train import Trainer, Workbench

    config = load_config("recipes/calculator-zero.yaml", overrides=[f"output_dir={tmp}", "device=cpu"])
    config.train.warm_start = False
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    part = trainer.collector.roll_out(1)
    for i, traj in enumerate(part.trajs):
        traj.reward = float(i % 2)
    initial = copy.deepcopy(bench.model.state_dict())
    rows: dict[int, list[tuple[float, float]]] = {b: [] for b in budgets}
    for _ in range(repeats):
        for budget in budgets:
            trainer.scorer.micro_batch_tokens = budget
            bench.model.load_state_dict(initial)
            started = time.perf_counter()
            with meter.phase("update"):
                trainer.update(part.trajs)
                trainer.state.optimizer.zero_grad(set_to_none=True)
            rows[budget].append((time.perf_counter() - started, meter.last["update"]))
            print(f"  micro_batch_tokens {budget}: {rows[budget][-1][0]:.1f} s, peak {meter.last['update']:.2f} GB")
    bench.close()
    return {
        "trained_tokens": sum(sum(t.loss_mask) for t in part.trajs),
        "tokens": sum(len(t.token_ids) for t in part.trajs),
        "repeats": repeats,
        "budgets": {str(b): budget_row(r) for b, r in rows.items()},
    }


def budget_row(runs: list[tuple[float, float]]) -> dict:
    times = sorted(t for t, _ in runs)
    return {"update_s": [round(t, 2) for t, _ in runs], "median_s": round(times[len(times) // 2], 2),
            "peak_gb": round(max(p for _, p in runs), 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workloads", default="demo,demo_gc,qwen05b_full,qwen05b_lora")
    parser.add_argument("--full", action="store_true", help="only the real demo run end to end (demo_full)")
    parser.add_argument("--breakdown", action="store_true", help="only the demo's memory by component")
    parser.add_argument("--micro-batches", type=int, nargs="+", help="only the update at these micro_batch_tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--label", help="--full: the result's name (default demo_full, or one made of --set)")
    parser.add_argument("--set", action="append", default=[], help="a config override for the full run")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="bench/results/memory.json")
    args = parser.parse_args()
    if args.one:  # a child process: one workload, its result as the last line of stdout
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(workload(args.one, args.steps, Path(tmp))))
        return
    if args.micro_batches:
        with tempfile.TemporaryDirectory() as tmp:
            sweep = micro_batch_sweep(args.micro_batches, args.repeats, Path(tmp))
        old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        old["micro_batch_sweep"] = {"machine": machine(), **sweep}
        write_results(args.out, old)
        return
    if args.breakdown:
        with tempfile.TemporaryDirectory() as tmp:
            parts = breakdown(args.set, Path(tmp))
        print(f"\n{'component':<52}{'GB':>7}")
        for name, value in parts["components_gb"].items():
            print(f"{name:<52}{value:>7.2f}")
        print("phase peaks: " + ", ".join(f"{k} {v:.2f} GB" for k, v in parts["phase_peaks_gb"].items()))
        old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        key = "demo" if not args.set else "_".join(args.set).replace("=", "-").replace(".", "-")
        old.setdefault("breakdown", {})[key] = {"machine": machine(), **parts}
        write_results(args.out, old)
        return
    if args.full:
        with tempfile.TemporaryDirectory() as tmp:
            run = full_run("recipes/calculator-zero.yaml", Path(tmp), args.set)
        print(f"\ndemo full run: peak {run['peak_gb']:.2f} GB (sampled {run['peak_sampled_gb']:.2f}, "
              f"in process {run['peak_in_process_gb']:.2f}), {run['wall_s']:.0f} s")  # fmt: skip
        for phase, gb in run["phases_peak_gb"].items():
            print(f"  {phase:<12}{gb:6.2f} GB")
        old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        made = "demo_full_" + "_".join(args.set).replace("=", "-").replace(".", "-") if args.set else "demo_full"
        key = args.label or made
        old.setdefault("full_runs", {})[key] = {"machine": machine(), **run}
        if key == "demo_full":
            old["demo_full_run_peak_gb"] = run["peak_gb"]
        write_results(args.out, old)
        return
    results = {}
    for name in args.workloads.split(","):
        print(f"{name}:", flush=True)
        done = subprocess.run(
            [sys.executable, __file__, "--one", name, "--steps", str(args.steps)], stdout=subprocess.PIPE, text=True
        )
        if done.returncode:
            raise SystemExit(f"{name} failed (exit {done.returncode})")
        lines = done.stdout.strip().splitlines()
        print("\n".join(lines[:-1]))
        results[name] = json.loads(lines[-1])
    print(f"\n{'workload':<14}{'params':>8}" + "".join(f"{p:>12}" for p in PHASES) + f"{'peak':>9}  (GB)")
    for name, r in results.items():
        cells = "".join(f"{r['phases'].get(p, {}).get('peak_gb', float('nan')):>12.2f}" for p in PHASES)
        print(f"{name:<14}{r['parameters'] / 1e6:>7.0f}M{cells}{r['peak_rss_gb']:>9.2f}")
    result = {"machine": machine(), "workloads": results}
    if Path(args.out).exists():  # the full runs (--full) are measured by their own invocations: kept
        kept = json.loads(Path(args.out).read_text())
        kept_keys = ("full_runs", "demo_full_run_peak_gb", "breakdown", "micro_batch_sweep")
        result |= {k: kept[k] for k in kept_keys if k in kept}
    if "demo" in results:
        demo = results["demo"]
        per_phase = {p: demo["phases"][p]["peak_gb"] for p in PHASES}
        result["demo_peak_rss_gb"] = {**per_phase, "overall": demo["peak_rss_gb"]}
    write_results(args.out, result)


if __name__ == "__main__":
    main()
