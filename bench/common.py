"""What every benchmark records: the machine it ran on, and its results as JSON under bench/results/. Importing
it also puts the repository's root on the import path, so that a benchmark reaches the test harness
(tests/harness: tiny models, the reference engine) as `python bench/NAME.py` runs it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))


def machine() -> dict[str, str | int]:
    import torch

    cpu, flags = "unknown", set()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    isa = [name for flag, name in ISA_FLAGS if flag in flags]
    return {
        "cpu": cpu,
        "isa": " ".join(isa) or "unknown",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # set to measure another machine's ISA on this one (with ATEN_CPU_CAPABILITY, which torch reports above)
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "all"),
        "mkl_enable_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS", "all"),
        "cores": os.cpu_count() or 0,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


ISA_FLAGS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_vnni", "AVX-512-VNNI"),
             ("avx512_bf16", "AVX-512-BF16"), ("amx_tile", "AMX"))  # fmt: skip
"""The vector instructions a matmul peak depends on (what oneDNN may use on this CPU), as /proc/cpuinfo names them."""


CODE = ("src", "bench", "recipes", ":(exclude)bench/results")
"""What a measurement depends on: a change there since the commit makes the commit alone not name what ran."""


def git_head(root: Path = ROOT) -> str:
    """The checkout's short commit, with `-dirty` where its code differs from it (a change to a tracked file, or an
    untracked one, under CODE); `unknown` outside a git checkout."""
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not head:
        return "unknown"
    changed = subprocess.run([*git, "status", "--porcelain", "--", *CODE], capture_output=True, text=True).stdout
    return f"{head}-dirty" if changed.strip() else head


@contextlib.contextmanager
def locked(path: str | Path):
    """Hold `path`'s lock file (`path`.lock) for a read, change and write of it: runs side by side that finish
    together do not lose one's results."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_results(path: str, result: dict[str, Any]) -> None:
    """Write a results file, and name it to bench/run.py (TOOLRL_BENCH_WRITTEN), which stamps what its own run
    wrote and not what a benchmark running beside it wrote meanwhile."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    if listing := os.environ.get("TOOLRL_BENCH_WRITTEN"):
        with open(listing, "a") as f:
            f.write(f"{Path(path).resolve()}\n")


def measured_here(load_before: tuple[float, ...], rows: dict[str, Any]) -> dict[str, Any]:
    """A result: the machine, its matmul peak now and the load average before the run and now, then `rows`."""
    return {"machine": machine(), "matmul_peak_gflops": round(matmul_peak_gflops(), 1),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], **rows}  # fmt: skip


def save_with_load(path: str, result: dict[str, Any]) -> None:
    """Print the load averages measured_here recorded and write the result."""
    print(f"load average before {result['load_avg_before']}, after {result['load_avg_after']}")
    write_results(path, result)


def padded_rows(trajs):
    """Trajectories' whole sequences padded on the right: ids, attention mask, and the (row, column) that
    predicts each trained token, with those tokens."""
    import torch

    width = max(len(t.token_ids) for t in trajs)
    ids = torch.zeros(len(trajs), width, dtype=torch.long)
    mask = torch.zeros(len(trajs), width, dtype=torch.long)
    for i, t in enumerate(trajs):
        ids[i, : len(t.token_ids)] = torch.tensor(t.token_ids)
        mask[i, : len(t.token_ids)] = 1
    rows = [i for i, t in enumerate(trajs) for m in t.loss_mask if m]
    cols = [p - 1 for t in trajs for p, m in enumerate(t.loss_mask) if m]
    targets = torch.tensor([t.token_ids[p] for t in trajs for p, m in enumerate(t.loss_mask) if m])
    return ids, mask, rows, cols, targets


def timed_backward(model, fn, trajs, repeats: int):
    """The best time of `repeats` forward+backward passes of `fn(model, trajs)` (trained-token log-probs),
    with its last result and the gradient of every parameter, flat."""
    import time

    import torch

    best, result = float("inf"), None
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        result = fn(model, trajs)
        result.sum().backward()
        best = min(best, time.perf_counter() - start)
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return best, result.detach(), grads


def memory_bandwidth_gbs(mb: int = 512, repeats: int = 5) -> float:
    """The machine's memory read rate (GB/s, the best of `repeats` sums of a `mb` MB fp32 tensor with torch's
    threads, more than the caches hold): the bound of work that reads more bytes than it computes FLOPs, such as
    a decode step reading every weight and the shared prompt's keys and values."""
    import time

    import torch

    x = torch.ones(mb * 1024 * 1024 // 4)
    x.sum()  # warm-up: the pages are touched
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - started)
    return x.numel() * 4 / best / 1e9


