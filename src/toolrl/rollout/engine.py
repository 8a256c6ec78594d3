"""The engine interface: generate a continuation of a sequence's tokens, with the sampled ids' log-probs.

A rollout asks for one turn at a time and passes the sequence's whole context (prompt, earlier turns and
observations) as token ids, the source of truth. An engine with a cache keeps each sequence's state and feeds
only the tokens it has not seen; engines are registered by name for `rollout.engine`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from toolrl.registry import Registry

if TYPE_CHECKING:
    import torch

    from toolrl.envs.base import Task
    from toolrl.rollout.inflight import WeightInbox
    from toolrl.rollout.sampling import SamplingParams

T = TypeVar("T")


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by all sequences, leaving at least one token in each."""
    shortest = min(len(s) for s in sequences)
    n = 0
    while n < shortest - 1 and all(s[n] == sequences[0][n] for s in sequences):
        n += 1
    return n


@dataclass
class Sampled:
    ids: list[int]
    logprobs: list[float]
    ended: bool
    """True when the sequence emitted a stop token (which is the last id)."""
    versions: list[int] = field(default_factory=list)
    """The version (optimizer steps) of the weights that sampled each id, where the engine took new weights during
    the turn (partial rollouts, rollout/inflight.py); empty: all by `Engine.weights_version` as the turn began."""


class Engine(ABC):
    """Generates continuations; `generate` calls from many trajectories run concurrently on one event loop."""

    follows_grammars = False
    """Whether it samples under `SamplingParams.grammar` (forced tool calls, structured replies); one that does not
    is never given a grammar (the gateway refuses such requests in one line)."""
    stops_at_strings = False
    """Whether it ends a turn at a `SamplingParams.stop` string itself; for one that does not, what it sampled
    past the stop string is cut off afterwards (rollout/guidance.py, cut_at_stop) and never recorded."""
    weights_version = 0
    """The version (optimizer steps) of the weights it samples from: what each trajectory's tokens are tagged with."""
    inbox: WeightInbox | None = None
    """Where a trainer posts new weights that the engine takes while it samples (partial rollouts); None: only between
    rollouts."""

    @abstractmethod
    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        """Sample up to params.max_new_tokens tokens after `tokens`, the sequence's whole context so far."""

    async def generate_stream(
        self, seq: Hashable, tokens: list[int], params: SamplingParams, on_tokens: Callable[[list[int]], None]
    ) -> Sampled:
        """`generate`, telling `on_tokens` (on the calling event loop) each run of new ids as it is sampled. This
        default samples the turn at once and tells it once, at the end; an engine that samples step by step
        overrides it (the hf engine: after each decoding step)."""
        sampled = await self.generate(seq, tokens, params)
        on_tokens(list(sampled.ids))
        return sampled

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro`, which uses this engine (a rollout), to its end on an event loop of its own, as `asyncio.run`
        does. An engine that computes in this process may run its steps on the calling thread meanwhile (hf:
        rollout/caller_thread.py)."""
        return asyncio.run(coro)

    def begin(self, seq: Hashable, task: Task) -> None:  # noqa: B027 - optional: engines that play any task
        """A sequence for `task` begins (before its first `generate`): a policy played without a model (the
        reference, rollout/scripted.py) keys its turns by task and turn."""

    def release(self, seq: Hashable) -> None:  # noqa: B027 - optional: engines without per-sequence state
        """The sequence is finished: free what the engine keeps for it."""

    def load_weights(self, weights: dict[str, torch.Tensor], version: int | None = None) -> None:
        """Take the policy's new weights (a plain model's state dict, LoRA merged) before the next rollout, or
        while one runs (partial rollouts: `version` is then what the tokens sampled after them are tagged with).
        Only engines registered with `loads_weights=True` are given them; they must override this."""
        raise NotImplementedError(f"{type(self).__name__} samples from weights of its own and cannot load them")

    def free_memory(self) -> None:  # noqa: B027 - optional: engines that keep nothing between rollouts
        """A rollout ended and nothing runs: free what the engine keeps between rollouts (its KV cache); the
        next `generate` allocates again."""

    def trim_cache(self, keep_bytes: int) -> bool | None:
        """Between served requests (the gateway, nothing in flight): give back the KV cache where it holds more than
        `keep_bytes`, the next request starting from a small one. True where memory was given back; None where
        the engine is still busy (ask again shortly)."""
        return False

    kv_bytes_per_token: int | None = None
    """Bytes of keys and values one token of a sequence holds in this process (None: not here, or not known)."""

    def close(self) -> None:  # noqa: B027
        """Free the engine's resources."""


ENGINES: Registry[Callable[..., Engine]] = Registry("engine", "rollout.engine")
"""Engine name -> factory(model=, chat=, device=, seed=, config=). Capabilities: supports_training (it samples
from the model being trained, or from weights the trainer gives it, so training may use it); supports_images (it
takes a vision-language policy's images); loads_weights (the trainer gives it the new weights after each
optimizer step, `Engine.load_weights`, and one instance serves training and evaluation). The built-in ones are
declared below and imported when first asked for, so that checking a config's engine imports no torch."""


def engine_capabilities(
    supports_training: bool = False,
    supports_images: bool = False,
    loads_weights: bool = False,
    can_train: bool | None = None,
    **more: Any,
) -> dict[str, Any]:
    """An engine's capabilities, each named (`can_train`: the earlier name of supports_training)."""
    training = supports_training if can_train is None else can_train
    return dict(supports_training=training, supports_images=supports_images, loads_weights=loads_weights, **more)


def register_engine(name: str, **capabilities: Any) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    """Register an engine factory under `name` with its capabilities (see engine_capabilities)."""
    return ENGINES.register(name, **engine_capabilities(**capabilities))


for _name, _module, _capabilities in [
    ("hf", "toolrl.rollout.hf", dict(supports_training=True)),
    ("hf-vision", "toolrl.rollout.vision", dict(supports_training=True, supports_images=True)),
    ("openai", "toolrl.rollout.openai", {}),
    ("vllm-server", "toolrl.rollout.openai", dict(supports_training=True, loads_weights=True)),
    ("vllm", "toolrl.rollout.vllm", dict(supports_training=True, loads_weights=True)),
]:
    ENGINES.declare(_name, _module, **engine_capabilities(**_capabilities))


def get_engine_factory(name: str) -> Callable[..., Engine]:
    return ENGINES.lookup(name)
