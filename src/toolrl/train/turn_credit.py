"""Dense turn credit (TRACE; IGPO, Wang et al. 2025, arXiv:2510.14967): how much each turn made the gold answer
more likely. A frozen model (the run's initial policy, or a named one) reads the context the policy had before each
of its turns, and after its last, and scores the gold answer written as the final answer would be
(`train.turn_credit.template`): lp_k = log p(gold | context before turn k), lp_T = log p(gold | the whole
trajectory). Turn k's credit is lp_{k+1} - lp_k, so a trajectory's credits sum to lp_T - lp_0 (they telescope): a
call whose result holds the answer gains, a turn that wanders loses. The credits are turn rewards (times `coef`):
at each turn's last generated token, for every estimator (summed into the sequence score by grpo, credited per
token by reinforce_pp and gae, per turn by gigpo and igpo).

What changes is `train.turn_credit.measure` (MEASURES): `logprob` as above, unbounded (a turn moves it by several
nats); `prob`, IGPO's p(gold | context) = exp(mean over the answer's tokens of log p), in [0, 1], so a turn's credit
is in [-1, 1] and a trajectory's sum telescopes to p_T - p_0. `train.turn_credit.normalize` standardizes the credits
of a group's turns (all its trajectories' turns of one role) to mean 0 and std 1 before they are weighted, as IGPO
does (`group_normalized`; the sums then no longer telescope).

The contexts of one segment are prefixes of each other, and a group's trajectories share their prompt: the model
reads a step's contexts through one key/value cache that keeps what a context shares with the one before it, and
scores the answer from the cache at each boundary (then drops the answer's entries), so a group's prompt is read
once, a trajectory of T turns costs one pass over its own tokens and T + 1 short ones, and logits are computed only
at the positions a score needs. A task without a gold answer gets no credit (counted).
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from toolrl.errors import ConfigError
from toolrl.models.cache_arg import cache_arg
from toolrl.rollout.trajectory import MODEL, Trajectory


def boundary_contexts(traj: Trajectory, closing: list[int]) -> list[list[int]]:
    """The ids the policy had before each of its model turns (its segment up to the turn's first generated token),
    then the whole last segment followed by `closing` (what opens the next assistant turn)."""
    contexts = []
    segments = traj.sequences()
    for segment in segments:
        for kind, start, _ in segment.trained_spans():
            if kind == MODEL:
                contexts.append(list(segment.token_ids[:start]))
    contexts.append([*segments[-1].token_ids, *closing])
    return contexts


def shared_length(a: list[int], b: list[int]) -> int:
    """How many leading ids two lists share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class PrefixReader:
    """Scores contexts through one key/value cache that keeps what each context shares with the one read before
    it: a trajectory's boundaries extend each other, and the trajectories of a group share their prompt, so a
    step's group prompt is read once and each trajectory's tokens once. A boundary is one forward (the context's
    new ids, the probe and the target) with logits only where the target is predicted. `tokens_read` counts what
    the model was fed."""

    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = None
        self.fed: list[int] = []
        self.tokens_read = 0

    def _logits(self, ids: list[int], positions: torch.Tensor) -> torch.Tensor:
        """The logits at `positions` of `ids` read on from the cache."""
        self.tokens_read += len(ids)
        out = self.model(input_ids=torch.tensor([ids], device=self.device), **cache_arg(self.model, self.cache),
                         use_cache=True, logits_to_keep=positions)  # fmt: skip
        return out.logits[0]

    def _keep(self, length: int) -> None:
        """The cache cut to its first `length` positions (crop by a negative count: every transformers version's
        way; 5.x refuses a positive one)."""
        drop = self.cache.get_seq_length() - length
        if drop > 0:
            self.cache.crop(-drop)

    @torch.no_grad()
    def score(self, context: list[int], probe: list[int], target: list[int]) -> float:
        """log p(target | context + probe), summed over the target's tokens; the cache holds `context` after."""
        from transformers import DynamicCache

        kept = max(0, min(shared_length(self.fed, context), len(context) - 1))  # one id read again: the target's
        if self.cache is None or kept == 0:  # first token may follow it (an empty probe)
            self.cache, kept = DynamicCache(), 0
        else:
            self._keep(kept)
        ids = [*context[kept:], *probe, *target]
        first = len(ids) - len(target) - 1  # the position whose logits predict target[0]
        logits = self._logits(ids, torch.arange(first, len(ids) - 1, device=self.device))
        self.fed = list(context)
        self._keep(len(context))  # the probe's and target's entries dropped
        predicted = logits.float().log_softmax(-1)
        return float(predicted.gather(1, torch.tensor(target, device=self.device)[:, None]).sum())


def answer_logprobs(model, contexts: list[list[int]], probe: list[int], target: list[int]) -> list[float]:
    """log p(target | context + probe) for each context, summed over the target's tokens, read through one
    PrefixReader (a context that extends the one before it reads only its new ids)."""
    reader = PrefixReader(model)
    return [reader.score(context, probe, target) for context in contexts]


def naive_answer_logprobs(model, contexts: list[list[int]], probe: list[int], target: list[int]) -> list[float]:
    """The same, each context read whole (the check of answer_logprobs's cache)."""
    device = next(model.parameters()).device
    scores = []
    with torch.no_grad():
        for context in contexts:
            ids = torch.tensor([context + probe + target], device=device)
            logits = model(input_ids=ids).logits[0, -len(target) - 1 : -1].float().log_softmax(-1)
            scores.append(float(logits.gather(1, torch.tensor(target, device=device)[:, None]).sum()))
    return scores


MEASURES: dict[str, Callable[[float, int], float]] = {
    "logprob": lambda total, tokens: total,  # log p(gold), summed over its tokens (TRACE)
    "prob": lambda total, tokens: math.exp(total / tokens),  # per-token geometric mean probability (IGPO)
}
"""What a turn's credit is the change of, from the answer's summed log-probability and its number of tokens."""


def telescoped(scores: list[float]) -> list[float]:
    """Each turn's credit: the change of the measure of the answer over it."""
    return [after - before for before, after in itertools.pairwise(scores)]


def mean(xs: list[float]) -> float:
    """The mean, 0 for none."""
    return sum(xs) / max(len(xs), 1)


def group_normalized(credits: list[list[float] | None], keys: list) -> list[list[float] | None]:
    """Each trajectory's turn credits standardized over every turn of the trajectories that share its key (a group
    and a role): minus their mean, over their standard deviation (0 where they are all equal). None stays None."""
    pooled: dict = {}
    for turns, key in zip(credits, keys, strict=True):
        pooled.setdefault(key, []).extend(turns or [])
    stats = {key: (statistics.fmean(v), statistics.pstdev(v)) for key, v in pooled.items() if v}
    return [None if turns is None else
            [(c - stats[key][0]) / stats[key][1] if stats[key][1] > 1e-8 else 0.0 for c in turns]
            for turns, key in zip(credits, keys, strict=True)]  # fmt: skip


@dataclass
class TurnCredit:
    """Scores a step's trajectories (`assign`) with a frozen model, in place: `traj.turn_credit`."""

    model: object
    chat: object
    template: str
    coef: float
    context: object = None
    """A context manager the model is read under (LoRA's adapters off), or None."""
    measure: str = "logprob"
    """A name in MEASURES."""
    normalize: bool = False
    """Standardize each group's turn credits (group_normalized)."""

    def __post_init__(self) -> None:
        if self.template.count("{answer}") != 1:
            raise ConfigError("train.turn_credit.template: write {answer} once, where the gold answer goes")
        if self.measure not in MEASURES:
            raise ConfigError(f"train.turn_credit.measure: {self.measure!r} is not one of {', '.join(MEASURES)}")
        self.prefix, self.suffix = self.template.split("{answer}")

    def _read(self) -> AbstractContextManager:
        return self.context() if callable(self.context) else nullcontext()

    def boundaries(self, traj: Trajectory) -> tuple[list[list[int]], list[int]] | None:
        """(the contexts scored, the gold answer's ids as the template writes it) of a trajectory, or None where its
        task has no gold answer or it has no tokens."""
        answer = str(traj.task.answer or "").strip()
        if not answer or not traj.token_ids:
            return None
        last = traj.sequences()[-1].token_ids
        closing = self.chat.continuation_ids([], bool(last) and last[-1] == self.chat.end_of_turn_id)
        return boundary_contexts(traj, closing), self.chat.encode(answer + self.suffix)

    def assign(self, trajs: list[Trajectory], group_size: int | None = None) -> dict[str, float]:
        """Each trajectory's per-turn credits (None where its task has no gold answer), and the step's metrics. A
        group is `group_size` trajectories in a row (None: the step is one group), split by role."""
        started = time.perf_counter()
        probe = self.chat.encode(self.prefix) if self.prefix else []
        measure = MEASURES[self.measure]
        starts, ends, scored = [], [], 0
        reader = PrefixReader(self.model)  # one for the step: a group's prompt is read once
        with self._read():
            for traj in trajs:
                traj.turn_credit = None
                if (job := self.boundaries(traj)) is None:
                    continue
                contexts, target = job
                scores = [reader.score(c, probe, target) for c in contexts]
                traj.turn_credit = telescoped([measure(score, len(target)) for score in scores])
                starts.append(scores[0])
                ends.append(scores[-1])
                scored += 1
        credits = [c for traj in trajs for c in (traj.turn_credit or [])]  # as measured, before normalizing
        if self.normalize:
            keys = [(i // group_size if group_size else 0, traj.role) for i, traj in enumerate(trajs)]
            for traj, normalized in zip(trajs, group_normalized([t.turn_credit for t in trajs], keys), strict=True):
                traj.turn_credit = normalized
        return {"credit/scored": scored, "credit/no_answer": len(trajs) - scored,
                "credit/gold_logprob_start": mean(starts), "credit/gold_logprob_end": mean(ends),
                "credit/turn_mean": mean(credits), "credit/turn_mean_abs": mean([abs(c) for c in credits]),
                "credit/tokens_read": reader.tokens_read, "credit_s": time.perf_counter() - started}  # fmt: skip


def make_turn_credit(config, policy, reference, chat, device, dtype: str, cpu_linear: str) -> TurnCredit | None:
    """The credit `train.turn_credit` asks for (None when off): `reference` scores with the run's reference copy
    when it has one (a frozen copy of the initial policy), LoRA's adapters off, or a frozen copy made here; a name
    loads that model, which must read the policy's token ids (its tokenizer)."""
    from toolrl.models.policy import check_teacher_tokenizer, frozen_copy, is_lora

    if not config.model:
        return None
    context = None
    if config.model == "reference":
        if reference is not None and not getattr(reference, "served", False) and isinstance(reference, torch.nn.Module):
            model = reference
        elif is_lora(policy):
            model, context = policy, policy.disable_adapter
        else:
            model = frozen_copy(policy)
    else:
        from toolrl.models import load_model

        check_teacher_tokenizer(chat.tokenizer, config.model)
        model = load_model(config.model, device, dtype, cpu_linear).eval().requires_grad_(False)
    return TurnCredit(model, chat, config.template, config.coef, context, config.measure, config.normalize)
