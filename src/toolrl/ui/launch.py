"""The UI's launch tab: recipes to start from, a config edited on the page and validated as the CLI validates
it (the same one-line errors), runs started as `toolrl train` subprocesses that outlive the page, their console
log followed, a stop that ends a run after its step with a checkpoint (RUN/STOP), and resume.

A config from the page is data: it may change any value but not what names code to import (`plugins`,
`env.module`), which must stay those of the recipe file it started from; commands of tool servers come only
from tool config files on disk (`tools.file` names one). A run is resumed only after saying what it will
import or start, and a run made elsewhere only when the caller says it trusts it. "Stop now" signals only a
process this UI started or one verified to be the run's `toolrl train` (runs/rundir.py: train_process): never
the UI itself or an ancestor of it. A run folder's files are read as runs/files.py reads them (no FIFO, device or
link out of the folder)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from toolrl.config.loader import config_data, default_config_text
from toolrl.config.resolve import resolve_data
from toolrl.config.run_name import run_name_problem
from toolrl.errors import ConfigError
from toolrl.runs.files import open_in_run, read_run_file
from toolrl.runs.rundir import STOP_FILE, RunDir, train_process
from toolrl.runs.trust import code_to_run, foreign
from toolrl.text import clip
from toolrl.ui.runs import MAX_CONFIG_BYTES, resolve_run, run_state

CONSOLE_LOG = "console.log"
LOG_CHUNK = 256_000


def find_recipes(dirs: list[Path]) -> dict[str, str]:
    """Recipe name -> YAML text: the packaged default, then every *.yaml of `dirs`."""
    recipes = {"default": default_config_text()}
    for folder in dirs:
        for path in sorted(folder.glob("*.yaml")):
            recipes.setdefault(path.stem, path.read_text())
    return recipes


def validate(text: str, base: str | None) -> dict[str, Any]:
    """The config on the page, validated: the resolved config, or ConfigError with one line. `base`: the
    recipe text it was edited from (its plugins are the only ones allowed)."""
    data = config_data(text, "config")
    recipe = config_data(base, "recipe") if base is not None else {}
    for key in CODE_KEYS:
        if _lookup(data, key) != _lookup(recipe, key):
            raise ConfigError(
                f"config: {key} cannot be set from the page (it imports code); put it in a recipe file and "
                "choose it, or use `toolrl train FILE`"
            )
    return resolve_data(data, "config").model_dump(mode="json")  # its code is the recipe's, a file on disk


CODE_KEYS = ("plugins", "env.module")
"""Config keys that name code to import: a page may only keep its recipe's values."""


