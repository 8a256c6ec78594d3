"""How stale a step's trajectories are: the trainer's version (optimizer steps) minus the version of the weights that
sampled each trained token (Trajectory.versions; a trajectory without them: its rollout's version as it started).
Pure functions over the versions; the trainer bounds staleness with train.async_steps and logs offpolicy/*."""

from __future__ import annotations

from collections.abc import Sequence

from toolrl.rollout.trajectory import Trajectory


def token_versions(traj: Trajectory, fallback: int) -> list[int]:
    """The version of each trained token: its own where the engine said, else `fallback` (the rollout's)."""
    count = traj.trained_count
    return list(traj.versions) if len(traj.versions) == count else [fallback] * count


def staleness(trajs: Sequence[Trajectory], trainer_version: int, fallback: int) -> list[int]:
    """Per trajectory, its largest staleness: updates between its oldest trained token's weights and the trainer's
    (0 for a trajectory with nothing trained)."""
    return [trainer_version - min(token_versions(traj, fallback), default=trainer_version) for traj in trajs]


def offpolicy_metrics(trajs: Sequence[Trajectory], trainer_version: int, fallback: int, bound: int) -> dict[str, float]:
    """offpolicy/staleness: the largest over the step's tokens; staleness_mean: over its trained tokens;
    partial_fraction: the share of trajectories sampled by more than one version (weights taken mid-episode);
    too_stale: trajectories over `bound`, left out of the loss."""
    versions = [token_versions(traj, fallback) for traj in trajs]
    tokens = [trainer_version - v for vs in versions for v in vs]
    per_traj = [trainer_version - min(vs, default=trainer_version) for vs in versions]  # staleness(), read once
    return {
        "offpolicy/staleness": max(per_traj, default=0),
        "offpolicy/staleness_mean": sum(tokens) / len(tokens) if tokens else 0.0,
        "offpolicy/partial_fraction": sum(len(set(vs)) > 1 for vs in versions) / max(len(trajs), 1),
        "offpolicy/too_stale": sum(s > bound for s in per_traj),
    }
