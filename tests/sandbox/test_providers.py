"""Every sandbox provider starts a box, runs commands in it, copies files in and out, stops it and leaves nothing
behind: `local` on this machine's sandbox, `container` through a stand-in for podman's command line (podman's
runtimes cannot run on this machine: crun cannot set rlimits, runc cannot mount cgroups), and one registered from
outside the package. What a box's code leaves (links to host files, processes, files outside its folders) never
reaches the host."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from toolrl.errors import ConfigError
from toolrl.sandbox import BoxSpec, make_provider

FAKE = Path(__file__).parents[1] / "fixtures" / "fake_container.py"
needs_isolation = pytest.mark.skipif(shutil.which("bwrap") is None and shutil.which("unshare") is None,
                                     reason="no sandbox on this machine")  # fmt: skip


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def fake_container(tmp_path, monkeypatch):
    """The container provider's options with the stand-in as its program; its state folder."""
    state = tmp_path / "state"
    program = tmp_path / "podman"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    program.chmod(0o755)
    monkeypatch.setenv("FAKE_CONTAINER_STATE", str(state))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2] / "src"))
    return {"provider": "container", "program": str(program)}, state


def providers(fake_container) -> list[dict]:
    return [{"provider": "local"}, fake_container[0]]


async def round_trip(provider, tmp_path: Path) -> None:
    source = tmp_path / "in"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("alpha\n")
    (source / "sub" / "b.txt").write_text("beta\n")
    box = await provider.start(BoxSpec(timeout_s=20, image="debian:12-slim"))  # local: the host's programs
    try:
        ran = await box.exec("pwd; echo made > here.txt; cat here.txt")
        assert ran.ok and ran.output.split() == ["/app", "made"], ran
        await box.put(source, "/tests")
        seen = await box.exec("cat /tests/a.txt /tests/sub/b.txt; exit 3")
        assert seen.status == 3 and seen.output.split() == ["alpha", "beta"], seen
        out = await box.get("/app", tmp_path / "out")
        assert [p.name for p in out.files] == ["here.txt"] and not out.refused
        assert (tmp_path / "out" / "here.txt").read_text() == "made\n"
        slow = await box.exec("sleep 30", timeout_s=1)
        assert slow.status is None  # stopped at its limit
    finally:
        await box.stop()


@needs_isolation
@pytest.mark.parametrize("which", ["local", "local-unshare", "container"])
def test_a_provider_starts_runs_copies_stops_and_leaves_nothing(which, fake_container, tmp_path):
    if which == "local-unshare" and shutil.which("unshare") is None:
        pytest.skip("no util-linux unshare here")
    options = {"local": {"provider": "local"}, "local-unshare": {"provider": "local", "isolation": "unshare"},
               "container": fake_container[0]}[which]  # fmt: skip
    provider = make_provider(options)
    try:
        run(round_trip(provider, tmp_path))
        assert provider.leftovers() == []
    finally:
        provider.close()
    if which == "container":
        assert not list((fake_container[1] / "boxes").iterdir())


