"""A run's checkpoints: everything a resumed run needs to continue exactly (trainable weights, optimizer,
scheduler, torch and data RNGs, the data position, the step, the best score), written atomically under
RUN/checkpoints/ with RUN/last (and RUN/best) pointing at them, and the exported models (RUN/final, best).

One process writes the trainable weights and the optimizer as safetensors; under torchrun they are sharded
and go through torch.distributed.checkpoint (sharded.py). Either kind resumes at any world size.
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from toolrl.errors import ConfigError
from toolrl.text import first_line
from toolrl.train import distributed, sharded
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


def write_state(trainer: Trainer, folder: Path, weights: bool = True) -> None:
    """The checkpoint's files; `weights=False`: all but the weights and optimizer (sharded.save wrote them)."""
    tree = {"scheduler": trainer.scheduler.state_dict(), "torch_rng": torch.get_rng_state()}
    if weights:
        save_trainable(folder / TRAINABLE, trainer.model, trainer.value_head)
        tree["optimizer"] = trainer.optimizer.state_dict()
    save_state(folder / OPTIMIZER, tree)
    state = {"step": trainer.step_done, **trainer.data_state(), "best": trainer.best}
    (folder / STATE).write_text(json.dumps(state))


def prune(trainer: Trainer) -> None:
    run = trainer.run
    keep = {p for p in (run.pointed("last"), run.pointed("best")) if p is not None}
    run.prune("checkpoints", keep)


def save_checkpoint(trainer: Trainer) -> Path | None:
    """Written atomically under checkpoints/, then run/last points at it."""
    name = f"checkpoints/step-{trainer.step_done:06d}"
    if trainer.dist.on:
        return _save_sharded(trainer, name)
    if not trainer.run:
        return None
    path = trainer.run.save(name, lambda folder: write_state(trainer, folder))
    trainer.run.point("last", path)
    prune(trainer)
    return path


def _save_sharded(trainer: Trainer, name: str) -> Path | None:
    """Every rank writes its shards into the folder rank 0 made; rank 0 adds the rest, renames it into place
    once every rank's shards are written (DCP's save ends after all have), and points last at it."""
    run = trainer.run  # rank 0's; None on the other ranks
    with run.atomic_dir(name) if run else nullcontext(None) as tmp:
        folder = distributed.broadcast(trainer.dist, str(tmp) if tmp else None)
        if folder is None:  # no run directory: nothing is saved, on any rank
            return None
        sharded.save(Path(folder), trainer.model, trainer.value_head, trainer.optimizer)
        if run:
            write_state(trainer, Path(folder), weights=False)
    path = None
    if run:
        path = run.path / name
        run.point("last", path)
        prune(trainer)
    distributed.barrier(trainer.dist)
    return path


def save_best(trainer: Trainer, step: int, metric: str) -> None:
    def write(folder: Path) -> None:
        write_model(trainer, folder)
        (folder / BEST).write_text(json.dumps({"step": step, "metric": metric, "score": trainer.best}))

    trainer.run.point("best", trainer.run.save(f"checkpoints/best-step-{step:06d}", write))
    prune(trainer)


def resume(trainer: Trainer, folder: Path | None = None) -> int:
    """Continue from run/last (`folder`: the run, for the ranks of a torchrun job other than 0, which hold no
    RunDir): load the state and drop log records of later steps. Returns the step. A sharded checkpoint loads at
    any world size; one written by one process loads under torchrun too."""
    from toolrl.train.rundir import RunDir

    run = trainer.run or (RunDir.existing(folder) if folder is not None else None)
    last = run.pointed("last") if run else None
    if last is None or not (last / STATE).is_file():
        raise ConfigError(f"{run.path if run else '?'}: no checkpoint to resume from (no last/)")
    if trainer.run:
        run.remove_leftovers()
    distributed.barrier(trainer.dist)
    saved = _load_weights_and_optimizer(trainer, last)
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
    if trainer.run:
        run.truncate_logs(trainer.step_done)
    trainer.generator_version = -1  # the generation copy and engines start from the loaded weights
    trainer.refresh_generator()
    log.info("resumed %s at step %d", run.path, trainer.step_done)
    return trainer.step_done


def _load_weights_and_optimizer(trainer: Trainer, last: Path) -> dict:
    """Load the trainable weights and the optimizer state; returns the rest (scheduler, torch RNG)."""
    if sharded.is_sharded(last):
        sharded.load(last, trainer.model, trainer.value_head, trainer.optimizer)
        return load_state(last / OPTIMIZER)
    if (last / LEGACY_OPTIMIZER).is_file():
        try:  # tensors and containers only: a pickle that would run code is refused
            saved = torch.load(last / LEGACY_OPTIMIZER, weights_only=True)
        except Exception as exc:
            raise ConfigError(
                f"{last / LEGACY_OPTIMIZER}: refused, it is not plain training state ({first_line(exc)})"
            ) from None
    else:
        saved = load_state(last / OPTIMIZER)
    optimizer = saved.pop("optimizer")
    if trainer.dist.on:  # written by one process: every rank takes its shards of the full tensors
        sharded.load_full(last / TRAINABLE, optimizer, trainer.model, trainer.value_head, trainer.optimizer)
    else:
        load_trainable(last / TRAINABLE, trainer.model, trainer.value_head)
        trainer.optimizer.load_state_dict(optimizer)
    return saved
