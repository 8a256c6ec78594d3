"""Rollouts: the generation engine, trajectories and the multi-turn tool loop."""

from toolrl.rollout.engine import HFEngine
from toolrl.rollout.loop import Rollout, RolloutLimits
from toolrl.rollout.trajectory import Trajectory

__all__ = ["HFEngine", "Rollout", "RolloutLimits", "Trajectory"]
