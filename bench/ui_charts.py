"""Benchmark: the runs tab's charts in headless Chromium on a long run: 5,000 steps x 40 metrics (issue 50's
size). Measures, in the page:
- the first view: from loading the page (the URL ticks the run and its 40 metrics) to every chart drawn;
- ticking one more metric: the click's main-thread time until its chart is there;
- a live update: a record appended to metrics.jsonl, then the main-thread time the page spends on it (the poll's
  answer to the charts updated), and whether the charts' nodes are kept (appended to) or drawn again;
- what a chart draws: the points of its longest line (downsampled to the chart's pixels) against the run's steps,
  and the value hover shows at a step against the file's (exact, not a bucket's);
- beside the update, in the same page: every chart drawn again from the same data (the ratio is the comparison).

Prints a table and writes bench/results/ui_charts.json.

    python bench/ui_charts.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, write_results

STEPS, METRICS = 5000, 40
NAMED = ["reward", "success", "tool_calls", "kl", "entropy", "response_tokens", "step_s", "stop/answer"]


def value(step: int, i: int) -> float:
    """A metric's value at a step: a noisy curve (so that downsampling has peaks to keep)."""
    return round(math.sin(step / (40 + i)) + 0.3 * math.sin(step * 1.7 + i) + i, 6)


def record(step: int) -> dict:
    keys = NAMED + [f"extra/m{i:02d}" for i in range(METRICS - len(NAMED))]
    return {"step": step, "trajectories": 8, **{k: value(step, i) for i, k in enumerate(keys)}}


def write_run(root: Path) -> Path:
    run = root / "long"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("env:\n  name: calculator\ntrain:\n  steps: 100000\n")
    # running (updated now, no host: a run the page takes as live), so that its charts keep room for new steps
    status = {"state": "running", "step": STEPS, "steps": 100000, "updated_at": time.time()}
    (run / "status.json").write_text(json.dumps(status))
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, STEPS + 1):
            f.write(json.dumps(record(step)) + "\n")
    return run


