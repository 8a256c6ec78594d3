"""Harbor's verification of a box: the task's tests run in it after the agent, and the reward they wrote read back.

`verify` is one box command (VERIFY); `HarborVerifier` runs it once per episode of a batch, concurrently, and is
read by the environment's three criteria (reward, success, verified). A harness's run (env.options.agent) was
verified by the environment before its box stopped: its outcome carries the verdict.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import tarfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.envs.agent.env import AgentOutcome
from toolrl.envs.harbor.task import HarborTask
from toolrl.sandbox import Box
from toolrl.text import clip

log = logging.getLogger(__name__)


@dataclass
class Verdict:
    reward: float = 0.0
    error: str | None = None
    """Why no reward was read (the box did not start, the tests timed out or wrote none)."""
    seconds: float = 0.0


VERIFY = """
export LC_ALL=C
rm -rf /logs/verifier /tests/* /tests/.[!.]* 2>/dev/null
tar -x --no-same-owner -C / || exit 91
cd "$1" || exit 92
bash /tests/test.sh < /dev/null > /tmp/.toolrl-test-output 2>&1
printf 'exit %s\\n' "$?"
for name in reward.txt reward.json; do
  [ -f "/logs/verifier/$name" ] || continue
  IFS= read -r -d '' -N 65536 text < "/logs/verifier/$name"
  printf '%s %s\\n%s\\n' "$name" "${#text}" "$text"
done
"""
"""One command per verification, and few programs in it (each costs ~1 ms here, and a rollout verifies its whole
batch at once): the verifier's folders emptied (what the agent left there does not count), the tests and an empty
/logs/verifier unpacked from stdin, test.sh run, and its exit code and reward files printed, length-prefixed (read
inside the box: the host opens no path the box's code could have made a link). Past the verifier's timeout the
whole command is killed with everything it started."""


@functools.cache
def tests_stream(tests: Path) -> bytes:
    """The tar stream `VERIFY` unpacks at /: tests/... and an empty logs/verifier/ (made once per task)."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for name in ("logs", "logs/verifier"):
            folder = tarfile.TarInfo(name)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(folder)
        tar.add(tests, arcname="tests")  # links stay links
    return stream.getvalue()


def read_printed(data: bytes) -> tuple[str, dict[str, str]]:
    """(test.sh's exit code, {reward file name: its text}) from what VERIFY printed."""
    text = data.decode("utf-8", errors="replace")
    code, _, rest = text.partition("\n")
    files = {}
    while rest:
        header, _, rest = rest.partition("\n")
        name, _, length = header.partition(" ")
        if name not in ("reward.txt", "reward.json") or not length.isdigit():
            break
        files[name], rest = rest[: int(length)], rest[int(length) + 1 :]
    return code.removeprefix("exit "), files


async def verify(box: Box, task: HarborTask) -> Verdict:
    """Run the task's tests in `box` as Harbor does and read the reward they wrote."""
    started = time.perf_counter()
    timeout = task.verifier_timeout_s
    status, data = await box.run_raw(["bash", "-c", VERIFY, "verify", task.workdir], tests_stream(task.tests), timeout)
    if status is None:
        return Verdict(error=f"tests ran past [verifier] timeout_sec ({timeout:g} s)")
    if status != 0:
        return Verdict(error=f"the box could not run its tests (exit {status})")
    code, files = read_printed(data)
    try:
        if "reward.txt" in files:
            reward = float(files["reward.txt"].strip())
        elif "reward.json" in files:
            reward = float(json.loads(files["reward.json"])["reward"])
        else:
            return Verdict(error=f"the tests wrote no /logs/verifier/reward.txt (exit {code}){await _tail(box)}")
    except (ValueError, KeyError, TypeError) as exc:
        return Verdict(error=f"the tests' reward file does not hold a number: {clip(str(exc), 100)}")
    return Verdict(reward, None, time.perf_counter() - started)


async def _tail(box: Box) -> str:
    """The end of test.sh's output, for the log line of a verification that read no reward."""
    shown = await box.exec(["tail", "-c", "300", "/tmp/.toolrl-test-output"])
    lines = shown.output.strip().splitlines()
    return f"; its output ends: {clip(lines[-1], 200)}" if shown.ok and lines else ""


class HarborVerifier:
    """Verifies a batch of episodes' boxes concurrently, once each; the rubric's three criteria read its verdicts
    (`part`: reward, success or verified)."""

    def __init__(self, success_at: float, part: str = "reward", shared: HarborVerifier | None = None):
        self.success_at, self.part = success_at, part
        self.running: dict[int, asyncio.Future] = shared.running if shared is not None else {}
        self.stats: Counter[str] = Counter()
        """The reward criterion's counts (its views keep none), as reward/NAME metrics: verify_errors, and what a
        harness run through the gateway adds (rollout/agent.py: requests, segments, agent_failures)."""

    def view(self, part: str) -> HarborVerifier:
        return HarborVerifier(self.success_at, part, self)

    async def _verify(self, episode: Any) -> Verdict:  # a HarborEpisode (env.py imports this module)
        if episode.box is None:
            verdict = Verdict(error="the task's box did not start")
        else:
            try:
                verdict = await verify(episode.box, episode.harbor)
            except (OSError, RuntimeError) as exc:
                verdict = Verdict(error=f"verifying failed: {exc}")
        if verdict.error:
            log.warning("env harbor: task %s: %s", episode.harbor.name, verdict.error)
            self.stats["verify_errors"] += 1
        episode.verdict = verdict
        return verdict

    async def verdict(self, traj) -> Verdict:
        episode = traj.episode
        if isinstance(episode, AgentOutcome):  # a harness's run (run_agent verified its box)
            if episode.error is not None or not isinstance(episode.result, dict):
                return Verdict(error=episode.error or "the harness gave no verdict")
            return Verdict(float(episode.result.get("reward", 0.0)), episode.result.get("verify_error"))
        if not hasattr(episode, "harbor"):
            return Verdict(error="no Harbor episode")
        if episode.verdict is not None:
            return episode.verdict
        key = id(episode)
        if key not in self.running:
            self.running[key] = asyncio.ensure_future(self._verify(episode))
        try:
            return await self.running[key]
        finally:
            self.running.pop(key, None)

    def _value(self, verdict: Verdict) -> float:
        if self.part == "verified":
            return float(verdict.error is None)
        if self.part == "success":
            return float(verdict.error is None and verdict.reward >= self.success_at)
        return verdict.reward

    async def score_batch(self, trajs) -> list[float]:
        return [self._value(v) for v in await asyncio.gather(*(self.verdict(t) for t in trajs))]
