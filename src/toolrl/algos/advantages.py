"""Advantage estimators: pure functions from rewards (and values) to one advantage per trained token.

Tensors are flat over the trained tokens of a step, trajectory after trajectory; `counts[i]` is how many
belong to trajectory i. Sequence-level estimators score a trajectory by its reward plus the sum of its
per-token rewards (a KL penalty applied as reward; turn rewards placed at their turn's last token with
train.turn_rewards: tokens) and give every token that advantage.
Trajectories marked invalid (hit by a tool's infrastructure fault) are left out of every statistic (group
means and stds, whitening) and get advantage 0. Adding one is a function and `@register_advantage("name")`;
an estimator that learns a value head declares it (`@register_advantage("gae", needs_values=True)`): the
trainer then makes the head, scores values before the update and adds the value loss. One with options of its
own declares their pydantic model (`options=Model`): `train.advantage_options` is validated by it when the config
is resolved, and the estimator reads them as `x.options`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.algos.correction_options import GDPOOptions
from toolrl.algos.registries import register_advantage


@dataclass
class AdvantageInputs:
    rewards: torch.Tensor
    """[trajectories], the samples of a group next to each other."""
    group_size: int
    counts: list[int]
    """Trained tokens per trajectory."""
    token_rewards: torch.Tensor | None = None
    """[tokens] rewards given at single tokens besides the final reward, or None."""
    values: torch.Tensor | None = None
    """[tokens] the value head's estimates at sampling time (PPO)."""
    eps: float = 1e-4
    gamma: float = 1.0
    lam: float = 0.95
    valid: torch.Tensor | None = None
    """[trajectories] bool: False leaves a trajectory out of the statistics (advantage 0); None: all valid."""
    turns: list[list[TurnInput]] | None = None
    """Per trajectory, its model turns in order (trained tokens, reward, anchor state): for turn-level
    estimators; their token counts add up to `counts[i]`."""
    step_weight: float = 1.0
    """Weight of the turn-level advantage beside the trajectory-level one (GiGPO's omega)."""
    options: Any = None
    """The estimator's own options (train.advantage_options), an instance of the model it registered with."""
    components: torch.Tensor | None = None
    """[trajectories, K] each paid reward component of the rubric, unweighted (0 where a trajectory lacks it):
    for estimators that normalize components apart (gdpo); None where the rubric paid none."""
    component_weights: torch.Tensor | None = None
    """[K] their weights (times train.kl.task_reward): `rewards` is components @ component_weights."""
    component_names: list[str] | None = None
    """[K] their names (ranks that gather a step line their columns up by name)."""
    roles: list[str] | None = None
    """[trajectories] the role each one played (a solver and a judge, two players of one policy): a group's
    statistics are taken over its members of the same role, each role apart; None: one role."""


@dataclass(frozen=True)
class TurnInput:
    tokens: int
    """Trained tokens of this turn."""
    reward: float
    """Its reward (the environment's StepResult.reward after it)."""
    state: Hashable
    """The state the turn started from: turns of the group that start from equal states are compared."""
    credit: float = 0.0
    """The part of `reward` that is dense turn credit (train.turn_credit, times its coef)."""


@dataclass
class Advantages:
    advantages: torch.Tensor
    """[tokens]"""
    returns: torch.Tensor | None = None
    """[tokens] targets for a value head, from estimators that use one."""