def _lookup(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node or None


class Launcher:
    """Runs started from the page, as processes of their own session (they go on when the UI stops)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: dict[str, subprocess.Popen] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def _lock(self, name: str) -> threading.Lock:
        """One lock per run: what the page does to a run (start, resume, stop) is checked and done as one, and
        a slow action on one run never waits on another's."""
        with self._locks_lock:
            return self._locks.setdefault(name, threading.Lock())

    def _spawn(self, name: str, command: list[str]) -> None:
        run = self.root / name
        run.mkdir(parents=True, exist_ok=True)
        with (run / CONSOLE_LOG).open("ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self.processes[name] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )  # fmt: skip

    def start(self, name: str, text: str, base: str | None) -> dict[str, Any]:
        problem = run_name_problem(name)
        if problem:
            raise ConfigError(f"run name: {problem}")
        validate(text, base)
        with self._lock(name):
            if (self.root / name).exists():
                raise ConfigError(f"run name {name}: {self.root / name} exists; choose another name or resume it")
            configs = self.root / ".ui"
            configs.mkdir(parents=True, exist_ok=True)
            path = configs / f"{name}.yaml"
            path.write_text(text)
            sets = ["--set", f"output_dir={self.root}", "--set", f"run_name={name}"]
            self._spawn(name, [sys.executable, "-m", "toolrl", "train", str(path), *sets])
        return {"name": name, "pid": self.processes[name].pid}

    def resume(self, name: str, trust: bool = False) -> dict[str, Any]:
        """Resume `name` from its last checkpoint; the answer lists what it imports or starts. A run made on
        another machine or by another user needs `trust` (it runs the code its config names)."""
        run = resolve_run(self.root, name)
        with self._lock(name):  # two clicks cannot start two processes on one run
            process = self.processes.get(name)
            if run_state(run) == "running":
                raise ConfigError(f"{name}: the run is still running; stop it first")
            if process is not None and process.poll() is None:  # stopped, its process still writing its last files
                raise ConfigError(f"{name}: its process (pid {process.pid}) is still running; resume it in a moment")
            if not (run / "last").is_symlink():
                raise ConfigError(f"{name}: no checkpoint to resume from (train.save_every writes them)")
            text = read_run_file(run, run / "config.yaml", MAX_CONFIG_BYTES).decode("utf-8", errors="replace")
            starts = code_to_run(config_data(text, f"{name}/config.yaml"))
            reason = foreign(run, RunDir(run).read_status())
            if reason is not None and not trust:
                named = f"; it would {'; '.join(starts)}" if starts else ""
                raise ConfigError(clip(f"{name}: {reason}{named}; resume it only if you trust it", 600))
            command = [sys.executable, "-m", "toolrl", "train", "--resume", str(run)]
            self._spawn(name, [*command, "--trust-run"] if reason is not None else command)
            return {"name": name, "pid": self.processes[name].pid, "starts": starts}

    def stop(self, name: str, now: bool = False) -> dict[str, Any]:
        """Ask the run to stop after its step (a checkpoint is written), or with `now` interrupt it (SIGINT:
        the last checkpoint stays)."""
        run = resolve_run(self.root, name)
        if run_state(run) != "running":
            raise ConfigError(f"{name}: the run is not running")
        if not now:
            (run / STOP_FILE).touch()
            return {"name": name, "stopping": "after this step"}
        process = self.processes.get(name)
        started_here = process is not None and process.poll() is None  # this UI's child, still running
        if started_here:
            process.send_signal(signal.SIGINT)
        else:
            os.kill(_verified_pid(run), signal.SIGINT)
        return {"name": name, "stopping": "now"}

    def log(self, name: str, offset: int = 0) -> dict[str, Any]:
        """The console log (or progress.log of a run started elsewhere) from byte `offset` on."""
        run = resolve_run(self.root, name, started=name in self.processes)
        for path in (run / CONSOLE_LOG, run / "progress.log"):
            try:
                f = open_in_run(run, path)
            except FileNotFoundError:
                continue
            except OSError as exc:  # a FIFO, a device, a link out of the run folder: named, never read
                raise ConfigError(f"{name}: {exc}") from None
            with f:
                f.seek(max(0, offset))
                chunk = f.read(LOG_CHUNK)
            return {"text": chunk.decode(errors="replace"), "offset": offset + len(chunk), "file": path.name}
        return {"text": "", "offset": 0, "file": None}

    def close(self) -> None:
        """Reap the processes that ended (the running ones go on)."""
        for process in self.processes.values():
            process.poll()


def _verified_pid(run: Path) -> int:
    """The run's process, only when it is verifiably that run's toolrl process on this machine."""
    status = RunDir(run).read_status()
    if status.get("host") != socket.gethostname():
        host = clip(str(status.get("host")), 60)
        raise ConfigError(f"{run.name}: it runs on {host}; interrupt it there (or use the stop button)")
    pid = train_process(run, status)
    if pid is None:
        raise ConfigError(
            f"{run.name}: its status.json names no process that is this run's `toolrl train` (a stale or edited "
            "status, or a process started elsewhere); nothing was signalled: use the stop button (after the step)"
        )
    return pid
