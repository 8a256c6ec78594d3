"""Benchmark: `toolrl ui` in headless Chromium over a real run folder (`make demo`'s, say): how long each view
takes to show (the runs list with its curves, a step's trajectories, one trajectory token by token), with a
screenshot of each (docs/images/demo-*.png come from this). Prints a table and writes
bench/results/ui_views.json.

    python bench/ui_views.py runs --shots docs/images
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import machine, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--shots", type=Path, default=Path("bench/results/ui_views"))
    parser.add_argument("--out", default="bench/results/ui_views.json")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("no chromium: make install-test installs Debian's")
    server = subprocess.Popen(
        [sys.executable, "-m", "toolrl", "ui", str(args.runs), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    url = re.search(r"http://\S+", server.stdout.readline()).group(0)
    args.shots.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1360, "height": 900})

            def timed(name: str, action, ready: str) -> None:
                started = time.perf_counter()
                action()
                page.wait_for_selector(ready, timeout=60_000)
                timings[name] = (time.perf_counter() - started) * 1e3
                page.screenshot(path=str(args.shots / f"demo-{name}.png"), full_page=True)

            timed("runs", lambda: page.goto(url + "#runs"), ".chart[data-metric=reward] path.series")
            page.goto(url + "#trajectories")
            page.wait_for_selector("#tr-step option", state="attached")
            timed("step", lambda: page.select_option("#tr-step", index=0), "#tr-list .card")  # the first step
            page.select_option("#tr-heat", "logprob")
            timed("trajectory", lambda: page.click("#tr-list .card >> nth=0"), "#tr-detail .tok")
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
    print(f"{'view':<12} {'ms to show':>10}")
    for name, ms in timings.items():
        print(f"{name:<12} {ms:>10.0f}")
    runs = sorted(p.name for p in args.runs.iterdir() if (p / "config.yaml").is_file())
    write_results(
        args.out, {"machine": machine(), "runs": runs, "ms_to_show": {k: round(v) for k, v in timings.items()}}
    )


if __name__ == "__main__":
    main()
