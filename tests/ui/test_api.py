"""`toolrl ui`'s JSON API, without a browser: runs and their states from plain files, metrics from a line on,
trajectory records by step (the index follows a growing file), a task across steps; access rules (a token on
every request, loopback included; loopback host; same origin; X-Toolrl on POST; --no-token); config
validation with the CLI's one-line errors and no plugins or env.module from the page; tool calls through the
run's executor and policies, and no file contents in a refused tool file's error; "stop now" signals only a
verified run process; a run from elsewhere is resumed only when trusted."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.fixtures import mcp_server_entry, write_tool_config
from toolrl.runs.rundir import RunDir, process_start
from toolrl.ui import build_app

FIXTURES = Path(__file__).parents[1] / "fixtures"
POST = {"X-Toolrl": "1"}
TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def ui_client(root: Path, base_url: str = "http://127.0.0.1:7860", recipes: Path | None = None, **kwargs) -> TestClient:
    """A client of a UI with the token (as the page has it after its first visit)."""
    app = build_app(root, [recipes] if recipes else [], token=TOKEN, **kwargs)
    return TestClient(app, base_url=base_url, headers=AUTH)


def fake_run_process(run: Path | str = "runs/live") -> subprocess.Popen:
    """A process whose command line is `toolrl train` naming the run folder, as a resumed run's is; SIGINT ends it
    with exit code 3 (its own handler: a process started in the background may inherit SIGINT ignored)."""
    code = "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(3)); time.sleep(120)"
    return subprocess.Popen([sys.executable, "-c", code, "toolrl", "train", "--resume", str(run)])


def running_status(pid: int, **extra) -> dict:
    host = socket.gethostname()
    return {"state": "running", "pid": pid, "pid_start": process_start(pid), "host": host, **extra}


def make_run(root: Path, name: str, steps: int = 3, status: dict | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"env:\n  name: calculator\nmodel:\n  name: tiny\ntrain:\n  steps: {steps}\n")
    with (run / "metrics.jsonl").open("w") as f:
        f.write(json.dumps({"eval": "start", "step": 0, "reward": 0.1, "success": 0.0}) + "\n")
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "reward": step / 10, "success": step / 20}) + "\n")
    for step in range(1, steps + 1):
        records = [
            {"task_id": f"t{i % 2}", "reward": float(i), "success": float(i == 1), "stop_reason": "answer",
             "tool_calls": i, "tool_errors": int(i == 2), "segments": []}
            for i in range(3)
        ]  # fmt: skip
        RunDir(run).log_samples(step, records)
    RunDir(run).log_samples(0, [{"task_id": "t1", "reward": 0.0, "segments": []}], "evals.jsonl", eval="start")
    if status is not None:
        (run / "status.json").write_text(json.dumps(status))
    return run


@pytest.fixture
def client(tmp_path):
    root = tmp_path / "runs"
    live = fake_run_process()
    make_run(root, "done", status={"state": "finished", "step": 3, "steps": 3})
    make_run(root, "live", status=running_status(live.pid))
    make_run(root, "gone", status={"state": "running", "pid": 2**22 + 12345, "host": socket.gethostname()})
    make_run(root, "broke", status={"state": "failed", "error": "RuntimeError: boom"})
    try:
        with ui_client(root) as c:
            c.root = root
            yield c
    finally:
        live.kill()
        live.wait()


def test_runs_list_states_and_metrics_from_a_line_on(client):
    runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert {n: r["state"] for n, r in runs.items()} == {
        "done": "finished",
        "live": "running",
        "gone": "died",  # said running, but no process has that id
        "broke": "failed",
    }
    assert runs["broke"]["error"] == "RuntimeError: boom" and runs["done"]["step"] == 3
    records = client.get("/api/metrics", params={"run": "done", "since": 2}).json()["records"]
    assert [r["step"] for r in records] == [2, 3]


def test_records_by_step_follow_the_growing_file_and_a_task_across_steps(client):
    steps = client.get("/api/steps", params={"run": "done"}).json()["steps"]
    assert steps == {"1": {"count": 3}, "2": {"count": 3}, "3": {"count": 3}}
    briefs = client.get("/api/briefs", params={"run": "done", "step": 2}).json()["records"]
    assert [b["tool_errors"] for b in briefs] == [0, 0, 1] and "segments" not in briefs[0]
    evals = client.get("/api/steps", params={"run": "done", "kind": "eval"}).json()["steps"]
    assert evals == {"0": {"count": 1, "eval": "start"}}
    RunDir(client.root / "done").log_samples(4, [{"task_id": "t1", "reward": 9.0, "segments": []}])
    steps = client.get("/api/steps", params={"run": "done"}).json()["steps"]
    assert list(steps) == ["1", "2", "3", "4"]
    record = client.get("/api/record", params={"run": "done", "step": 4, "index": 0}).json()
    assert record["reward"] == 9.0
    history = client.get("/api/task", params={"run": "done", "task": "t1"}).json()["records"]
    assert [(h["kind"], h["step"]) for h in history] == [("eval", 0)] + [("train", s) for s in (1, 2, 3, 4)]
    missing = client.get("/api/record", params={"run": "done", "step": 9, "index": 0})
    assert missing.status_code == 400 and "no record 0 at step 9" in missing.json()["error"]


def test_paths_outside_the_runs_folder_are_refused(client):
    make_run(client.root.parent, "outside")  # a run directory, but not under the UI's folder
    for name in ("../outside", str(client.root.parent / "outside"), "/etc", "nope"):
        answer = client.get("/api/metrics", params={"run": name})
        assert answer.status_code == 400 and "no run of that name" in answer.json()["error"]


def test_access_rules(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "done")
    app = build_app(root, [], token=TOKEN)
    local = TestClient(app, base_url="http://127.0.0.1:7860")
    assert local.get("/api/runs").status_code == 401  # loopback too: any local process could call it
    page = local.get("/")  # a shared link without the token: a page that asks for it, with no data of the runs
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert "needs its access token" in page.text and "done" not in page.text and str(root) not in page.text
    wrong = local.get("/?token=nope")
    assert wrong.status_code == 401 and "needs its access token" in wrong.text and not local.cookies
    assert local.get("/api/runs").json()["error"].startswith("an access token is needed")  # the API: JSON
    assert local.get("/static/app.js").status_code == 200  # the page's code holds no data
    for wrong in ("nope", "t0kem", "tök€n"):
        assert local.get("/api/runs", headers={"Authorization": f"Bearer {wrong}".encode()}).status_code == 401
    assert local.get("/api/runs", headers=AUTH).status_code == 200
    assert local.get(f"/?token={TOKEN}").status_code == 200 and local.cookies.get("toolrl_token_7860") == TOKEN
    assert local.get("/api/runs").status_code == 200  # the cookie the page got, for this port only
    rebound = TestClient(app, base_url="http://evil.example:7860", headers=AUTH)
    assert rebound.get("/api/runs").status_code == 403  # a rebound DNS name is not served on loopback
    cross = local.post("/api/stop", json={"run": "done"}, headers={**POST, "Origin": "http://evil.example"})
    assert cross.status_code == 403 and "another origin" in cross.json()["error"]
    null = local.get("/api/runs", headers={"Origin": "null"})
    assert null.status_code == 403
    same = local.post("/api/stop", json={"run": "done"}, headers={**POST, "Origin": "http://127.0.0.1:7860"})
    assert same.status_code == 400 and "not running" in same.json()["error"]  # let through, then refused
    no_header = local.post("/api/stop", json={"run": "done"})
    assert no_header.status_code == 403 and "X-Toolrl" in no_header.json()["error"]
    remote = TestClient(build_app(root, [], token=TOKEN, loopback_only=False), base_url="http://10.0.0.5:7860")
    assert remote.get("/api/runs").status_code == 401
    assert remote.get("/api/runs", headers=AUTH).status_code == 200
    open_ui = TestClient(build_app(root, [], token=None), base_url="http://127.0.0.1:7860")
    assert open_ui.get("/api/runs").status_code == 200  # --no-token: the old behaviour, asked for


def test_validation_gives_the_cli_one_line_errors_and_refuses_plugins(client):
    bad = client.post("/api/validate", json={"config": "train:\n  stepz: 3\n"}, headers=POST)
    assert bad.status_code == 400 and bad.json()["error"].startswith("config: unknown key 'train.stepz'")
    wrong = client.post("/api/validate", json={"config": "train:\n  steps: -1\n"}, headers=POST)
    assert "train.steps must be greater than or equal to 0" in wrong.json()["error"]
    plugin = client.post("/api/validate", json={"config": "plugins: [os]\n"}, headers=POST)
    assert plugin.status_code == 400 and "plugins cannot be set from the page" in plugin.json()["error"]
    module = client.post("/api/validate", json={"config": "env:\n  module: antigravity\n"}, headers=POST)
    assert module.status_code == 400 and "env.module cannot be set from the page" in module.json()["error"]
    assert "antigravity" not in sys.modules
    launched = client.post("/api/launch", json={"config": "env:\n  module: [os]\n", "name": "m"}, headers=POST)
    assert launched.status_code == 400 and "env.module cannot be set" in launched.json()["error"]
    good = client.post("/api/validate", json={"config": "train:\n  steps: 3\n", "recipe": "default"}, headers=POST)
    assert good.json() == {"ok": True, "steps": 3, "env": "calculator"}
    named = client.post("/api/launch", json={"config": "", "name": "../x"}, headers=POST)
    assert named.status_code == 400 and "run name: '../x' is not one folder name" in named.json()["error"]
    trailing = client.post("/api/launch", json={"config": "", "name": "x\n"}, headers=POST)
    assert trailing.status_code == 400 and "not one folder name" in trailing.json()["error"]
    taken = client.post("/api/launch", json={"config": "", "name": "done"}, headers=POST)
    assert taken.status_code == 400 and "exists" in taken.json()["error"]


def test_tools_go_through_the_runs_executor_and_policies(client, tmp_path):
    slow = {"slow": {"timeout_s": 0.3, "retries": 0}}
    servers = {
        "srv": mcp_server_entry("add", "slow", "square", policies=slow),
        "down": {"command": str(tmp_path / "no-such-server")},
    }
    config = write_tool_config(tmp_path / "tools.json", servers)
    missing = client.post("/api/tools/load", json={"file": str(tmp_path / "nope.json")}, headers=POST)
    assert missing.status_code == 400 and "no such tool config file" in missing.json()["error"]
    loaded = client.post("/api/tools/load", json={"file": str(config)}, headers=POST).json()
    assert loaded["servers"]["srv"] == "ok" and loaded["servers"]["down"].startswith("error:")
    add = next(t for t in loaded["tools"] if t["name"] == "srv.add")
    assert add["parameters"]["required"] == ["a", "b"]
    result = client.post("/api/tools/call", json={"name": "add", "arguments": {"a": 2, "b": 40}}, headers=POST).json()
    assert result["outcome"] == "ok" and result["result"] == "42" and result["latency_s"] > 0
    slow = client.post("/api/tools/call", json={"name": "srv.slow", "arguments": {"seconds": 5}}, headers=POST)
    assert slow.json()["outcome"] == "unknown"  # the file's policy, as in training (an MCP call that may still run)
    off_schema = client.post("/api/tools/call", json={"name": "add", "arguments": {"a": "two"}}, headers=POST)
    assert off_schema.json()["outcome"] == "invalid_arguments"
    square = client.post("/api/tools/call", json={"name": "square", "arguments": {"size": 5}}, headers=POST).json()
    assert square["result"] == "a red square of 5 pixels" and square["images"][0].startswith("data:image/png;base64,")


def test_the_command_always_makes_a_token_unless_told_no_token(tmp_path):
    import httpx

    for host, extra in (("127.0.0.1", []), ("0.0.0.0", []), ("127.0.0.1", ["--no-token"])):
        server = subprocess.Popen(
            [sys.executable, "-m", "toolrl", "ui", str(tmp_path / "runs"), "--host", host, "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            line = server.stdout.readline()
            url = line.split()[2]
            needs_token = not extra
            assert ("?token=" in url) == needs_token, line
            base, _, token = url.partition("?token=")
            port = base.rstrip("/").rsplit(":", 1)[1]
            plain = httpx.get(f"http://127.0.0.1:{port}/api/runs")
            assert plain.status_code == (401 if needs_token else 200)
            if needs_token:
                assert len(token) >= 32
                bearer = httpx.get(f"http://127.0.0.1:{port}/api/runs", headers={"Authorization": f"Bearer {token}"})
                assert bearer.status_code == 200 and bearer.json()["runs"] == []
            else:
                more = server.stdout.readline()  # whole: what goes into a pipe is not wrapped at 80 columns
                assert "any process on this machine can use this UI as you" in more
        finally:
            server.terminate()
            server.wait(10)
    busy = subprocess.run(
        [sys.executable, "-m", "toolrl", "ui", str(tmp_path), "--port", "70000"], capture_output=True, text=True
    )
    assert busy.returncode == 2 and "--port: '70000' is above 65535" in busy.stderr
    exposed = subprocess.run(
        [sys.executable, "-m", "toolrl", "ui", str(tmp_path), "--host", "0.0.0.0", "--no-token"],
        capture_output=True,
        text=True,
    )
    assert exposed.returncode == 2 and "without a token, serve only on 127.0.0.1" in exposed.stderr


def test_a_run_on_another_machine_is_stopped_by_file_and_never_signalled_here(tmp_path):
    import time

    root = tmp_path / "runs"
    status = {"state": "running", "pid": os.getpid(), "host": "elsewhere", "updated_at": time.time()}
    make_run(root, "remote", status=status)
    client = ui_client(root)
    assert client.get("/api/runs").json()["runs"][0]["state"] == "running"
    now = client.post("/api/stop", json={"run": "remote", "now": True}, headers=POST)
    assert now.status_code == 400 and "runs on elsewhere" in now.json()["error"]  # not our pid to signal
    after_step = client.post("/api/stop", json={"run": "remote"}, headers=POST)
    assert after_step.json()["stopping"] == "after this step" and (root / "remote" / "STOP").exists()
    (root / "remote" / "status.json").write_text(json.dumps({**status, "updated_at": time.time() - 4000}))
    assert client.get("/api/runs").json()["runs"][0]["state"] == "stale"


def test_stop_now_signals_only_the_runs_verified_toolrl_process(tmp_path):
    """A stale pid, -1, 1, the UI's own pid, a pid whose start time differs (reused), a process that is not
    toolrl: each refused, nothing signalled. The run's own process (start time and command line) is."""
    root = tmp_path / "runs"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    mentions = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "toolrl", "ui"])
    target = fake_run_process(root / "real")
    try:
        cases = {
            "other-run": running_status(target.pid),  # the process of another run folder (named by "real")
            "mentions-toolrl": running_status(mentions.pid),  # a command line naming toolrl, not `toolrl train`
            "minus-one": running_status(-1),
            "init": running_status(1),
            "me": running_status(os.getpid()),
            "reused": {**running_status(target.pid), "pid_start": process_start(target.pid) - 1},
            "not-toolrl": running_status(bystander.pid),
            "no-start": {k: v for k, v in running_status(target.pid).items() if k != "pid_start"},
            "text-pid": {**running_status(target.pid), "pid": str(target.pid)},
        }
        for name, status in cases.items():
            make_run(root, name, status={**status, "updated_at": time.time()})
        client = ui_client(root)
        for name in cases:
            answer = client.post("/api/stop", json={"run": name, "now": True}, headers=POST)
            assert answer.status_code == 400, name
            assert "not running" in answer.json()["error"] or "nothing was signalled" in answer.json()["error"]
        assert bystander.poll() is None and target.poll() is None and mentions.poll() is None
        make_run(root, "real", status={**running_status(target.pid), "updated_at": time.time()})
        answer = client.post("/api/stop", json={"run": "real", "now": True}, headers=POST)
        assert answer.json() == {"name": "real", "stopping": "now"}
        assert target.wait(10) == 3  # its SIGINT handler ran
    finally:
        for process in (bystander, target, mentions):
            process.kill()
            process.wait()


