"""The run directory: resolved config, metrics.jsonl, sample trajectories, checkpoints written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolrl.config import RunConfig, config_to_yaml
from toolrl.errors import ConfigError

METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"


class RunDir:
    def __init__(self, path: Path):
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def create(cls, config: RunConfig) -> RunDir:
        name = config.run_name or time.strftime("%Y%m%d-%H%M%S") + f"-{config.env.name}"
        run = cls(Path(config.output_dir) / name)
        (run.path / "config.yaml").write_text(config_to_yaml(config))
        return run

    @classmethod
    def existing(cls, path: Path) -> RunDir:
        if not (path / "config.yaml").is_file():
            raise ConfigError(f"{path}: not a run directory (no config.yaml); pass the folder `toolrl train` made")
        return cls(path)

    def _append(self, filename: str, records: list[dict[str, Any]]) -> None:
        with open(self.path / filename, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        self._append(METRICS, [metrics])

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        self._append(SAMPLES, [{"step": step, **r} for r in records])

    def read_metrics(self) -> list[dict[str, Any]]:
        path = self.path / METRICS
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def truncate_logs(self, step: int) -> None:
        """Drop records of steps after `step` (written after the checkpoint a resumed run starts from), so
        that no step appears twice."""
        for filename in (METRICS, SAMPLES):
            path = self.path / filename
            if not path.is_file():
                continue
            kept = [
                line
                for line in path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step
            ]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
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
        """Delete the folders under run/folder that no link points to."""
        for child in (self.path / folder).iterdir():
            if child.is_dir() and not child.name.startswith(".") and child.resolve() not in keep:
                shutil.rmtree(child, ignore_errors=True)

    def save(self, name: str, write: Callable[[Path], None]) -> Path:
        """`write` fills a folder that becomes run/name atomically."""
        with self.atomic_dir(name) as tmp:
            write(tmp)
        return self.path / name
