"""The harbor environment: Harbor task folders played in sandbox boxes, verified by their own tests. The shipped
fixture tasks check 100% by their reference and 0% idle; a task folder written outside the package (a Dockerfile
with COPY, RUN and ENV) plays the same way, also through a provider of one's own; what an agent leaves in the
verifier's folders does not count; broken folders are one line naming the file."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs.base import make_env
from toolrl.envs.harbor.env import HarborEpisode, verify
from toolrl.errors import ConfigError

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and shutil.which("unshare") is None,
                                reason="no sandbox on this machine")  # fmt: skip


def toolrl(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)  # fmt: skip


def write_task(root: Path, name: str = "shout", test_sh: str | None = None) -> Path:
    """A task written as a user would: its Dockerfile copies a file, runs a command and sets a variable."""
    task = root / name
    (task / "environment" / "files").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[metadata]\ncategory = "custom"\n[verifier]\ntimeout_sec = 5\n'
                                    '[environment]\nmemory = "256M"\n')  # fmt: skip
    (task / "instruction.md").write_text("Write the word in /work/word.txt, upper-cased, to /work/out.txt.\n")
    (task / "environment" / "files" / "word.txt").write_text("harbor\n")
    (task / "environment" / "Dockerfile").write_text(
        textwrap.dedent("""\
        FROM debian:12-slim
        WORKDIR /work
        ENV GREETING=hello
        COPY files/word.txt /work/
        RUN echo "$GREETING" > /work/built.txt && \\
            chmod 600 /work/built.txt
        CMD ["bash"]
        """)
    )
    (task / "tests" / "test.sh").write_text(
        test_sh
        or textwrap.dedent("""\
        #!/bin/bash
        mkdir -p /logs/verifier
        if [ "$(cat /work/out.txt)" = HARBOR ] && [ "$(cat /work/built.txt)" = hello ]; then
          echo '{"reward": 1.0}' > /logs/verifier/reward.json
        else
          echo '{"reward": 0.0}' > /logs/verifier/reward.json
        fi
        """)
    )
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntr a-z A-Z < /work/word.txt > /work/out.txt\n")
    return task


def test_the_shipped_tasks_check_full_by_reference_and_empty_idle():
    checked = toolrl("env", "check", "--set", "env.name=harbor", "--json")
    assert checked.returncode == 0, checked.stderr[-2000:]
    result = json.loads(checked.stdout)
    reference, idle = result["policies"]
    assert reference["tasks"] >= 12 and reference["success"] == 1.0 and idle["success"] == 0.0


def test_a_task_folder_of_ones_own_plays_through_a_provider_of_ones_own(tmp_path):
    write_task(tmp_path)
    (tmp_path / "notes").mkdir()  # not a task: skipped and logged
    checked = toolrl("env", "check", "--set", "env.name=harbor", "--set", f"env.options.path={tmp_path}",
                     "--set", "plugins=[tests.fixtures.own_provider]",
                     "--set", "env.options.sandbox={provider: tracing, tag: mine}", "--json")  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-2000:]
    reference, idle = json.loads(checked.stdout)["policies"]
    assert (reference["tasks"], reference["success"], idle["success"]) == (1, 1.0, 0.0)


def episode(env, name: str) -> HarborEpisode:
    task = next(t for t in env.tasks("train") if t.id == name)
    return env.reset(task)


def test_what_the_agent_leaves_for_the_verifier_does_not_count(tmp_path):
    """An agent that writes a passing reward file, plants a link there to a host file, or replaces the tests,
    gets what the task's own tests say: 0."""
    env = make_env(EnvConfig(name="harbor", options={"path": str(write_task(tmp_path))}))

    async def play():
        ep = episode(env, "shout")
        await ep.open()
        try:
            cheat = ("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
                     "echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
                     "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh")  # fmt: skip
            assert (await ep.box.exec(cheat)).ok
            return await verify(ep.box, ep.harbor)
        finally:
            ep.close()

    try:
        verdict = asyncio.run(play())
    finally:
        env.close()
    assert verdict.error is None and verdict.reward == 0.0


@pytest.mark.parametrize(
    ("test_sh", "error"),
    [
        ("#!/bin/bash\nsleep 60\n", "tests ran past [verifier] timeout_sec (5 s)"),
        ("#!/bin/bash\necho no reward\n", "the tests wrote no /logs/verifier/reward.txt (exit 0)"),
        ("#!/bin/bash\nmkdir -p /logs/verifier; echo lots > /logs/verifier/reward.txt\n", "does not hold a number"),
    ],
)
def test_tests_that_hang_or_write_no_reward_are_counted_never_passed(tmp_path, test_sh, error):
    env = make_env(EnvConfig(name="harbor", options={"path": str(write_task(tmp_path, test_sh=test_sh))}))

    async def play():
        ep = episode(env, "shout")
        await ep.open()

        class Traj:
            episode, task = ep, None

        try:
            return [await c.fn.score_batch([Traj]) for c in env.rubric.criteria], ep.verdict
        finally:
            ep.close()

    try:
        (reward, success, verified), verdict = asyncio.run(play())
    finally:
        env.close()
    assert (reward, success, verified) == ([0.0], [0.0], [0.0]) and error in verdict.error


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda t: (t / "task.toml").write_text("version = [\n"), "task.toml: "),
        (lambda t: (t / "instruction.md").unlink(), "instruction.md: missing"),
        (
            lambda t: (t / "environment" / "Dockerfile").write_text("FROM x\nFROBNICATE y\n"),
            "Dockerfile:2: unknown instruction 'FROBNICATE'",
        ),
        (
            lambda t: (t / "environment" / "Dockerfile").write_text("FROM x\nCOPY --from=build /a /b\n"),
            "Dockerfile:2: COPY",
        ),
        (
            lambda t: (t / "environment" / "Dockerfile").write_text("FROM x\nWORKDIR /app\nRUN exit 7\n"),
            "Dockerfile:3: RUN failed in a local box (exit 7)",
        ),
    ],
)
def test_a_broken_task_folder_is_one_line_naming_the_file(tmp_path, break_it, message):
    task = write_task(tmp_path)
    break_it(task)
    checked = toolrl("env", "check", "--set", "env.name=harbor", "--set", f"env.options.path={tmp_path}")
    assert checked.returncode != 0
    assert message in checked.stderr, checked.stderr[-1500:]
    assert "Traceback" not in checked.stderr


def test_unknown_task_names_are_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"env.options.test_tasks: no task 'nope' in .*known: count-lines"):
        make_env(EnvConfig(name="harbor", options={"test_tasks": ["nope"]}))


def test_the_harbor_recipe_warms_up_and_trains_two_steps_on_the_tiny_model(tiny_model_dir, tmp_path):
    """recipes/harbor.yaml: the warm start on the reference's bash calls, then two steps of the tool loop in boxes;
    every episode's box verified, none left behind."""
    run = tmp_path / "runs" / "run"
    done = toolrl("train", str(ROOT / "recipes" / "harbor.yaml"), "--set", f"model.name={tiny_model_dir}",
                  "--set", "device=cpu", "--set", f"output_dir={tmp_path / 'runs'}", "--set", "run_name=run",
                  "--set", "train.steps=2", "--set", "rollout.max_new_tokens=8", "--set", "eval.at_start=false",
                  "--set", "eval.at_end=false", "--set", "sft.num_tasks=4", "--set", "sft.keep=all")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    steps = [s for s in steps if "eval" not in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["reward/verified"] == 1.0 and not s.get("reward/verify_errors") for s in steps), steps[-1]
    assert (run / "final" / "model.safetensors").is_file()
