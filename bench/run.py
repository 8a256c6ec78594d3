"""The benchmarks, listed and run one way.

    python bench/run.py                 # every benchmark: its name, what it measures, where it writes
    python bench/run.py NAME [ARGS...]  # run one (its own --help lists its arguments)

A benchmark is a script in bench/ (what a user runs: learning, speed against TRL and vLLM, memory, faults, the
gateway, the builder, the UI) or in bench/kernels/ (micro-benchmarks of one kernel or one piece of a step), whose
docstring starts with "Benchmark:". Each writes JSON under bench/results/. Run through this script, every results
file it wrote (or rewrote) also gets a `run` block (the files it names through common.write_results; a script that
names none: every results file changed while it ran), the one format all results share: the benchmark, its
arguments, the commit, the machine, the load average before and after, the seconds, and what ran beside it
(TOOLRL_BENCH_BESIDE). `make bench` lists them; `make bench B=NAME ARGS='...'` runs one.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:  # common.py beside this script, also when a test loads it by path
    sys.path.insert(0, str(BENCH))
from common import locked  # noqa: E402

RESULTS = BENCH / "results"
FOLDERS = {"": BENCH, "kernels/": BENCH / "kernels"}


def benchmarks() -> dict[str, tuple[Path, str]]:
    """Name -> (script, its first sentence after "Benchmark:"), for every script whose docstring starts so."""
    found = {}
    for prefix, folder in FOLDERS.items():
        for script in sorted(folder.glob("*.py")):
            doc = ast.get_docstring(ast.parse(script.read_text())) or ""
            if doc.startswith("Benchmark:"):
                text = " ".join(doc.removeprefix("Benchmark:").split())
                first = re.split(r"(?<=[.?!])\s", text, maxsplit=1)[0]
                found[prefix + script.stem] = (script, first if len(first) <= 160 else first[:159] + "…")
    return found


def listing() -> str:
    rows = benchmarks()
    width = max(len(name) for name in rows)
    lines = [f"{len(rows)} benchmarks (python bench/run.py NAME [ARGS]; results in bench/results/):", ""]
    for top in (True, False):
        lines.append("what a user runs:" if top else "kernels and pieces of a step (bench/kernels/):")
        lines += [f"  {name:{width}s}  {what}" for name, (_, what) in rows.items() if ("/" not in name) == top]
        lines.append("")
    return "\n".join(lines)


def stamp(path: Path, run: dict) -> None:
    """Add the `run` block to a results file a benchmark wrote (a JSON object; anything else is left as it is),
    and to each of its seeds that has none (the seeds this run measured)."""
    with locked(path):  # a run beside this one may be writing the same file
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            data["run"] = run
            seeds = data.get("seeds")
            for row in seeds.values() if isinstance(seeds, dict) else ():
                if isinstance(row, dict):  # seeds measured by this run (common.merged_seeds keeps earlier runs')
                    row.setdefault("run", run)
            path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-l", "--list", "list"):
        print(listing())
        return 0
    name, args = argv[0], argv[1:]
    known = benchmarks()
    name = name if name in known or f"kernels/{name}" not in known else f"kernels/{name}"
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `python bench/run.py` lists them"
        print(f"bench/run.py: no benchmark named {name!r}{hint}", file=sys.stderr)
        return 2
    script = known[name][0]
    before = {p: p.stat().st_mtime for p in RESULTS.glob("*.json")}
    load_before, started = os.getloadavg(), time.perf_counter()
    sys.path.insert(0, str(BENCH))
    from common import git_head, machine

    commit = git_head()  # what runs is the code as it is now (a commit made meanwhile did not run)
    with tempfile.NamedTemporaryFile("r", suffix=".written") as written:
        env = {**os.environ, "TOOLRL_BENCH_WRITTEN": written.name}  # common.write_results names its files there
        code = subprocess.call([sys.executable, str(script), *args], env=env)
        named = {Path(line).resolve() for line in written.read().splitlines() if line}
    if code == 0:
        run = {"bench": name, "args": args, "commit": commit, "machine": machine(),
               "load_avg_before": [round(x, 2) for x in load_before],
               "load_avg_after": [round(x, 2) for x in os.getloadavg()],
               "seconds": round(time.perf_counter() - started, 1),
               "beside": os.environ.get("TOOLRL_BENCH_BESIDE", "")}  # fmt: skip
        changed = [p for p in sorted(RESULTS.glob("*.json")) if before.get(p) != p.stat().st_mtime]
        for path in [p for p in changed if p.resolve() in named] if named else changed:
            stamp(path, run)
            print(f"bench/run.py: {path.name} in {path.parent} stamped with its run")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
