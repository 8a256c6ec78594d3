"""The pieces of one policy update, as functions of the step's trajectories: the rows that are scored (every
segment of every trajectory), the per-token inputs (old and reference log-probs, values, token rewards), the
advantage estimator's inputs, which rows enter the loss, and the loss itself over micro-batches. The trainer calls
them in order (trainer.py, `Trainer.update`); scoring (toolrl/scoring) runs the forward passes.

A trajectory of several segments (rollout/trajectory.py) is one sample to every estimator: its trained tokens, segment
after segment in the order they were sampled, get its advantages, which are then split over its segments; each
segment is a row (a sequence) to scoring and to the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from toolrl.algos import AdvantageInputs, Advantages, PolicyInputs, StepTotals, TurnInput, informative_groups
from toolrl.algos import value_loss as clipped_value_loss
from toolrl.algos.corrections import Corrected, CorrectionInputs, CorrectionStats
from toolrl.algos.mismatch import Mismatch
from toolrl.rollout import Trajectory
from toolrl.rollout.trajectory import MODEL, SUMMARY, Segment, UpdateValues
from toolrl.scoring import Plan, TokenScores

LOSS_TERMS = ("loss", "pg_loss", "kl", "entropy", "value_loss")


@dataclass
class StepRows:
    """What the step scores: every segment of every trajectory (its rows), with the trajectory each belongs to."""

    rows: list[Segment]
    owners: list[int]

    @classmethod
    def of(cls, trajs: list[Trajectory]) -> StepRows:
        pairs = [(segment, i) for i, traj in enumerate(trajs) for segment in traj.sequences()]
        return cls([segment for segment, _ in pairs], [owner for _, owner in pairs])

    @property
    def linked(self) -> bool:
        """Whether some trajectory has several segments (scored as a prefix tree: scoring/plan.py)."""
        return len(set(self.owners)) < len(self.rows)

    @property
    def longest_episode(self) -> int:
        """The most tokens one trajectory's segments hold together (its prompt and carried context counted in each)."""
        return episode_tokens(self.rows, self.owners)

    def per_trajectory(self, parts: list[torch.Tensor | None], n: int) -> list[torch.Tensor | None]:
        """Per-row tensors (None for a row with nothing scored) joined per trajectory, in row order."""
        joined: list[list[torch.Tensor]] = [[] for _ in range(n)]
        for owner, part in zip(self.owners, parts, strict=True):
            if part is not None:
                joined[owner].append(part)
        return [None if not p else p[0] if len(p) == 1 else torch.cat(p) for p in joined]


def episode_tokens(rows: list[Segment], owners: list[int]) -> int:
    """The most tokens the rows of one owner (a trajectory's segments) hold together; 0 without rows."""
    totals: dict[int, int] = {}
    for row, owner in zip(rows, owners, strict=True):
        totals[owner] = totals.get(owner, 0) + len(row.token_ids)
    return max(totals.values(), default=0)


def turn_inputs(traj: Trajectory, credit: float = 0.0, env_rewards: bool = True) -> list[TurnInput]:
    """A trajectory's trained spans, segment after segment, for turn-level estimators: trained tokens, reward (a
    model turn's from the environment, 0 where it gave none, plus `credit` times its dense turn credit; a summary's
    0), and the state the turn started from: the environment's `info["state"]` of the step before it when it gives
    one, else the exact context (prompt, calls, results) the turn was generated from in its segment."""
    turns, k = [], 0
    credits = traj.turn_credit or []
    for segment in traj.sequences():
        for kind, start, end in segment.trained_spans():
            reward, given, weighted = 0.0, None, 0.0
            if kind == MODEL:
                reward = traj.turn_rewards[k] if env_rewards and k < len(traj.turn_rewards) else 0.0
                weighted = credit * credits[k] if k < len(credits) else 0.0
                reward += weighted
                given = traj.infos[k - 1].get("state") if 0 < k <= len(traj.infos) else None
                k += 1
            state = ("env", given) if given is not None else ("context", hash(tuple(segment.token_ids[:start])))
            turns.append(TurnInput(sum(segment.loss_mask[start:end]), reward, state, weighted))
    return turns