@needs_isolation
def test_the_container_provider_asks_for_a_bounded_box_without_network(fake_container, tmp_path):
    options, state = fake_container
    provider = make_provider(options)
    build = tmp_path / "env"
    build.mkdir()
    (build / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")

    async def two():
        spec = BoxSpec(build=build, memory_mb=300, max_processes=40, cpus=0.5)
        boxes = [await provider.start(spec) for _ in range(2)]
        await boxes[0].exec("true", timeout_s=7)
        for box in boxes:
            await box.stop()

    try:
        run(two())
    finally:
        provider.close()
    calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
    builds = [c for c in calls if c[0] == "build"]
    runs = [c for c in calls if c[0] == "run"]
    assert len(builds) == 1 and builds[0][-1] == str(build)  # built once for both boxes
    flags = runs[0]
    for pair in (["--network", "none"], ["--memory", "300m"], ["--pids-limit", "40"], ["--cpus", "0.5"]):
        assert flags[flags.index(pair[0]) + 1] == pair[1], flags
    assert flags[-3:] == [builds[0][builds[0].index("-t") + 1], "sleep", "infinity"]
    timed = [c for c in calls if c[0] == "exec" and "true" in c]
    assert timed[0][-7:] == ["timeout", "-s", "KILL", "7", "bash", "-c", "true"]  # killed inside at its limit
    assert sum(c[0] == "rm" for c in calls) >= 2


@needs_isolation
@pytest.mark.parametrize("which", ["local", "container"])
def test_a_box_closes_from_synchronous_code_inside_a_running_loop(which, fake_container):
    """An episode closes its box from synchronous code called on the rollout's loop: every provider's box can (the
    container box had no way to but asyncio.run, which a running loop refuses)."""
    provider = make_provider({"local": {"provider": "local"}, "container": fake_container[0]}[which])

    async def start_and_close():
        box = await provider.start(BoxSpec(image="debian:12-slim"))
        box.close()

    try:
        run(start_and_close())
        assert provider.leftovers() == []
    finally:
        provider.close()


def test_a_missing_container_program_is_one_line_naming_the_option():
    with pytest.raises(ConfigError, match=r"env.options.sandbox.program: no-such-podman is not installed"):
        make_provider({"provider": "container", "program": "no-such-podman"})


def test_unknown_providers_and_options_are_refused():
    with pytest.raises(ConfigError, match="sandbox provider 'nope'"):
        make_provider({"provider": "nope"})
    with pytest.raises(ConfigError, match="isolation"):
        make_provider({"provider": "local", "isolation": "chroot"})
    with pytest.raises(ConfigError, match="absolute paths below /"):
        BoxSpec(workdir="/app/../etc")


@needs_isolation
def test_what_a_box_leaves_never_reaches_the_host(tmp_path):
    """Links to host files are refused on the way out, background processes die with their command, the host's
    folders are read-only, and there is no network."""
    provider = make_provider({"provider": "local"})

    async def attack():
        box = await provider.start(BoxSpec(timeout_s=20))
        try:
            planted = await box.exec(
                "ln -s /etc/passwd leak; ln -s / root; mkdir -p /logs/verifier; "
                "ln -s /etc/hostname /logs/verifier/reward.txt;"
                "(setsid sleep 300 &) ; nohup sleep 301 >/dev/null 2>&1 & echo planted"
            )
            assert planted.ok, planted
            out = await box.get("/app", tmp_path / "out")
            assert sorted(r.split(":")[0] for r in out.refused) == ["./leak", "./root"]
            assert not any((tmp_path / "out").iterdir())
            verdict = await box.get("/logs/verifier", tmp_path / "verdict")
            assert verdict.files == [] and verdict.refused
            still = await box.exec("ps -e -o comm= | grep -c sleep || true")
            assert still.output.strip() == "0"  # the planted processes died with their command
            host = await box.exec("touch /usr/evil; touch /etc/evil; echo x > /evil", cwd="/app")
            assert not host.ok and not Path("/usr/evil").exists() and not Path("/etc/evil").exists()
            net = await box.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\"")
            assert not net.ok and ("unreachable" in net.output or "Network" in net.output or "Errno" in net.output)
        finally:
            await box.stop()

    try:
        run(attack())
        assert provider.leftovers() == []
        assert not [pid for pid in _sleepers() if pid]  # nothing of the box runs on the host
    finally:
        provider.close()


def _sleepers() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd[:2] in ([b"sleep", b"300"], [b"sleep", b"301"]):
                found.append(int(entry.name))
    return found


@needs_isolation
def test_a_provider_of_ones_own_registers_from_outside_the_package():
    from tests.fixtures import own_provider

    provider = make_provider({"provider": "tracing", "tag": "mine"})

    async def use():
        box = await provider.start(BoxSpec())
        try:
            return await box.exec("echo hi")
        finally:
            await box.stop()

    try:
        assert run(use()).output.strip() == "hi"
    finally:
        provider.close()
    assert own_provider.CALLS["start"] == 1 and own_provider.CALLS["exec"] == 1 and own_provider.CALLS["close"] == 1
    assert os.getpid()  # the provider's options were validated by its own model:
    with pytest.raises(ConfigError, match="tag"):
        make_provider({"provider": "tracing", "tag": 3})
