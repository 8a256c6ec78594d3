"""`toolrl ui` in a real browser: headless Chromium (Debian's package, installed by `make install-test`) driven
by Playwright through the main flows on tiny runs made here: runs with live, overlaid curves; a trajectory
token by token with its loss mask and log-probs, filters, tool calls, and a task across steps; a tool called
from a form made from its schema; a run launched, followed, stopped after a step and resumed. Each view is
saved as a screenshot (TOOLRL_SCREENSHOTS=docs/images writes the ones the docs show: `make ui-screenshots`).

Without Chromium these tests skip, unless TOOLRL_BROWSER_TESTS=required (as `make test` sets): then they fail."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.fixtures import mcp_server_entry, write_tool_config
from toolrl.rollout.trajectory import Trajectory, UpdateValues
from toolrl.runs.rundir import RunDir, process_start
from toolrl.tools.call import ToolCall, ToolResult

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIXTURES = Path(__file__).parents[1] / "fixtures"
# The launched run: steps enough that a stop after step 2 lands before its end, few enough that the resumed rest
# finishes in minutes on a loaded CI machine (150 steps did not, in 600 s).
LAUNCH_STEPS = 30
if not CHROMIUM:
    if os.environ.get("TOOLRL_BROWSER_TESTS") == "required":
        raise RuntimeError("Chromium is not installed: `make install-test` installs Debian's chromium package")
    pytest.skip("no chromium on this machine (make install-test installs it)", allow_module_level=True)


def toolrl(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, **kwargs)


def tiny_run(model, root, name, seed):
    out = toolrl(
        "train", "--quiet",
        "--set", f"model.name={model}", "--set", f"output_dir={root}", "--set", f"run_name={name}",
        "--set", f"seed={seed}", "--set", "train.steps=3", "--set", "train.prompts_per_step=2",
        "--set", "train.group_size=3", "--set", "rollout.max_new_tokens=16", "--set", "eval.num_tasks=3",
        "--set", "eval.batch_size=3", "--set", "train.save_every=1",
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]


def run_with_tool_calls(root, tokenizer):
    """A run whose step-1 trajectory called tools (the tiny random model never does): a record written by
    Trajectory.to_record, as the trainer writes it, with an observation, a failed call and a user turn."""
    from toolrl.envs import Task

    run = root / "with-calls"
    run.mkdir()
    shutil.copy(root / "alpha" / "config.yaml", run / "config.yaml")
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    traj = Trajectory.start(Task(id="calc-7", question="What is 6 * 7?", answer="42"), encode("What is 6 * 7?"))
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
    traj.add_model_turn(encode(call), [-0.3] * len(encode(call)), call, [2] * len(encode(call)))
    traj.add_observation(encode("<tool_response>42</tool_response>"))
    answer = encode("The answer is 42.")  # partial rollouts: the trainer's next weights came mid-turn
    traj.add_model_turn(answer, [-0.1] * len(answer), "The answer is 42.", [2] * 2 + [3] * (len(answer) - 2))
    traj.add_user_message(encode("And 6 / 0?"), "And 6 / 0?")
    traj.results = [
        ToolResult(ToolCall("calculator", {"expression": "6 * 7"}), "42", "ok", 0.0021),
        ToolResult(ToolCall("calculator", {"expression": "6 / 0"}), "error: division by zero", "tool_error", 0.0013),
        ToolResult(ToolCall("fetch", {"url": "x"}), '<img src=x onerror="document.title=1"><b>bold</b>', "ok", 0.001),
    ]
    traj.num_tool_calls, traj.num_tool_errors, traj.stop_reason, traj.reward = 3, 1, "answer", 1.0
    traj.rewards = {"correct": 1.0, "format": 1.0}
    record = traj.to_record(tokenizer, success="correct", update=UpdateValues([0.8] * sum(traj.loss_mask)))
    RunDir(run).log_samples(1, [{**record, "sample": 0, "group": 0}])
    (run / "status.json").write_text(json.dumps({"state": "finished", "step": 1, "steps": 1}))


def run_with_segments(root, tokenizer):
    """A run whose trajectory a context strategy compacted twice (sliding_window, then summarize): three linked
    segments, written by Trajectory.to_record as the trainer writes them."""
    from toolrl.envs import Task
    from toolrl.rollout.trajectory import Carry, Written

    run = root / "with-segments"
    run.mkdir()
    shutil.copy(root / "alpha" / "config.yaml", run / "config.yaml")
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    traj = Trajectory.start(Task(id="chain-1", question="Follow the chain.", answer="K9"), encode("Follow the chain."))
    prompt = len(traj.token_ids)
    for k in range(2):
        traj.add_model_turn(encode(f"call {k}"), [-0.2] * len(encode(f"call {k}")), f"call {k}")
        traj.record_step(0.0, {})
        traj.add_observation(encode(f"report {k}"))
    last = [a for kind, a, _ in traj.spans if kind == "model"][-1]
    traj.compact([Carry(0, prompt), Carry(last, len(traj.token_ids))], "sliding_window")
    traj.add_model_turn(encode("call 2"), [-0.2] * len(encode("call 2")), "call 2")
    traj.record_step(0.0, {})
    traj.add_observation(encode("report 2"))
    traj.add_context(encode("Summarize."))
    traj.add_summary(encode("The next key is K9."), [-0.5] * len(encode("The next key is K9.")), "The next key is K9.")
    start = [a for kind, a, _ in traj.spans if kind == "summary"][-1]
    traj.compact([Carry(0, prompt), Carry(start, len(traj.token_ids)), Written(tuple(encode("Go on.")))], "summarize")
    traj.add_model_turn(
        encode("<answer>K9</answer>"), [-0.1] * len(encode("<answer>K9</answer>")), "<answer>K9</answer>"
    )
    traj.stop_reason, traj.reward, traj.rewards = "answer", 1.0, {"correct": 1.0}
    record = traj.to_record(tokenizer, success="correct", update=UpdateValues([0.5] * traj.trained_count))
    hostile = json.loads(json.dumps(record))  # a run directory's records are untrusted: a strategy named in HTML
    for span in hostile["segments"]:
        if span["kind"] == "compaction":
            span["strategy"] = '<img src=x onerror="document.title=2">'
    RunDir(run).log_samples(1, [{**record, "sample": 0, "group": 0}, {**hostile, "sample": 1, "group": 0}])
    (run / "status.json").write_text(json.dumps({"state": "finished", "step": 1, "steps": 1}))


def vision_run(base, root):
    """One step of a tiny random Qwen2.5-VL on the images environment: records with the task's image."""
    from tests.harness.tiny_vlm import make_tiny_vlm

    model = make_tiny_vlm(base / "vlm")
    out = toolrl(
        "train", "--quiet",
        "--set", f"model.name={model}", "--set", f"output_dir={root}", "--set", "run_name=vision",
        "--set", "env.name=images", "--set", "env.options.size=112", "--set", "env.options.num_train=4",
        "--set", "env.options.num_test=2", "--set", "train.steps=1", "--set", "train.prompts_per_step=1",
        "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=8", "--set", "eval.at_start=false",
        "--set", "eval.at_end=false",
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.fixture(scope="module")
def site(tiny_model_dir, tokenizer, tmp_path_factory):
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=15_000)

    base = tmp_path_factory.mktemp("ui")
    root = base / "runs"
    tiny_run(tiny_model_dir, root, "alpha", 0)
    tiny_run(tiny_model_dir, root, "beta", 1)
    run_with_tool_calls(root, tokenizer)
    run_with_segments(root, tokenizer)
    vision_run(base, root)
    recipes = base / "recipes"
    recipes.mkdir()
    (recipes / "tiny.yaml").write_text(
        f"# a tiny run\nmodel:\n  name: {tiny_model_dir}\nrollout:\n  max_new_tokens: 16\n"
        f"train:\n  steps: {LAUNCH_STEPS}\n  prompts_per_step: 2\n  group_size: 3\n  save_every: 1\n"
        "eval:\n  num_tasks: 3\n  batch_size: 3\n  at_start: false\n"
    )
    tools = write_tool_config(
        base / "tools.json",
        {"srv": mcp_server_entry("add"), "calc": {"python": "toolrl.envs.calculator.tool:calculator"}},
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "toolrl", "ui", str(root), "--port", "0", "--recipes", str(recipes)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=base,
    )  # fmt: skip
    line = server.stdout.readline()
    url = re.search(r"http://\S+", line)
    assert url, line
    shots = Path(os.environ.get("TOOLRL_SCREENSHOTS") or base / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        yield {"page": page, "url": url.group(0), "root": root, "tools": tools, "shots": shots, "errors": errors}
        browser.close()
    server.terminate()
    server.wait(10)


def shot(site, name):
    path = site["shots"] / f"ui-{name}.png"
    site["page"].screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    assert not site["errors"], site["errors"]


def load_tools(site):
    """The tools tab with the test's tool config loaded."""
    page = site["page"]
    page.goto(site["url"] + "#tools")
    page.fill("#tools-file", str(site["tools"]))
    page.click("#tools-load")


def untick_all(page):
    """Untick every ticked run, each found by its own label: the table may be drawn again between a click and its
    check (a torn metrics line met names itself in the row), and `input:checked >> nth=0` would then match none."""
    for label in [box.get_attribute("aria-label") for box in page.locator("#runs-table tbody input:checked").all()]:
        page.uncheck(f'#runs-table tbody input[aria-label="{label}"]')


def tick_only(site, *runs):
    """The runs tab with only `runs` ticked (the newest run is ticked on a first visit)."""
    page = site["page"]
    page.goto(site["url"] + "#runs")
    page.wait_for_selector(f"tr[data-run={runs[0]}] .badge")
    untick_all(page)
    for run in runs:
        page.check(f"tr[data-run={run}] input")


def test_runs_list_and_live_overlaid_curves(site):
    page, root = site["page"], site["root"]
    page.goto(site["url"] + "#runs")
    page.wait_for_selector("tr[data-run=alpha] .badge.state-finished")
    assert page.locator("tr[data-run=beta] .badge").inner_text() == "finished"
    untick_all(page)  # the newest run is shown first
    page.check("tr[data-run=alpha] input")
    page.check("tr[data-run=beta] input")
    reward = page.locator(".chart[data-metric=reward]")
    page.wait_for_function("document.querySelectorAll('.chart[data-metric=reward] path.series').length === 2")
    assert "alpha" in reward.inner_text() and "beta" in reward.inner_text()
    before = int(reward.get_attribute("data-points"))
    # the run trains on: its toolrl process is alive, and a step is appended to metrics.jsonl
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "toolrl", "train"])
    try:
        status = {"state": "running", "pid": sleeper.pid, "pid_start": process_start(sleeper.pid), "steps": 4}
        status["host"] = socket.gethostname()
        (root / "alpha" / "status.json").write_text(json.dumps(status))
        with (root / "alpha" / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 4, "reward": 0.9, "success": 0.5, "tool_calls": 1.0, "step_s": 0.2}) + "\n")
        page.wait_for_selector("tr[data-run=alpha] .badge.state-running", timeout=10_000)
        now = time.time()  # the step running now (RUN/live.json): its phase in the run's row, not just "4 / 4"
        live = {"step": 5, "steps": 6, "phase": "rollout", "done": 3, "total": 8, "unit": "trajectories",
                "started_at": now - 30, "phase_started_at": now - 30, "updated_at": now, "phase_eta_s": 50}  # fmt: skip
        (root / "alpha" / "live.json").write_text(json.dumps(live))
        phase = page.locator("tr[data-run=alpha] .live")
        expect(phase).to_contain_text("step 5: rollout 3/8 trajectories", timeout=10_000)
        assert "eta 50 s" in phase.inner_text()
        page.wait_for_function(
            f"+document.querySelector('.chart[data-metric=reward]').dataset.points > {before}", timeout=10_000
        )
        page.hover(".chart[data-metric=reward] svg")
        assert "step" in page.locator(".chart[data-metric=reward] .tip").inner_text()
        shot(site, "runs")
    finally:
        sleeper.kill()
        sleeper.wait()
    page.wait_for_selector("tr[data-run=alpha] .badge.state-died", timeout=10_000)  # its process is gone