def test_a_refused_tool_file_is_never_quoted(client, tmp_path):
    secret = "hunter2-do-not-show"
    files = {
        "shadow": f"root:{secret}:20228:0:99999:7:::\n",
        ".env": f"API_KEY={secret}\n",
        "copied.json": f"root:{secret}:20228\n",
        "keys.yaml": f"mcpServers: {{}}\n{secret}: 1\n",
        "values.yaml": f"mcpServers:\n  x:\n    command: [{secret}]\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        answer = client.post("/api/tools/load", json={"file": str(tmp_path / name)}, headers=POST)
        assert answer.status_code == 400 and secret not in answer.text, (name, answer.text)
        assert str(tmp_path / name) in answer.json()["error"]
    for device in ("/dev/zero", "/proc/self/environ"):
        answer = client.post("/api/tools/load", json={"file": device}, headers=POST)
        assert answer.status_code == 400 and len(answer.json()["error"]) < 300


def _resumable(root: Path, name: str, status: dict, module: str = "my_plugin_env") -> Path:
    run = make_run(root, name, status=status)
    (run / "config.yaml").write_text(f"env:\n  name: calculator\n  module: {module}\nmodel:\n  name: tiny\n")
    (run / "step-1").mkdir()
    (run / "last").symlink_to("step-1")
    return run


def test_a_run_from_elsewhere_is_resumed_only_when_trusted(tmp_path):
    root = tmp_path / "runs"
    status = {"state": "stopped", "pid": 4242, "host": "another-machine"}
    _resumable(root, "copied", status)
    client = ui_client(root)
    refused = client.post("/api/resume", json={"run": "copied"}, headers=POST)
    error = refused.json()["error"]
    assert refused.status_code == 400 and "made on 'another-machine'" in error
    assert "import module my_plugin_env (env.module)" in error and "my_plugin_env" not in sys.modules
    cli = subprocess.run(
        [sys.executable, "-m", "toolrl", "train", "--resume", str(root / "copied")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert cli.returncode != 0
    assert "resume will import module my_plugin_env (env.module)" in cli.stdout
    assert "pass --trust-run" in cli.stderr and len(cli.stderr.strip().splitlines()[-1]) < 400
    trusted = subprocess.run(
        [sys.executable, "-m", "toolrl", "train", "--resume", str(root / "copied"), "--trust-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # trusted: it goes on to import the module, which does not exist here
    assert "cannot import 'my_plugin_env'" in trusted.stderr


def test_a_recipe_whose_plugin_registers_the_environment_validates_on_the_page(tmp_path):
    """The page resolves a config as the CLI does: the recipe's plug-ins first, then the names they register."""
    from toolrl.envs.base import ENVIRONMENTS

    sys.modules.pop("tests.fixtures.plugin_env", None)  # imported afresh, as in a new UI process
    ENVIRONMENTS.pop("plugin-shelf", None)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    recipe = "plugins: [tests.fixtures.plugin_env]\nenv:\n  name: plugin-shelf\n"
    (recipes / "shelf.yaml").write_text(recipe)
    with ui_client(tmp_path / "runs", recipes=recipes) as client:
        edited = recipe + "  options:\n    shelves: 4\n"
        good = client.post("/api/validate", json={"config": edited, "recipe": "shelf"}, headers=POST)
        assert good.status_code == 200 and good.json()["env"] == "plugin-shelf"
        bad = client.post("/api/validate", json={"config": edited.replace("4", "0"), "recipe": "shelf"}, headers=POST)
        assert bad.status_code == 400
        assert bad.json()["error"].startswith("env.options of plugin-shelf: env.options.shelves must be greater")


def test_a_run_folder_reached_through_a_symlink_is_listed_and_read(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    make_run(tmp_path / "elsewhere", "exp")
    (root / "exp").symlink_to(tmp_path / "elsewhere" / "exp", target_is_directory=True)
    client = ui_client(root)
    assert [r["name"] for r in client.get("/api/runs").json()["runs"]] == ["exp"]
    records = client.get("/api/metrics", params={"run": "exp", "since": 1}).json()["records"]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert client.get("/api/steps", params={"run": "exp"}).json()["steps"]["3"] == {"count": 3}
    for name in ("exp/../../elsewhere/exp", "../elsewhere/exp", "."):  # climbing out by name is still refused
        assert client.get("/api/metrics", params={"run": name}).status_code == 400


def test_two_resumes_of_one_run_at_once_start_one_process(tmp_path, monkeypatch):
    """The UI's actions take a lock per run: the second of two simultaneous resumes sees the first's process."""
    import threading

    from toolrl.errors import ConfigError
    from toolrl.ui.launch import Launcher

    root = tmp_path / "runs"
    _resumable(root, "r", {"state": "stopped", "host": socket.gethostname(), "uid": os.getuid()})
    launcher, started = Launcher(root), []

    def slow_spawn(name, command):  # a process that takes its time to start, as a real run does
        time.sleep(0.3)
        launcher.processes[name] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        started.append(name)

    monkeypatch.setattr(launcher, "_spawn", slow_spawn)
    outcomes = []

    def resume():
        try:
            outcomes.append(launcher.resume("r", trust=True)["pid"])
        except ConfigError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=resume) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(started) == 1 and sum(isinstance(o, int) for o in outcomes) == 1, outcomes
        assert any(isinstance(o, str) and "still running" in o for o in outcomes)
    finally:
        for process in launcher.processes.values():
            process.kill()
            process.wait()


def test_nan_and_a_null_step_are_served_as_gaps_and_counted(client):
    run = client.root / "done"
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward": NaN, "success": Infinity}\n{"step": null, "reward": 1}\n')
    with (run / "samples.jsonl").open("a") as f:
        f.write('{"step": null, "task_id": "x", "reward": NaN}\n["not", "a", "record"]\n')
    answer = client.get("/api/metrics", params={"run": "done", "since": 4})
    assert answer.status_code == 200 and answer.json()["records"][0] == {"step": 4, "reward": None, "success": None}
    steps = client.get("/api/steps", params={"run": "done"}).json()
    assert list(steps["steps"]) == ["1", "2", "3"] and steps["unreadable"] == 2
    runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert runs["done"]["step"] == 4 and runs["done"]["reward"] is None
