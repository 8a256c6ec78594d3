"""The pieces of one policy update, as functions of the step's trajectories: the per-token inputs (old and
reference log-probs, values, token rewards), the advantage estimator's inputs, which trajectories enter the
loss, and the loss itself over micro-batches, and the forward passes that score them (Scorer). The trainer
calls them in order (trainer.py, `Trainer.update`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from toolrl import distributed
from toolrl.algos import AdvantageInputs, Advantages, PolicyInputs, StepTotals, TurnInput, informative_groups
from toolrl.algos import value_loss as clipped_value_loss
from toolrl.algos.mismatch import Mismatch, tis_weights
from toolrl.memory import for_sequences
from toolrl.models.policy import reference_context
from toolrl.rollout import Trajectory
from toolrl.rollout.trajectory import UpdateValues
from toolrl.train.logprobs import StepPrefix, TokenScores, micro_batches, score_tokens, shared_prefix_length
from toolrl.train.rollout_prefix import RolloutPrefix
from toolrl.train.teacher import EndpointTeacher
from toolrl.train.vocab_logprobs import VocabBlocks

LOSS_TERMS = ("loss", "pg_loss", "kl", "entropy", "value_loss")


def turn_inputs(traj: Trajectory) -> list[TurnInput]:
    """A trajectory's model turns for turn-level estimators: trained tokens, reward (0 where the environment
    gave none), and the state the turn started from: the environment's `info["state"]` of the step before it
    when it gives one, else the exact context (prompt, calls, results) the turn was generated from."""
    turns = []
    for k, (start, end) in enumerate(traj.model_spans()):
        reward = traj.turn_rewards[k] if k < len(traj.turn_rewards) else 0.0
        given = traj.infos[k - 1].get("state") if 0 < k <= len(traj.infos) else None
        state = ("env", given) if given is not None else ("context", hash(tuple(traj.token_ids[:start])))
        turns.append(TurnInput(sum(traj.loss_mask[start:end]), reward, state))
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


@dataclass
class StepBatch:
    """The step's trajectories with what the update needs per trajectory."""

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
    owners: list[int] = field(default_factory=list)
    """For each trajectory after the step's own (the extra sequences of a sample, Trajectory.extra), the index of
    the trajectory whose sample it belongs to."""

    @property
    def primary(self) -> int:
        """The step's own trajectories (the groups): the first ones."""
        return len(self.trajs) - len(self.owners)

    def head(self) -> StepBatch:
        """The step's own trajectories alone: what an advantage estimator reads (its groups are positional)."""
        n = self.primary
        rewards = None if self.token_rewards is None else self.token_rewards[: sum(self.counts[:n])]
        return StepBatch(self.trajs[:n], self.counts[:n], self.old[:n], self.refs[:n], self.values[:n],
                         self.turns[:n], self.valid[:n], rewards)  # fmt: skip


def with_extras(trajs: list[Trajectory], sequence_level: bool) -> tuple[list[Trajectory], list[int]]:
    """The step's trajectories followed by their samples' extra sequences, with each extra's owner; none when the
    estimator gives per-token advantages (an extra has no advantage of its own to take)."""
    if not sequence_level:
        return trajs, []
    extras = [(i, extra) for i, traj in enumerate(trajs) for extra in traj.extra]
    return trajs + [extra for _, extra in extras], [i for i, _ in extras]


def extend_advantages(est: Advantages, counts: list[int], owners: list[int], extra_counts: list[int]) -> Advantages:
    """A sequence-level estimator's advantages with each extra sequence given its owner's (one value per
    trajectory); an owner without trained tokens gives 0."""
    if not owners:
        return est
    starts = [0]
    for count in counts:
        starts.append(starts[-1] + count)
    parts = [est.advantages]
    for owner, count in zip(owners, extra_counts, strict=True):
        value = est.advantages[starts[owner]] if counts[owner] else est.advantages.new_zeros(())
        parts.append(value.expand(count))
    return Advantages(torch.cat(parts), est.returns)


