"""A run's checkpoints: everything a resumed run needs to continue exactly (trainable weights, optimizer,
scheduler, torch and data RNGs, the data position, the step, the best score), written atomically under
RUN/checkpoints/ with RUN/last (and RUN/best) pointing at them, and the exported models (RUN/final, best).

One process writes the trainable weights and the optimizer as safetensors; under torchrun they are sharded
and go through torch.distributed.checkpoint (sharded.py). Either kind resumes at any world size.

Each function is given values: the run directory (rank 0's; None on the other ranks), the torchrun context,
the PolicyState and the task order's state; none reads a trainer.
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from toolrl import distributed
from toolrl.distributed import Dist
from toolrl.errors import ConfigError
from toolrl.models.policy import PolicyState, load_trainable, save_model, save_trainable
from toolrl.runs import sharded
from toolrl.runs.rundir import RunDir
from toolrl.runs.state_io import load_state, save_state
from toolrl.text import first_line

log = logging.getLogger(__name__)

STATE = "trainer_state.json"
TRAINABLE = "trainable.safetensors"
OPTIMIZER = "optimizer"
"""optimizer.safetensors + optimizer.json: optimizer, scheduler and torch RNG state (runs/state_io.py)."""
LEGACY_OPTIMIZER = "optimizer.pt"
"""What checkpoints of earlier versions hold instead; loaded with weights_only=True."""
BEST = "best.json"
WARM_START = "warm_start"
"""RUN/warm_start/trainable.safetensors: the trained weights a warm start ended with, kept where the run's reference
is a copy of them (the KL term's model, dense turn credit's scorer), so that a resumed run scores with the same."""


def write_model(model, tokenizer, folder: Path) -> None:
    """The policy as a Hugging Face folder (under torchrun: the full, synced generation copy)."""
    save_model(model, tokenizer, folder)


def write_state(folder: Path, state: PolicyState, order: dict[str, Any], weights: bool = True) -> None:
    """The checkpoint's files; `weights=False`: all but the weights and optimizer (sharded.save wrote them)."""
    tree = {"scheduler": state.scheduler.state_dict(), "torch_rng": torch.get_rng_state()}
    if weights:
        save_trainable(folder / TRAINABLE, state.model, state.value_head)
        tree["optimizer"] = state.optimizer.state_dict()
    save_state(folder / OPTIMIZER, tree)
    (folder / STATE).write_text(json.dumps({"step": state.step, **order, "best": state.best}))


def save_warm_start(run: RunDir | None, model) -> None:
    """The policy's trained weights (every weight, or the adapters) as the warm start left them."""
    if run:
        run.save(WARM_START, lambda folder: save_trainable(folder / TRAINABLE, model, None))


def warm_start_weights(run: RunDir | None) -> Path | None:
    """What save_warm_start wrote in `run`, or None (no run, or a run of an earlier version)."""
    if not run:
        return None
    path = run.path / WARM_START / TRAINABLE
    return path if path.is_file() else None


def prune(run: RunDir) -> None:
    keep = {p for p in (run.pointed("last"), run.pointed("best")) if p is not None}
    run.prune("checkpoints", keep)


def save_checkpoint(run: RunDir | None, dist: Dist, state: PolicyState, order: dict[str, Any]) -> Path | None:
    """Written atomically under checkpoints/, then run/last points at it. `order`: the task order's state."""
    name = f"checkpoints/step-{state.step:06d}"
    if dist.on:
        return _save_sharded(run, dist, state, order, name)
    if not run:
        return None
    path = run.save(name, lambda folder: write_state(folder, state, order))
    run.point("last", path)
    prune(run)
    return path


def _save_sharded(run: RunDir | None, dist: Dist, state: PolicyState, order: dict[str, Any], name: str) -> Path | None:
    """Every rank writes its shards into the folder rank 0 made; rank 0 adds the rest, renames it into place
    once every rank's shards are written (DCP's save ends after all have), and points last at it."""
    with run.atomic_dir(name) if run else nullcontext(None) as tmp:
        folder = distributed.broadcast(dist, str(tmp) if tmp else None)
        if folder is None:  # no run directory: nothing is saved, on any rank
            return None
        sharded.save(Path(folder), state.model, state.value_head, state.optimizer)
        if run:
            write_state(Path(folder), state, order, weights=False)
    path = None
    if run:
        path = run.path / name
        run.point("last", path)
        prune(run)
    distributed.barrier(dist)
    return path


def save_best(run: RunDir, model, tokenizer, step: int, metric: str, score: float) -> None:
    """`model` (the generation copy: full weights) as RUN/best, with the score that made it the best."""

    def write(folder: Path) -> None:
        write_model(model, tokenizer, folder)
        (folder / BEST).write_text(json.dumps({"step": step, "metric": metric, "score": score}))

    run.point("best", run.save(f"checkpoints/best-step-{step:06d}", write))
    prune(run)


def resume(run: RunDir | None, dist: Dist, state: PolicyState, folder: Path | None = None) -> dict[str, Any]:
    """Load run/last into `state` (`folder`: the run, for the ranks of a torchrun job other than 0, which hold
    no RunDir) and drop log records of later steps. Returns the task order's state. A sharded checkpoint loads
    at any world size; one written by one process loads under torchrun too."""
    owner = run
    run = run or (RunDir.existing(folder) if folder is not None else None)
    last = run.pointed("last") if run else None
    if last is None or not (last / STATE).is_file():
        raise ConfigError(f"{run.path if run else '?'}: no checkpoint to resume from (no last/)")
    if owner:
        run.remove_leftovers()
    distributed.barrier(dist)
    saved = _load_weights_and_optimizer(dist, state, last)
    state.scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["torch_rng"])
    kept = json.loads((last / STATE).read_text())
    state.step, state.best = kept["step"], kept["best"]
    best = run.pointed("best")
    if best is not None and (best / BEST).is_file():  # an evaluation after the last checkpoint may have won
        scored = json.loads((best / BEST).read_text())
        state.best = max(state.best or 0.0, scored.get("score", scored.get("success", 0.0)))  # "success": older
    if owner:
        run.truncate_logs(state.step)
    log.info("resumed %s at step %d", run.path, state.step)
    return {key: value for key, value in kept.items() if key not in ("step", "best")}  # all the task order wrote


def _load_weights_and_optimizer(dist: Dist, state: PolicyState, last: Path) -> dict:
    """Load the trainable weights and the optimizer state; returns the rest (scheduler, torch RNG)."""
    if sharded.is_sharded(last):
        sharded.load(last, state.model, state.value_head, state.optimizer)
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
    if dist.on:  # written by one process: every rank takes its shards of the full tensors
        sharded.load_full(last / TRAINABLE, optimizer, state.model, state.value_head, state.optimizer)
    else:
        load_trainable(last / TRAINABLE, state.model, state.value_head)
        state.optimizer.load_state_dict(optimizer)
    return saved
