"""Weights that reach an engine while it samples: partial rollouts (`train.partial_rollouts`).

With `train.async_steps`, rollouts run while the trainer updates. Without partial rollouts an engine takes new
weights only when a rollout starts, so an episode that outlasts an update is sampled to its end by the weights it
started with. With them, the trainer posts each update's weights to a `WeightInbox` and the engine takes the newest
at its next step boundary (the hf engine: between two decoding steps; vLLM: between its own steps, as the weights
are loaded). What happens to the sequences in flight is the mode:

- `continue`: they go on. The keys and values already cached for their earlier positions stay as the old weights
  computed them (as PipelineRL does); every token sampled after the swap comes from a pass of the new weights
  (the hf engine feeds each sequence's last token again rather than sample from logits of the old weights).
- `cut`: they are cut at the swap and resumed: the hf engine drops every sequence's cache, so each one's whole
  context is computed again by the new weights before it samples on (AReaL's interruptible generation); it costs a
  prefill of every sequence in flight per swap.

Every sampled token carries the version (optimizer steps) of the weights that sampled it (`Sampled.versions`,
`Trajectory.versions`), so that the trainer bounds and reports each trajectory's staleness token by token.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

log = logging.getLogger(__name__)

PARTIAL_MODES: tuple[str, ...] = ("off", "continue", "cut")
"""train.partial_rollouts' values (config/schema.py names them too: the config imports no engine code)."""


class WeightInbox:
    """The newest weights a trainer posted for the generation copy (`target`), taken by whoever samples from it.

    `lock` is held by the trainer while its optimizer writes the weights (`writing`), so that a copy never reads
    half an update. A post carries either the weights themselves (gathered from shards under torchrun) or nothing:
    then `source()` (the trainer's own state dict) is read under the lock when the weights are taken."""

    def __init__(self, mode: str, target: torch.nn.Module, source: Callable[[], Mapping[str, torch.Tensor]]):
        if mode not in PARTIAL_MODES:
            raise ValueError(f"partial rollouts: unknown mode {mode!r}; one of {', '.join(PARTIAL_MODES)}")
        self.mode, self.target, self.source = mode, target, source
        self.lock = threading.RLock()
        self.posted = 0
        """The newest version posted (optimizer steps)."""
        self.taken = 0
        """The version in `target`."""
        self._state: Mapping[str, torch.Tensor] | None = None
        self.swaps_in_flight = 0
        """Swaps an engine made while sequences were in flight (partial rollouts)."""

    @property
    def mid_rollout(self) -> bool:
        """Whether engines take posted weights while a rollout runs (not only when it starts)."""
        return self.mode != "off"

    def writing(self) -> threading.RLock:
        """Held while the trainer's optimizer writes the weights: `with inbox.writing(): optimizer.step()`."""
        return self.lock

    def post(self, version: int, state: Mapping[str, torch.Tensor] | None = None) -> None:
        with self.lock:
            if version > self.posted:
                self.posted, self._state = version, state

    def newer(self) -> bool:
        return self.posted > self.taken

    def take(self) -> int:
        """Copy the newest posted weights into the target; returns the version it holds."""
        with self.lock:
            if self.posted > self.taken:
                state = self._state if self._state is not None else self.source()
                with torch.inference_mode(False), torch.no_grad():
                    self.target.load_state_dict(state)
                self.taken, self._state = self.posted, None
            return self.taken


def take_between_steps(engine: Any) -> bool:
    """At an hf engine's step boundary (rollout/hf.py; its worker thread, nothing computing): the newest posted
    weights, where the inbox's mode takes them mid-rollout. What the engine derived from the old weights goes (its
    packed copies, its lean forward); each sequence's logits go, so its next token is sampled after a pass of the new
    weights; under `cut` each sequence's cache goes too, and its whole context is computed again. True when weights
    were taken."""
    inbox = engine.inbox
    if inbox is None or not inbox.mid_rollout or not inbox.newer():
        return False
    before = engine.weights_version
    engine.weights_version = inbox.take()
    engine.packed.clear()
    engine._lean = False
    in_flight = [slot for slot in engine.slots.values() if slot.ids]
    for slot in in_flight:
        slot.logits = None
        if inbox.mode == "cut":
            slot.ids, slot.shared = [], False
    if inbox.mode == "cut":
        engine.shared = None
    if in_flight:
        inbox.swaps_in_flight += 1
    engine.stats["weight_swaps"] += 1
    log.debug("hf engine: weights %d -> %d with %d sequences in flight (%s)", before, engine.weights_version,
              len(in_flight), inbox.mode)  # fmt: skip
    return True