Estimator = Callable[[AdvantageInputs], Advantages]
"""What ADVANTAGES (registries.py) holds."""


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    eps: float = 1e-4,
    scale: bool = True,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each reward minus its group's mean, divided by the group's (unbiased) std when `scale`. A group whose
    rewards are all equal gets zero advantages. With `valid`, the statistics are over a group's valid members
    only, and the others get 0."""
    grouped = rewards.view(-1, group_size)
    if valid is None:
        centred = grouped - grouped.mean(dim=1, keepdim=True)
        if scale and group_size > 1:
            std = grouped.std(dim=1, keepdim=True)
            centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
        return centred.reshape(-1)
    mask = valid.view(-1, group_size).to(rewards.dtype)
    n = mask.sum(dim=1, keepdim=True)
    mean = (grouped * mask).sum(dim=1, keepdim=True) / n.clamp(min=1)
    centred = (grouped - mean) * mask
    if scale:
        std = ((centred**2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
        centred = torch.where((std > 0) & (n > 1), centred / (std + eps), torch.zeros_like(centred))
    return centred.reshape(-1)


def role_masks(
    roles: list[str] | None, valid: torch.Tensor | None, device: torch.device | str
) -> list[torch.Tensor | None]:
    """One validity mask per role the step's trajectories played (valid and of that role), [valid] for one role:
    a group's statistics over each mask are its role's."""
    if roles is None or len(set(roles)) < 2:
        return [valid]
    masks = []
    for role in dict.fromkeys(roles):
        mask = torch.tensor([r == role for r in roles], device=device)
        masks.append(mask if valid is None else mask & valid)
    return masks


def grouped(x: AdvantageInputs, scores: torch.Tensor, scale: bool = True) -> torch.Tensor:
    """group_advantages of `scores` within each group and role (each trajectory gets its role's)."""
    masks = role_masks(x.roles, x.valid, x.rewards.device)
    if len(masks) == 1:
        return group_advantages(scores, x.group_size, x.eps, scale=scale, valid=masks[0])
    return sum(group_advantages(scores, x.group_size, x.eps, scale=scale, valid=mask) for mask in masks)


def valid_counts(x: AdvantageInputs) -> torch.Tensor:
    """[trajectories] how many valid members of its role each trajectory's group has."""
    counts = torch.zeros(len(x.rewards), dtype=torch.long, device=x.rewards.device)
    for mask in role_masks(x.roles, x.valid, x.rewards.device):
        if mask is None:
            return torch.full((len(x.rewards),), x.group_size, device=x.rewards.device)
        per_group = mask.view(-1, x.group_size).sum(dim=1).repeat_interleave(x.group_size)
        counts = torch.where(mask, per_group, counts)
    return counts


def token_mask(x: AdvantageInputs) -> torch.Tensor | None:
    """[tokens] bool: the tokens of valid trajectories; None when all are."""
    return None if x.valid is None else per_token(x.valid, x.counts)


def token_reward_sums(x: AdvantageInputs) -> torch.Tensor:
    """[trajectories] the sum of each trajectory's per-token rewards (x.token_rewards given)."""
    owner = torch.repeat_interleave(torch.arange(len(x.counts)), torch.tensor(x.counts))
    return torch.zeros_like(x.rewards).index_add_(0, owner, x.token_rewards)


def sequence_scores(x: AdvantageInputs) -> torch.Tensor:
    """Reward plus the sum of the trajectory's per-token rewards."""
    return x.rewards if x.token_rewards is None else x.rewards + token_reward_sums(x)


def per_token(values: torch.Tensor, counts: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(values, torch.tensor(counts, device=values.device))


def whiten(x: torch.Tensor, eps: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Zero mean, unit std over the whole step (left as is when it has no spread); with `mask`, statistics over
    the masked-in entries, and 0 elsewhere."""
    if mask is not None:
        out = torch.zeros_like(x)
        if mask.any():
            out[mask] = whiten(x[mask], eps)
        return out
    if x.numel() < 2:
        return x - x.mean()
    std = x.std()
    return (x - x.mean()) / (std + eps) if std > 0 else x - x.mean()


def reverse_cumsum(x: torch.Tensor, counts: list[int], discount: float = 1.0) -> torch.Tensor:
    """Per trajectory, out[t] = sum over k >= t of discount^(k-t) * x[k]."""
    out = torch.empty_like(x)
    start = 0
    for n in counts:
        running = x.new_zeros(())
        for t in range(start + n - 1, start - 1, -1):
            running = x[t] + discount * running
            out[t] = running
        start += n
    return out


@register_advantage("grpo")
def grpo(x: AdvantageInputs) -> Advantages:
    """GRPO: (score - group mean) / (group std + eps)."""
    return Advantages(per_token(grouped(x, sequence_scores(x)), x.counts))


@register_advantage("dr_grpo")
def dr_grpo(x: AdvantageInputs) -> Advantages:
    """Dr. GRPO: score - group mean, not divided by the std (no difficulty bias)."""
    return Advantages(per_token(grouped(x, sequence_scores(x), scale=False), x.counts))


@register_advantage("rloo")
def rloo(x: AdvantageInputs) -> Advantages:
    """RLOO: score minus the mean of the other samples of its group = G / (G - 1) * (score - group mean)."""
    n = valid_counts(x).to(x.rewards.dtype)
    centred = grouped(x, sequence_scores(x), scale=False)
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return Advantages(per_token(centred * factor, x.counts))


@register_advantage("reinforce_pp")
def reinforce_pp(x: AdvantageInputs) -> Advantages:
    """REINFORCE++ with a baseline: the final reward minus its group's mean, plus the per-token rewards still to
    come, discounted by train.gamma (1, the default: undiscounted returns; 0: each token its own reward only, as
    on-policy distillation credits each token with its own reverse KL to the teacher), whitened over all tokens
    of the step."""
    baseline = grouped(x, x.rewards, scale=False)
    returns = per_token(baseline, x.counts)
    if x.token_rewards is not None:
        returns = returns + reverse_cumsum(x.token_rewards, x.counts, x.gamma)
    return Advantages(whiten(returns, x.eps, token_mask(x)))


@register_advantage("gae", needs_values=True)
def gae(x: AdvantageInputs) -> Advantages:
    """PPO's generalised advantage estimation over each trajectory's trained tokens (its actions): the final
    reward arrives at the last token, per-token rewards where they are; value after the last token 0.
    delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}; returns A + V are the value
    targets; advantages whitened over the step."""
    if x.values is None:
        raise ValueError("gae needs the value head's estimates (values)")
    values = x.values
    rewards = torch.zeros_like(values) if x.token_rewards is None else x.token_rewards.clone()
    ends = torch.cumsum(torch.tensor(x.counts), 0) - 1
    rewards[ends] += x.rewards.to(rewards.dtype)
    following = torch.cat([values[1:], values.new_zeros(1)])
    following[ends] = 0.0  # nothing after a trajectory's last token
    deltas = rewards + x.gamma * following - values
    advantages = reverse_cumsum(deltas, x.counts, x.gamma * x.lam)
    return Advantages(whiten(advantages, x.eps, token_mask(x)), returns=advantages + values)


def returns_to_go(rewards: list[float], gamma: float) -> list[float]:
    """Each position's discounted sum of its own and the later rewards."""
    running, back = 0.0, []
    for reward in reversed(rewards):
        running = reward + gamma * running
        back.append(running)
    return back[::-1]


def standardized(values: torch.Tensor, eps: float) -> torch.Tensor:
    """(values - mean) / (unbiased std + eps); all 0 where they do not vary (or there is one)."""
    std = values.std() if len(values) > 1 else torch.tensor(0.0)
    return (values - values.mean()) / (std + eps) if std > 0 else torch.zeros_like(values)


@register_advantage("gigpo")
def gigpo(x: AdvantageInputs) -> Advantages:
    """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv:2505.10978):
    a trajectory-level advantage (GRPO over the group's rewards) plus omega times a turn-level one. For the
    turn level, each turn's discounted return (its own reward and the later turns', the trajectory's reward
    at its last turn; discount `gamma`) is compared, mean-centred and divided by the std, with the returns of
    the turns of the same group that started from the same state (the anchor state groups of the paper); a
    turn whose state no other turn shares gets 0. A turn's tokens get A_trajectory + omega * A_turn. Without
    turn inputs, GRPO."""
    episode = grouped(x, x.rewards)
    if x.turns is None:
        return Advantages(per_token(episode, x.counts))
    returns = []
    for i, turns in enumerate(x.turns):  # the trajectory's reward at its last turn
        own = [turn.reward + (float(x.rewards[i]) if k == len(turns) - 1 else 0.0) for k, turn in enumerate(turns)]
        returns.append(returns_to_go(own, x.gamma))
    anchors: dict[tuple[int, Hashable], list[tuple[int, int]]] = defaultdict(list)
    for i, turns in enumerate(x.turns):
        if x.valid is None or bool(x.valid[i]):
            for k, turn in enumerate(turns):
                anchors[(i // x.group_size, x.roles[i] if x.roles else None, turn.state)].append((i, k))
    step = {}
    for members in anchors.values():
        scaled = standardized(torch.tensor([returns[i][k] for i, k in members], dtype=torch.float32), x.eps)
        step.update({member: float(a) for member, a in zip(members, scaled, strict=True)})
    parts = []
    for i, turns in enumerate(x.turns):
        for k, turn in enumerate(turns):
            value = float(episode[i]) + x.step_weight * step.get((i, k), 0.0)
            parts.append(torch.full((turn.tokens,), value if x.valid is None or bool(x.valid[i]) else 0.0))
    flat = torch.cat(parts) if parts else torch.zeros(0)
    return Advantages(flat.to(x.rewards.dtype).to(x.rewards.device))


@register_advantage("igpo")
def igpo(x: AdvantageInputs) -> Advantages:
    """IGPO (Wang et al. 2025, "Information Gain-based Policy Optimization", arXiv:2510.14967): turn-level
    advantages from dense turn rewards. A turn's reward is its own (its dense credit, train.turn_credit, and the
    environment's reward after it), except the last turn's: the trajectory's outcome reward takes the place of its
    credit (which would pay for the final text as the frozen model reads it back). The turn rewards of a group
    (all its valid trajectories' turns of one role) are standardized together, and each turn's tokens get the
    discounted sum (train.gamma) of its own and its later turns' standardized rewards. A group whose outcomes
    are all equal still learns from the turns' credits; one turn alone is scored by its outcome only. Like
    gigpo it reads rewards per turn, not per token (train.kl.mode reward is not part of it). Without turn
    inputs, GRPO."""
    if x.turns is None:
        return grpo(x)
    rewards = []
    for i, turns in enumerate(x.turns):
        own = [turn.reward for turn in turns]
        if own:
            own[-1] += float(x.rewards[i]) - turns[-1].credit
        rewards.append(own)
    roles = x.roles or [None] * len(x.turns)
    members: dict[tuple[int, Hashable], list[int]] = defaultdict(list)
    for i in range(len(x.turns)):
        if x.valid is None or bool(x.valid[i]):
            members[(i // x.group_size, roles[i])].append(i)
    scaled: dict[int, list[float]] = {}
    for group in members.values():
        flat = standardized(torch.tensor([r for i in group for r in rewards[i]], dtype=torch.float64), x.eps).tolist()
        for i in group:
            scaled[i], flat = flat[: len(rewards[i])], flat[len(rewards[i]) :]
    parts = []
    for i, turns in enumerate(x.turns):
        to_go = returns_to_go(scaled.get(i, [0.0] * len(turns)), x.gamma)
        parts += [torch.full((turn.tokens,), value) for turn, value in zip(turns, to_go, strict=True)]
    flat = torch.cat(parts) if parts else torch.zeros(0)
    return Advantages(flat.to(x.rewards.dtype).to(x.rewards.device))


@register_advantage("gdpo", options=GDPOOptions)
def gdpo(x: AdvantageInputs) -> Advantages:
    """GDPO (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization", arXiv:2601.05242;
    NeMo RL): each reward component mean-centred and divided by its std within the group, apart, then summed with
    its weight, and the sum whitened over the step's valid trajectories (options.batch_norm). Normalizing the
    total (GRPO) lets components with a large spread drown the others, and maps different mixes of components
    with equal totals to one advantage; here a component most of the group misses pays more where it is hit.
    Per-token rewards (a KL penalty as reward, turn rewards) count as one more component of weight 1. Without
    components, GRPO."""
    if x.components is None or x.component_weights is None:
        return grpo(x)
    columns = list(x.components.T)
    weights = [float(w) for w in x.component_weights]
    if x.token_rewards is not None:
        columns.append(token_reward_sums(x))
        weights.append(1.0)
    summed = torch.zeros_like(x.rewards)
    for column, weight in zip(columns, weights, strict=True):
        summed = summed + weight * grouped(x, column.to(x.rewards.dtype))
    options = x.options if isinstance(x.options, GDPOOptions) else GDPOOptions()
    if options.batch_norm:
        summed = whiten(summed, x.eps, x.valid)
    return Advantages(per_token(summed, x.counts))


def informative_groups(
    rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None, roles: list[str] | None = None
) -> torch.Tensor:
    """DAPO's dynamic sampling filter: a mask over trajectories that keeps the groups whose rewards differ
    (a group that all succeeded or all failed has no learning signal); with `valid`, among valid members; with
    `roles`, a group is kept where the rewards of any one role differ."""
    if roles is not None and len(set(roles)) > 1:
        kept = torch.zeros(len(rewards), dtype=torch.bool, device=rewards.device)
        for mask in role_masks(roles, valid, rewards.device):
            kept |= informative_groups(rewards, group_size, mask)
        return kept
    grouped = rewards.view(-1, group_size)
    if valid is None:
        differs = (grouped != grouped[:, :1]).any(dim=1)
    else:
        mask = valid.view(-1, group_size)
        low = torch.where(mask, grouped, torch.full_like(grouped, float("inf"))).min(dim=1).values
        high = torch.where(mask, grouped, torch.full_like(grouped, float("-inf"))).max(dim=1).values
        differs = high > low
    return differs.repeat_interleave(group_size)
