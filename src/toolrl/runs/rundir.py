"""The run directory: resolved config, metrics.jsonl, sample trajectories, checkpoints written atomically."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolrl.config import RunConfig, config_to_yaml
from toolrl.errors import ConfigError
from toolrl.files import read_jsonl
from toolrl.runs.files import read_run_file
from toolrl.text import clip, clip_path

METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
EVALS = "evals.jsonl"
STOP_FILE = "STOP"
"""A file a run checks after each step: present, it checkpoints and stops (the UI's stop button)."""
STATUS = "status.json"
MAX_STATUS_BYTES = 1 << 20
RUN_OUTPUTS = (METRICS, SAMPLES, EVALS, "sft.jsonl", "last", "final")
"""What a run leaves in its directory once it has trained or evaluated anything."""


class RunDir:
    def __init__(self, path: Path):
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def create(cls, config: RunConfig) -> RunDir:
        """A new run's directory (output_dir/run_name). One that already holds a run's records or checkpoints is
        refused: the new run's metrics would be appended to the old run's and its checkpoints replace them."""
        name = config.run_name or time.strftime("%Y%m%d-%H%M%S") + f"-{config.env.name}"
        path = Path(config.output_dir) / name
        if held := [f for f in RUN_OUTPUTS if os.path.lexists(path / f)]:  # lexists: "last" is a symlink
            shown = clip_path(path, 200)  # a config's names are untrusted text: the line stays one line
            raise ConfigError(
                f"run_name {clip(repr(name), 120)}: {shown} already holds a run ({', '.join(held)}); set another "
                f"run_name (or output_dir), continue that run with `toolrl train --resume {shown}`, or move it away"
            )
        run = cls(path)
        (run.path / "config.yaml").write_text(config_to_yaml(config))
        return run

    @classmethod
    def existing(cls, path: Path) -> RunDir:
        if not (path / "config.yaml").is_file():
            raise ConfigError(f"{path}: not a run directory (no config.yaml); pass the folder `toolrl train` made")
        return cls(path)

    def append(self, filename: str, records: list[dict[str, Any]]) -> None:
        """Records as JSON lines at the end of `filename` (metrics.jsonl, samples, sft.jsonl)."""
        with open(self.path / filename, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        self.append(METRICS, [metrics])

    def log_samples(self, step: int, records: list[dict[str, Any]], filename: str = SAMPLES, **extra: Any) -> None:
        self.append(filename, [{"step": step, **extra, **r} for r in records])

    def size_of(self, filename: str) -> int:
        path = self.path / filename
        return path.stat().st_size if path.is_file() else 0

    def write_status(self, **fields: Any) -> None:
        """Update status.json (state: running, finished, failed or stopped; the step reached; the process),
        replaced atomically so that a reader never sees half of it."""
        status = self.read_status()
        if fields.get("state") == "running" and status.get("state") != "running":
            status = {
                "started_at": time.time(),
                "pid": os.getpid(),
                "pid_start": process_start(os.getpid()),
                "host": socket.gethostname(),
            }
        status |= fields | {"updated_at": time.time()}
        self.write_json(STATUS, status)

    def write_json(self, filename: str, value: Any) -> None:
        """`filename` replaced atomically with `value` as JSON, so that a reader (the UI) never sees half of it."""
        tmp = self.path / f".{filename}.tmp"
        tmp.write_text(json.dumps(value) + "\n")
        os.replace(tmp, self.path / filename)

    def read_status(self) -> dict[str, Any]:
        """status.json as a dict; {} when there is none or it is not a JSON object of at most 1 MiB (a FIFO or
        a link out of the folder is not read: runs/files.py)."""
        try:
            status = json.loads(read_run_file(self.path, self.path / STATUS, MAX_STATUS_BYTES))
        except (OSError, ValueError, RecursionError):
            return {}
        return status if isinstance(status, dict) else {}

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records of metrics.jsonl (a last line cut short by a kill is skipped with a warning)."""
        return read_jsonl(self.path / METRICS)

    def truncate_logs(self, step: int) -> None:
        """Drop records of steps after `step` (written after the checkpoint a resumed run starts from), and a
        last line cut short by a kill, so that no step appears twice and every line parses."""
        for filename in (METRICS, SAMPLES, EVALS):
            path = self.path / filename
            if not path.is_file():
                continue
            kept = [record for record in read_jsonl(path) if record.get("step", 0) <= step]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(record) + "\n" for record in kept))
            os.replace(tmp, path)

    @contextmanager
    def atomic_dir(self, name: str) -> Iterator[Path]:
        """Write into a temporary folder, then rename it to `name` (relative to the run): a crash never leaves
        a half-written one. An existing folder of that name is replaced."""
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            yield tmp
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def point(self, link: str, target: Path) -> None:
        """Make run/link a symlink to `target` (inside the run), replacing any old link atomically."""
        tmp = self.path / f".{link}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(target, self.path))
        os.replace(tmp, self.path / link)

    def pointed(self, link: str) -> Path | None:
        path = self.path / link
        return path.resolve() if path.is_symlink() else None

    def prune(self, folder: str, keep: set[Path]) -> None:
        """Delete the folders under run/folder that no link points to, and what interrupted writes left."""
        self.remove_leftovers()
        for child in (self.path / folder).iterdir():
            if child.is_dir() and not child.name.startswith(".") and child.resolve() not in keep:
                shutil.rmtree(child, ignore_errors=True)

    def remove_leftovers(self) -> list[Path]:
        """Remove what a kill in the middle of a write leaves: `.NAME-*` folders of `atomic_dir`, `.LINK.tmp`
        links of `point` and `*.tmp` files of `truncate_logs` (nothing else writes them). Returns them."""
        patterns = (".*-*", "checkpoints/.*-*", "*.tmp")  # pathlib's * also matches names starting with a dot
        found = sorted({path for pattern in patterns for path in self.path.glob(pattern)})
        for path in found:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return found

    def save(self, name: str, write: Callable[[Path], None]) -> Path:
        """`write` fills a folder that becomes run/name atomically."""
        with self.atomic_dir(name) as tmp:
            write(tmp)
        return self.path / name


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, /proc/PID/stat), which tells a process from a later
    one given the same pid; None when there is no such process (or no /proc), and for pids <= 1."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return None
    return _stat_field(pid, 19)


def _stat_field(pid: int, index: int) -> int | None:
    """Field `index` of /proc/PID/stat after the command name (1: the parent's pid, 19: the start time)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[index])
    except (OSError, ValueError, IndexError):
        return None


def run_process(status: dict[str, Any]) -> int | None:
    """The pid status.json names, only when it is verifiably that run's toolrl process on this machine: the
    same host, a pid > 1, the start time it recorded, a command line that runs toolrl. Anything else (a stale
    pid reused by another process, an edited status.json, -1, a run from elsewhere) is None."""
    pid = status.get("pid")
    if status.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    started = process_start(pid)
    if started is None or started != status.get("pid_start"):
        return None
    return pid if any("toolrl" in arg for arg in _argv(pid)) else None


def _argv(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _ancestors() -> set[int]:
    """This process and its ancestors, by /proc's parent ids: never a process to signal from here."""
    found, pid = set(), os.getpid()
    while pid is not None and pid > 1 and pid not in found:
        found.add(pid)
        pid = _stat_field(pid, 1)
    return found | {os.getpid(), os.getppid()}


def _holds_file_in(pid: int, run: str) -> bool:
    """Whether process `pid` has a file of the folder `run` open (a training run keeps progress.log open)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(run + os.sep):
            return True
    return False


def train_process(run: Path, status: dict[str, Any]) -> int | None:
    """The `toolrl train` process of the run folder `run`, which only then may be signalled: the pid status.json
    names passes run_process (this host, its recorded start time), its command line is `toolrl ... train`, it
    was started for this run (its command line names the folder, or its run_name, or it holds a file of the
    folder open), and it is neither this process nor one of its ancestors. None otherwise."""
    pid = run_process(status)
    if pid is None or pid in _ancestors():
        return None
    argv = _argv(pid)
    tool = next((i for i, a in enumerate(argv) if a == "toolrl" or a.endswith(("/toolrl", "toolrl/__main__.py"))), None)
    if tool is None or "train" not in argv[tool + 1 :]:
        return None
    folder = os.path.realpath(run)
    named = any(os.path.realpath(a) == folder for a in argv if a.startswith(("/", ".")) or os.sep in a)
    named = named or f"run_name={run.name}" in argv
    return pid if named or _holds_file_in(pid, folder) else None