def step_batch(trajs, refs, values, t, kl, device, owners: list[int] | None = None) -> StepBatch:
    """Per-token rewards: the KL penalty when it is applied as a reward, and each turn's reward at its last
    token with train.turn_rewards: tokens."""
    old = [torch.tensor(traj.trained_logprobs, device=device) for traj in trajs]
    token_rewards = None
    if t.kl.coef > 0 and t.kl.mode == "reward":  # KL to the reference, per token, at sampling time
        token_rewards = torch.cat(
            [-t.kl.coef * kl(o, r) if r is not None else o for o, r in zip(old, refs, strict=True)]
        )
    turns = [turn_inputs(traj) for traj in trajs]
    if t.turn_rewards == "tokens":
        placed = torch.cat([turn_reward_tokens(traj_turns) for traj_turns in turns]).to(device)
        token_rewards = placed if token_rewards is None else token_rewards + placed
    valid = [not (t.infra_faults == "mask" and (traj.num_tool_faults or traj.env_fault)) for traj in trajs]
    counts = [sum(traj.loss_mask) for traj in trajs]
    return StepBatch(trajs, counts, old, refs, values, turns, valid, token_rewards, list(owners or []))


def advantage_inputs(batch: StepBatch, t, device, with_values: bool, options: Any = None) -> AdvantageInputs:
    flat_values = None
    if with_values:
        flat_values = torch.cat([v if v is not None else o for v, o in zip(batch.values, batch.old, strict=True)])
    valid = None if all(batch.valid) else torch.tensor(batch.valid, device=device)
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
    )


@dataclass
class Work:
    """One trajectory in the loss, with its per-token tensors."""

    traj: Trajectory
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    """The engine's log-probs (behaviour policy)."""
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    index: int = 0
    """Its position among the step's trajectories."""
    trainer_logprobs: list[float] | None = None
    """The trainer's own log-probs of its trained tokens, once the loss scored it (for its written record)."""


@dataclass
class Selection:
    work: list[Work]
    keep: list[bool] = field(default_factory=list)
    totals: StepTotals = field(default_factory=lambda: StepTotals(1, 1))
    advantages: dict[int, list[float]] = field(default_factory=dict)
    """Trajectory index -> the advantages of its trained tokens, for every trajectory that entered the loss."""

    def values(self, n: int) -> list[UpdateValues | None]:
        """Per trajectory of the step (`n` of them): what the update computed for it (None: left out)."""
        scored = {w.index: w.trainer_logprobs for w in self.work}
        return [UpdateValues(self.advantages[i], scored.get(i)) if i in self.advantages else None for i in range(n)]


def select(batch: StepBatch, est: Advantages, t, only_policy: bool) -> Selection:
    """The trajectories that enter the loss: trained tokens, no infrastructure fault; with
    train.dynamic_sampling only groups whose rewards differ; with train.mask_truncated none cut by a token limit.
    With `only_policy` (no other loss term), trajectories whose advantages are all 0 are skipped too: they add
    nothing to the gradient, and they still count in the denominators (`totals`), so the loss is unchanged.
    The advantages of each kept trajectory are in `Selection.advantages` (for its written record)."""
    advantages = est.advantages.split(batch.counts)
    returns = est.returns.split(batch.counts) if est.returns is not None else [None] * len(batch.trajs)
    keep = [n > 0 and v for n, v in zip(batch.counts, batch.valid, strict=True)]
    if t.dynamic_sampling:  # groups are the step's own trajectories; an extra sequence goes with its owner's
        n = batch.primary
        rewards = torch.tensor([traj.reward for traj in batch.trajs[:n]])
        informative = informative_groups(rewards, t.group_size, torch.tensor(batch.valid[:n])).tolist()
        informative += [informative[owner] for owner in batch.owners]
        keep = [k and i for k, i in zip(keep, informative, strict=True)]
    if t.mask_truncated:  # cut by a token limit: its last turn is unfinished, leave it out of the loss
        keep = [k and not traj.truncated for k, traj in zip(keep, batch.trajs, strict=True)]
    parts = zip(batch.trajs, advantages, batch.old, batch.refs, batch.values, returns, keep, strict=True)
    work = [Work(traj, a, o, r, v, ret, i) for i, (traj, a, o, r, v, ret, k) in enumerate(parts) if k]
    given = {w.index: w.advantages.tolist() for w in work}
    totals = StepTotals(tokens=max(sum(len(w.advantages) for w in work), 1), sequences=max(len(work), 1))
    if only_policy:
        work = [w for w in work if bool(w.advantages.any())]
    return Selection(work, keep, totals, given)


