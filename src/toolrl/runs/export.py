"""`toolrl export`: any checkpoint of a run (one process's or a sharded one, at any world size) as a plain
Hugging Face folder that transformers and vLLM load (LoRA merged; the adapter beside it in adapter/)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from toolrl.config.resolve import read_checked
from toolrl.errors import ConfigError
from toolrl.models.policy import apply_lora, load_trainable, save_model
from toolrl.runs import sharded
from toolrl.runs.checkpoints import STATE, TRAINABLE
from toolrl.runs.rundir import RunDir

log = logging.getLogger(__name__)


def find_checkpoint(path: Path) -> tuple[RunDir, Path]:
    """A run directory (its last checkpoint) or a checkpoint folder inside one."""
    path = path.resolve()
    if (path / "config.yaml").is_file():
        run = RunDir.existing(path)
        last = run.pointed("last")
        if last is None:
            raise ConfigError(f"{path}: the run has no checkpoint (no last/); train.save_every writes them")
        return run, last
    if not (path / STATE).is_file():
        raise ConfigError(f"{path}: not a run directory nor a checkpoint (no config.yaml, no {STATE})")
    return RunDir.existing(path.parent.parent), path


def load_checkpoint(path: Path, device: torch.device | None = None):
    """(the run's config, its base model with the checkpoint's trained weights in it, LoRA merged; the
    checkpoint's folder). The run's config is read, its code not imported."""
    from toolrl.models import load_model

    run, checkpoint = find_checkpoint(path)
    config = read_checked(run.path / "config.yaml")
    model = load_model(config.model.name, device or torch.device("cpu"), config.model.dtype)
    if config.train.lora.r:
        model = apply_lora(model, config.train.lora, vision=config.train.train_vision)
    if sharded.is_sharded(checkpoint):
        sharded.load(checkpoint, model, None)
    else:
        load_trainable(checkpoint / TRAINABLE, model, None)
    return config, model, checkpoint


def export_checkpoint(path: Path, out: Path) -> Path:
    """Load the run's base model, put the checkpoint's trained weights in it and save it to `out`."""
    from toolrl.models import load_tokenizer

    config, model, checkpoint = load_checkpoint(path)
    save_model(model, load_tokenizer(config.model.name), out)
    log.info("exported %s to %s", checkpoint, out)
    return out
