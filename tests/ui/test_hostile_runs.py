"""Run folders are data from anyone, and `toolrl ui` is attacked through them as a local attacker would, over
real sockets against the real command: a FIFO or a socket where a run's files should be never blocks the UI (it is
skipped and named, static pages and other runs go on, and it is still served after the FIFO is gone); a malformed
run is listed with its problem and never fails the list; a link out of the run folder is never served; "stop now"
signals only the run's own `toolrl train`, never the UI or its ancestors; Host is parsed as a URL authority; the
token comes from an environment variable or a file and never shows in `ps`."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ui.test_api import POST, make_run, running_status

TOKEN = "hostile-t0ken-from-the-environment"
ROOT = Path(__file__).parents[2]


def start_ui(
    root: Path, *extra: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "toolrl", "ui", str(root), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
        env={**os.environ, "TOOLRL_UI_TOKEN": TOKEN, **(env or {})},
    )  # fmt: skip
    line = server.stdout.readline()
    assert "toolrl ui:" in line, line + server.stdout.read()
    return server, line.split()[2].partition("?")[0].rstrip("/")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    server.wait(10)


@pytest.fixture
def hostile(tmp_path):
    """A runs folder with a good run beside runs whose files are FIFOs, sockets, links out and garbage."""
    root = tmp_path / "runs"
    make_run(root, "good")
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2-outside-the-run\n")
    for name in ("status.json", "config.yaml", "metrics.jsonl", "samples.jsonl", "console.log", "pass_rates.json"):
        run = make_run(root, f"fifo-{name.split('.')[0]}")
        (run / name).unlink(missing_ok=True)
        os.mkfifo(run / name)
    device = make_run(root, "device")  # /dev/zero's node made inside the run folder (as root; else a link to it)
    (device / "metrics.jsonl").unlink()
    try:
        os.mknod(device / "metrics.jsonl", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        (device / "metrics.jsonl").symlink_to("/dev/zero")
    run = make_run(root, "socket")
    (run / "metrics.jsonl").unlink()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(run / "metrics.jsonl"))
    linked = make_run(root, "links")
    for name in ("console.log", "metrics.jsonl", "samples.jsonl", "plot.png", "status.json"):
        (linked / name).unlink(missing_ok=True)
        (linked / name).symlink_to(secret)
    (linked / "images").mkdir()
    (linked / "images" / "x.png").symlink_to(secret)
    malformed = {
        "scalar": "just a string\n",
        "train-5": "train: 5\nenv: [1, 2]\nmodel: 7\n",
        "not-yaml": "env: {name: [unclosed\n",
        "empty": "",
    }
    for name, text in malformed.items():
        (make_run(root, f"bad-{name}") / "config.yaml").write_text(text)
    odd = {"state": ["running"], "updated_at": "yesterday", "steps": {"a": 1}, "error": {"x": 1}, "started_at": None}
    make_run(root, "bad-status", status=odd)
    (make_run(root, "deep-status") / "status.json").write_text("[" * 100_000 + "]" * 100_000)
    (make_run(root, "huge-status") / "status.json").write_text(json.dumps({"state": "x" * (2 << 20)}))
    yield root, secret
    listener.close()


def test_fifos_sockets_links_and_garbage_never_block_or_break_the_ui(hostile):
    root, secret = hostile
    server, url = start_ui(root)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=url, headers=auth, timeout=20) as client:
            started = time.monotonic()
            runs = client.get("/api/runs")
            assert runs.status_code == 200 and time.monotonic() - started < 15
            by_name = {r["name"]: r for r in runs.json()["runs"]}
            assert len(by_name) == 17, sorted(by_name)
            assert by_name["good"]["problems"] == [] and by_name["good"]["step"] == 3
            for name in ("status", "config", "metrics", "samples", "console", "pass_rates"):
                problems = by_name[f"fifo-{name}"]["problems"]
                if name != "pass_rates":  # pass_rates.json is read for the run's page only
                    assert any("a FIFO; skipped" in p for p in problems), (name, problems)
            assert any("metrics.jsonl: a socket" in p for p in by_name["socket"]["problems"])
            device = by_name["device"]["problems"]
            assert any("metrics.jsonl: not a regular file" in p or "outside the run" in p for p in device), device
            assert client.get("/api/metrics", params={"run": "device"}).json()["records"] == []
            assert sum("outside the run folder" in p for p in by_name["links"]["problems"]) == 5
            assert any("config.yaml: a str" in p for p in by_name["bad-scalar"]["problems"])
            wrong = {f"config.yaml: {k} is a {t}, not a mapping" for k, t in (("train", "int"), ("env", "list"))}
            assert wrong <= set(by_name["bad-train-5"]["problems"]), by_name["bad-train-5"]
            assert any("not YAML" in p for p in by_name["bad-not-yaml"]["problems"])
            assert by_name["bad-status"]["state"] == "['running']" and by_name["bad-status"]["steps"] is None
            assert "hunter2" not in runs.text

            for run in ("fifo-console", "links"):
                log = client.get("/api/console", params={"run": run})
                assert log.status_code == 400 and "console.log" in log.json()["error"], log.text
            for path, params in (
                ("/api/metrics", {"run": "links"}),
                ("/api/steps", {"run": "links"}),
                ("/api/plot", {"run": "links"}),
                ("/api/image", {"run": "links", "path": "images/x.png"}),
                ("/api/run", {"run": "links"}),
                ("/api/run", {"run": "fifo-pass_rates"}),
                ("/api/metrics", {"run": "fifo-metrics"}),
                ("/api/briefs", {"run": "fifo-samples", "step": 1}),
                ("/api/run", {"run": "fifo-config"}),
            ):
                answer = client.get(path, params=params)
                assert answer.status_code < 500 and "hunter2" not in answer.text, (path, params, answer.text)
            assert client.get("/api/metrics", params={"run": "links"}).json()["records"] == []
            assert client.get("/api/run", params={"run": "bad-train-5"}).status_code == 200
            assert client.get("/api/run", params={"run": "fifo-config"}).status_code == 400
            assert client.get("/static/app.js").status_code == 200
            for fifo in root.glob("fifo-*/*"):
                if fifo.is_fifo():
                    fifo.unlink()
            assert client.get("/api/runs").status_code == 200 and client.get("/").status_code == 200
            assert server.poll() is None
    finally:
        stop(server)
    assert secret.read_text() == "hunter2-outside-the-run\n"


def test_host_is_a_url_authority_and_the_token_never_shows_in_ps(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "done")
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file-0123456789\n")
    server, url = start_ui(root, "--token-file", str(token_file), env={"TOOLRL_UI_TOKEN": ""})
    try:
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert b"from-a-file" not in argv
        port = url.rsplit(":", 1)[1]
        good = {"Authorization": "Bearer from-a-file-0123456789"}

        def status(host: str) -> int:
            return httpx.get(f"http://127.0.0.1:{port}/api/runs", headers={**good, "Host": host}).status_code

        assert status(f"127.0.0.1:{port}") == 200 and status(f"localhost:{port}") == 200
        assert status(f"[::1]:{port}") == 200 and status("LOCALHOST") == 200
        refused = ["127.0.0.1:1@evil.example", "user:pw@127.0.0.1", "127.0.0.1:port", "evil.example"]
        refused += ["127.0.0.1/x", "127.0.0.1 evil", "[::1", "127.0.0.1.evil.example", "localhost:99999"]
        for hostile in refused:
            assert status(hostile) in (400, 403), hostile
        assert httpx.get(f"{url}/api/runs").status_code == 401
    finally:
        stop(server)
    server, url = start_ui(root)  # the token from TOOLRL_UI_TOKEN, the URL printed with it
    try:
        assert TOKEN.encode() not in Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert httpx.get(f"{url}/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    finally:
        stop(server)
    for bad in (tmp_path / "missing", tmp_path):
        done = subprocess.run([sys.executable, "-m", "toolrl", "ui", str(root), "--token-file", str(bad)],
                              capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        assert done.returncode == 2 and "--token-file" in done.stderr and len(done.stderr.strip().splitlines()) == 1


TRAIN_AND_UI = """
import subprocess, sys, time
ui = subprocess.Popen([sys.executable, "-m", "toolrl", "ui", sys.argv[1], "--port", "0"], stdout=subprocess.PIPE,
                      text=True)
