"""Advantage estimators: pure functions of rewards."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, scale: bool = True) -> torch.Tensor:
    """GRPO: each reward minus its group's mean, divided by the group's (unbiased) std when `scale`.

    `rewards` is (groups * group_size,) with the samples of a group next to each other. A group whose rewards
    are all equal gets zero advantages.
    """
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        std = grouped.std(dim=1, keepdim=True)
        centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    return centred.reshape(-1)