def test_a_long_live_run_is_drawn_per_pixel_and_new_steps_extend_its_lines_held_only_while_dragging(site):
    """Item 2 of the UI review: a line of 3,000 steps is drawn from at most 4 points a pixel column, hover still
    reads the exact value of a step; a new step extends the charts in place (same nodes, longer paths), also under a
    resting pointer (issue 77: 40 charts leave the pointer on one almost always); only a drag across a chart holds
    it, with a line saying how many steps wait; a point outside a chart's axes draws that chart anew."""
    import math

    page, root = site["page"], site["root"]
    run = root / "long"
    run.mkdir()
    value = lambda step: round(math.sin(step / 50) + 0.3 * math.sin(step * 1.7), 6)  # noqa: E731
    try:
        (run / "config.yaml").write_text("env:\n  name: calculator\n")
        status = {"state": "running", "step": 3000, "steps": 10000, "updated_at": time.time()}  # live: fresh, no host
        (run / "status.json").write_text(json.dumps(status))
        with (run / "metrics.jsonl").open("w") as f:
            for step in range(1, 3001):
                f.write(json.dumps({"step": step, "reward": value(step), "success": 0.5}) + "\n")
        page.goto(site["url"] + "#runs?runs=long")
        chart = page.locator(".chart[data-metric=reward]")
        expect(chart).to_have_attribute("data-points", "3000")
        drawn = int(chart.locator("path.series").get_attribute("data-drawn"))
        assert 250 <= drawn <= 4 * 250  # per pixel column of the 250 px plot: first, lowest, highest, last
        box = chart.locator("svg").bounding_box()
        page.mouse.move(box["x"] + 42 + (box["width"] - 50) * 0.4, box["y"] + 80)
        tip = chart.locator(".tip").inner_text()
        step = int(re.search(r"step (\d+)", tip).group(1))
        assert float(re.search(r"long: (-?[\d.]+)", tip).group(1)) == pytest.approx(value(step), abs=5e-3)
        page.evaluate("window.__reward = document.querySelector('.chart[data-metric=reward]')")
        length = page.evaluate(
            "document.querySelector('.chart[data-metric=reward] path.series').getAttribute('d').length"
        )
        with (run / "metrics.jsonl").open("a") as f:  # the pointer resting on the chart holds nothing (issue 77)
            f.write(json.dumps({"step": 3001, "reward": 0.1, "success": 0.5}) + "\n")
        expect(chart).to_have_attribute("data-extended", "1")  # extended in place under it, its tooltip kept
        assert chart.locator(".tip").is_visible() and page.locator("#charts-held").is_hidden()
        assert page.evaluate("window.__reward === document.querySelector('.chart[data-metric=reward]')")
        longer = page.evaluate("document.querySelector('.chart[data-metric=reward] path.series').getAttribute('d')")
        assert len(longer) > length and longer.count("L") >= drawn
        page.mouse.down()  # a drag across the chart (a zoom being chosen) holds the redraw, and the page says so
        page.mouse.move(box["x"] + 42 + (box["width"] - 50) * 0.6, box["y"] + 80, steps=3)
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 3002, "reward": 0.2, "success": 0.5}) + "\n")
        held = page.locator("#charts-held")
        expect(held).to_have_text(re.compile(r"^1 new step waits: held while a drag across a chart"), timeout=10_000)
        assert chart.get_attribute("data-extended") == "1"
        page.mouse.move(0, 0)
        page.mouse.up()  # let go outside the chart: no zoom; what waited goes onto the chart, in place
        expect(chart).to_have_attribute("data-extended", "2")
        expect(held).to_be_hidden()
        assert (
            page.locator("#chart-reset-zoom").is_hidden()
            and chart.locator(".zoom-band").get_attribute("visibility") == "hidden"
        )
        with (run / "metrics.jsonl").open("a") as f:  # far outside the y axis: this chart is drawn anew, not the rest
            f.write(json.dumps({"step": 3003, "reward": 50.0, "success": 0.5}) + "\n")
        page.wait_for_function(
            "window.__reward !== document.querySelector('.chart[data-metric=reward]')", timeout=10_000
        )
        expect(chart).to_have_attribute("data-points", "3003")
        expect(page.locator(".chart[data-metric=success]")).to_have_attribute("data-extended", "3")
        assert not site["errors"], site["errors"]
    finally:
        shutil.rmtree(run)


def test_log_scale_eval_rings_a_legend_of_runs_and_no_empty_panels(site):
    """Item 5 and 7 of the UI review: a chart's y axis can be logarithmic (kept across a reload); evaluations are
    rings, not dots of the line's colour; the legend names the runs; a metric no run logged has no panel; no tick
    label runs past its chart's edge."""
    page = site["page"]
    tick_only(site, "alpha")
    reward = page.locator(".chart[data-metric=reward]")
    expect(reward.locator("path.series")).to_have_count(1)
    assert page.locator(".chart-empty").count() == 0  # every panel shown has something in it
    rings = reward.locator("circle.eval-dot")
    assert rings.count() >= 1 and rings.first.get_attribute("fill") == "#fff"
    legend = reward.locator(".legend").inner_text()
    assert "alpha" in legend and "alpha eval" in legend
    chart = page.locator(".chart[data-metric=step_s]")
    chart.locator(".chart-log").click()
    expect(page.locator(".chart[data-metric=step_s]")).to_have_attribute("data-scale", "log")
    page.reload()
    page.wait_for_selector("tr[data-run=alpha] .badge")
    expect(page.locator(".chart[data-metric=step_s]")).to_have_attribute("data-scale", "log")
    outside = page.evaluate("""() => [...document.querySelectorAll('.chart svg text')].filter((t) => {
        const box = t.getBBox();
        return box.x < 0 || box.x + box.width > 300.5;
    }).map((t) => t.textContent)""")
    assert outside == []
    page.locator(".chart[data-metric=step_s] .chart-log").click()  # back to linear for the tests after
    expect(page.locator(".chart[data-metric=step_s]")).to_have_attribute("data-scale", "linear")


