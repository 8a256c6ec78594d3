"""The code environment: the sandbox is a boundary (escape attempts, for every isolation this machine has), its
limits do what the docs say, a fresh folder per call that the host never reads or writes by path, and the
rewards (answer, and verification by running the model's code again)."""

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.envs.code.sandbox import Sandbox, SandboxLimits, run_python
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools import ToolExecutor
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.limits import ToolFailed


@pytest.fixture
def sandbox():
    box = Sandbox(SandboxLimits(timeout_s=1.0, memory_mb=256, max_output_chars=100, max_file_mb=1))
    yield box
    box.close()


def test_each_call_runs_in_an_empty_capped_folder_with_an_empty_environment(sandbox):
    out = run_python("import os; print(os.getcwd(), os.getuid() != 0); print(sorted(os.environ))", sandbox)
    assert out.splitlines() == ["/sandbox True", "['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']"]
    assert sandbox.isolation in {"bubblewrap", "unshare"}  # make install-test installs bubblewrap where it can
    assert run_python("open('note.txt', 'w').write('hi'); import os; print(os.listdir())", sandbox) == "['note.txt']"
    assert run_python("import os; print(os.listdir())", sandbox) == "[]"  # the next call starts empty
    assert run_python("import sys; print(repr(sys.stdin.read()))", sandbox) == "''"  # the program is not stdin


def _host_file(tmp_path: Path) -> Path:
    """A root-owned host file the sandboxed code must never have read or written for it."""
    target = tmp_path / "shadow"
    target.write_text("host secret")
    target.chmod(0o600)
    return target


@pytest.mark.parametrize("isolation", ["bubblewrap", "unshare", "none"])
def test_the_host_follows_nothing_the_code_leaves_in_its_folder(isolation, tmp_path):
    """The issue's attacks: .output as a symlink to a root-owned file came back as the tool result; main.py as
    one got that file overwritten by the next call; .output as /dev/zero or a FIFO stalled a host thread."""
    target = _host_file(tmp_path)
    box = Sandbox(SandboxLimits(timeout_s=10.0, isolation=isolation))
    try:
        traps = (
            "import os\n"
            f"for name in ('.output', 'main.py', 'output'):\n    os.symlink({str(target)!r}, name)\n"
            "os.symlink('/dev/zero', 'zero')\nos.mkfifo('fifo')\nprint('set')"
        )
        assert run_python(traps, box) == "set"
        for _ in range(2):
            started = time.monotonic()
            assert run_python("print('next')", box) == "next"
            assert time.monotonic() - started < 8.0  # not stalled until the deadline
        assert target.read_text() == "host secret"
    finally:
        box.close()


def test_output_is_read_through_a_pipe_within_the_deadline_and_the_output_limit():
    box = Sandbox(SandboxLimits(timeout_s=3.0, max_output_chars=100, max_file_mb=1))
    try:
        started = time.monotonic()
        with pytest.raises(ToolFailed, match=r"wrote past its limits and was stopped:[\s\S]*output past 1 MB"):
            run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", box)
        assert time.monotonic() - started < 3.0
        status, text = box.run("import os, time\nprint('a', flush=True)\nos.close(1)\ntime.sleep(60)")
        assert status is None and text.strip() == "a"  # a program that closes its output still has a deadline
    finally:
        box.close()


def test_a_large_program_goes_in_whole_through_the_pipe(sandbox):
    code = "x = 0\n" + "x += 1\n" * 50_000 + "print(x)"  # 350 kB, several pipe buffers
    assert run_python(code, sandbox) == "50000"


def test_disk_is_capped_per_call():
    box = Sandbox(SandboxLimits(timeout_s=5.0, max_file_mb=4, disk_mb=8))
    try:
        fill = (
            "n = 0\ntry:\n    while True:\n        open(f'f{n}', 'wb').write(b'0' * 2**20)\n        n += 1\n"
            "except OSError as e:\n    print(n, e.strerror)"
        )
        assert run_python(fill, box) == "8 No space left on device"
        assert run_python(fill, box) == "8 No space left on device"  # each call gets the whole folder again
    finally:
        box.close()


