"""The update's one entry into scoring: a step's rows (every segment of every trajectory) planned once, then
reference log-probs and values before the update, and the policy's scores for each micro-batch of the loss."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl import distributed
from toolrl.memory import for_sequences
from toolrl.models.policy import reference_context
from toolrl.scoring.plan import Sharing, micro_batches, tree_batches
from toolrl.scoring.prefix import StepPrefix, shared_prefix_length
from toolrl.scoring.rollout_prefix import RolloutPrefix
from toolrl.scoring.tokens import Row, TokenScores, score_tokens
from toolrl.scoring.vocab import VocabBlocks


@dataclass
class Plan:
    """A step's rows as they are scored: micro-batches (indices into the rows), how rows share their common tokens,
    and the prompt all of them share computed once (None where each micro-batch computes its own)."""

    batches: list[list[int]]
    sharing: Sharing
    prefix: StepPrefix | None = None

    def finish(self) -> None:
        """After every micro-batch's backward pass: their gradients of the shared prompt through its pass."""
        if self.prefix is not None:
            self.prefix.backward()


class Scorer:
    """The trainer's forward passes over a step's rows: planned (scoring/plan.py) so that what rows share is computed
    once, reference log-probs and value estimates before the update, and the policy's scores in the loss."""

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
        """The shared prompt the rollout computed with the update's forward pass (scoring/rollout_prefix.py)."""

    def scores(
        self, model, rows: list[Row], entropy: bool | str = False, value_head=None, prefix=None, sharing="group"
    ) -> TokenScores:
        return score_tokens(model, rows, self.temperature, entropy, value_head, self.vocab, prefix, sharing)

    def policy(self, model, value_head, entropy: bool | str, plan: Plan) -> Callable[[list[Row]], TokenScores]:
        """The policy's log-probs (with entropy and values when the loss needs them) for a micro-batch of `plan`; the
        step's shared prompt is read from the plan (computed once for every micro-batch)."""
        return lambda rows: self.scores(model, rows, entropy, value_head, plan.prefix, plan.sharing)

    def plan(self, model, rows: list[Row], sharing: Sharing, longest_episode: int = 0) -> Plan:
        """The rows' micro-batches and the step's shared prompt, computed now (or taken from the rollout's pass).
        `longest_episode`: the tokens of the longest trajectory over all its segments (linked rows), which bounds
        the heap as one sequence that long does (memory.py: a long horizon fragments it as a long sequence does)."""
        batches = self.micro_batches(rows, sharing)
        for_sequences(max(longest_episode, *(len(row.token_ids) for row in rows), 0))  # a long step's heap
        if self.dist.on or sharing == "naive":
            return Plan(batches, sharing)
        kept = self.kept
        taken = kept.take(rows, StepPrefix.usable_length(model, rows)) if kept is not None else None
        return Plan(batches, sharing, taken or StepPrefix.of(model, rows, batches))

    def prompt_pass_metrics(self) -> dict[str, int]:
        """The rollouts' prompt passes so far: taken by an update, or dropped (computed again by the update)."""
        if self.kept is None:
            return {}
        return {f"prompt_pass/{what}": self.kept.stats[what] for what in ("taken", "dropped")}

    def micro_batches(self, rows: Sequence[Row], sharing: Sharing = "group") -> list[list[int]]:
        if sharing == "naive":
            return micro_batches([len(row.token_ids) for row in rows], self.micro_batch_tokens)
        # sharded, each row runs its whole sequence (scoring/tokens.py): no shared prefix to leave out
        shared = shared_prefix_length(rows) if rows and not self.dist.on else 0
        if sharing == "tree":
            return tree_batches([row.token_ids[shared:] for row in rows], self.micro_batch_tokens)
        return micro_batches([len(row.token_ids) - shared for row in rows], self.micro_batch_tokens)

    def before_update(
        self, model, value_head, rows: list[Row], need_ref: bool, sharing: Sharing = "group"
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Per row, without gradient: reference log-probs (KL) and the value head's estimates (GAE)."""
        refs: list[torch.Tensor | None] = [None] * len(rows)
        values: list[torch.Tensor | None] = [None] * len(rows)
        need_values = value_head is not None
        if not (need_ref or need_values):
            return refs, values
        scored = [i for i, row in enumerate(rows) if sum(row.loss_mask)]
        if need_ref and getattr(self.reference, "served", False):  # a served teacher scores over HTTP
            for i, part in zip(scored, self.reference.score([rows[i] for i in scored]), strict=True):
                refs[i] = part
            need_ref = False
        model.eval()
        batches = self.micro_batches([rows[i] for i in scored], sharing)
        with torch.no_grad():
            sharded = need_values or (need_ref and self.reference is None)  # passes through the sharded model
            for _ in range(distributed.max_over_ranks(self.dist, len(batches)) - len(batches) if sharded else 0):
                self._dummy(model, value_head, rows[0], need_ref)  # the passes other ranks make
            for batch in batches:
                chosen = [rows[scored[i]] for i in batch]
                if need_ref:
                    ref_model, context = reference_context(model, self.reference)
                    with context:
                        ref = self.scores(ref_model, chosen, sharing=sharing)
                    for i, part in zip(batch, ref.logprobs.split(ref.counts), strict=True):
                        refs[scored[i]] = part
                if need_values:
                    out = self.scores(model, chosen, value_head=value_head, sharing=sharing)
                    for i, part in zip(batch, out.values.split(out.counts), strict=True):
                        values[scored[i]] = part
        return refs, values

    def _dummy(self, model, value_head, row: Any, ref: bool) -> None:
        """The sharded passes another rank makes and this one has no batch for (results unused)."""
        if ref and self.reference is None:
            ref_model, context = reference_context(model, None)
            with context:
                self.scores(ref_model, [row])
        if value_head is not None:
            self.scores(model, [row], value_head=value_head)