def turn_reward_tokens(turns: list[TurnInput]) -> torch.Tensor:
    """[trained tokens] each turn's reward at its last trained token, 0 elsewhere."""
    parts = []
    for turn in turns:
        part = torch.zeros(turn.tokens)
        if turn.tokens:
            part[-1] = turn.reward
        parts.append(part)
    return torch.cat(parts) if parts else torch.zeros(0)


def token_weights(row: Segment, summary_weight: float) -> torch.Tensor | None:
    """[trained tokens of the row] each one's loss weight: 1 on model turns, train.summary_weight on what the policy
    wrote for a context strategy; None where every weight is 1."""
    if summary_weight == 1.0 or not any(kind == SUMMARY for kind, _, _ in row.spans):
        return None
    return torch.tensor([summary_weight if kind == SUMMARY else 1.0 for kind, a, b in row.trained_spans()
                         for _ in range(sum(row.loss_mask[a:b]))])  # fmt: skip


@dataclass
class StepBatch:
    """The step's trajectories with what the update needs per trajectory (over all of its segments)."""

    trajs: list[Trajectory]
    counts: list[int]
    """Trained tokens per trajectory."""
    old: list[torch.Tensor]
    """The engine's log-probs at sampling time (the behaviour policy), per trained token."""
    refs: list[torch.Tensor | None]
    values: list[torch.Tensor | None]
    turns: list[list[TurnInput]]
    valid: list[bool]
    """False for a trajectory that a tool's infrastructure fault or its environment's (a user that failed) cut
    short (with train.infra_faults: mask)."""
    token_rewards: torch.Tensor | None = None


def step_batch(trajs, refs, values, t, kl, device, leave_out: Sequence[bool] = ()) -> StepBatch:
    """Per-token rewards: the KL penalty when it is applied as a reward, and each turn's reward at its last
    token with train.turn_rewards: tokens. `refs` and `values`: per trajectory (StepRows.per_trajectory);
    `leave_out`: trajectories not valid whatever their faults (too stale)."""
    old = [torch.tensor(traj.trained_logprobs, device=device) for traj in trajs]
    token_rewards = None
    if t.kl.coef > 0 and t.kl.mode == "reward":  # KL to the reference, per token, at sampling time
        token_rewards = torch.cat(
            [-t.kl.coef * kl(o, r) if r is not None else o for o, r in zip(old, refs, strict=True)]
        )
    coef = t.turn_credit.coef if t.turn_credit.model else 0.0
    turns = [turn_inputs(traj, coef) for traj in trajs]
    placing = turns if t.turn_rewards == "tokens" else None  # else dense credit alone, where it is on
    if placing is None and coef and any(traj.turn_credit for traj in trajs):
        placing = [turn_inputs(traj, coef, env_rewards=False) for traj in trajs]
    if placing is not None:
        placed = torch.cat([turn_reward_tokens(traj_turns) for traj_turns in placing]).to(device)
        token_rewards = placed if token_rewards is None else token_rewards + placed
    valid = [not (t.infra_faults == "mask" and (traj.num_tool_faults or traj.env_fault)) for traj in trajs]
    if leave_out:
        valid = [v and not out for v, out in zip(valid, leave_out, strict=True)]
    counts = [traj.trained_count for traj in trajs]
    return StepBatch(trajs, counts, old, refs, values, turns, valid, token_rewards)


def advantage_inputs(batch: StepBatch, t, device, with_values: bool, options: Any = None) -> AdvantageInputs:
    flat_values = None
    if with_values:
        flat_values = torch.cat([v if v is not None else o for v, o in zip(batch.values, batch.old, strict=True)])
    valid = None if all(batch.valid) else torch.tensor(batch.valid, device=device)
    components, weights, names = reward_components(batch.trajs, t.kl.task_reward, device)
    return AdvantageInputs(
        torch.tensor([traj.reward * t.kl.task_reward for traj in batch.trajs], device=device),
        t.group_size,
        batch.counts,
        batch.token_rewards,
        flat_values,
        t.advantage_eps,
        t.gamma,
        t.lam,
        valid,
        batch.turns,
        t.step_weight,
        options,
        components,
        weights,
        names,
        step_roles(batch.trajs),
    )