def _cat(work: list[Work], name: str) -> torch.Tensor:
    return torch.cat([getattr(w, name) for w in work])


@dataclass
class LossFunctions:
    policy_loss: Callable
    aggregate: Callable
    kl: Callable


def backward(
    selection: Selection,
    batches: list[list[int]],
    scores: Callable[[list[Trajectory]], TokenScores],
    fns: LossFunctions,
    t,
    pad_to: int = 0,
    dummy: Trajectory | None = None,
    mismatch: Mismatch | None = None,
    prefix: StepPrefix | None = None,
) -> tuple[dict[str, float], int]:
    """The loss over micro-batches, each backpropagated: policy loss, plus the KL term (train.kl.mode: loss),
    minus the entropy bonus, plus the value loss. Returns the summed terms and the clipped token count;
    "entropy" is the mean entropy of the tokens the update scored (None when it scored none).

    The trainer recomputes every log-prob itself. The step makes one optimizer step after all its micro-batches,
    so the log-probs of this forward pass, detached, are the old policy's: the ratio is against them, and the
    engine's sampling log-probs (`Work.old_logprobs`, the behaviour policy) only measure the mismatch
    (`mismatch`), or weigh each token by min(pi_trainer / pi_engine, train.tis_cap) with a cap. With
    train.async_steps and no cap, the ratio is against the behaviour log-probs (clipped as PPO does).
    `pad_to`: run forward and backward passes of zero loss on `dummy` until there were that many (data
    parallel ranks must make the same number of sharded passes). `prefix`: the step's shared prompt, computed once
    for every micro-batch (StepPrefix); the micro-batches' gradients of it go through it at the end."""
    sums = dict.fromkeys(LOSS_TERMS, 0.0)
    clipped = 0
    measured = [0.0, 0]  # entropy: the sum over scored tokens, and their number
    totals = selection.totals
    for _ in range(pad_to - len(batches)):
        scored = scores([dummy])
        zero = scored.logprobs.sum() * 0.0
        for extra in (scored.entropy, scored.values):
            if extra is not None:
                zero = zero + extra.sum() * 0.0
        zero.backward()
    for batch in batches:
        chosen = [selection.work[i] for i in batch]
        scored = scores([w.traj for w in chosen])
        engine = _cat(chosen, "old_logprobs")
        for w, own in zip(chosen, scored.logprobs.detach().split(scored.counts), strict=True):
            w.trainer_logprobs = own.tolist()  # for its written record
        if mismatch is not None:
            mismatch.add(scored.logprobs, engine, t.tis_cap)
        against_behaviour = t.async_steps > 0 and t.tis_cap is None
        inputs = PolicyInputs(
            scored.logprobs,
            engine if against_behaviour else scored.logprobs.detach(),
            _cat(chosen, "advantages"),
            scored.counts,
            t.clip_low,
            t.clip_high,
        )
        per_token, was_clipped = fns.policy_loss(inputs)
        if t.tis_cap is not None:
            per_token = per_token * tis_weights(scored.logprobs, engine, t.tis_cap)
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
    if prefix is not None:
        prefix.backward()
    sums["entropy"] = measured[0] / measured[1] if measured[1] else None  # mean over the tokens scored
    return sums, clipped


