"""Benchmark: a rollout's engine steps on the thread that started it (rollout/caller_thread.py) against a worker
thread of the engine's own, the layout before.

PyTorch's CPU threads are GNU OpenMP's: a pool of threads per thread that opens a parallel region, and while the
process holds more of them than the machine has cores, idle pool threads barely spin before they sleep, so that
every parallel region waits for the kernel to wake them.

1. `threads`: one flash-attention call of a decode step's size (16 rows, 3 KV heads, 3 queries each, 40 keys) and
   one product of 16 rows by 576 x 1536, on a second thread: while the main thread has opened no parallel region,
   and after it has (its pool alive); then on the main thread while the second thread's pool is alive.
2. `step`: train_vs_trl.py's GRPO step (the calculator prompts, 2 tasks x 8 samples, 64 new tokens, one turn, the
   default model), one process, two layouts alternating step by step after a warm-up step (`--layouts`: caller,
   always on the rollout's caller; worker, on the engine's worker thread, as before; auto, the default, which
   chooses the worker when other processes keep the CPUs busy). After each step
   of the worker layout its thread is replaced (a thread's pool ends with it), so that each step starts with the
   pools its layout has. Per layout: mean seconds of the step, rollout and update, and milliseconds per generated
   token (the samples' lengths differ from step to step).
Prints a table and writes bench/results/caller_thread.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import _parent  # noqa: F401  (bench/ on the import path)
import torch
from common import measured_here, save_with_load


def per_call_us(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


def on_thread(fn) -> float:
    out: list[float] = []
    thread = threading.Thread(target=lambda: out.append(per_call_us(fn)))
    thread.start()
    thread.join()
    return out[0]


def threads() -> dict:
    """Run before anything else opens a parallel region on the main thread."""
    q, k, v = torch.randn(16, 3, 3, 64), torch.randn(16, 3, 40, 64), torch.randn(16, 3, 40, 64)
    x, w = torch.randn(16, 576), torch.randn(1536, 576)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    calls = {"flash_attention_us": lambda: flash(q, k, v, 0.0, False, scale=0.125),
             "product_us": lambda: torch.nn.functional.linear(x, w)}  # fmt: skip
    rows = {name: {"second_thread_alone": round(on_thread(fn), 1)} for name, fn in calls.items()}
    big = torch.randn(1024, 1024)
    big @ big  # the main thread's pool, as a trainer's update makes it
    for name, fn in calls.items():
        rows[name]["second_thread_beside_main_pool"] = round(on_thread(fn), 1)
        rows[name]["main_thread_alone"] = round(per_call_us(fn), 1)
    pool = ThreadPoolExecutor(max_workers=1)  # a second pool, alive while the main thread runs
    pool.submit(lambda: [fn() for fn in calls.values() for _ in range(20)]).result()
    for name, fn in calls.items():
        rows[name]["main_thread_beside_second_pool"] = round(per_call_us(fn), 1)
    pool.shutdown()
    return rows


LAYOUTS = {"caller": True, "worker": False, "auto": None}
"""caller_thread.ON_CALLER per layout: always on the caller, never, or as the machine's load says (the default)."""


def steps(count: int, layouts: list[str]) -> dict:
    import train_vs_trl  # noqa: F401  (registers bench-digits)

    import toolrl.rollout.caller_thread as caller_thread
    from toolrl.config import load_config
    from toolrl.train import Trainer, Workbench

    config = load_config(overrides=[
        "env.name=bench-digits", f"env.options.num_train={2 * (count + 1)}", "device=cpu", "rollout.max_turns=1",
        "rollout.max_new_tokens=64", f"train.steps={count + 1}", "train.prompts_per_step=2", "train.group_size=8",
        "train.lr=1e-6", "eval.at_start=false", "eval.at_end=false",
    ])  # fmt: skip
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    engine = trainer.rollout.engine
    trainer.step(1)  # warm-up, in the new layout
    seen: dict[str, list[dict]] = {layout: [] for layout in layouts}
    busy = 0
    for step in range(2, count + 2):
        layout = layouts[step % 2]
        caller_thread.ON_CALLER = LAYOUTS[layout]
        before = engine._worker.on_worker
        m = trainer.step(step)
        busy += layout == "auto" and engine._worker.on_worker > before
        if layout == "worker":  # the worker thread's pool ends with the thread
            old, engine._worker.fallback = engine._worker.fallback, ThreadPoolExecutor(1, "toolrl-engine")
            old.shutdown(wait=True)
        seen[layout].append(m)
        print(f"step {step} ({layout}): {m['step_s']:.2f} s, rollout {m['rollout_s']:.2f} s, update "
              f"{m['time/forward_backward_s']:.2f} s, {m['generated_tokens']} tokens", flush=True)  # fmt: skip
    caller_thread.ON_CALLER = None
    bench.close()

    def summary(ms: list[dict]) -> dict:
        return {
            "steps": len(ms),
            "step_s": round(statistics.mean(m["step_s"] for m in ms), 2),
            "rollout_s": round(statistics.mean(m["rollout_s"] for m in ms), 2),
            "update_s": round(statistics.mean(m["time/forward_backward_s"] for m in ms), 2),
            "ms_per_generated_token": round(
                1000 * sum(m["step_s"] for m in ms) / sum(m["generated_tokens"] for m in ms), 2
            ),
        }

    rows: dict = {layout: summary(ms) for layout, ms in seen.items()}
    first, second = layouts
    for key in ("step_s", "rollout_s", "update_s", "ms_per_generated_token"):
        rows[f"{second}_vs_{first}_{key}"] = round(rows[second][key] / rows[first][key], 2)
    if "auto" in layouts:
        rows["auto_steps_on_worker"] = busy
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps, alternating, after one warm-up step")
    parser.add_argument("--layouts", default="caller,worker", help="the two layouts alternated: caller, worker, auto")
    parser.add_argument("--out", default="bench/results/caller_thread.json")
    args = parser.parse_args()
    load = os.getloadavg()
    calls = threads()
    print(f"{'call':<20} {'2nd thread alone':>17} {'2nd beside main pool':>21} {'main alone':>11} "
          f"{'main beside 2nd pool':>21}")  # fmt: skip
    for name, row in calls.items():
        print(f"{name:<20} {row['second_thread_alone']:>17} {row['second_thread_beside_main_pool']:>21} "
              f"{row['main_thread_alone']:>11} {row['main_thread_beside_second_pool']:>21}")  # fmt: skip
    layouts = args.layouts.split(",")
    if len(layouts) != 2 or not set(layouts) <= set(LAYOUTS):
        parser.error("--layouts: two of caller, worker, auto, comma-separated")
    step = steps(args.steps, layouts)
    print(f"{'layout':<8} {'step s':>7} {'rollout s':>10} {'update s':>9} {'ms/token':>9}")
    for layout in layouts:
        r = step[layout]
        print(f"{layout:<8} {r['step_s']:>7} {r['rollout_s']:>10} {r['update_s']:>9} {r['ms_per_generated_token']:>9}")
    a, b = layouts
    print(f"{b} / {a}: step {step[f'{b}_vs_{a}_step_s']}x, rollout {step[f'{b}_vs_{a}_rollout_s']}x, update "
          f"{step[f'{b}_vs_{a}_update_s']}x, per token {step[f'{b}_vs_{a}_ms_per_generated_token']}x")  # fmt: skip
    if "auto" in layouts:
        print(f"auto: {step['auto_steps_on_worker']} of {step['auto']['steps']} steps found the machine busy")
    save_with_load(args.out, measured_here(load, {"calls": calls, "step": step}))


if __name__ == "__main__":
    main()
