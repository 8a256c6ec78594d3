"""Benchmark: standalone `toolrl eval --model RUN/final` against the evaluation at the end of training, on the same
tasks (issue 73, item 4: 387 s against 47 s for a user's 60 tasks). A short warm start on the calculator recipe
(`toolrl sft`, the default model) evaluates its final model at its end; `toolrl eval` then evaluates that model
again; both play the same sampled tasks with the same seeds, so their trajectories are the same. Each is timed from
its progress line, alone and beside a process that keeps every core busy with matrix products (a second run, a
test suite), as it runs by default (the engine's thread pool opened on the main thread first, toolrl/threads.py)
and with the opt-in thread governor (TOOLRL_ADAPT_THREADS=1).

Keys: `rows` (per condition: in-training and standalone seconds, and `standalone_vs_training`; goal <= 1.2),
`tasks`, the load average before and after, what ran beside. Prints a table and writes
bench/results/eval_speed.json.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, write_results

BUSY = """
import os, torch
torch.set_num_threads(os.cpu_count() or 2)
a = torch.randn(1024, 1024)
while True:
    a @ a
"""
"""Every core busy with torch's products, as another training run keeps them."""


def seconds(text: str, label: str) -> float:
    """The seconds of an evaluation's last progress line ('eval end: 16/16 tasks  1.15 tasks/s  14 s')."""
    found = re.findall(rf"{label}: (\d+)/\1 tasks .*?(\d+(?:\.\d+)?) (s|min)\b", text)
    if not found:
        raise SystemExit(f"bench/eval_speed.py: no finished '{label}' line in:\n{text[-2000:]}")
    _, value, unit = found[-1]
    return float(value) * (60 if unit == "min" else 1)


def toolrl(args: list[str], cwd: Path, adapt: bool) -> str:
    env = {**os.environ, "TOOLRL_ADAPT_THREADS": "1" if adapt else "0"}
    done = subprocess.run([sys.executable, "-m", "toolrl", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=3600)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"bench/eval_speed.py: toolrl {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def measure(folder: Path, tasks: int, adapt: bool, name: str) -> dict[str, float]:
    runs = folder / "runs"
    common = ["--set", f"eval.num_tasks={tasks}", "--set", f"output_dir={runs}"]
    toolrl(["sft", *common, "--set", "sft.num_tasks=4", "--set", "sft.epochs=1", "--set", "eval.at_start=false",
            "--set", f"run_name={name}"], folder, adapt)  # fmt: skip
    training = seconds((runs / name / "progress.log").read_text(), "eval end")
    standalone = seconds(toolrl(["eval", "--model", str(runs / name / "final"), "--num-tasks", str(tasks)], folder,
                                adapt), "eval")  # fmt: skip
    return {"training_s": training, "standalone_s": standalone,
            "standalone_vs_training": round(standalone / training, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--beside", default=os.environ.get("TOOLRL_BENCH_BESIDE", ""), help="what else ran")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "eval_speed.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for busy in (False, True):
            hog = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
            try:
                for adapt in (False, True):
                    name = f"{'busy' if busy else 'alone'}_{'governor' if adapt else 'default'}"
                    started = time.perf_counter()
                    rows[name] = measure(Path(tmp), args.tasks, adapt, name)
                    row = rows[name]
                    print(f"{name:24s} in training {row['training_s']:6.1f} s   standalone {row['standalone_s']:6.1f} s"
                          f"   ratio {row['standalone_vs_training']:5.2f}   ({time.perf_counter() - started:.0f} s)",
                          flush=True)  # fmt: skip
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    result = {"tasks": args.tasks, "rows": rows, "goal": "standalone_vs_training <= 1.2",
              "beside": args.beside, "load_avg_before": [round(x, 2) for x in load_before],
              "load_avg_after": [round(x, 2) for x in os.getloadavg()], "machine": machine()}  # fmt: skip
    write_results(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
