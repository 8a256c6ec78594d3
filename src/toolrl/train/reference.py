"""The run's reference after a warm start. The KL term's model and dense turn credit's scorer
(`train.turn_credit.model: reference`) are frozen copies of the initial policy, made when the trainer starts; a warm
start (`train.warm_start`) then moves the policy, and RL starts from there. Those copies are remade from the
warm-started policy (models/policy.py `frozen_copy`: a LoRA policy's with its adapters merged, since its adapters off
would be the base model): else the KL term pulls the policy back to the model the warm start left, and the credit is
scored by a model that never saw the environment's format. A teacher and a named credit model stay. The warm start's
trained weights are kept in the run (runs/checkpoints.py `save_warm_start`) so that a resumed run rebases on them."""

from __future__ import annotations

import logging
from pathlib import Path

from toolrl.config.schema import RunConfig
from toolrl.errors import ConfigError
from toolrl.models.policy import frozen_copy
from toolrl.runs import checkpoints
from toolrl.runs.rundir import RunDir
from toolrl.train.turn_credit import TurnCredit, make_turn_credit

log = logging.getLogger(__name__)


def copies_of_initial(config: RunConfig, credit: TurnCredit | None) -> tuple[bool, bool]:
    """Whether the KL term's model and dense turn credit's scorer are copies of the initial policy (not a teacher,
    not a named model)."""
    t = config.train
    kl = t.kl.coef > 0 and not t.kl.teacher and t.kl.teacher_endpoint is None
    return kl, credit is not None and t.turn_credit.model == "reference"


def rebase(trainer, weights: Path | None = None) -> bool:
    """After a warm start, the trainer's copies of the initial policy (its `reference`, which its scorer reads for the
    KL term, and its `credit`) become frozen copies of the policy as it is, or with the warm start's kept `weights`
    (on resume). True where one was remade."""
    config = trainer.config
    kl, credited = copies_of_initial(config, trainer.credit)
    if not (kl or credited):
        return False
    frozen, m = frozen_copy(trainer.model, weights), config.model
    if kl:
        trainer.reference = trainer.scorer.reference = frozen
    if credited:
        trainer.credit = make_turn_credit(config.train.turn_credit, trainer.model, frozen, trainer.bench.chat,
                                          trainer.bench.device, m.dtype, m.cpu_linear)  # fmt: skip
    log.info("the reference is the warm-started policy (%s)", ", ".join(
        name for name, used in (("kl", kl), ("turn credit", credited)) if used))  # fmt: skip
    return True


def kept_weights(config: RunConfig, credit: TurnCredit | None, run: RunDir | None, distributed: bool) -> Path | None:
    """On resume, the warm start's weights to rebase on (`run`'s RUN/warm_start), or None: where nothing is a copy
    of the initial policy nothing was kept; a run of an earlier version kept none (a warning says the reference
    stays the model before the warm start). Under torchrun, one line: such a run resumes in one process."""
    weights = checkpoints.warm_start_weights(run)
    if weights is not None and distributed:
        raise ConfigError(f"train.warm_start: this run's reference is its warm-started policy ({weights}); resume it "
                          "in one process, as it was started")  # fmt: skip
    if weights is None and any(copies_of_initial(config, credit)):
        log.warning("%s: no %s/ (a run of an earlier version): the reference stays the model before the warm start",
                    run.path if run else "?", checkpoints.WARM_START)  # fmt: skip
    return weights
