"""Named random streams: every random number a run draws comes from the run's seed and the name of what draws
it, never from a shared generator or from arithmetic on seeds that two streams could share.

    derive(run_seed, "sampling", step)   the trajectories of training step `step`
    derive(run_seed, "eval")             every evaluation (the same draws at each, whatever eval.batch_size)
    derive(run_seed, "task_order")       the shuffle of the train split, epoch after epoch
    derive(run_seed, "init")             torch's global generator (a value head's or LoRA's initial weights)
    derive(run_seed, "engine", purpose)  an engine's own generator (sequences without a seed of their own)
    derive(seed, index)                  trajectory `index` of a rollout seeded `seed` (its sampler's seed)
    derive(trajectory_seed, "episode")   what the environment draws for that trajectory (Environment.reset)
    derive(episode_seed, "user", k)      the simulated user's k-th message in that episode (envs/users.py)

A stream is a hash (BLAKE2b) of its path, so streams are independent of each other and of how work is batched or
ordered: evaluation draws do not change with eval.batch_size or with the number of steps trained, a step's draws
not with the steps before it, and a resumed run draws what the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 63
"""Seeds are non-negative and fit a signed 64-bit integer (torch generators, JSON, server APIs take them)."""


def derive(seed: int, *path: str | int) -> int:
    """The seed of stream `path` under `seed`: a 63-bit number that no other path gives (but by chance)."""
    text = "/".join(str(part) for part in (int(seed), *path))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def sampling(run_seed: int, step: int) -> int:
    """The rollout seed of training step `step`."""
    return derive(run_seed, "sampling", step)


def evaluation(run_seed: int) -> int:
    """The rollout seed of evaluations: task i of the test split draws derive(evaluation(seed), i) at each."""
    return derive(run_seed, "eval")


def task_order(run_seed: int) -> int:
    return derive(run_seed, "task_order")


def init(run_seed: int) -> int:
    return derive(run_seed, "init")


def engine(run_seed: int, purpose: str) -> int:
    return derive(run_seed, "engine", purpose)


def episode(trajectory_seed: int | None) -> int | None:
    """What an environment draws for one trajectory (None: the trajectory has no seed of its own)."""
    return None if trajectory_seed is None else derive(trajectory_seed, "episode")
