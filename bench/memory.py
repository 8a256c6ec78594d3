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
Prints a table and writes bench/results/memory.json (`demo_peak_rss_gb` per phase and overall).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, write_results

PHASES = ("load", "rollout", "train", "checkpoint", "eval")


def _status_gb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024**2
    raise RuntimeError(f"no {field} in /proc/self/status")


class Phases:
    """Peak and resident memory after each phase, and its seconds."""

    def __init__(self):
        self.rows: dict[str, dict[str, float]] = {}

    def run(self, name: str, fn):
        Path("/proc/self/clear_refs").write_text("5")  # the peak mark starts again from the current RSS
        started = time.perf_counter()
        out = fn()
        peak, rss = _status_gb("VmHWM"), _status_gb("VmRSS")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workloads", default="demo,demo_gc,qwen05b_full,qwen05b_lora")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="bench/results/memory.json")
    args = parser.parse_args()
    if args.one:  # a child process: one workload, its result as the last line of stdout
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(workload(args.one, args.steps, Path(tmp))))
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
    if "demo" in results:
        demo = results["demo"]
        per_phase = {p: demo["phases"][p]["peak_gb"] for p in PHASES}
        result["demo_peak_rss_gb"] = {**per_phase, "overall": demo["peak_rss_gb"]}
    write_results(args.out, result)


if __name__ == "__main__":
    main()