# Main-thread time: every task longer than 0 ms the page runs, from the PerformanceObserver's long tasks and a wrap
# of the page's draw. The draw wrap counts the charts' own work; long tasks (>= 50 ms) would show any other.
INSTRUMENT = """() => {
  window.__draws = [];
  const wrap = (name) => {
    const original = Runs[name].bind(Runs);
    Runs[name] = (...args) => { const t = performance.now(); const out = original(...args);
      window.__draws.push([name, performance.now() - t]); return out; };
  };
  wrap("draw");
  window.__long = [];
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push(e.duration); })
    .observe({ type: "longtask", buffered: false });
  window.__charts = new Set(document.querySelectorAll("#charts .chart"));
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/ui_charts.json")
    parser.add_argument("--repeat", type=int, default=5, help="live updates measured")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("no chromium: make install-test installs Debian's")
    base = Path(tempfile.mkdtemp(prefix="toolrl-ui-charts-"))
    run = write_run(base / "runs")
    megabytes = (run / "metrics.jsonl").stat().st_size / 1e6
    server = subprocess.Popen(
        [sys.executable, "-m", "toolrl", "ui", str(base / "runs"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    url = re.search(r"http://\S+", server.stdout.readline()).group(0)
    extra = ",".join(k for k in record(1) if k not in ("step", "trajectories"))
    out: dict = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            charts = page.locator("#charts .chart")
            started = time.perf_counter()
            page.goto(f"{url}#runs?runs=long&metrics={extra}")
            page.wait_for_function(f"document.querySelectorAll('#charts .chart').length >= {METRICS}", timeout=120_000)
            out["first_view_ms"] = (time.perf_counter() - started) * 1e3
            out["charts"] = charts.count()
            chart = page.locator('#charts .chart[data-metric="reward"]')
            out["drawn_points"] = int(chart.locator("path.series").get_attribute("data-drawn") or -1)
            out["steps"] = STEPS
            # hover at step 2,500's x: the tooltip's value against the file's value at the step it names
            box = chart.locator("svg").bounding_box()
            page.mouse.move(box["x"] + 42 + (box["width"] - 50) * 0.5, box["y"] + 80)
            tip = chart.locator(".tip").inner_text()
            step = int(re.search(r"step (\d+)", tip).group(1))
            shown = float(re.search(r": (-?[\d.]+)", tip).group(1))
            out["hover_exact"] = abs(shown - value(step, 0)) < 5e-3
            page.mouse.move(0, 0)
            page.evaluate(INSTRUMENT)
            # ticking one more metric: the checkbox's click to its chart
            started = time.perf_counter()
            page.evaluate("""() => { const t = performance.now();
                Runs.extra.add("trajectories"); Runs.draw(); window.__tick = performance.now() - t; }""")
            out["tick_metric_ms"] = page.evaluate("window.__tick")
            page.evaluate(INSTRUMENT)
            updates = []
            for i in range(args.repeat):
                page.evaluate("window.__draws = []; window.__long = []")
                with open(run / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(record(STEPS + 1 + i)) + "\n")
                page.wait_for_function(f"Runs.metrics.long.length >= {STEPS + 1 + i} && window.__draws.length > 0",
                                       timeout=30_000)  # fmt: skip
                updates.append(sum(ms for _, ms in page.evaluate("window.__draws")))
            out["update_ms"] = statistics.median(updates)
            out["update_ms_all"] = [round(u, 1) for u in updates]
            out["charts"] = charts.count()
            out["charts_kept"] = page.evaluate(
                "[...document.querySelectorAll('#charts .chart')].filter((c) => window.__charts.has(c)).length"
            )
            # extended in place at every update (not drawn anew): their lines' paths grew by the new points
            out["charts_extended"] = page.locator(f'#charts .chart[data-extended="{args.repeat}"]').count()
            out["long_tasks_ms"] = page.evaluate("window.__long")
            # beside it, in the same page: every chart drawn again from the same data (what an update is when its
            # points fall outside a chart's axes, and what every update was before the charts were extended)
            redraw = "(() => { const t = performance.now(); Runs.draw(); return performance.now() - t; })()"
            redraws = [page.evaluate(redraw) for _ in range(args.repeat)]
            out["full_redraw_ms"] = statistics.median(redraws)
            out["update_vs_full_redraw"] = out["update_ms"] / out["full_redraw_ms"]
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(base, ignore_errors=True)
    out = {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}
    result = {"machine": machine(), "load_average": os.getloadavg(), "metrics_mb": round(megabytes, 2),
              "size": f"{STEPS} steps x {METRICS} metrics", **out,
              "goals": {"first_view_ms": 1000, "update_ms": 50}}  # fmt: skip
    rows = [
        ("first view (page load to every chart)", f"{out['first_view_ms']:.0f} ms", "<= 1000 ms"),
        ("tick one more metric", f"{out['tick_metric_ms']:.0f} ms", ""),
        ("live update (main thread, median)", f"{out['update_ms']:.1f} ms", "<= 50 ms"),
        (
            "every chart drawn again (median)",
            f"{out['full_redraw_ms']:.1f} ms",
            f"update {out['update_vs_full_redraw']:.2f}x of it",
        ),
        ("charts kept across the updates (same node)", f"{out['charts_kept']} of {out['charts']}", ""),
        ("charts extended at every update (not redrawn)", f"{out['charts_extended']} of {out['charts']}", ""),
        ("points drawn in a line of 5,000 steps", str(out["drawn_points"]), "min/max per pixel"),
        ("hover shows the exact value", str(out["hover_exact"]), ""),
    ]
    print(f"toolrl ui charts: {STEPS} steps x {METRICS} metrics ({megabytes:.1f} MB of metrics.jsonl)")
    for name, got, goal in rows:
        print(f"  {name:<42} {got:>12}  {goal}")
    print(f"  load average {os.getloadavg()[0]:.1f}")
    write_results(args.out, result)


if __name__ == "__main__":
    main()