class Scorer:
    """The trainer's forward passes over a step's trajectories: micro-batches (a group's shared prompt computed
    once), reference log-probs and value estimates before the update, and the policy's scores in the loss."""

    def __init__(
        self,
        reference,
        temperature: float,
        micro_batch_tokens: int,
        dist,
        vocab: VocabBlocks,
        kept: RolloutPrefix | None = None,
    ) -> None:
        self.reference, self.temperature, self.micro_batch_tokens, self.dist = (
            reference,
            temperature,
            micro_batch_tokens,
            dist,
        )
        self.vocab = vocab
        self.kept: RolloutPrefix | None = kept
        """The shared prompt the rollout computed with the update's forward pass (train/rollout_prefix.py)."""

    def scores(
        self, model, trajs: list[Trajectory], entropy: bool | str = False, value_head=None, prefix=None
    ) -> TokenScores:
        return score_tokens(model, trajs, self.temperature, entropy, value_head, self.vocab, prefix)

    def policy(
        self, model, value_head, entropy: bool | str, prefix: StepPrefix | None = None
    ) -> Callable[[list[Trajectory]], TokenScores]:
        """The policy's log-probs (with entropy and values when the loss needs them) for a micro-batch; with
        `prefix`, the step's shared prompt is read from it (computed once for every micro-batch)."""
        return lambda trajs: self.scores(model, trajs, entropy, value_head, prefix)

    def step_prefix(self, model, work: list[Work], batches: list[list[int]]) -> StepPrefix | None:
        """The step's shared prompt through the model once for all its micro-batches: the one the rollout
        computed (`kept`) where it applies, else computed now (None where each micro-batch computes its own: one
        micro-batch, data-parallel ranks)."""
        for_sequences(max((len(w.traj.token_ids) for w in work), default=0))  # a long step's heap: memory.py
        if self.dist.on:
            return None
        trajs = [w.traj for w in work]
        kept = self.kept
        taken = kept.take(trajs, StepPrefix.usable_length(model, trajs)) if kept is not None else None
        return taken or StepPrefix.of(model, trajs, batches)

    def prompt_pass_metrics(self) -> dict[str, int]:
        """The rollouts' prompt passes so far: taken by an update, or dropped (computed again by the update)."""
        if self.kept is None:
            return {}
        return {f"prompt_pass/{what}": self.kept.stats[what] for what in ("taken", "dropped")}

    def micro_batches(self, trajs: list[Trajectory]) -> list[list[int]]:
        # sharded, each row runs its whole sequence (logprobs.py): no shared prefix to leave out
        shared = shared_prefix_length(trajs) if trajs and not self.dist.on else 0
        return micro_batches([len(traj.token_ids) - shared for traj in trajs], self.micro_batch_tokens)

    def before_update(
        self, model, value_head, trajs: list[Trajectory], need_ref: bool
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Per trajectory, without gradient: reference log-probs (KL) and the value head's estimates (GAE)."""
        refs: list[torch.Tensor | None] = [None] * len(trajs)
        values: list[torch.Tensor | None] = [None] * len(trajs)
        need_values = value_head is not None
        if not (need_ref or need_values):
            return refs, values
        scored = [i for i, traj in enumerate(trajs) if sum(traj.loss_mask)]
        if need_ref and isinstance(self.reference, EndpointTeacher):  # a served teacher scores over HTTP
            for i, part in zip(scored, self.reference.score([trajs[i] for i in scored]), strict=True):
                refs[i] = part
            need_ref = False
        model.eval()
        batches = self.micro_batches([trajs[i] for i in scored])
        with torch.no_grad():
            sharded = need_values or (need_ref and self.reference is None)  # passes through the sharded model
            for _ in range(distributed.max_over_ranks(self.dist, len(batches)) - len(batches) if sharded else 0):
                self._dummy(model, value_head, trajs[0], need_ref)  # the passes other ranks make
            for batch in batches:
                chosen = [trajs[scored[i]] for i in batch]
                if need_ref:
                    ref_model, context = reference_context(model, self.reference)
                    with context:
                        ref = self.scores(ref_model, chosen)
                    for i, part in zip(batch, ref.logprobs.split(ref.counts), strict=True):
                        refs[scored[i]] = part
                if need_values:
                    out = self.scores(model, chosen, value_head=value_head)
                    for i, part in zip(batch, out.values.split(out.counts), strict=True):
                        values[scored[i]] = part
        return refs, values

    def _dummy(self, model, value_head, traj: Trajectory, ref: bool) -> None:
        """The sharded passes another rank makes and this one has no batch for (results unused)."""
        if ref and self.reference is None:
            ref_model, context = reference_context(model, None)
            with context:
                self.scores(ref_model, [traj])
        if value_head is not None:
            self.scores(model, [traj], value_head=value_head)
