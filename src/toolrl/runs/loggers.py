"""Loggers besides metrics.jsonl, chosen by `train.report_to`: TensorBoard and Weights & Biases (offline).

Each is imported only when asked for; a missing package is a one-line config error naming the extra to
install. Both write inside the run directory and need no network.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any, Protocol

from toolrl.errors import ConfigError
from toolrl.registry import Registry


class MetricLogger(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None: ...
    def close(self) -> None: ...


LOGGERS: Registry = Registry("logger", "train.report_to")


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Number)}


@LOGGERS.register("tensorboard")
class TensorBoardLogger:
    def __init__(self, run_path: Path, config):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "train.report_to: tensorboard needs the tensorboard package: pip install 'toolrl[tensorboard]'"
            ) from None
        self.writer = SummaryWriter(log_dir=str(run_path / "tensorboard"))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for key, value in _scalars(metrics).items():
            if key != "step":
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@LOGGERS.register("wandb")
class WandbLogger:
    """Weights & Biases in offline mode: runs are written under run/wandb; `wandb sync` uploads them later."""

    def __init__(self, run_path: Path, config):
        try:
            import wandb
        except ImportError:
            raise ConfigError("train.report_to: wandb needs the wandb package: pip install 'toolrl[wandb]'") from None
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project="toolrl",
            name=run_path.name,
            dir=str(run_path),
            mode="offline",
            config=config.model_dump(mode="json"),
            reinit="finish_previous",
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log({k: v for k, v in _scalars(metrics).items() if k != "step"}, step=step)

    def close(self) -> None:
        self.run.finish()


def open_loggers(names: list[str], run_path: Path | None, config) -> list[MetricLogger]:
    if run_path is None:
        return []
    return [LOGGERS.lookup(name)(run_path, config) for name in names]