def step_roles(trajs) -> list[str] | None:
    """Each trajectory's role where a step's trajectories played more than one (None: one role, as usual)."""
    roles = [traj.role or "" for traj in trajs]
    return roles if len(set(roles)) > 1 else None


def reward_components(trajs, scale: float, device):
    """[trajectories, K] the paid components of the step's rewards (unweighted; 0 where a trajectory's rubric has
    no such component: a mix's environments pay their own), [K] their weights times `scale` and their names;
    None, None, None where no rubric paid a component."""
    weights: dict[str, float] = {}
    for traj in trajs:
        for name, weight in traj.reward_weights.items():
            weights.setdefault(name, weight)
    if not weights:
        return None, None, None
    names = list(weights)
    values = [[traj.rewards.get(name, 0.0) if name in traj.reward_weights else 0.0 for name in names] for traj in trajs]
    scaled = torch.tensor([weights[n] * scale for n in names], device=device)
    return torch.tensor(values, device=device), scaled, names


@dataclass
class Work:
    """One row (a trajectory's segment) in the loss, with its per-token tensors."""

    row: Segment
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    """The engine's log-probs (behaviour policy)."""
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    index: int = 0
    """Its trajectory's position among the step's trajectories."""
    weights: torch.Tensor | None = None
    """Each trained token's loss weight (token_weights), None: all 1."""
    trainer_logprobs: list[float] | None = None
    """The trainer's own log-probs of its trained tokens, once the loss scored it (for its written record)."""


@dataclass
class Selection:
    work: list[Work]
    keep: list[bool] = field(default_factory=list)
    """Per trajectory: whether it entered the loss."""
    totals: StepTotals = field(default_factory=lambda: StepTotals(1, 1))
    advantages: dict[int, list[float]] = field(default_factory=dict)
    """Trajectory index -> the advantages of its trained tokens, for every trajectory that entered the loss."""
    rows: dict[int, list[Work]] = field(default_factory=dict)
    """Trajectory index -> its rows in the loss, before rows of all-zero advantages were skipped."""
    left_out: int = 0
    """Rows with trained tokens of a trajectory in the loss that got no advantage (segments_left_out: always 0)."""

    def values(self, n: int) -> list[UpdateValues | None]:
        """Per trajectory of the step (`n` of them): what the update computed for it (None: left out)."""
        out: list[UpdateValues | None] = []
        for i in range(n):
            if i not in self.advantages:
                out.append(None)
                continue
            scored = [w.trainer_logprobs for w in self.rows.get(i, [])]
            joined = None if not scored or any(lp is None for lp in scored) else [x for lp in scored for x in lp]
            out.append(UpdateValues(self.advantages[i], joined))
        return out


def _share(start: int, n: int, whole: int) -> Callable[[torch.Tensor | None], torch.Tensor | None]:
    """A row's share of its trajectory's per-token tensor: tokens [start, start + n) (the tensor itself for the only
    row of a trajectory)."""
    if n == whole:
        return lambda x: x
    return lambda x: None if x is None else x[start : start + n]


