"""README.md's and docs/benchmarks.md's speed and memory figures are written by bench/report.py from the committed
results (no figure typed by hand); a document without the block's markers is a one-line error."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
REPORT = ROOT / "bench" / "report.py"


def test_the_committed_documents_are_what_the_committed_results_make():
    done = subprocess.run([sys.executable, str(REPORT), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def load_report():
    sys.path.insert(0, str(REPORT.parent))
    try:
        import report
    finally:
        sys.path.remove(str(REPORT.parent))
    return report


def test_a_result_changes_the_block_and_a_missing_one_reads_not_measured(tmp_path, monkeypatch):
    report = load_report()
    results = tmp_path / "results"
    results.mkdir()
    (results / "memory.json").write_text(json.dumps({"demo_full_run_peak_gb": 3.21}))
    monkeypatch.setattr(report, "RESULTS", results)
    block = report.readme_block()
    assert "| 3.21 GB | <= 4.0 GB |" in block
    assert block.count(report.MISSING) == 4  # the end-to-end pair, vLLM and TRL were not measured here
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- speed and memory: python bench/report.py -->\nold\n<!-- /speed and memory -->\nend\n")
    new = report.render(doc.read_text(), "speed and memory", block, doc)
    assert new.startswith("intro\n") and new.endswith("end\n") and "old" not in new and "3.21 GB" in new


def test_a_document_without_the_markers_is_a_one_line_error(tmp_path):
    report = load_report()
    doc = tmp_path / "doc.md"
    try:
        report.render("no markers here\n", "speed and memory", "x", doc)
    except SystemExit as exc:
        message = str(exc)
    assert "\n" not in message and str(doc) in message and "<!-- speed and memory" in message


def test_a_full_run_measured_beside_other_work_says_so_beside_its_wall_time():
    report = load_report()
    run = {"peak_gb": 3.7, "peak_sampled_gb": 3.69, "peak_in_process_gb": 3.7, "wall_s": 595.0,
           "phases_peak_gb": {"update": 3.5}, "machine": {"cores": 2}}  # fmt: skip
    quiet = "\n".join(report.memory_tables({"full_runs": {"demo_full": {**run, "load_avg_max": 2.4}}}))
    assert "595 s wall." in quiet and "other work" not in quiet
    busy = "\n".join(report.memory_tables({"full_runs": {"demo_full": {**run, "load_avg_max": 4.6}}}))
    assert "595 s wall (other work shared the machine, load average up to 4.6 on 2 cores" in busy
    before = {"peak_gb": 4.4, "wall_s": 150.0, "revision": "abc"}
    both = {"full_runs": {"demo_full": {**run, "load_avg_max": 4.6}, "demo_full_before": before}}
    assert "wall time not compared" in "\n".join(report.memory_tables(both))
    both["full_runs"]["demo_full"]["load_avg_max"] = 2.0
    assert "wall time 3.97x" in "\n".join(report.memory_tables(both))
