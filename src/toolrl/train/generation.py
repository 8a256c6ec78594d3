"""The weights rollouts sample from: the policy itself (one process, lock-step) or a copy of it (under torchrun, or
with train.async_steps), brought up to the trainer's weights between rollouts; with partial rollouts the engines
take each update's weights while they sample (rollout/inflight.py). Engines with weights of their own (vLLM) are
given the copy's, LoRA merged."""

from __future__ import annotations

import copy
from collections.abc import Callable

from toolrl import distributed
from toolrl.distributed import Dist
from toolrl.errors import ConfigError
from toolrl.models.policy import exported
from toolrl.rollout.engine import ENGINES
from toolrl.rollout.inflight import WeightInbox

PARTIAL_ENGINES = {"continue": ("hf", "vllm"), "cut": ("hf",)}
"""The engines that take weights while they sample, by partial_rollouts mode: the hf engine between decoding steps
(cut: its caches computed again); vLLM as it loads them, between its own steps (its caches kept)."""


class Generation:
    """`copy`: what the engines sample from; `version`: the optimizer steps in its weights. `steps()`: the trainer's
    optimizer steps now."""

    def __init__(self, bench, model, t, dist: Dist, steps: Callable[[], int]):
        self.bench, self.model, self.dist, self.steps = bench, model, dist, steps
        self.copy = model
        if dist.on or t.async_steps:
            self.copy = copy.deepcopy(model).eval()  # unsharded, refreshed after updates
            bench.model = self.copy
            bench.engines.clear()
        self.asynchronous = t.async_steps > 0
        mode = t.partial_rollouts if self.asynchronous else "off"
        self.inbox = WeightInbox(mode, self.copy, lambda: self.model.state_dict())
        self.loads_weights = ENGINES.capability(bench.engine_name, "loads_weights")

    @staticmethod
    def check(t, engine_name: str) -> None:
        """partial_rollouts needs async_steps and an engine that takes weights as it samples: one line if not."""
        mode = t.partial_rollouts
        if mode == "off":
            return
        if not t.async_steps:
            raise ConfigError(
                f"train.partial_rollouts: {mode} takes new weights into rollouts running while the "
                "trainer updates; set train.async_steps to 1 or more (or partial_rollouts: off)"
            )
        if engine_name not in PARTIAL_ENGINES[mode]:
            raise ConfigError(f"train.partial_rollouts: {mode} needs rollout.engine "
                              f"{' or '.join(PARTIAL_ENGINES[mode])} (it takes weights as it samples), not "
                              f"{engine_name}; use partial_rollouts: off")  # fmt: skip

    @property
    def version(self) -> int:
        return self.inbox.taken

    def attach(self, engine) -> None:
        """The rollout engine of training takes posted weights as it samples (partial rollouts, hf)."""
        if self.inbox.mid_rollout and not self.loads_weights:
            engine.inbox = self.inbox
        engine.weights_version = self.version

    def refresh(self, version: int | None = None, force: bool = False) -> None:
        """The copy and the engines hold the trainer's weights of `version` optimizer steps (default: now). No
        rollout may be sampling; under torchrun every rank calls it (the weights are gathered)."""
        version = self.steps() if version is None else version
        if self.version == version and not force:
            return
        if self.copy is not self.model:
            state = distributed.full_state(self.model) if self.dist.on else self.model.state_dict()
            with self.inbox.lock:
                self.copy.load_state_dict(state)
        self.publish()
        self._mark(version)

    def _mark(self, version: int) -> None:
        with self.inbox.lock:
            self.inbox.taken = version
            self.inbox.posted = max(self.inbox.posted, version)
        for engine in self.bench.distinct_engines():
            engine.weights_version = version

    def before_rollout(self) -> None:
        """Before a rollout starts (on the thread that runs it): lock-step, the trainer's weights now; ahead, the
        newest posted ones (no collective: the main thread gathered them when it posted); with partial rollouts
        nothing: the engine takes them as it samples."""
        if not self.asynchronous:
            self.refresh()
        elif not self.inbox.mid_rollout and self.inbox.newer():
            taken = self.inbox.take()
            self.publish()
            self._mark(taken)

    def updated(self, version: int, stepped: bool) -> None:
        """After an optimizer step (main thread, every rank): lock-step, the copy and engines get the weights at
        once; ahead, they are posted for the next rollout to take (or, partial rollouts, the engine as it samples;
        vLLM is given them now, between its steps)."""
        if not self.asynchronous:
            if stepped:
                self.refresh(version)
            else:
                self._mark(version)  # nothing stepped: the copy and engines are current
            return
        self.inbox.post(version, distributed.full_state(self.model) if self.dist.on else None)
        if self.inbox.mid_rollout and self.loads_weights:
            taken = self.inbox.take()
            self.publish(taken)  # loaded between the engine's steps; the tokens after it carry the new version
            self._mark(taken)

    def publish(self, version: int | None = None) -> None:
        """Engines that sample from weights of their own (vLLM) get the copy's, LoRA merged (`version`: in flight,
        what the tokens sampled after them are tagged with)."""
        engines = self.bench.distinct_engines()
        if not engines or not self.loads_weights:
            return
        with self.inbox.lock, exported(self.copy) as plain:
            weights = {name: tensor.detach() for name, tensor in plain.state_dict().items()}
        for engine in engines:
            engine.load_weights(weights, **({"version": version} if version is not None else {}))
