"""bench/ has one way to list and run its benchmarks (bench/run.py, `make bench`): what a user runs stands at its
top, kernel micro-benchmarks in bench/kernels/, and every results file a run writes carries the same `run` block
(issue 73, item 7)."""

import contextlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
RUN = ROOT / "bench" / "run.py"
HELPERS = {"common", "run", "report", "fault_tools", "sandbox_escapes"}
"""Scripts of bench/ that are not benchmarks: shared code, this runner, the documents' figures, the faults bench's
tools, the sandbox probe's attempts."""


def load_run():
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_script_is_a_listed_benchmark_or_a_named_helper_and_kernels_have_a_folder():
    listed = load_run().benchmarks()
    top = {p.stem for p in (ROOT / "bench").glob("*.py")}
    assert top - HELPERS == {name for name in listed if "/" not in name}
    kernels = {p.stem for p in (ROOT / "bench" / "kernels").glob("*.py")} - {"_parent"}
    assert {f"kernels/{k}" for k in kernels} == {name for name in listed if name.startswith("kernels/")}
    assert {"kernels/decode_kernel", "kernels/attention_kernels", "kernels/linear_kernels"} <= set(listed)
    assert {"learning", "train_vs_trl", "memory", "faults", "gateway", "env_builder", "ui", "eval_speed"} <= set(listed)
    done = subprocess.run([sys.executable, str(RUN)], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.index("what a user runs:") < done.stdout.index("kernels and pieces of a step")
    assert all(name in done.stdout for name in listed)


def test_an_unknown_name_is_one_line_with_the_near_one():
    done = subprocess.run([sys.executable, str(RUN), "kernel/heap"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "did you mean kernels/heap?" in done.stderr


def bench_of(tmp_path, monkeypatch, name: str, script: str):
    """bench/run.py over a folder of one benchmark `name` (its source `script`), results in its results/."""
    run = load_run()
    bench, results = tmp_path / "bench", tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    (bench / f"{name}.py").write_text(script)
    monkeypatch.setattr(run, "FOLDERS", {"": bench})
    monkeypatch.setattr(run, "RESULTS", results)
    monkeypatch.setattr(run, "BENCH", ROOT / "bench")  # common.machine() and git come from the repository
    return run, results


def test_a_run_stamps_the_results_it_wrote_and_leaves_the_others(tmp_path, monkeypatch):
    run, results = bench_of(tmp_path, monkeypatch, "tiny", (
        '"""Benchmark: writes one number."""\n'
        "import json, sys, pathlib\n"
        "out = pathlib.Path(__file__).with_name('results') / 'tiny.json'\n"
        "out.write_text(json.dumps({'n': sys.argv[1:]}))\n"
    ))  # fmt: skip
    (results / "old.json").write_text('{"kept": 1}\n')
    monkeypatch.setenv("TOOLRL_BENCH_BESIDE", "make test")
    assert run.main(["tiny", "--x", "1"]) == 0
    stamped = json.loads((results / "tiny.json").read_text())
    assert stamped["n"] == ["--x", "1"]
    assert {"bench", "args", "commit", "machine", "load_avg_before", "load_avg_after", "seconds", "beside"} == set(
        stamped["run"]
    )
    assert stamped["run"]["bench"] == "tiny" and stamped["run"]["beside"] == "make test"
    assert json.loads((results / "old.json").read_text()) == {"kept": 1}


def test_a_run_beside_another_stamps_only_what_it_named(tmp_path, monkeypatch):
    """Two benchmarks run at once: each stamps the results it wrote through common.write_results, not the file the
    other wrote meanwhile (its run block would say the wrong benchmark, arguments and seconds)."""
    run, results = bench_of(tmp_path, monkeypatch, "mine", (
        '"""Benchmark: writes its result, while another benchmark writes its own."""\n'
        "import json, pathlib, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "from common import write_results\n"
        "here = pathlib.Path(__file__).with_name('results')\n"
        "(here / 'other.json').write_text(json.dumps({'other': 1}))  # the benchmark beside it\n"
        "write_results(str(here / 'mine.json'), {'n': 2})\n"
    ))  # fmt: skip
    assert run.main(["mine"]) == 0
    assert json.loads((results / "mine.json").read_text())["run"]["bench"] == "mine"
    assert json.loads((results / "other.json").read_text()) == {"other": 1}


def test_a_results_commit_says_dirty_when_the_code_that_ran_differs_from_it(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    from common import git_head

    assert git_head(tmp_path) == "unknown"  # not a checkout

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "src").mkdir()
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    head = git_head(tmp_path)
    assert head and not head.endswith("-dirty") and head != "unknown"
    (tmp_path / "bench" / "results" / "x.json").write_text("{}")  # results are not code
    (tmp_path / "notes.md").write_text("a note")  # nor is anything outside src, bench, recipes
    assert git_head(tmp_path) == head
    (tmp_path / "bench" / "new.py").write_text("")  # an untracked benchmark is
    assert git_head(tmp_path) == f"{head}-dirty"
    (tmp_path / "bench" / "new.py").unlink()
    (tmp_path / "src" / "a.py").write_text("x = 2\n")  # and so is a changed module
    assert git_head(tmp_path) == f"{head}-dirty"


def test_a_seed_run_later_keeps_each_seeds_own_run(tmp_path, monkeypatch):
    """Seeds measured by separate runs merge into one results file; the top-level stamp names the last run, and each
    seed keeps the run (commit, load, arguments) that measured it."""
    run, results = bench_of(tmp_path, monkeypatch, "seeded", (
        '"""Benchmark: one seed per run, merged."""\n'
        "import argparse, pathlib, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "from common import merged_seeds, write_results\n"
        "args = argparse.Namespace(seed=sys.argv[1], games=2)\n"
        "out = str(pathlib.Path(__file__).with_name('results') / 'seeded.json')\n"
        "seeds = merged_seeds(out, {args.seed: {'won': 1}}, args, ('games',))\n"
        "write_results(out, {'games': 2, 'seeds': seeds})\n"
    ))  # fmt: skip
    assert run.main(["seeded", "0"]) == 0 and run.main(["seeded", "1"]) == 0
    merged = json.loads((results / "seeded.json").read_text())
    assert sorted(merged["seeds"]) == ["0", "1"]
    assert merged["seeds"]["0"]["run"]["args"] == ["0"] and merged["seeds"]["1"]["run"]["args"] == ["1"]
    assert merged["run"]["args"] == ["1"] and merged["seeds"]["0"]["won"] == 1


def test_a_stamp_waits_for_a_run_beside_it_that_is_writing_the_same_results(tmp_path):
    """Runs side by side (bench/credit.py's arms as separate invocations) read, change and write one results
    file under common.locked: a stamp started while another holds the file waits, and then keeps its change."""
    path = tmp_path / "credit.json"
    path.write_text(json.dumps({"search-r1": {"runs": []}}))
    stamp = ("import importlib.util, json, pathlib, sys\n"
             f"spec = importlib.util.spec_from_file_location('bench_run', {str(RUN)!r})\n"
             "run = importlib.util.module_from_spec(spec); spec.loader.exec_module(run)\n"
             f"run.stamp(pathlib.Path({str(path)!r}), {{'commit': 'abc'}})\n")  # fmt: skip
    locked = load_run().locked
    with locked(path):
        waiting = subprocess.Popen([sys.executable, "-c", stamp])
        with contextlib.suppress(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)
        assert waiting.returncode is None, "the stamp wrote while another run held the results file"
        path.write_text(json.dumps({"search-r1": {"runs": [{"arms": ["dense_prob"]}]}}))  # the other run's change
    assert waiting.wait(timeout=60) == 0
    data = json.loads(path.read_text())
    assert data == {"search-r1": {"runs": [{"arms": ["dense_prob"]}]}, "run": {"commit": "abc"}}