def matmul_peak_gflops(n: int = 2048, seconds: float = 0.8) -> float:
    """The machine's fp32 matmul rate (GFLOP/s, the fastest n x n product with torch's threads, on torch's kernel
    and on oneDNN's, repeated for `seconds`): the bound the model's achieved FLOP/s is compared with. The same
    measure as `toolrl train`'s estimate (models/linear.py), at a larger product."""
    from toolrl.models.linear import matmul_gflops

    return matmul_gflops(n, seconds)


def model_sizes(model) -> tuple[int, int]:
    """(parameters outside the output layer, output-layer weights: vocabulary x hidden) of a causal LM; with tied
    embeddings the input embedding is the output layer (a lookup, no FLOPs), counted once."""
    head = model.get_output_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    return total - head - (0 if tied else embedding.numel()), head


def measured_calls(names: list[str]):
    """Wrap scoring/tokens.py's forward and output-layer calls: each one's peak above what was resident before it
    (the activations it keeps for the backward pass, the scores it makes)."""
    import toolrl.scoring.tokens as module
    from toolrl.memory import meter, rss_gb

    meter.exact = True  # a call's peak may last less than the sampler's interval

    peaks: dict[str, float] = {}

    def wrap(label, fn):
        def wrapped(*a, **k):
            before = rss_gb()
            with meter.phase(label):
                out = fn(*a, **k)
            peaks[label] = max(peaks.get(label, 0.0), meter.last[label] - before)
            return out

        return wrapped

    for label, name in zip(("activations", "output_layer"), names, strict=True):
        setattr(module, name, wrap(label, getattr(module, name)))
    return peaks


def timed(fn) -> float:
    """Seconds one call of `fn` takes."""
    import time

    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def side_by_side(ways: dict, repeats: int) -> dict[str, float]:
    """The best time of each of `ways` (name -> function), run in turn `repeats` times: a busy machine's slow
    moments fall on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            times[name].append(timed(fn))
    return {name: min(t) for name, t in times.items()}


def cpu_since(before) -> dict[str, float]:
    """This process's CPU use since `before` (a resource.getrusage(RUSAGE_SELF)): user and kernel seconds and the
    minor page faults (each a fresh page the kernel zeroed and mapped: freed memory handed back to the system and
    taken again costs one per 4 KB)."""
    import resource

    now = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_s": round(now.ru_utime - before.ru_utime, 2), "sys_s": round(now.ru_stime - before.ru_stime, 2),
            "minor_faults": now.ru_minflt - before.ru_minflt}  # fmt: skip


class SeedLog:
    """A benchmark's progress lines, each with the time: to stdout and to a log file beside its results."""

    def __init__(self, path: Path | None = None):
        self.path = path

    def open_beside(self, out: str) -> None:
        self.path = Path(out).with_suffix(".log")
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")


def quick_setup(args: Any, name: str) -> Path | None:
    """Where a benchmark writes (`args.out`: its results file, a temporary one under --quick), and under --quick
    the tiny test model made beside it (its folder, named after the results file: benchmarks writing into one
    folder at once, as bench/credit.py's arms do, each make their own; None otherwise)."""
    if args.out is None:
        args.out = str(Path(tempfile.mkdtemp()) / f"{name}.json") if args.quick else f"bench/results/{name}.json"
    if not args.quick:
        return None
    from tests.harness.tiny import make_tiny_model

    out = Path(args.out)
    return make_tiny_model(out.parent / f"tiny-model.{out.stem}")


def merged_seeds(out: str, rows: dict[str, Any], args: Any, same: tuple[str, ...]) -> dict[str, Any]:
    """The seeds of the results at `out` and `rows`: a seed run later as a process of its own merges into the
    results of the same measurement (the `same` arguments agree), else `rows` alone. Each earlier seed carries the
    bench/run.py stamp of the run that measured it (`run`), which the file's top-level stamp no longer names."""
    path = Path(out)
    previous = json.loads(path.read_text()) if path.is_file() else {}
    agree = all(previous.get(key) == getattr(args, key) for key in same)
    earlier = previous.get("seeds", {}) if agree else {}
    if run := previous.get("run"):  # an earlier seed keeps the run (commit, load) that measured it
        earlier = {seed: {"run": run, **row} for seed, row in earlier.items()}
    return {**earlier, **rows}


def seeded_arguments(parser: Any, name: str, quick: str) -> None:
    """The arguments every seeded training benchmark takes: --seeds, --steps, --set, --quick (`quick` says what
    it runs), --out, --runs, --threads."""
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="train.steps (default: the recipe's)")
    parser.add_argument("--set", action="append", default=[], help="a config override")
    parser.add_argument("--quick", action="store_true", help=f"the tiny model, 1 seed, 2 steps, {quick}")
    parser.add_argument("--out", default=None, help=f"default: bench/results/{name}.json (--quick: a temporary one)")
    parser.add_argument("--runs", default=str(ROOT / "runs" / name))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def start(args: Any, say: SeedLog) -> tuple[float, ...]:
    """Torch's threads as asked, the log beside the results; the load average now."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    say.open_beside(args.out)
    return os.getloadavg()