def test_runs_compared_by_the_config_keys_that_differ_with_tags_and_a_note(site):
    """Item 3 of the UI review: the ticked runs' differing config keys in a sortable table (alpha and beta differ
    in their seed and run name), grouped by a key; tags and a note saved from the run's view into its folder, and
    the runs list filtered by a tag."""
    page, root = site["page"], site["root"]
    tick_only(site, "alpha", "beta")
    table = page.locator("#compare-table")
    expect(table.locator("th", has_text="seed")).to_have_count(1, timeout=10_000)
    assert table.locator("tbody tr[data-compared]").count() == 2
    table.locator("th", has_text="seed").click()
    table.locator("th", has_text="seed").click()  # descending: beta (seed 1) first
    expect(table.locator("tbody tr[data-compared]").first).to_have_attribute("data-compared", "beta")
    page.select_option("#compare-group", "seed")
    expect(table.locator("tr.group")).to_have_count(2)
    # grouped charts: a line per value of the key (the mean of its runs), the runs faint; kept in the URL
    reward = page.locator(".chart[data-metric=reward]")
    expect(reward.locator(".legend")).to_contain_text("seed=0 (1 run)")
    assert "seed=1 (1 run)" in reward.locator(".legend").inner_text()
    expect(reward.locator("path.series-raw")).to_have_count(2)
    assert "group=seed" in page.url
    page.reload()
    expect(page.locator(".chart[data-metric=reward] .legend")).to_contain_text("seed=1 (1 run)", timeout=10_000)
    steps = {}
    for name in ("alpha", "beta"):
        for line in (root / name / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if "eval" not in r and "reward" in r:
                steps.setdefault(r["step"], []).append(r["reward"])
    mean = page.evaluate("Runs.groupMean(['alpha', 'beta'], 'reward').map(([x, y, step]) => [step, y])")
    assert mean == [[step, pytest.approx(sum(v) / len(v))] for step, v in sorted(steps.items())]
    page.select_option("#compare-group", "")
    expect(reward.locator("path.series-raw")).to_have_count(0)
    page.click("tr[data-run=alpha] a")
    page.wait_for_selector("#run-meta[data-run=alpha]")  # the run's view has loaded its tags and note
    page.fill("#meta-tags", "baseline, seed0")
    page.fill("#meta-note", "the first of two seeds")
    page.click("#meta-save")
    expect(page.locator("#meta-saved")).to_contain_text("saved: 2 tags")
    assert json.loads((root / "alpha" / "ui.json").read_text()) == {"tags": ["baseline", "seed0"],
                                                                     "note": "the first of two seeds"}  # fmt: skip
    expect(page.locator("tr[data-run=alpha] .tag", has_text="baseline")).to_have_count(1, timeout=10_000)
    page.fill("#runs-filter", "baseline")
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
    page.fill("#runs-filter", "")


def test_every_view_is_in_the_url_a_reload_and_another_browser_show_it(site):
    """Item 1 of the UI review: the ticked runs, x axis, smoothing, log-scale charts and sort are in the URL; a
    reload restores them, and the copied URL opens the same view in another browser (a fresh context, through the
    token link). The trajectory open and the filters too."""
    page = site["page"]
    tick_only(site, "alpha", "beta")
    page.select_option("#chart-x", "wall")
    page.locator(".chart[data-metric=step_s] .chart-log").click()
    page.locator("#runs-table th[data-sort=name]").click()
    expect(page).to_have_url(re.compile(r"#runs\?.*runs=alpha%2Cbeta.*x=wall.*log=step_s.*sort=name"))
    copied = page.url
    page.reload()
    expect(page.locator(".chart[data-metric=reward] path.series")).to_have_count(2)
    assert page.locator("#chart-x").input_value() == "wall"
    expect(page.locator(".chart[data-metric=step_s]")).to_have_attribute("data-scale", "log")
    other = page.context.browser.new_context().new_page()  # another browser: no cookie, no localStorage
    try:
        other.goto(site["url"] + "#" + copied.split("#", 1)[1])  # the token link, then the copied view
        expect(other.locator(".chart[data-metric=reward] path.series")).to_have_count(2)
        assert other.locator("#chart-x").input_value() == "wall"
        expect(other.locator(".chart[data-metric=step_s]")).to_have_attribute("data-scale", "log")
        expect(other.locator("tr[data-run=alpha] input")).to_be_checked()
    finally:
        other.context.close()
    page.locator(".chart[data-metric=step_s] .chart-log").click()  # as the tests after expect
    page.select_option("#chart-x", "step")

    page.goto(site["url"] + "#trajectories")
    page.select_option("#tr-run", "alpha")
    page.select_option("#tr-step", "1")
    page.click("#tr-list .card >> nth=2")
    page.wait_for_selector("#tr-list .card.selected[data-index='2']")
    page.select_option("#f-errors", "no")
    expect(page).to_have_url(re.compile(r"#trajectories\?run=alpha&kind=train&step=1&i=2&.*errors=no"))
    page.reload()
    page.wait_for_selector("#tr-list .card.selected[data-index='2']")
    assert page.locator("#f-errors").input_value() == "no" and page.locator("#tr-detail .tok").count() > 0
    page.select_option("#f-errors", "")


def test_search_across_runs_opens_the_trajectory_it_found(site):
    """Item 4 of the UI review: text in the tool results, across every run; a hit opens its trajectory (hostile
    text in a result is shown as text)."""
    page = site["page"]
    page.goto(site["url"] + "#trajectories")
    page.click("#search summary")
    page.fill("#s-text", "division by ZERO")
    page.select_option("#s-scope", "all")
    page.click("#s-go")
    hit = page.locator("#s-results .hit")
    expect(hit).to_have_count(1)
    assert hit.get_attribute("data-run") == "with-calls" and "division by zero" in hit.inner_text()
    page.fill("#s-text", "")
    page.fill("#s-tool", "fetch")
    page.click("#s-go")
    expect(hit).to_have_count(1)
    hit.click()
    page.wait_for_selector("#tr-detail .tok")
    assert page.locator("#tr-run").input_value() == "with-calls"
    assert page.locator("#tr-detail b").count() == 0  # the result's <b> is text, not an element
    page.fill("#s-tool", "")


def test_a_searchs_late_hits_are_not_shown_over_the_next_searchs(site):
    """Two searches, the first answered last: its hits had replaced the second's."""
    page = site["page"]
    page.goto(site["url"] + "#trajectories")
    page.click("#search summary")
    page.select_option("#s-scope", "all")
    slow_answer(page, r"^/api/search\?.*tool=fetch")
    page.fill("#s-tool", "fetch")
    page.click("#s-go")
    page.wait_for_function("window.slowAsked >= 1")
    page.fill("#s-tool", "")
    page.fill("#s-text", "division by ZERO")
    page.click("#s-go")
    page.wait_for_function("window.slowDelivered >= 1")
    hit = page.locator("#s-results .hit")
    expect(hit).to_have_count(1)
    assert "division by zero" in hit.inner_text()
    page.fill("#s-text", "")
    assert not site["errors"], site["errors"]


def test_pass_rates_are_sorted_by_any_column_and_paged(site):
    """Item 7 of the UI review: a curriculum's pass rates had shown the first 200 tasks only; now every task, 50 a
    page, sorted by any column."""
    page, root = site["page"], site["root"]
    rates = {f"t{i:03d}": {"pass_rate": (i % 10) / 10, "attempts": i, "weight": 1 + (i % 7)} for i in range(120)}
    (root / "beta" / "pass_rates.json").write_text(json.dumps({"step": 3, "tasks": rates}))
    try:
        page.goto(site["url"] + "#runs")
        page.click("tr[data-run=beta] a")
        box = page.locator("#run-pass-rates")
        expect(box.locator("#pr-page")).to_contain_text("page 1 of 3 (120 tasks, by weight ↓)")
        box.locator("summary").click()
        assert box.locator("tbody tr").count() == 50
        box.locator("th[data-key=attempts]").click()  # the most attempts first
        assert box.locator("tbody tr").first.locator("td").nth(2).inner_text() == "119"
        box.locator("th[data-key=attempts]").click()  # then the fewest
        assert box.locator("tbody tr").first.locator("td").nth(0).inner_text() == "t000"
        page.click("#pr-next")
        page.click("#pr-next")
        expect(box.locator("#pr-page")).to_contain_text("page 3 of 3")
        assert box.locator("tbody tr").count() == 20 and page.locator("#pr-next").is_disabled()
        assert box.locator("tbody tr").last.locator("td").nth(0).inner_text() == "t119"
    finally:
        (root / "beta" / "pass_rates.json").unlink()


def test_nan_inf_and_null_in_metrics_are_gaps_not_a_blank_page(site):
    """One NaN in metrics.jsonl had made every chart's request fail (HTTP 400) and "step": null HTTP 500: now
    the value is a gap in its line and the record without a step is left out."""
    page, root = site["page"], site["root"]
    run = root / "gappy"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: calculator\ntrain:\n  steps: 6\n")
    rewards = ["0.1", "0.2", "NaN", "0.4", "Infinity", "0.6"]
    lines = [f'{{"step": {i + 1}, "reward": {r}, "success": 0.5}}' for i, r in enumerate(rewards)]
    torn = ['{"step": 7, "rew', "[7]"]  # a kill mid-write; JSON that is not a record
    (run / "metrics.jsonl").write_text(
        "\n".join([*lines, '{"step": null, "reward": 9}', '{"reward": 9}', *torn]) + "\n"
    )
    page.goto(site["url"] + "#runs")
    page.wait_for_selector("tr[data-run=gappy]")
    untick_all(page)
    page.check("tr[data-run=gappy] input")
    page.wait_for_function("document.querySelectorAll('.chart[data-metric=reward] path.series').length === 1")
    path = page.locator(".chart[data-metric=reward] path.series")
    assert path.get_attribute("data-pieces") == "3"  # 1-2, 4, 6: broken at the NaN and at the inf
    assert page.locator(".chart[data-metric=success] path.series").get_attribute("data-pieces") == "1"
    assert page.locator("tr[data-run=gappy]").inner_text().count("6") >= 1  # its last step, not the stepless line
    # item 8: the lines that were not read are named in the run's row and view, not skipped silently
    expect(page.locator("tr[data-run=gappy] .warn")).to_contain_text("2")
    page.click("tr[data-run=gappy] a")
    expect(page.locator("#run-problems")).to_contain_text("metrics.jsonl:9: not a JSON object, skipped")
    assert "metrics.jsonl:10: not a JSON object, skipped" in page.locator("#run-problems").inner_text()
    assert not site["errors"], site["errors"]


X_TICKS = "text.tick[y='162']"
"""A chart's x-axis tick labels (charts.js: H - 8)."""


def rewards_run(root, name: str, rewards: list[float], train: str = "") -> Path:
    """A run folder of `rewards`, one a step (`train`: more lines of its config's train section)."""
    run = root / name
    run.mkdir()
    (run / "config.yaml").write_text(f"env:\n  name: calculator\ntrain:\n  steps: {len(rewards)}\n{train}")
    lines = [json.dumps({"step": i + 1, "reward": r}) + "\n" for i, r in enumerate(rewards)]
    (run / "metrics.jsonl").write_text("".join(lines))
    return run


def show_only(page, site, *runs: str) -> None:
    """The runs tab with `runs` ticked alone, once the last one is listed."""
    page.goto(site["url"] + "#runs")
    page.wait_for_selector(f"tr[data-run={runs[-1]}]")
    untick_all(page)
    for run in runs:
        page.check(f"tr[data-run={run}] input")


def test_values_equal_but_for_rounding_draw_a_flat_line_with_distinct_ticks(site):
    """CI's browser hung on a chart of values equal but for rounding (0.3 and 0.1 + 0.2, as smoothing makes them):
    the tick step was below the values' resolution, the loop added nothing until "Invalid array length", and every
    chart drawn after it failed. Now the line is flat in the middle of its chart and its ticks are distinct."""
    page, root = site["page"], site["root"]
    rewards = [0.3, 0.1 + 0.2, 0.3, 0.1 + 0.2]
    assert len(set(rewards)) == 2  # equal but for rounding
    run = rewards_run(root, "flat", rewards)
    try:
        show_only(page, site, "flat")
        page.wait_for_function("document.querySelectorAll('.chart[data-metric=reward] path.series').length === 1")
        chart = page.locator(".chart[data-metric=reward]")
        assert chart.get_attribute("data-points") == "4"
        labels = chart.locator("text.tick").all_text_contents()
        assert len(labels) == len(set(labels)) >= 3, labels  # y ticks around 0.3 and the steps, none repeated
        assert chart.locator(X_TICKS).all_text_contents() == ["1", "2", "3", "4"], labels  # whole steps only
        assert not site["errors"], site["errors"]
    finally:  # the site is shared: later pages compare the newest run
        shutil.rmtree(run)


def test_numbers_keep_their_significant_digits_in_the_compare_table_and_tick_labels(site):
    """Issue 73: two runs with train.lr 0.000123 and 0.000456 both read 0.000 in the compare table; issue 77: a
    chart's ticks read 0.01 0.01 0.01 and a 3-step run's x ticks 1, 1.5, 2."""
    page, root = site["page"], site["root"]
    made = [rewards_run(root, "lr-a", [0.01, 0.015, 0.02], "  lr: 0.000123\n"),
            rewards_run(root, "lr-b", [0.012, 0.014, 0.018], "  lr: 0.000456\n")]  # fmt: skip
    try:
        show_only(page, site, "lr-a", "lr-b")
        table = page.locator("#compare-table")
        expect(table.locator("th", has_text="train.lr")).to_have_count(1, timeout=10_000)
        text = table.inner_text()
        assert "1.23e-4" in text and "4.56e-4" in text, text
        chart = page.locator(".chart[data-metric=reward]")
        expect(chart.locator("path.series")).to_have_count(2)
        y = chart.locator(f"text.tick:not({X_TICKS})").all_text_contents()
        assert len(y) == len(set(y)) >= 3, y  # 0.01, 0.012, ... each told apart
        assert chart.locator(X_TICKS).all_text_contents() == ["1", "2", "3"]  # whole steps only
        chart.locator(".chart-log").click()  # log scale within one decade: it had read "0.00 / 0.01", then "0.01"
        chart = page.locator(".chart[data-metric=reward][data-scale=log]")
        y = chart.locator(f"text.tick:not({X_TICKS})").all_text_contents()
        assert len(y) == len(set(y)) >= 2 and all(0.01 <= float(v) <= 0.02 for v in y), y
        assert chart.locator(X_TICKS).all_text_contents() == ["1", "2", "3"]
        chart.locator(".chart-log").click()
        expect(page.locator(".chart[data-metric=reward]")).to_have_attribute("data-scale", "linear")
        assert not site["errors"], site["errors"]
    finally:
        for run in made:
            shutil.rmtree(run)


def slow_answer(page, pattern: str, ms: int = 1500) -> None:
    """The page's answers from URLs that match `pattern` (a regular expression, on the URL as the page asks for it)
    arrive `ms` late, as from a busy server; window.slowAsked counts their requests, window.slowDelivered the late
    answers handed over."""
    page.evaluate(
        """([pattern, ms]) => {
          window.slowAsked = window.slowDelivered = 0;
          const fetched = window.fetch;
          window.fetch = async (url, ...rest) => {
            const slow = new RegExp(pattern).test(String(url));
            window.slowAsked += slow;
            const response = await fetched(url, ...rest);
            if (slow) {
              await new Promise((done) => setTimeout(done, ms));
              window.slowDelivered += 1;
            }
            return response;
          };
        }""",
        [pattern, ms],
    )


def test_a_late_answer_for_fewer_runs_does_not_replace_the_comparison_of_the_runs_ticked_now(site):
    """CI: lr-a was ticked, then lr-b; the answer for lr-a alone came back last and its table (no train.lr column,
    one row) stayed, since the page had already asked for both. Now an answer for runs no longer ticked is dropped."""
    page, root = site["page"], site["root"]
    made = [rewards_run(root, "late-a", [0.1, 0.2], "  lr: 0.000123\n"),
            rewards_run(root, "late-b", [0.1, 0.3], "  lr: 0.000456\n")]  # fmt: skip
    try:
        page.goto(site["url"] + "#runs")
        page.wait_for_selector("tr[data-run=late-b]")
        untick_all(page)
        slow_answer(page, r"^/api/compare\?run=late-a$")
        page.check("tr[data-run=late-a] input")
        page.check("tr[data-run=late-b] input")
        page.wait_for_function("window.slowDelivered >= 1")  # the answer for late-a alone has landed, last
        table = page.locator("#compare-table")
        expect(table.locator("th", has_text="train.lr")).to_have_count(1)
        expect(table.locator("tbody tr")).to_have_count(2)
        # the same with a run's view: late-a's name clicked, then late-b's; late-a's answer comes last
        slow_answer(page, r"^/api/run\?run=late-a$")
        page.click("tr[data-run=late-a] a")
        page.click("tr[data-run=late-b] a")
        page.wait_for_function("window.slowDelivered >= 1")
        expect(page.locator("#run-meta")).to_have_attribute("data-run", "late-b")
        expect(page.locator("#run-config pre")).to_contain_text("0.000456")
        assert not site["errors"], site["errors"]
    finally:
        for run in made:
            shutil.rmtree(run)


def test_a_card_clicked_while_another_loads_is_the_one_shown(site):
    """The viewer: card 0 clicked, then another card before card 0's record came back; card 0's record, landing
    last, had replaced the other's and moved the selection back."""
    page, root = site["page"], site["root"]
    records = [json.loads(line) for line in (root / "alpha" / "samples.jsonl").read_text().splitlines()]
    step1 = [r for r in records if r["step"] == 1]
    other = next(i for i, r in enumerate(step1) if r["task_id"] != step1[0]["task_id"])
    page.goto(site["url"] + "#trajectories")
    page.select_option("#tr-run", "alpha")
    page.select_option("#tr-kind", "train")
    page.select_option("#tr-step", "1")
    expect(page.locator("#tr-list .count")).to_have_text(f"{len(step1)} of {len(step1)} trajectories")
    slow_answer(page, r"^/api/record\?run=alpha&kind=train&step=1&index=0$")
    page.click("#tr-list .card >> nth=0")
    page.click(f"#tr-list .card[data-index='{other}']")
    page.wait_for_function("window.slowDelivered >= 1")
    expect(page.locator("#tr-detail .trajectory")).to_have_attribute("data-task", step1[other]["task_id"])
    expect(page.locator("#tr-list .card.selected")).to_have_attribute("data-index", str(other))
    assert not site["errors"], site["errors"]


def test_a_poll_slower_than_its_interval_is_not_asked_again_beside_itself(site):
    """The runs tab polls every 2 s; with a run's metrics answered in 3 s, the next poll had asked for the new
    records from the same offset and both answers were appended: every new step twice. Now a poll waits for the
    last one."""
    page, root = site["page"], site["root"]
    run = rewards_run(root, "slow-metrics", [0.1, 0.2, 0.3])
    try:
        page.goto(site["url"] + "#runs")
        page.wait_for_selector("tr[data-run=slow-metrics]")
        untick_all(page)
        page.check("tr[data-run=slow-metrics] input")
        expect(page.locator(".chart[data-metric=reward]")).to_have_attribute("data-points", "3")
        slow_answer(page, r"^/api/metrics\?run=slow-metrics&", 3000)
        with (run / "metrics.jsonl").open("a") as f:  # the run goes on: two more steps
            f.write('{"step": 4, "reward": 0.4}\n{"step": 5, "reward": 0.5}\n')
        page.wait_for_function("window.slowDelivered >= 2", timeout=30_000)  # the poll that read them, and the next
        assert page.evaluate("Runs.metrics['slow-metrics'].length") == 5
        expect(page.locator(".chart[data-metric=reward]")).to_have_attribute("data-points", "5")
        assert not site["errors"], site["errors"]
    finally:
        shutil.rmtree(run)


def test_a_console_answer_for_the_run_followed_before_is_not_shown_for_the_next(site):
    """The launch tab: alpha followed, then beta before alpha's first console answer came back; that answer, landing
    last, had been appended to beta's log and its offset kept, so beta's log read on from alpha's length."""
    page, root = site["page"], site["root"]
    page.goto(site["url"] + "#launch")
    expect(page.locator("#follow-run option[value=beta]")).to_have_count(1)
    slow_answer(page, r"^/api/console\?run=alpha&")
    page.select_option("#follow-run", "alpha")
    page.wait_for_function("window.slowAsked >= 1")  # alpha's console asked for, its answer on its way
    page.select_option("#follow-run", "beta")
    page.wait_for_function("window.slowDelivered >= 1")
    beta = (root / "beta" / "progress.log").read_text()
    assert beta and beta != (root / "alpha" / "progress.log").read_text()
    expect(page.locator("#follow-log")).to_have_text(beta)
    assert not site["errors"], site["errors"]


def sweep(root, count: int) -> list[Path]:
    """A learning-rate sweep of `count` runs, started one after another (status.json's started_at)."""
    made = []
    for i in range(count):
        run = rewards_run(root, f"sweep-{i:02d}", [0.1 * i + 0.01 * s for s in range(5)], f"  lr: {1e-5 * (i + 1)}\n")
        status = {"state": "finished", "step": 5, "steps": 5, "started_at": 1e9 + i}
        (run / "status.json").write_text(json.dumps(status))
        made.append(run)
    return made


def rgb(hex_colour: str) -> str:
    """#2563eb -> rgb(37, 99, 235), as the browser reports a computed colour."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_an_18_run_sweep_sits_beside_its_charts_each_run_in_one_colour_with_a_compact_legend(site):
    """Issue 77 item 7: with 18 runs the runs table had filled the first screen; the runs are a narrow column beside
    the charts, each run keeps its colour whatever else is ticked (its swatch in the table is the line's colour), a
    chart's legend names a few lines and counts the rest; ⇔ shows every column; at phone width the runs come first."""
    page, root = site["page"], site["root"]
    made = sweep(root, 18)
    try:
        show_only(page, site, "sweep-05")
        expect(page.locator(".chart[data-metric=reward] path.series")).to_have_count(1)
        alone = page.locator(".chart[data-metric=reward] path.series").get_attribute("stroke")
        swatch = page.locator("tr[data-run=sweep-05] .swatch")
        assert swatch.evaluate("(e) => getComputedStyle(e).backgroundColor") == rgb(alone)
        for run in made:
            page.check(f"tr[data-run={run.name}] input")
        reward = page.locator(".chart[data-metric=reward]")
        expect(reward.locator("path.series")).to_have_count(18)
        strokes = reward.locator("path.series").evaluate_all("(ps) => ps.map((p) => p.getAttribute('stroke'))")
        order = page.evaluate("[...Runs.compared]")
        assert strokes[order.index("sweep-05")] == alone  # the same colour with 17 more runs ticked
        assert len(set(strokes)) == 18  # 18 runs started one after another: 18 colours
        legend = reward.locator(".legend")
        assert legend.locator("span").count() == 6 and "+13 more" in legend.inner_text()
        assert "sweep-17" in legend.locator(".more").get_attribute("title")
        plot = reward.locator("svg").bounding_box()
        assert legend.bounding_box()["height"] < plot["height"] / 2
        side, charts = page.locator("#runs-side").bounding_box(), page.locator("#charts").bounding_box()
        assert side["x"] + side["width"] <= charts["x"] and charts["y"] < 200  # beside: the charts on the first screen
        assert side["width"] <= 360 and page.locator("#runs-table th[data-sort=model]").is_hidden()
        shot(site, "sweep")
        page.click("#runs-widen")  # every column, the table above the charts
        expect(page.locator("#runs-table th[data-sort=model]")).to_be_visible()
        assert page.locator("#charts").bounding_box()["y"] > page.locator("#runs-side").bounding_box()["y"] + 100
        page.click("#runs-widen")
        expect(page.locator("#runs-table th[data-sort=model]")).to_be_hidden()
        page.set_viewport_size({"width": 390, "height": 844})
        try:
            side, charts = page.locator("#runs-side").bounding_box(), page.locator("#charts").bounding_box()
            assert side["y"] + side["height"] <= charts["y"] and side["height"] <= 844 * 0.4 + 1
            shot(site, "sweep-phone")
        finally:
            page.set_viewport_size({"width": 1360, "height": 900})
        assert not site["errors"], site["errors"]
    finally:
        for run in made:
            shutil.rmtree(run)


def test_a_family_chart_of_several_runs_keeps_each_runs_colour_and_tells_its_keys_by_dash(site):
    """Issue 77 item 7, in the charts of a family (stop/*): with several runs ticked, each line is in its run's
    colour (the swatch's) and a key has one dash in every run; one run alone colours its keys apart."""
    page, root = site["page"], site["root"]
    made = []
    for i in range(2):
        run = rewards_run(root, f"stops-{i}", [0.1, 0.2, 0.3])
        lines = [
            {"step": s, "reward": 0.1 * s, "stop/answer": 0.5 + 0.1 * i, "stop/length": 0.5 - 0.1 * i}
            for s in (1, 2, 3)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        made.append(run)
    try:
        show_only(page, site, "stops-0", "stops-1")
        paths = page.locator(".chart[data-metric='stop/*'] path.series")
        expect(paths).to_have_count(4)
        drawn = paths.evaluate_all(
            "(ps) => ps.map((p) => [p.getAttribute('stroke'), p.getAttribute('stroke-dasharray') || ''])"
        )
        swatches = [
            page.locator(f"tr[data-run=stops-{i}] .swatch").evaluate("(e) => getComputedStyle(e).backgroundColor")
            for i in (0, 1)
        ]
        assert [rgb(stroke) for stroke, _ in drawn] == [swatches[0]] * 2 + [swatches[1]] * 2, (drawn, swatches)
        assert [dash for _, dash in drawn[:2]] == [dash for _, dash in drawn[2:]] and drawn[0][1] != drawn[1][1]
        show_only(page, site, "stops-0")
        expect(paths).to_have_count(2)
        assert len(set(paths.evaluate_all("(ps) => ps.map((p) => p.getAttribute('stroke'))"))) == 2
        assert not site["errors"], site["errors"]
    finally:
        for run in made:
            shutil.rmtree(run)


def test_a_metric_search_draws_the_charts_whose_name_matches(site):
    """Issue 77 item 8: 40 checkboxes in 9 groups to find a chart; a search box draws the charts whose metric (or
    title) has every word typed, among the default panels and every metric the runs log; it is in the URL."""
    page = site["page"]
    tick_only(site, "alpha")
    expect(page.locator(".chart[data-metric=reward]")).to_have_count(1)
    logged = page.evaluate("Object.values(Runs.metricKeys()).flat()")
    assert "grad_norm" in logged and "time/forward_backward_s" in logged, logged
    page.fill("#metric-search", "grad")
    expect(page.locator(".chart")).to_have_count(len([k for k in logged if "grad" in k]))
    assert page.locator(".chart[data-metric=grad_norm] path.series").count() == 1  # not a default panel: found
    expect(page.locator("#metric-search-count")).to_contain_text("match")
    assert "q=grad" in page.url
    page.fill("#metric-search", "time/ backward")  # every word
    expect(page.locator(".chart[data-metric='time/forward_backward_s']")).to_have_count(1)
    assert all(
        "time/" in m and "backward" in m
        for m in page.locator(".chart").evaluate_all("(cs) => cs.map((c) => c.dataset.metric)")
    )
    page.click("#chart-metrics summary")  # the metric list shows the matches only
    shown = page.locator("#chart-metrics label.metric-pick:visible").all_inner_texts()
    assert shown and all("time/" in t and "backward" in t for t in shown), shown
    page.click("#chart-metrics summary")
    shot(site, "metric-search")
    page.fill("#metric-search", "no such metric")
    expect(page.locator(".chart")).to_have_count(0)
    expect(page.locator("#metric-search-count")).to_have_text("0 charts match")
    hostile = "<img src=x onerror=window.__pwned=1>"  # a link's search is text: matched, never markup
    page.goto(site["url"].split("?")[0] + "#runs?runs=alpha&q=" + urllib.parse.quote(hostile))
    expect(page.locator("#metric-search")).to_have_value(hostile)
    expect(page.locator("#metric-search-count")).to_have_text("0 charts match")
    assert page.evaluate("window.__pwned") is None and page.locator("#runs-main img").count() == 0
    page.fill("#metric-search", "")
    expect(page.locator(".chart[data-metric=reward]")).to_have_count(1)
    assert "grad_norm" not in page.locator("#charts").evaluate("(c) => [...c.children].map((x) => x.dataset.metric)")
    assert not site["errors"], site["errors"]


def test_a_pasted_link_ticks_its_runs_a_link_without_the_token_asks_for_it_and_smoothing_shows_its_value(site):
    """Issue 77 item 10: a link pasted into an open tab changed the charts but not the ticked boxes; a shared link
    opened without the token showed raw JSON; the smoothing slider showed no value."""
    page = site["page"]
    tick_only(site, "alpha")
    page.goto(site["url"].split("?")[0] + "#runs?runs=beta&smooth=0.3")  # the same tab: only the hash changes
    expect(page.locator("tr[data-run=beta] input")).to_be_checked()
    expect(page.locator("tr[data-run=alpha] input")).not_to_be_checked()
    expect(page.locator(".chart[data-metric=reward] .legend")).to_contain_text("beta")
    expect(page.locator("#chart-smooth-value")).to_have_text("0.30")
    page.eval_on_selector("#chart-smooth", "e => { e.value = '0.6'; e.dispatchEvent(new Event('input')); }")
    expect(page.locator("#chart-smooth-value")).to_have_text("0.60")
    page.eval_on_selector("#chart-smooth", "e => { e.value = '0'; e.dispatchEvent(new Event('input')); }")
    expect(page.locator("#chart-smooth-value")).to_have_text("off")

    base, token = site["url"].split("?token=")
    other = page.context.browser.new_context().new_page()  # another browser: no cookie
    try:
        response = other.goto(base + "#runs?runs=alpha%2Cbeta&x=wall")
        assert response.status == 401 and "needs its access token" in other.locator("h2").inner_text()
        assert "access token is needed" not in other.content()  # a page, not the API's JSON error
        expect(other.locator("#token-view")).to_contain_text("runs view")
        other.fill("#token-value", "not-the-token")
        other.click("#token-form button")
        expect(other.locator("#token-wrong")).to_be_visible()
        assert other.url.endswith("#runs?runs=alpha%2Cbeta&x=wall")  # the view kept through a wrong try
        other.fill("#token-value", site["url"])  # the whole URL `toolrl ui` printed
        other.click("#token-form button")
        expect(other.locator(".chart[data-metric=reward] path.series")).to_have_count(2)
        expect(other.locator("tr[data-run=alpha] input")).to_be_checked()
        assert other.locator("#chart-x").input_value() == "wall" and token not in other.url  # out of the history
    finally:
        other.context.close()
    assert not site["errors"], site["errors"]


def test_success_by_category_draws_a_never_solved_category_at_zero(site):
    """The "success by task category" chart has one line per category the steps logged (success/<category>),
    and a category at 0 at every step (a built environment's multi-hop tasks) is a line at 0, not left out."""
    page, root = site["page"], site["root"]
    run = root / "kinds"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: built\ntrain:\n  steps: 3\n")
    lines = [{"step": 1, "success": 0.75, "success/single_hop": 1.0, "success/multi_hop": 0.0},
             {"step": 2, "success": 0.0, "success/multi_hop": 0.0},
             {"step": 3, "success": 0.5, "success/single_hop": 1.0, "success/multi_hop": 0.0}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    page.goto(site["url"] + "#runs")
    page.wait_for_selector("tr[data-run=kinds]")
    untick_all(page)
    page.check("tr[data-run=kinds] input")
    chart = ".chart[data-metric='success/*']"
    try:
        page.wait_for_function(f'document.querySelectorAll("{chart} path.series").length === 2')
        assert page.locator(chart).inner_text().count("multi_hop") >= 1
        assert not site["errors"], site["errors"]
    finally:  # the site is shared, and a page opened later compares the newest run: one that logs a reward
        shutil.rmtree(run)


def test_a_mix_draws_success_reward_and_share_by_environment(site):
    """A run of several environments (env as a list) logs env/LABEL/success, reward and share: a chart each, one
    line per environment named by its label, an environment never solved a line at 0."""
    page, root = site["page"], site["root"]
    run = root / "mixed"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: mix\ntrain:\n  steps: 2\n")
    lines = [
        {
            "step": s,
            "success": 0.5,
            "env/calc/success": 1.0,
            "env/harbor/success": 0.0,
            "env/calc/share": 0.75,
            "env/harbor/share": 0.25,
            "env/calc/reward": 1.1,
            "env/harbor/reward": 0.0,
            "role/calc/success": 1.0,
            "role/harbor/success": 0.0,
            "role/calc/reward": 1.1,
            "role/harbor/reward": 0.0,
        }
        for s in (1, 2)
    ]  # the roles of one policy by the same names
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    page.goto(site["url"] + "#runs")
    page.wait_for_selector("tr[data-run=mixed]")
    untick_all(page)
    page.check("tr[data-run=mixed] input")
    try:
        for metric in ("env/*/success", "env/*/reward", "env/*/share", "role/*/success", "role/*/reward"):
            chart = f".chart[data-metric='{metric}']"
            page.wait_for_function(f'document.querySelectorAll("{chart} path.series").length === 2')
            text = page.locator(chart).inner_text()
            assert "calc" in text and "harbor" in text, text
        assert not site["errors"], site["errors"]
    finally:  # the site is shared, and a page opened later compares the newest run: one that logs a reward
        shutil.rmtree(run)


def test_evaluations_with_trials_draw_pass_hat_k_and_pass_at_k_one_ring_series_per_k(site):
    """eval.trials above 1: each evaluation logs pass@k and pass^k; a chart each, drawn from the evaluations alone
    (rings at their steps), one series per k in order of k."""
    page, root = site["page"], site["root"]
    run = root / "reliable"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: calculator\neval:\n  trials: 4\ntrain:\n  steps: 2\n")
    evals = {k: 1.0 - k / 10 for k in (1, 2, 3, 4, 10)}
    lines = [{"eval": "start", "step": 0, "success": 0.5, **{f"pass^{k}": v / 2 for k, v in evals.items()},
              **{f"pass@{k}": v for k, v in evals.items()}}, {"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.7},
             {"eval": "end", "step": 2, "success": 0.7, **{f"pass^{k}": v for k, v in evals.items()},
              **{f"pass@{k}": v for k, v in evals.items()}}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    page.goto(site["url"] + "#runs")
    page.wait_for_selector("tr[data-run=reliable]")
    untick_all(page)
    page.check("tr[data-run=reliable] input")
    try:
        for metric in ("pass^*", "pass@*"):
            chart = f".chart[data-metric='{metric}']"
            page.wait_for_selector(chart)
            legend = page.locator(f"{chart} .legend").inner_text()
            kind = metric[4]
            order = [legend.find(f"pass{kind}{k}") for k in (1, 2, 3, 4, 10)]
            assert all(i >= 0 for i in order) and order == sorted(order), legend  # pass^10 after pass^4
            assert page.locator(f"{chart} circle").count() >= 10  # two evaluations x five k
        assert not site["errors"], site["errors"]
    finally:
        shutil.rmtree(run)


def test_any_metric_smoothing_x_axes_zoom_downloads_and_a_point_to_its_trajectories(site):
    """What TensorBoard and W&B users rely on: any logged metric as a chart (grouped by prefix), smoothing, the x
    axis by step, wall time or samples, drag to zoom, CSV and PNG downloads, a click on a line opens that step's
    trajectories; the runs list filters and sorts; at phone width nothing overflows the page."""
    page = site["page"]
    page.set_viewport_size({"width": 1360, "height": 900})
    page.goto(site["url"] + "#runs")
    page.wait_for_selector("tr[data-run=alpha]")
    page.evaluate("localStorage.clear()")
    page.fill("#runs-filter", "alph")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 1")
    page.fill("#runs-filter", "")
    page.click("#runs-table th[data-sort=name]")
    names = page.eval_on_selector_all("#runs-table tbody tr", "rows => rows.map(r => r.dataset.run)")
    assert names == sorted(names) and "alpha" in names
    page.click("#runs-table th[data-sort=name]")
    assert page.eval_on_selector_all("#runs-table tbody tr", "rows => rows.map(r => r.dataset.run)") == names[::-1]
    untick_all(page)
    page.check("tr[data-run=alpha] input")
    page.wait_for_function("document.querySelectorAll('.chart[data-metric=reward] path.series').length === 1")
    page.click("#chart-metrics summary")  # every metric the run logs, grouped by prefix
    assert page.locator("#chart-metrics legend", has_text="time (").count() == 1
    page.check("#chart-metrics input[value=grad_norm]")
    page.wait_for_selector(".chart[data-metric=grad_norm] path.series", state="attached")
    page.eval_on_selector("#chart-smooth", "e => { e.value = '0.6'; e.dispatchEvent(new Event('input')); }")
    page.wait_for_selector(".chart[data-metric=reward] path.series-raw", state="attached")
    page.select_option("#chart-x", "wall")
    page.wait_for_selector(".chart[data-metric=reward] text:text('wall time (min)')")
    page.select_option("#chart-x", "samples")
    page.wait_for_selector(".chart[data-metric=reward] text:text('samples')")
    page.select_option("#chart-x", "step")
    chart = page.locator(".chart[data-metric=reward] svg")
    box = chart.bounding_box()
    before = int(page.locator(".chart[data-metric=reward]").get_attribute("data-points"))
    page.mouse.move(box["x"] + box["width"] * 0.16, box["y"] + box["height"] / 2)  # drag across the first steps
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    page.wait_for_selector("#chart-reset-zoom:not([hidden])")
    assert int(page.locator(".chart[data-metric=reward]").get_attribute("data-points")) < before
    page.click("#chart-reset-zoom")
    page.wait_for_function(f"+document.querySelector('.chart[data-metric=reward]').dataset.points === {before}")
    with page.expect_download() as csv:
        page.click("#chart-csv")
    text = Path(csv.value.path()).read_text()
    assert text.startswith("run,metric,step,step,value\n") and "alpha,reward,1,1," in text
    with page.expect_download() as png:
        page.click(".chart[data-metric=reward] .chart-png")
    assert Path(png.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page.eval_on_selector("#chart-smooth", "e => { e.value = '0'; e.dispatchEvent(new Event('input')); }")
    box = chart.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.95, box["y"] + box["height"] / 2)  # near the last step
    page.wait_for_selector("#tab-trajectories:not([hidden])")
    page.wait_for_function("document.querySelector('#tr-run').value === 'alpha'")
    page.wait_for_function("document.querySelector('#tr-step').value === '3'")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(site["url"] + "#runs")
    page.wait_for_selector(".chart[data-metric=reward] path.series", state="attached")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot(site, "phone")
    page.set_viewport_size({"width": 1360, "height": 900})
    page.evaluate("localStorage.clear()")


def test_the_group_view_shows_the_samples_of_one_prompt_side_by_side(site):
    page = site["page"]
    page.goto(site["url"] + "#trajectories")
    page.select_option("#tr-run", "alpha")
    page.select_option("#tr-kind", "train")
    page.select_option("#tr-step", "1")
    page.click("#tr-list .card >> nth=0")
    page.click("#tr-group")
    page.wait_for_function("document.querySelectorAll('#cmp-columns .group-member').length === 3")  # group_size 3
    assert page.locator("#cmp-title").inner_text().startswith("Group 0 of step 1: 3 samples of one prompt")
    # a column with content wider than itself (a long tool call's table) keeps it inside, scrolling, never over the
    # next column: a 2,000 px table put into the first column
    spills = page.evaluate("""() => {
        const columns = [...document.querySelectorAll('#cmp-columns .group-member')];
        const wide = document.createElement('div');
        wide.style.cssText = 'width: 2000px; height: 4px';
        columns[0].append(wide);
        const visible = (c) => getComputedStyle(c).overflowX === 'visible';
        const spilled = columns.filter((c) => c.scrollWidth > c.clientWidth && visible(c));
        wide.remove();
        return spilled.length;
    }""")
    assert spills == 0
    headers = page.locator("#cmp-columns .group-member h4").all_inner_texts()
    assert all("reward" in text and "advantage" in text and "tool calls" in text for text in headers), headers
    shot(site, "group")
    page.click("#cmp-close")
    assert not site["errors"], site["errors"]


def test_trajectory_viewer_tokens_mask_filters_calls_and_a_task_across_steps(site):
    page, root = site["page"], site["root"]
    page.goto(site["url"] + "#trajectories")
    page.select_option("#tr-run", "alpha")
    page.select_option("#tr-step", "1")
    records = [json.loads(line) for line in (root / "alpha" / "samples.jsonl").read_text().splitlines()]
    step1 = [r for r in records if r["step"] == 1]
    expect(page.locator("#tr-list .count")).to_have_text(f"{len(step1)} of {len(step1)} trajectories")
    page.click("#tr-list .card >> nth=0")
    page.wait_for_selector("#tr-detail .tok")
    tokens = [t for s in step1[0]["segments"] if s["kind"] == "model" for t in s["tokens"]]
    assert page.locator("#tr-detail .tok.trained").count() == len(tokens)
    page.hover("#tr-detail .tok >> nth=0")
    token, box = page.locator("#tr-detail .tok >> nth=0").bounding_box(), page.locator("#token-info").bounding_box()
    assert abs(box["y"] - (token["y"] + token["height"])) <= 12 or abs(box["y"] + box["height"] - token["y"]) <= 12
    assert box["x"] <= token["x"] + 4 and box["x"] + box["width"] >= token["x"]  # next to the token, not a corner
    info = page.locator("#token-info").inner_text()
    assert "log-prob" in info and str(step1[0]["segments"][0]["ids"][0]) in info
    successes = sum(r["success"] >= 0.5 for r in step1)
    page.select_option("#f-success", "yes")
    expect(page.locator("#tr-list .count")).to_have_text(f"{successes} of {len(step1)} trajectories")
    page.select_option("#f-success", "")
    top = max(r["reward"] for r in step1)
    page.fill("#f-reward-min", str(top + 0.01))
    expect(page.locator("#tr-list .count")).to_have_text(f"0 of {len(step1)} trajectories")
    page.fill("#f-reward-min", str(top))
    kept = sum(r["reward"] >= top for r in step1)
    expect(page.locator("#tr-list .count")).to_have_text(f"{kept} of {len(step1)} trajectories")
    page.fill("#f-reward-min", "")
    reason = step1[0]["stop_reason"]
    page.select_option("#f-stop", reason)
    same = sum(r["stop_reason"] == reason for r in step1)
    expect(page.locator("#tr-list .count")).to_have_text(f"{same} of {len(step1)} trajectories")
    page.select_option("#f-stop", "")
    RunDir(root / "alpha").log_samples(7, [{k: v for k, v in step1[0].items() if k != "step"}])  # it trains on
    expect(page.locator("#tr-step option[value='7']")).to_have_count(1, timeout=10_000)
    expect(page.locator("#tr-step")).to_have_value("1")  # the step being read stays chosen

    page.select_option("#tr-kind", "eval")  # the same test tasks at the start and the end
    expect(page.locator("#tr-step")).to_have_value("3")  # the last evaluation: the end
    page.select_option("#tr-step", "0")
    expect(page.locator("#tr-list .count")).to_have_text("3 of 3 trajectories")  # the start's three tasks
    page.click("#tr-list .card >> nth=0")
    evals = [json.loads(line) for line in (root / "alpha" / "evals.jsonl").read_text().splitlines()]
    expect(page.locator("#tr-detail .trajectory")).to_have_attribute("data-task", evals[0]["task_id"])
    page.click("#tr-same-task")
    expect(page.locator("#cmp-columns .column h4")).to_have_text(["eval (start) · step 0", "eval (end) · step 3"])

    page.select_option("#tr-kind", "train")
    page.select_option("#tr-run", "with-calls")
    expect(page.locator("#tr-list .count")).to_have_text("1 of 1 trajectories")  # the filter list shows its tool error
    page.select_option("#f-errors", "yes")
    page.click("#tr-list .card >> nth=0")
    page.wait_for_selector("#tr-detail table.calls")
    rows = page.locator("#tr-detail table.calls tr")
    failed = rows.nth(2).inner_text()
    assert rows.count() == 4 and "tool_error" in failed and "division by zero" in failed
    hostile = rows.nth(3)  # a tool's HTML is shown as text: no element made, no script run
    assert '<img src=x onerror="document.title=1"><b>bold</b>' in hostile.inner_text()
    assert hostile.locator("img, b").count() == 0 and page.title() == "toolrl"
    labels = page.locator("#tr-detail .segment-label").all_inner_texts()
    assert labels == [
        "model · trained (loss mask 1) · sampled by version 2", "tool result · not trained",
        "model · trained (loss mask 1) · sampled by versions 2-3 (new weights mid-turn)", "user · not trained",
    ]  # fmt: skip
    page.hover("#tr-detail .segment.model >> nth=1 >> .tok >> nth=-1")  # each token says which weights sampled it
    assert "sampled by the weights after 3 updates" in page.locator("#token-info").inner_text()
    page.select_option("#tr-heat", "advantage")
    assert "22, 163, 74" in page.locator("#tr-detail .tok >> nth=0").get_attribute("style")  # positive: green
    page.select_option("#f-errors", "")
    page.locator("#tr-compare").evaluate("e => e.hidden = true")
    shot(site, "trajectory")


def test_the_viewer_shows_each_segment_and_where_its_context_was_compacted(site):
    page = site["page"]
    page.goto(site["url"] + "#trajectories")
    page.select_option("#tr-run", "with-segments")
    expect(page.locator("#tr-list .card .badge.segments")).to_have_text(["3 segments", "3 segments"])
    page.click("#tr-list .card >> nth=0")
    page.wait_for_selector("#tr-detail .segment.compaction")
    marks = page.locator("#tr-detail .segment.compaction").all_inner_texts()
    assert len(marks) == 2 and marks[0].startswith("sliding_window compacted the context after turn 2")
    assert marks[1].startswith("summarize compacted the context after turn 3") and "written for it" in marks[1]
    labels = page.locator("#tr-detail .segment-label").all_inner_texts()
    assert "summary for the context strategy · trained (loss mask 1)" in labels
    assert sum(label.startswith("segment 2 · the prompt again") for label in labels) == 1
    # the round segment 2 kept, its request for a summary, and what segment 3 started from (the summary, "Go on.")
    assert sum(label == "carried or written by the context strategy · not trained" for label in labels) == 3
    record = json.loads((site["root"] / "with-segments" / "samples.jsonl").read_text().splitlines()[0])
    trained = sum(len(s["tokens"]) for s in record["segments"] if s.get("loss"))
    assert page.locator("#tr-detail .tok.trained").count() == trained  # every segment's trained tokens, each once
    shot(site, "segments")
    page.click("#tr-list .card >> nth=1")  # the record whose strategy is named in HTML: shown as text
    expect(page.locator("#tr-detail .segment.compaction >> nth=0")).to_contain_text(
        '<img src=x onerror="document.title=2">'
    )
    assert page.locator("#tr-detail .segment.compaction img").count() == 0 and page.title() == "toolrl"


def test_the_viewer_shows_a_vision_policys_images(site):
    page = site["page"]
    page.goto(site["url"] + "#trajectories")
    page.select_option("#tr-kind", "train")
    page.select_option("#tr-run", "vision")
    expect(page.locator("#tr-list .count")).to_have_text("2 of 2 trajectories")
    page.click("#tr-list .card >> nth=0")
    image = page.locator("#tr-detail .images img").first
    expect(image).to_be_visible()
    page.wait_for_function("document.querySelector('#tr-detail .images img').naturalWidth === 112")
    assert "image tokens (not trained)" in page.locator("#tr-detail .images figcaption").first.inner_text()
    shot(site, "vision")


def test_tools_load_and_call_through_a_form(site):
    page = site["page"]
    load_tools(site)
    page.wait_for_selector("[data-server=srv] .badge.ok")
    page.click("[data-tool='srv.add']")
    page.fill("#tools-form [name=a]", "2")
    page.fill("#tools-form [name=b]", "40")
    page.click("#tools-call")
    page.wait_for_selector("#tools-result:not([hidden])", timeout=120_000)  # a worker starts: slow when busy
    assert page.locator("#tools-output").inner_text() == "42" and page.locator("#tools-outcome").inner_text() == "ok"
    page.click("[data-tool='calc.calculator']")
    page.fill("#tools-form [name=expression]", "__import__('os').getpid()")  # data for the tool, not code
    page.click("#tools-call")
    page.wait_for_function("document.querySelector('#tools-outcome').textContent !== 'ok'")
    assert "42" not in page.locator("#tools-output").inner_text()
    page.fill("#tools-form [name=expression]", "2 * (3 + 4)")
    page.click("#tools-call")
    page.wait_for_function("document.querySelector('#tools-output').textContent === '14'")
    shot(site, "tools")


def test_a_tools_slow_result_is_not_shown_under_the_tool_chosen_after_it(site):
    """srv.add called, then calc.calculator chosen before add's result came back: that result (42) had appeared
    under the calculator's name. Now it is dropped; the calculator's own call shows its own."""
    page = site["page"]
    load_tools(site)
    page.wait_for_selector("[data-server=srv] .badge.ok")
    slow_answer(page, r"^/api/tools/call$")
    page.click("[data-tool='srv.add']")
    page.fill("#tools-form [name=a]", "2")
    page.fill("#tools-form [name=b]", "40")
    page.click("#tools-call")
    page.wait_for_function("window.slowAsked >= 1")
    page.click("[data-tool='calc.calculator']")
    page.wait_for_function("window.slowDelivered >= 1", timeout=120_000)  # add's answer has landed
    expect(page.locator("#tools-result")).to_be_hidden()
    page.fill("#tools-form [name=expression]", "2 * (3 + 4)")
    page.click("#tools-call")
    expect(page.locator("#tools-output")).to_have_text("14", timeout=120_000)
    assert not site["errors"], site["errors"]


def test_launch_follow_stop_and_resume_a_run(site):
    page, root = site["page"], site["root"]
    page.goto(site["url"] + "#launch")
    page.select_option("#launch-recipe", "tiny")
    text = page.locator("#launch-config").input_value()
    page.fill("#launch-config", text.replace(f"steps: {LAUNCH_STEPS}", f"stepz: {LAUNCH_STEPS}"))
    page.click("#launch-validate")
    page.wait_for_selector("#launch-check.error-text")
    assert page.locator("#launch-check").inner_text().startswith("config: unknown key 'train.stepz'")
    page.fill("#launch-config", text)
    page.fill("#launch-name", "from-the-page")
    page.click("#launch-start")
    second = f"document.querySelector('#follow-log').textContent.includes('step 2/{LAUNCH_STEPS}')"
    page.wait_for_function(second, timeout=300_000)
    page.click("#follow-stop")
    page.wait_for_selector("#follow-state.state-stopped", timeout=120_000)
    stopped = "document.querySelector('#follow-log').textContent.includes('stopped after step')"
    page.wait_for_function(stopped, timeout=60_000)
    run = RunDir(root / "from-the-page")
    stopped_at = run.read_status()["step"]
    assert run.pointed("last").name == f"step-{stopped_at:06d}" and stopped_at < LAUNCH_STEPS
    shot(site, "launch")
    pid, deadline = run.read_status()["pid"], time.monotonic() + 300
    while _alive(pid) and time.monotonic() < deadline:  # "stopped" is written before the process exits
        time.sleep(0.5)
    page.click("#follow-resume")
    # the resumed run's remaining steps: a generous wait, for a shared CI machine under load
    page.wait_for_selector("#follow-state.state-finished", timeout=600_000)
    steps = [m["step"] for m in run.read_metrics() if "eval" not in m]
    assert steps == list(range(1, LAUNCH_STEPS + 1))  # every step once, across the stop
    expect(page.locator("#follow-resume")).to_be_disabled(timeout=10_000)  # finished: resume says why it cannot
    expect(page.locator("#follow-why")).to_contain_text(f"the run finished all its {LAUNCH_STEPS} steps")


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (an exited child the server has not reaped yet is a zombie: not running)."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# Elements whose content runs out of them where they do not scroll (overflow visible), and a page wider than the
# window. Hidden elements, SVG inside charts and inline text runs are left out: their boxes are their parents'.
OVERFLOWS = """() => {
  const out = [];
  const name = (el) => el.tagName.toLowerCase() + (el.id ? `#${el.id}` : "")
    + (el.classList.length ? `.${[...el.classList].join(".")}` : "");
  for (const el of document.querySelectorAll("body *")) {
    if (!(el instanceof HTMLElement) || !el.getClientRects().length) continue;
    const style = getComputedStyle(el);
    if (style.display === "inline" || /(auto|scroll|hidden|clip)/.test(style.overflowX)) continue;
    if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) {
      const widest = [...el.children].sort((a, b) => b.scrollWidth - a.scrollWidth)[0];
      const inside = widest ? ` (${name(widest)})` : "";
      out.push(`${name(el)}: ${el.scrollWidth} px of content in ${el.clientWidth}${inside}`);
    }
  }
  const page = document.documentElement.scrollWidth;
  if (page > window.innerWidth + 1) out.push(`the page: ${page} px wide in a ${window.innerWidth} px window`);
  return out;
}"""


@pytest.mark.parametrize("width,height", [(1440, 900), (390, 844)])
def test_no_view_overflows_at_desktop_and_phone_widths(site, width, height):
    """Item 7 of the UI review: each view (runs and charts, a step's trajectories with one open, the group view,
    tools with a result, launch, the token page), screenshot at 1440x900 and at a phone's 390x844: no element's
    content runs out of a box that does not scroll, and the page is never wider than the window (the trajectory,
    521 px, and its calls table had run off a phone's screen)."""
    page = site["page"]
    page.set_viewport_size({"width": width, "height": height})
    try:
        found = {}

        def check(view):
            page.wait_for_timeout(300)
            site["page"].screenshot(path=str(site["shots"] / f"ui-fit-{view}-{width}.png"), full_page=True)
            found[view] = page.evaluate(OVERFLOWS)

        tick_only(site, "alpha", "beta")
        page.wait_for_selector(".chart[data-metric=reward]")
        check("runs")
        page.goto(site["url"] + "#trajectories")
        page.select_option("#tr-run", "with-calls")
        page.select_option("#tr-step", "1")
        page.click("#tr-list .card >> nth=0")
        page.wait_for_selector("#tr-detail .tok")
        check("trajectory")
        page.select_option("#tr-run", "alpha")
        page.select_option("#tr-kind", "train")
        page.select_option("#tr-step", "1")
        page.click("#tr-list .card >> nth=0")
        page.click("#tr-group")
        page.wait_for_selector("#cmp-columns .group-member")
        check("group")
        load_tools(site)
        page.wait_for_selector("[data-tool='calc.calculator']")
        page.click("[data-tool='calc.calculator']")
        page.fill("#tools-form [name=expression]", "6 * 7")
        page.click("#tools-call")
        page.wait_for_selector("#tools-result:not([hidden])", timeout=120_000)  # a worker starts: slow when busy
        check("tools")
        page.goto(site["url"] + "#launch")
        page.select_option("#launch-recipe", "tiny")
        check("launch")
        other = page.context.browser.new_context(viewport={"width": width, "height": height}).new_page()
        try:  # a shared link opened without the token
            other.goto(site["url"].split("?")[0] + "#runs?runs=alpha")
            other.wait_for_selector("#token-form")
            other.screenshot(path=str(site["shots"] / f"ui-fit-token-{width}.png"), full_page=True)
            found["token"] = other.evaluate(OVERFLOWS)
        finally:
            other.context.close()
        overflowing = {view: problems for view, problems in found.items() if problems}
        assert not overflowing, json.dumps(overflowing, indent=1)
        assert not site["errors"], site["errors"]
    finally:
        page.set_viewport_size({"width": 1360, "height": 900})
