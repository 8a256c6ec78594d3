"""The run directory: resolved config, metrics.jsonl, sample trajectories, checkpoints written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from toolrl.config import RunConfig, config_to_yaml


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

    def _append(self, filename: str, records: list[dict[str, Any]]) -> None:
        with open(self.path / filename, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        self._append("metrics.jsonl", [metrics])

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        self._append("samples.jsonl", [{"step": step, **r} for r in records])

    def save_checkpoint(self, model, tokenizer, name: str) -> Path:
        """Write to a temporary folder, then rename: a crash never leaves a half-written checkpoint."""
        target = self.path / name
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.path))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target
