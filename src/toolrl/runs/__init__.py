"""Run files: the run directory (rundir.py), its journal of metrics and trajectories (journal.py), loggers,
checkpoints and their state files (checkpoints.py, state_io.py, sharded.py), export to a Hugging Face folder,
the report and plot, and what resuming a run trusts (trust.py). Each takes values (a RunDir, a PolicyState,
metrics, trajectories), never a trainer."""

from toolrl.runs.rundir import RunDir

__all__ = ["RunDir"]