print(ui.pid, ui.stdout.readline().split()[2], flush=True)
time.sleep(120)
"""


def test_stop_now_never_signals_the_ui_or_an_ancestor_even_when_it_looks_like_the_run(tmp_path):
    """The UI runs as the child of a process whose command line is `toolrl train RUN` and whose start time
    status.json names: everything a run's process shows, but it is the UI's parent, and is never signalled."""
    root = tmp_path / "runs"
    run = root / "mine"
    argv = [sys.executable, "-c", TRAIN_AND_UI, str(root), "toolrl", "train", "--resume", str(run)]
    env = {**os.environ, "TOOLRL_UI_TOKEN": TOKEN}
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    ui_pid, url = parent.stdout.readline().split()
    try:
        make_run(root, "mine", status={**running_status(parent.pid), "updated_at": time.time()})
        make_run(root, "itself", status={**running_status(int(ui_pid)), "updated_at": time.time()})
        auth = {"Authorization": f"Bearer {TOKEN}", **POST}
        for name in ("mine", "itself"):
            answer = httpx.post(f"{url.partition('?')[0]}api/stop", json={"run": name, "now": True}, headers=auth)
            assert answer.status_code == 400 and "nothing was signalled" in answer.json()["error"], answer.text
        time.sleep(0.5)
        assert parent.poll() is None
        assert Path(f"/proc/{ui_pid}").exists()
    finally:
        os.kill(int(ui_pid), signal.SIGTERM)
        parent.kill()
        parent.wait()