def select(batch: StepBatch, rows: StepRows, est: Advantages, t, only_policy: bool) -> Selection:
    """The trajectories that enter the loss: trained tokens, no infrastructure fault; with
    train.dynamic_sampling only groups whose rewards differ; with train.mask_truncated none cut by a token limit.
    Each enters as its rows (segments with trained tokens), its per-token values split over them in order. With
    `only_policy` (no other loss term), rows whose advantages are all 0 are skipped too: they add nothing to the
    gradient, and they still count in the denominators (`totals`), so the loss is unchanged. The advantages of each
    kept trajectory are in `Selection.advantages` (for its written record)."""
    advantages = est.advantages.split(batch.counts)
    returns = est.returns.split(batch.counts) if est.returns is not None else [None] * len(batch.trajs)
    keep = [n > 0 and v for n, v in zip(batch.counts, batch.valid, strict=True)]
    if t.dynamic_sampling:
        rewards = torch.tensor([traj.reward for traj in batch.trajs])
        informative = informative_groups(rewards, t.group_size, torch.tensor(batch.valid), step_roles(batch.trajs))
        informative = informative.tolist()
        keep = [k and i for k, i in zip(keep, informative, strict=True)]
    if t.mask_truncated:  # cut by a token limit: its last turn is unfinished, leave it out of the loss
        keep = [k and not traj.truncated for k, traj in zip(keep, batch.trajs, strict=True)]
    per_traj = [(a, o, r, v, ret) for a, o, r, v, ret in zip(advantages, batch.old, batch.refs, batch.values, returns,
                                                             strict=True)]  # fmt: skip
    offsets = [0] * len(batch.trajs)
    selection = Selection([], keep)
    for row, owner in zip(rows.rows, rows.owners, strict=True):
        n = sum(row.loss_mask)
        if not (keep[owner] and n):
            continue
        a, o, r, v, ret = per_traj[owner]
        share = _share(offsets[owner], n, batch.counts[owner])
        offsets[owner] += n
        a, o, r, v, ret = (share(x) for x in (a, o, r, v, ret))
        work = Work(row, a, o, r, v, ret, owner, token_weights(row, t.summary_weight))
        selection.work.append(work)
        selection.rows.setdefault(owner, []).append(work)
    selection.left_out = sum(keep[i] and offsets[i] != batch.counts[i] for i in range(len(batch.trajs)))
    selection.advantages = {i: advantages[i].tolist() for i in range(len(batch.trajs)) if keep[i]}
    selection.totals = StepTotals(tokens=max(sum(len(w.advantages) for w in selection.work), 1),
                                  sequences=max(len(selection.work), 1))  # fmt: skip
    if only_policy:
        selection.work = [w for w in selection.work if bool(w.advantages.any())]
    return selection


def _cat(work: list[Work], name: str) -> torch.Tensor:
    return torch.cat([getattr(w, name) for w in work])


@dataclass
class LossFunctions:
    policy_loss: Callable
    aggregate: Callable
    kl: Callable
    correction: Callable[[CorrectionInputs], Corrected] = field(default=lambda x: Corrected(None))
    """The off-policy correction with its options bound (train.correction; algos/corrections.py)."""
    corrects: bool = False
    """A correction other than none: its metrics (correction/*) are logged."""

    @classmethod
    def of(cls, config) -> LossFunctions:
        """A run config's policy loss, aggregation, KL estimator and off-policy correction (with its options)."""
        from toolrl.algos import AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES
        from toolrl.config.resolve import correction_name, plugin_options

        t, name = config.train, correction_name(config.train)
        correct = partial(CORRECTIONS.lookup(name), options=plugin_options(config)["correction"])
        kl = KL_ESTIMATORS.lookup(t.kl.estimator)
        return cls(POLICY_LOSSES.lookup(t.loss), AGGREGATIONS.lookup(t.aggregation), kl, correct, name != "none")


