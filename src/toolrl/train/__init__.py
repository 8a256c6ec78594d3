"""Training: GRPO trainer, log-prob computation, evaluation, the run directory."""

from toolrl.train.rundir import RunDir
from toolrl.train.trainer import GRPOTrainer, Workbench

__all__ = ["GRPOTrainer", "RunDir", "Workbench"]