def test_the_interpreter_path_is_normalized(monkeypatch):
    """Started as bench/../.venv/bin/python, the sandbox has no bench/ to walk through."""
    from toolrl.envs.code import sandbox as module

    assert ".." not in Path(module.PYTHON).parts and Path(module.PYTHON).is_absolute()
    assert os.path.samefile(module.PYTHON, sys.executable)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("while True: pass", "the code used more than 1 s of CPU|the code ran longer than 1 s"),
        ("import time; time.sleep(30)", "the code ran longer than 1 s and was stopped"),
        ("x = bytearray(2 * 1024**3)", "MemoryError"),
        ("open('big', 'wb').write(b'0' * 3 * 2**20)", "File too large"),
        ("import os\nfor _ in range(200):\n    os.fork()", "exit|Resource temporarily unavailable|ran longer"),
        ("1 / 0", "ZeroDivisionError: division by zero"),
    ],
)
def test_limits(sandbox, code, message):
    with pytest.raises(ToolFailed, match=message):
        run_python(code, sandbox)


@pytest.mark.parametrize("isolation", ["bubblewrap", "unshare", "none"])
def test_a_signal_that_ends_the_code_is_named_in_every_isolation(isolation):
    """CI saw `while True: pass` end as "the code failed (exit 152)": bwrap reports a child that SIGXCPU killed
    as 128 + 24. Under unshare the code was the PID namespace's init, which ignores SIGXCPU (so the CPU limit
    waited for the hard limit's SIGKILL) and any signal the code sent itself without a handler."""
    box = Sandbox(SandboxLimits(timeout_s=5.0, isolation=isolation))
    kill = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.{})\nprint('after')"
    try:
        with pytest.raises(ToolFailed, match=r"^the code used more than 5 s of CPU and was stopped$"):
            run_python(kill.format("SIGXCPU"), box)
        with pytest.raises(ToolFailed, match=r"^the code was killed by SIGTERM:\nbefore$"):
            run_python(kill.format("SIGTERM"), box)
        with pytest.raises(ToolFailed, match=r"^the code was killed by signal 40:\nbefore$"):
            run_python(kill.format("SIGRTMIN + 6"), box)
        with pytest.raises(ToolFailed, match=r"^the code failed \(exit 3\)$"):
            run_python("import sys; sys.exit(3)", box)
        assert box.run("import sys; sys.exit(0)") == (0, "")
        if isolation != "none":  # the code is not the namespace's init: it is not pid 1, and its orphans are reaped
            assert run_python("import os; print(os.getpid() > 1)", box) == "True"
    finally:
        box.close()


def test_a_failure_shows_the_traceback_of_the_code_itself():
    box = Sandbox(SandboxLimits())
    try:
        with pytest.raises(ToolFailed) as info:
            run_python("x = 1\ny = x / 0", box)
        message = str(info.value)
        assert message.startswith(
            'the code failed (exit 1):\nTraceback (most recent call last):\n  File "main.py", line 2'
        )
        assert message.endswith("ZeroDivisionError: division by zero") and "<string>" not in message
    finally:
        box.close()


def test_output_is_cut_and_network_is_blocked(sandbox):
    out = run_python("print('a' * 500 + 'b' * 500)", sandbox)
    assert out == "a" * 50 + "\n... [901 characters cut] ...\n" + "b" * 49  # head and tail (then stripped)
    with pytest.raises(ToolFailed, match=r"Network is unreachable"):  # no interface but (its own) loopback
        run_python("import socket; socket.create_connection(('10.255.255.1', 80), timeout=1)", sandbox)


def test_episodes_get_their_own_sandbox_and_rewards_verify_by_running_again():
    env = make_env(EnvConfig(name="code", options={"num_train": 5, "num_test": 5, "timeout_s": 2}))
    task = env.tasks("test")[0]
    executor = ToolExecutor(env.tools())
    one, two = env.reset(task), env.reset(task)
    assert one.sandbox is not two.sandbox
    step = asyncio.run(one.step([ToolCall("python", {"code": f"print({task.answer})"})], executor))
    assert step.observations[0].content == task.answer
    one.close()
    two.close()

    traj = Trajectory.start(task, [1])
    traj.results = [ToolResult(ToolCall("python", {"code": f"print({task.answer})"}), task.answer)]
    traj.add_model_turn([2], [0.0], f"<answer>{task.answer}</answer>")
    lying = Trajectory.start(task, [1])  # claims a result its code does not print
    lying.results = [ToolResult(ToolCall("python", {"code": "print(1)"}), task.answer)]
    lying.add_model_turn([2], [0.0], f"<answer>{task.answer}</answer>")
    asyncio.run(env.rubric.score_all([traj, lying]))
    assert traj.rewards["correct"] == 1.0 and traj.rewards["verified"] == 1.0 and traj.rewards["ran_code"] == 1.0
    assert lying.rewards["correct"] == 1.0 and lying.rewards["verified"] == 0.0