def backward(
    selection: Selection,
    plan: Plan,
    scores: Callable[[list[Segment]], TokenScores],
    fns: LossFunctions,
    t,
    pad_to: int = 0,
    dummy: Segment | None = None,
    mismatch: Mismatch | None = None,
    corrections: CorrectionStats | None = None,
) -> tuple[dict[str, float], int]:
    """The loss over micro-batches, each backpropagated: policy loss, plus the KL term (train.kl.mode: loss),
    minus the entropy bonus, plus the value loss. Returns the summed terms and the clipped token count;
    "entropy" is the mean entropy of the tokens the update scored (None when it scored none).

    The trainer recomputes every log-prob itself. The step makes one optimizer step after all its micro-batches,
    so the log-probs of this forward pass, detached, are the old policy's: the ratio is against them, and the
    engine's sampling log-probs (`Work.old_logprobs`, the behaviour policy) measure the mismatch (`mismatch`) and
    go to the off-policy correction (`fns.correction`, train.correction: a weight per token, 0 where masked, summed
    in `corrections`), which may take the ratio against them; with none and train.async_steps, it is against them
    (clipped as PPO does).
    `pad_to`: run forward and backward passes of zero loss on `dummy` until there were that many (data
    parallel ranks must make the same number of sharded passes). `plan`: the micro-batches and the step's shared
    prompt, computed once for every micro-batch; the micro-batches' gradients of it go through it at the end. A token
    the policy wrote for a context strategy weighs train.summary_weight in the policy loss (Work.weights)."""
    sums = dict.fromkeys(LOSS_TERMS, 0.0)
    clipped = 0
    measured = [0.0, 0]  # entropy: the sum over scored tokens, and their number
    totals = selection.totals
    batches = plan.batches
    for _ in range(pad_to - len(batches)):
        scored = scores([dummy])
        zero = scored.logprobs.sum() * 0.0
        for extra in (scored.entropy, scored.values):
            if extra is not None:
                zero = zero + extra.sum() * 0.0
        zero.backward()
    for batch in batches:
        chosen = [selection.work[i] for i in batch]
        scored = scores([w.row for w in chosen])
        engine = _cat(chosen, "old_logprobs")
        for w, own in zip(chosen, scored.logprobs.detach().split(scored.counts), strict=True):
            w.trainer_logprobs = own.tolist()  # for its written record
        if mismatch is not None:
            mismatch.add(scored.logprobs, engine, t.tis_cap)
        corrected = fns.correction(CorrectionInputs(scored.logprobs, engine, scored.counts))
        if corrections is not None:
            corrections.add(corrected, len(engine))
        against = corrected.against or ("behaviour" if t.async_steps > 0 else "trainer")
        inputs = PolicyInputs(
            scored.logprobs,
            engine if against == "behaviour" else scored.logprobs.detach(),
            _cat(chosen, "advantages"),
            scored.counts,
            t.clip_low,
            t.clip_high,
        )
        per_token, was_clipped = fns.policy_loss(inputs)
        if corrected.weights is not None:
            per_token = per_token * corrected.weights.to(per_token.device)
        if any(w.weights is not None for w in chosen):
            weights = [w.weights if w.weights is not None else torch.ones(len(w.advantages)) for w in chosen]
            per_token = per_token * torch.cat(weights).to(per_token.device)
        pg = fns.aggregate(per_token, scored.counts, totals)
        loss = pg
        sums["pg_loss"] += float(pg.detach())
        if t.kl.coef > 0:
            kl = fns.aggregate(fns.kl(scored.logprobs, _cat(chosen, "ref_logprobs")), scored.counts, totals)
            sums["kl"] += float(kl.detach())
            if t.kl.mode == "loss":
                loss = loss + t.kl.coef * kl
        if scored.entropy is not None:  # a loss term with train.entropy_coef, else measured (no gradient)
            measured[0] += float(scored.entropy.detach().sum())
            measured[1] += len(scored.entropy)
            if t.entropy_coef > 0:
                loss = loss - t.entropy_coef * fns.aggregate(scored.entropy, scored.counts, totals)
        if scored.values is not None:
            v_loss = clipped_value_loss(
                scored.values, _cat(chosen, "old_values"), _cat(chosen, "returns"), t.value_clip
            )
            v_loss = fns.aggregate(v_loss, scored.counts, totals)
            sums["value_loss"] += float(v_loss.detach())
            loss = loss + t.vf_coef * v_loss
        loss.backward()
        sums["loss"] += float(loss.detach())
        clipped += int(was_clipped.sum())
    plan.finish()
    sums["entropy"] = measured[0] / measured[1] if measured[1] else None  # mean over the tokens scored
    return sums, clipped
