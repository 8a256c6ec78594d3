"""RL math: advantages, policy losses, KL estimators."""

from toolrl.algos.advantages import group_advantages
from toolrl.algos.losses import kl_k3, ppo_clip_loss

__all__ = ["group_advantages", "kl_k3", "ppo_clip_loss"]
