"""The code environment: the sandbox is a boundary (escape attempts, for every isolation this machine has), its
limits do what the docs say, per-trajectory directories, and the rewards (answer, and verification by running
the model's code again)."""

import asyncio

import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.envs.code.sandbox import Sandbox, SandboxLimits, run_python
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools import ToolExecutor
from toolrl.tools.call import ToolCall, ToolResult


@pytest.fixture
def sandbox():
    box = Sandbox(SandboxLimits(timeout_s=1.0, memory_mb=256, max_output_chars=100, max_file_mb=1))
    yield box
    box.close()


def test_runs_code_in_its_own_directory_with_an_empty_environment(sandbox):
    out = run_python("import os; print(os.getcwd()); print(sorted(os.environ))", sandbox)
    assert out.splitlines() == [str(sandbox.dir), "['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']"]
    assert sandbox.isolation in {"bubblewrap", "unshare"}  # make install-test installs bubblewrap where it can
    run_python("open('note.txt', 'w').write('hi')", sandbox)
    assert (sandbox.dir / "note.txt").read_text() == "hi"
    sandbox.close()
    assert not sandbox.dir.exists()


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("while True: pass", "the code used more than 1 s of CPU|the code ran longer than 1 s"),
        ("import time; time.sleep(30)", "the code ran longer than 1 s and was stopped"),
        ("x = bytearray(2 * 1024**3)", "MemoryError"),
        ("open('big', 'wb').write(b'0' * 3 * 2**20)", "File too large"),
        ("1 / 0", "ZeroDivisionError: division by zero"),
    ],
)
def test_limits(sandbox, code, message):
    with pytest.raises(ValueError, match=message):
        run_python(code, sandbox)


def test_a_failure_shows_the_traceback_of_the_code_itself():
    box = Sandbox(SandboxLimits())
    try:
        with pytest.raises(ValueError) as info:
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
    with pytest.raises(ValueError, match=r"Network is unreachable"):  # no interface but (its own) loopback
        run_python("import socket; socket.create_connection(('10.255.255.1', 80), timeout=1)", sandbox)


def test_episodes_get_their_own_sandbox_and_rewards_verify_by_running_again():
    env = make_env(EnvConfig(name="code", options={"num_train": 5, "num_test": 5, "timeout_s": 2}))
    task = env.tasks("test")[0]
    executor = ToolExecutor(env.tools())
    one, two = env.reset(task), env.reset(task)
    assert one.sandbox.dir != two.sandbox.dir
    step = asyncio.run(one.step([ToolCall("python", {"code": f"print({task.answer})"})], executor))
    assert step.observations[0].content == task.answer
    one.close()
    two.close()
    assert not one.sandbox.dir.exists()

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


@pytest.mark.parametrize("isolation", ["bubblewrap", "unshare"])
def test_escape_attempts_fail_in_every_isolation(isolation):
    """Each attempt the issue found open (home and /etc/passwd read, writes outside the folder, the network
    through _socket, bash's /dev/tcp, os.system, ctypes; processes left after the call; no process limit) is
    made, and checked from outside."""
    from toolrl.envs.code.escapes import probe

    attempts = probe(isolation, timeout_s=5)
    assert len(attempts) == 18
    assert [a.name for a in attempts if a.escaped] == [], [(a.name, a.detail) for a in attempts if a.escaped]


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