def test_generated_questions_have_the_right_answers():
    env = make_env(EnvConfig(name="code", seed=3, options={"num_train": 10, "num_test": 10}))
    box = Sandbox(SandboxLimits())
    try:
        for task in env.tasks("test"):
            if task.question.startswith("What is the sum of all prime numbers below"):
                n = int(task.question.rsplit(" ", 1)[1].rstrip("?"))
                code = f"print(sum(p for p in range(2, {n}) if all(p % d for d in range(2, int(p**0.5) + 1))))"
                assert run_python(code, box) == task.answer
    finally:
        box.close()


def test_the_reference_computes_each_answer_rather_than_printing_it():
    """The warm start learns the reference's programs: each kind of question's program, run in the sandbox,
    prints the task's value, and none has the value written into it (a reference that printed the value taught
    the default model to print a number it made up: 0% greedy after training)."""
    env = make_env(EnvConfig(name="code", seed=5, options={"num_train": 16, "num_test": 1}))
    box = Sandbox(SandboxLimits(timeout_s=10))
    try:
        tasks = env.tasks("train")
        assert len({re.sub(r"\d+", "N", t.question) for t in tasks}) == 8  # every kind of question
        for task in tasks:
            ((call,),) = env.reference(task)[0].rounds
            assert task.answer not in call.arguments["code"], task.question
            assert run_python(call.arguments["code"], box) == task.answer, task.question
    finally:
        box.close()


sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from sandbox_escapes import ATTEMPTS, probe  # noqa: E402  (bench/sandbox_probe.py runs the same attempts)


@pytest.mark.parametrize("attempt", ATTEMPTS)
@pytest.mark.parametrize("isolation", ["bubblewrap", "unshare"])
def test_escape_attempt_fails(isolation, attempt):
    """Each escape class, checked from outside (see bench/sandbox_escapes.py): reads and writes on the host,
    the network by every API, UDP, DNS, abstract unix sockets, processes left behind, host processes killed,
    traced or read, links and FIFOs the host might follow on the next call, devices, and the limits (processes,
    threads, fork bombs, memory, file size, disk). No host call may overrun its deadline by more than 1 s."""
    [result] = probe(isolation, timeout_s=2.0, only={attempt})
    assert not result.escaped, result.detail
    assert result.seconds <= 3.0


def test_memory_held_across_processes_stopped_at_its_deadline_before_holding_is_no_escape():
    """CI (load 5 on 2 cores): six interpreters had not all started when the 2 s deadline stopped the call, nothing
    was printed and no memory event counted, and the probe called it an escape. Stopped at its deadline (here 50 ms,
    before any child starts) without a memory event, the bound was never passed."""
    [result] = probe(
        "bubblewrap", timeout_s=0.05, only={"allocate past the memory limit across processes (6 x 400 MB at 512 MB)"}
    )
    assert not result.escaped and "deadline" in result.detail, result


def test_without_isolation_the_code_environment_refuses_to_start_unless_told_none(monkeypatch, tmp_path, caplog):
    from toolrl.envs.code import sandbox
    from toolrl.errors import ConfigError

    monkeypatch.setattr(sandbox, "_probes", {})
    monkeypatch.setenv("PATH", str(tmp_path))  # neither bwrap nor unshare to be found
    with pytest.raises(ConfigError) as err:
        make_env(EnvConfig(name="code", options={"num_train": 2, "num_test": 2}))
    message = str(err.value)
    assert message.startswith("env.options.isolation: no sandbox for model code on this machine (bwrap is not")
    assert "apt install bubblewrap" in message and "env.options.isolation: none (unsafe)" in message
    env = make_env(EnvConfig(name="code", options={"num_train": 2, "num_test": 2, "isolation": "none"}))
    assert env.limits.isolation == "none" and "model code runs unisolated" in caplog.text


def test_bounded_output_keeps_head_and_tail_of_what_it_cannot_hold():
    from toolrl.envs.code.sandbox import BoundedOutput

    out = BoundedOutput(cap=10, limit=10**9)
    for _ in range(200):
        out.add(b"a" * 1000)
    out.add(b"z" * 7)
    assert out.total == 200_007 and len(out.head) + len(out.tail) <= 2 * out.keep
    assert out.text() == "aaaaa\n... [199997 bytes cut] ...\nzzzzz"
    assert not out.over_limit
    capped = BoundedOutput(cap=10, limit=2**20)
    capped.add(b"x" * (2**20 + 1))
    assert capped.over_limit and capped.text().endswith("\n[output past 1 MB: the program was stopped]")
