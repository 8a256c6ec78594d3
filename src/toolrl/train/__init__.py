"""Training: the workbench (model, tools, environment), the trainer, run directories."""

from toolrl.runs.rundir import RunDir
from toolrl.train.trainer import GRPOTrainer, Trainer
from toolrl.train.workbench import Workbench

__all__ = ["GRPOTrainer", "RunDir", "Trainer", "Workbench"]
