"""A run's checkpoints: everything a resumed run needs to continue exactly (trainable weights, optimizer,
scheduler, torch and data RNGs, the data position, the step, the best score), written atomically under
RUN/checkpoints/ with RUN/last (and RUN/best) pointing at them, and the exported models (RUN/final, best).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from toolrl.errors import ConfigError
from toolrl.text import first_line
from toolrl.train.checkpoint import load_state, save_state
from toolrl.train.policy import load_trainable, save_model, save_trainable

if TYPE_CHECKING:
    from toolrl.train.trainer import Trainer

log = logging.getLogger(__name__)

STATE = "trainer_state.json"
TRAINABLE = "trainable.safetensors"
OPTIMIZER = "optimizer"
"""optimizer.safetensors + optimizer.json: optimizer, scheduler and torch RNG state (train/checkpoint.py)."""
LEGACY_OPTIMIZER = "optimizer.pt"
"""What checkpoints of earlier versions hold instead; loaded with weights_only=True."""
BEST = "best.json"


def write_model(trainer: Trainer, folder: Path) -> None:
    """The policy as a Hugging Face folder (under torchrun: the full, synced generation copy)."""
    save_model(trainer.generator, trainer.bench.tokenizer, folder)


def write_state(trainer: Trainer, folder: Path) -> None:
    save_trainable(folder / TRAINABLE, trainer.model, trainer.value_head)
    save_state(
        folder / OPTIMIZER,
        {
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        },
    )
    state = {"step": trainer.step_done, "order": trainer.order, "rng": trainer.rng.getstate(), "best": trainer.best}
    (folder / STATE).write_text(json.dumps(state))


def prune(trainer: Trainer) -> None:
    run = trainer.run
    keep = {p for p in (run.pointed("last"), run.pointed("best")) if p is not None}
    run.prune("checkpoints", keep)


def save_checkpoint(trainer: Trainer) -> Path | None:
    """Written atomically under checkpoints/, then run/last points at it."""
    if not trainer.run:
        return None
    if trainer.dist.on:  # the optimizer's state is sharded: torch.distributed.checkpoint is not wired in yet
        log.warning("torchrun: resumable checkpoints of sharded runs are not written yet; final/ is")
        return None
    path = trainer.run.save(f"checkpoints/step-{trainer.step_done:06d}", lambda folder: write_state(trainer, folder))
    trainer.run.point("last", path)
    prune(trainer)
    return path


def save_best(trainer: Trainer, step: int, metric: str) -> None:
    def write(folder: Path) -> None:
        write_model(trainer, folder)
        (folder / BEST).write_text(json.dumps({"step": step, "metric": metric, "score": trainer.best}))

    trainer.run.point("best", trainer.run.save(f"checkpoints/best-step-{step:06d}", write))
    prune(trainer)


def resume(trainer: Trainer) -> int:
    """Continue from run/last: load the state and drop log records of later steps. Returns the step."""
    run = trainer.run
    if trainer.dist.on:
        raise ConfigError("--resume under torchrun: sharded runs write no resumable checkpoint yet")
    last = run.pointed("last") if run else None
    if last is None or not (last / STATE).is_file():
        raise ConfigError(f"{run.path if run else '?'}: no checkpoint to resume from (no last/)")
    run.remove_leftovers()
    load_trainable(last / TRAINABLE, trainer.model, trainer.value_head)
    if (last / LEGACY_OPTIMIZER).is_file():
        try:  # tensors and containers only: a pickle that would run code is refused
            saved = torch.load(last / LEGACY_OPTIMIZER, weights_only=True)
        except Exception as exc:
            raise ConfigError(
                f"{last / LEGACY_OPTIMIZER}: refused, it is not plain training state ({first_line(exc)})"
            ) from None
    else:
        saved = load_state(last / OPTIMIZER)
    trainer.optimizer.load_state_dict(saved["optimizer"])
    trainer.scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["torch_rng"])
    state = json.loads((last / STATE).read_text())
    trainer.step_done, trainer.order, trainer.best = state["step"], state["order"], state["best"]
    best = run.pointed("best")
    if best is not None and (best / BEST).is_file():  # an evaluation after the last checkpoint may have won
        kept = json.loads((best / BEST).read_text())
        trainer.best = max(trainer.best or 0.0, kept.get("score", kept.get("success", 0.0)))  # "success": older
    version, internal, gauss = state["rng"]
    trainer.rng.setstate((version, tuple(internal), gauss))
    run.truncate_logs(trainer.step_done)
    log.info("resumed %s at step %d", run.path, trainer.step_done)
    return trainer.step_done
