"""Harbor's task format, read: a folder per task with

    task.toml           [verifier] timeout_sec, [agent] timeout_sec, [environment] cpus, memory_mb (or memory = "2G"),
                        docker_image (a prebuilt image), allow_internet; [metadata] anything (category is used)
    instruction.md      what the agent is told
    environment/        Dockerfile and its build folder: the box the agent works in
    tests/test.sh       run after the agent (tests/ uploaded to /tests); writes /logs/verifier/reward.txt (a number)
                        or reward.json ({"reward": number, ...})
    solution/solve.sh   the reference (optional)

A folder that is not a task (no task.toml) is skipped and named in the log; a task folder that lacks a part, or a
task.toml that does not parse, is a one-line error naming the file.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from toolrl.errors import ConfigError
from toolrl.sandbox.dockerfile import parse

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).with_name("tasks")
"""toolrl's own fixture tasks (text processing, small scripts, failing unit tests to fix)."""
DEFAULT_WORKDIR = "/app"


@dataclass(frozen=True)
class HarborTask:
    name: str
    folder: Path
    instruction: str
    category: str
    verifier_timeout_s: float
    agent_timeout_s: float
    memory_mb: int
    cpus: float
    network: bool
    image: str | None
    """[environment] docker_image: a prebuilt image (container providers); else the Dockerfile is built."""
    workdir: str

    @property
    def build(self) -> Path | None:
        folder = self.folder / "environment"
        return folder if (folder / "Dockerfile").is_file() else None

    @property
    def tests(self) -> Path:
        return self.folder / "tests"

    @property
    def solve(self) -> Path:
        return self.folder / "solution" / "solve.sh"


def _megabytes(value: Any, where: str) -> int:
    if isinstance(value, int | float):
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ConfigError(f"{where}: {value!r} is no size; write 512M, 2G or a number of MB")
    scale = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}[match[2].lower()]
    return max(1, int(float(match[1]) * scale))


def load_task(folder: Path) -> HarborTask:
    toml = folder / "task.toml"
    try:
        config = tomllib.loads(toml.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{toml}: {exc}; a Harbor task needs a task.toml that parses") from None
    for part in ("instruction.md", "tests/test.sh"):
        if not (folder / part).is_file():
            raise ConfigError(f"{folder / part}: missing; a Harbor task has instruction.md and tests/test.sh")
    environment, verifier, agent = (config.get(k, {}) for k in ("environment", "verifier", "agent"))
    memory = environment.get("memory_mb", environment.get("memory", 1024))
    dockerfile = folder / "environment" / "Dockerfile"
    workdir = DEFAULT_WORKDIR
    if dockerfile.is_file():
        found = parse(dockerfile).workdir
        workdir = found if found != "/" else DEFAULT_WORKDIR
    elif not environment.get("docker_image"):
        raise ConfigError(f"{dockerfile}: missing; a Harbor task has environment/Dockerfile or a docker_image")
    return HarborTask(
        name=config.get("task", {}).get("name") or folder.name,
        folder=folder,
        instruction=(folder / "instruction.md").read_text(encoding="utf-8").strip(),
        category=str(config.get("metadata", {}).get("category", "")),
        verifier_timeout_s=float(verifier.get("timeout_sec", 120.0)),
        agent_timeout_s=float(agent.get("timeout_sec", 600.0)),
        memory_mb=_megabytes(memory, f"{toml}: [environment] memory"),
        cpus=float(environment.get("cpus", 1)),
        network=bool(environment.get("allow_internet", False)),
        image=environment.get("docker_image"),
        workdir=workdir,
    )


def load_tasks(path: Path) -> list[HarborTask]:
    """The tasks of a dataset folder (one task folder each, sorted by name), or of one task folder."""
    if not path.is_dir():
        raise ConfigError(f"env.options.path: {path} is not a folder of Harbor tasks")
    if (path / "task.toml").is_file():
        return [load_task(path)]
    tasks, skipped = [], []
    for folder in sorted(p for p in path.iterdir() if p.is_dir()):
        if (folder / "task.toml").is_file():
            tasks.append(load_task(folder))
        else:
            skipped.append(folder.name)
    if skipped:
        log.info("env harbor: %d folder(s) of %s are no tasks (no task.toml): %s", len(skipped), path,
                 ", ".join(skipped[:5]))  # fmt: skip
    if not tasks:
        raise ConfigError(f"env.options.path: {path} holds no Harbor task (a folder with task.toml)")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ConfigError(f"env.options.path: two tasks in {path} are named the same")
    return tasks
