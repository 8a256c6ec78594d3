"""Continuous batching for a Hugging Face causal LM: whichever sequences are waiting join each decode step.

Each sequence owns a slot of a `SlotCache`. Every engine step (1) prefills the sequences with new tokens (a
new prompt, or the observations after a tool call), feeding only those slots and only the new tokens, and
(2) samples one token for every sequence that is decoding and feeds them all in one forward pass. Sequences
that are away running tools simply sit in their slots; when their request arrives they join the next step.

Shared prompt prefixes are computed once, read once per step and held once (prefixes.py, `PrefixSharing`).
While it generates, the engine keeps the linear weights packed in oneDNN's layout (models/linear.py). On CPU,
Llama-style models run through the engine's own forward pass (rollout/lean.py), others through transformers'.

The model runs on another thread than the event loop, which keeps serving tool calls while a step computes: within
`run` (a rollout), on the thread that called it, the one doing the process's other compute (rollout/caller_thread.py
says why); otherwise on a worker thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from toolrl.memory import trim
from toolrl.models.cache_arg import cache_arg
from toolrl.models.linear import PackedWeights
from toolrl.models.native import wanted
from toolrl.rollout.caller_thread import CallerThread
from toolrl.rollout.cascade import NAME as CASCADE
from toolrl.rollout.cascade import SharedPrefix, attention_implementation, supports_cascade
from toolrl.rollout.engine import Engine, Sampled, register_engine
from toolrl.rollout.guidance import TurnGuide, Vocabulary, allowed_tokens
from toolrl.rollout.inflight import take_between_steps
from toolrl.rollout.lean import LeanForward
from toolrl.rollout.prefixes import PAD_POSITION, PrefixSharing, Slot
from toolrl.rollout.sampling import SamplingParams, sample_tokens
from toolrl.rollout.slots import Feed, SlotCache, attention_mask, kv_bytes_per_token
from toolrl.threads import adapt, open_pool

log = logging.getLogger(__name__)

SETTLE_QUIET_S = 0.002
SETTLE_MAX_S = 0.05
"""Between steps, wait for requests on their way in until 2 ms pass without one (at most 50 ms): small next
to a decode step of a batch (about 0.25 s for 64 sequences of the default model on 2 cores)."""
SUBSET_DECODE = 0.5
"""Decode only the decoding slots (gathering their caches) when they are at most this share of the slots in
use; above it, one pass over every slot in use is cheaper than the gather."""
START_CACHE_SIZE = (8, 256)
"""(slots, positions) of a first KV cache, and of the next one after a served request's cache was given back."""


@dataclass
class _Request:
    seq: Hashable
    tokens: list[int]
    params: SamplingParams
    future: asyncio.Future
    out: Sampled = field(default_factory=lambda: Sampled([], [], False))
    done: bool = False
    on_tokens: Callable[[list[int]], None] | None = None
    told: int = 0  # how many of out.ids on_tokens has heard
    guide: TurnGuide | None = None
    """Its stop strings and grammar (rollout/guidance.py), when it has any."""
    cancelled: bool = False
    """Its caller stopped waiting: dropped after the step under way."""

    def tell(self) -> None:
        if self.on_tokens is not None and len(self.out.ids) > self.told:
            new, self.told = self.out.ids[self.told :], len(self.out.ids)
            try:
                self.on_tokens(list(new))
            except Exception:  # a listener's fault stops its stream, never the engine's other sequences
                log.exception("hf engine: a token listener failed; it hears no more")
                self.on_tokens = None


class HFEngine(PrefixSharing, Engine):
    follows_grammars = True
    stops_at_strings = True

    def __init__(
        self,
        model,
        stop_ids: Sequence[int],
        pad_id: int,
        device: torch.device,
        seed: int = 0,
        prefill_tokens: int = 4096,
        cascade: bool = True,
        pack_weights: bool = True,
        tokenizer=None,
        decode_kernel: str = "auto",
        lean: bool = True,
    ):
        self.model = model
        if torch.device(device).type == "cpu":
            open_pool()  # the main thread's parallel product first (toolrl/threads.py)
        self.vocabulary = Vocabulary(tokenizer, model.config.vocab_size) if tokenizer is not None else None
        """The tokenizer, for requests with stop strings or a grammar."""
        self.stop_ids = set(stop_ids)
        self.pad_id = pad_id
        self.device = device
        self.prefill_tokens = prefill_tokens
        """Most rows x width per prefill forward pass; larger prefills are split by rows."""
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.cache: SlotCache | None = None
        self._last_cache_size = START_CACHE_SIZE
        """(slots, capacity) of the cache when it was last freed, the size the next one starts at. Slots that read
        the shared prefix hold only what follows it: a few hundred columns for most tool-use turns."""
        self.cascade = cascade and supports_cascade(model.config)
        """Read the shared prefix once per step (cascade attention) rather than once per sequence."""
        self.shared: SharedPrefix | None = None
        self.slots: dict[Hashable, Slot] = {}
        self.free: list[int] = []
        self.requests: dict[Hashable, _Request] = {}
        self.stats: Counter[str] = Counter()
        """decode_steps, decoded_tokens, prefill_tokens (fed), reused_prefix_tokens (copied, not computed),
        forwards (passes through the model after the prefixes computed once), cascade_forwards (those that read
        the shared prefix once), lean_forwards (those through rollout/lean.py) and prefix_passes_given (shared
        prefixes computed by `prefix_pass`, a trainer's forward, rather than the engine's)."""
        self._released: list[Hashable] = []
        self._driver: asyncio.Task | None = None
        self._worker = CallerThread(ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolrl-engine"))
        """Where steps run: on the thread inside `run` (a rollout's caller), else on a worker thread of its own."""
        native = pack_weights and device.type == "cpu" and wanted(decode_kernel)
        self.packed = PackedWeights(model if pack_weights else torch.nn.Module(), native=native)
        """The linear weights in oneDNN's layout, or the small-batch kernel's (`decode_kernel`: models/native),
        while a rollout runs (fp32 CPU; freed with the cache)."""
        self.lean = lean and pack_weights and device.type == "cpu"
        self._lean: LeanForward | bool | None = False
        """This rollout's forward (rollout/lean.py) where `lean` and it applies; None: transformers'; False: unread."""

    # ---- the async surface -------------------------------------------------------------------------------

    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        return await self.generate_stream(seq, tokens, params, None)

    async def generate_stream(self, seq, tokens, params, on_tokens: Callable[[list[int]], None] | None) -> Sampled:
        if seq in self.requests:
            raise RuntimeError(f"sequence {seq!r} already has a request in flight")
        loop = asyncio.get_running_loop()
        if self._driver is not None and not self._driver.done() and self._driver.get_loop() is not loop:
            raise RuntimeError("HFEngine serves one event loop at a time; this one is busy on another")
        future = loop.create_future()
        guide = None
        if params.stop or params.grammar is not None:
            if self.vocabulary is None:
                raise RuntimeError("this HFEngine has no tokenizer: stop strings and grammars need one")
            if params.grammar is None:
                guide = TurnGuide(self.vocabulary, params.stop)
            else:  # compiling a grammar takes long and frees the GIL: off the loop, other sequences go on
                guide = await asyncio.to_thread(TurnGuide, self.vocabulary, params.stop, params.grammar)
                if seq in self.requests:  # another request of the sequence came in while this one compiled
                    raise RuntimeError(f"sequence {seq!r} already has a request in flight")
        request = _Request(seq, list(tokens), params, future, on_tokens=on_tokens, guide=guide)
        self.requests[seq] = request
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive())
        try:
            return await future
        except asyncio.CancelledError:  # its caller is gone (a client that hung up): out of the batch after this
            request.cancelled = True  # step, its slot freed, no more steps for it
            self.stats["cancelled"] += 1
            raise

    def run(self, coro):
        return self._worker.run(coro)

    def release(self, seq: Hashable) -> None:
        # Freed at the start of the next step, in the worker thread: a step may be running right now.
        self._released.append(seq)

    @property
    def _busy(self) -> bool:
        """A request in flight, or the driver still stepping: the cache is not for dropping now."""
        return bool(self.requests) or (self._driver is not None and not self._driver.done())

    def free_memory(self) -> None:
        """Drop the KV cache and the packed weights between rollouts (two engines' caches, training's and
        evaluation's, kept for the whole run were most of a demo run's resident memory); making them again
        costs far less than a rollout."""
        if self._busy:
            return
        self._worker.submit(self._drop_cache).result()  # one thread at a time touches the cache: the steps' own
        trim()

    def trim_cache(self, keep_bytes: int) -> bool | None:
        if self._busy:
            return None
        if self.cache is None or self.cache.nbytes() <= keep_bytes:
            return False
        dropped = self._worker.submit(self._drop_cache, False).result()
        if dropped:
            self._last_cache_size = START_CACHE_SIZE  # a long request's size is not the next one's
            trim()
        return dropped

    @property
    def kv_bytes_per_token(self) -> int:  # type: ignore[override]
        return kv_bytes_per_token(self.model)

    def _drop_cache(self, packed: bool = True) -> bool:
        """Free the KV cache (and the packed weights, with `packed`) where no sequence holds a slot; True where
        the cache was freed."""
        self._free_released()
        if packed:
            self.packed.clear()
            self._lean = False
        if self.slots:
            return False
        if self.cache is not None:
            self._last_cache_size = (self.cache.num_slots, self.cache.capacity)
            self.cache.clear()  # its layers point back at it: without this the cycle waits for the gc
        self.cache, self.shared, self.free = None, None, []
        return True

    def close(self) -> None:
        self._worker.shutdown(wait=False)

    async def _settle(self) -> None:
        """Let trajectories whose tools just returned reach `generate` before a step starts. After a tool
        call each one still renders and tokenizes its observation on the event loop, so a burst of returns
        arrives over some milliseconds; a request that misses the step runs a step behind the rest for the
        whole turn. Wait while requests keep arriving, until SETTLE_QUIET_S passes without one (at most
        SETTLE_MAX_S)."""
        loop = asyncio.get_running_loop()
        start = last = loop.time()
        count = len(self.requests)
        while self._away() and loop.time() - last < SETTLE_QUIET_S and loop.time() - start < SETTLE_MAX_S:
            await asyncio.sleep(0)
            if len(self.requests) != count:
                count, last = len(self.requests), loop.time()

    def _away(self) -> bool:
        """Whether a sequence holding a slot has no request in flight (it is running tools). Called between
        steps only, when the worker thread is not touching the slots."""
        released = set(self._released)
        return any(seq not in self.requests and seq not in released for seq in self.slots)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        await self._settle()
        while self.requests:
            batch = list(self.requests.values())
            try:
                await loop.run_in_executor(self._worker, self._step, batch)
            except BaseException as exc:
                for request in batch:
                    del self.requests[request.seq]
                    if not request.future.done():
                        request.future.set_exception(exc)
                raise
            for request in batch:
                if request.cancelled:
                    del self.requests[request.seq]
                    self.release(request.seq)
                    continue
                request.tell()  # a streaming request hears this step's tokens now, on the event loop
                if request.done:
                    del self.requests[request.seq]
                    request.future.set_result(request.out)
            await self._settle()

    # ---- one step, in the worker thread ------------------------------------------------------------------

    @torch.inference_mode()  # lighter than no_grad; the cache is only ever touched here
    def _step(self, batch: list[_Request]) -> None:
        self.model.eval()
        adapt()  # opt-in: one thread for the products while other work holds the cores (toolrl/threads.py)
        self._free_released()
        take_between_steps(self)  # partial rollouts: weights a trainer posted since the last step (inflight.py)
        prefill = {}
        for request in batch:
            slot = self._slot(request.seq)
            pending = self._pending(slot, request)
            if pending:
                prefill[request.seq] = pending
        if self._lean is False:  # read once per rollout: LoRA or sharding may have changed the modules since
            self._lean = LeanForward.of(self.model, self.packed) if self.lean else None
        with contextlib.nullcontext() if self._lean else self.packed.active():
            if prefill:
                self._prefill(prefill)
            self._decode([r for r in batch if not r.done])

    def _free_released(self) -> None:
        while self._released:
            slot = self.slots.pop(self._released.pop(), None)
            if slot is not None:
                self.free.append(slot.index)

    def _slot(self, seq: Hashable) -> Slot:
        if seq not in self.slots:
            index = min(self.free) if self.free else len(self.slots)
            if self.free:
                self.free.remove(index)
            self.slots[seq] = Slot(index)
        return self.slots[seq]

    def _pending(self, slot: Slot, request: _Request) -> list[int]:
        """The request's tokens the slot has not seen: generated ids already fed count as seen."""
        tokens = request.tokens + request.out.ids
        n = len(slot.ids)
        if tokens[:n] != slot.ids:  # the caller's context diverged from what is cached (a compacted trajectory)
            n = self._diverged(slot, tokens)
        if n == len(tokens) and slot.logits is None and n:  # asked again at the same point: re-feed the last
            if self._offset(slot) >= n:  # the last is in the shared prefix: the slot needs it written
                self._materialize(slot)
            slot.ids.pop()
            n -= 1
        return tokens[n:]

    def _slots_in_use(self) -> int:
        """Slots 0..n-1 cover every sequence's slot (freed slots below the highest stay in the range)."""
        return max((s.index for s in self.slots.values()), default=0) + 1

    def _ensure(self, longest: int) -> SlotCache:
        used = self._slots_in_use()
        if self.cache is None:  # at the size the last rollout grew it to: no growth copies at every rollout
            layers = self.model.config.num_hidden_layers
            slots, capacity = self._last_cache_size
            slots = used if longest > capacity else max(used, slots)  # a longer first step: its own rows only
            self.cache = SlotCache(layers, slots, max(longest, capacity))
        self.cache.ensure(used, longest)
        return self.cache

    def _decode(self, batch: list[_Request]) -> None:
        ready = [r for r in batch if self.slots[r.seq].logits is not None]
        if not ready:
            return
        logits = torch.stack([self.slots[r.seq].logits for r in ready])
        positions = [len(r.tokens) + len(r.out.ids) for r in ready]
        allowed = allowed_tokens([r.guide for r in ready], logits.shape[-1])
        tokens, logprobs = sample_tokens(logits, [r.params for r in ready], self.generator, positions, allowed)
        feed = {}
        for request, token, logprob in zip(ready, tokens.tolist(), logprobs.tolist(), strict=True):
            out = request.out
            out.ids.append(token)
            out.logprobs.append(logprob)
            out.versions.append(self.weights_version)
            out.ended = token in self.stop_ids
            stopped = request.guide is not None and request.guide.accept(token)
            if out.ended or stopped or len(out.ids) >= request.params.max_new_tokens:
                request.done = True
            else:
                feed[request.seq] = token
            self.slots[request.seq].logits = None
        if not feed:
            return
        shared = self._shared_by(feed)
        self._ensure(max(self._columns(self.slots[s]) for s in feed) + 2)
        used = self._slots_in_use()
        subset = len(feed) <= SUBSET_DECODE * used
        rows = {seq: row for row, seq in enumerate(feed)} if subset else {s: self.slots[s].index for s in feed}
        ids = torch.full((len(feed) if subset else used, 1), self.pad_id, dtype=torch.long)
        positions = torch.full_like(ids, PAD_POSITION)
        for seq, token in feed.items():
            ids[rows[seq], 0] = token
            positions[rows[seq], 0] = len(self.slots[seq].ids)
        slots = torch.tensor([self.slots[s].index for s in feed]) if subset else None
        logits = self._forward(ids, positions, slots, shared)
        self.stats["decode_steps"] += 1
        self.stats["decoded_tokens"] += len(feed)
        for seq, token in feed.items():
            slot = self.slots[seq]
            slot.ids.append(token)
            slot.logits = logits[rows[seq]]

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor | None, shared: SharedPrefix | None
    ) -> torch.Tensor:
        """Feed `ids` at `positions` (PAD_POSITION: padding, written to the scratch column); return the logits
        after each row's last column. With `shared`, attention reads the prefix from it once, and each slot
        holds what comes after it: the token at position p goes to column p - len(shared)."""
        cache = self.cache
        positions = positions.to(self.device)
        real = positions != PAD_POSITION
        columns = positions - len(shared) if shared is not None else positions
        columns = torch.where(real, columns, cache.scratch)
        kv_len = int(columns[real].max()) + 1
        cache.feed = Feed(None if slots is None else slots.to(self.device), columns, kv_len)
        inputs = dict(
            input_ids=ids.to(self.device),
            attention_mask=attention_mask(columns, kv_len, cache.scratch, self.model.dtype),
            position_ids=torch.where(real, positions, torch.zeros_like(positions)),
            **cache_arg(self.model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats["forwards"] += 1
        if self._lean:
            self.stats["lean_forwards"] += 1
            self.stats["cascade_forwards"] += shared is not None
            fed = inputs["input_ids"], inputs["position_ids"], inputs["attention_mask"]
            return self._lean(*fed, cache, shared)
        if shared is None:
            out = self.model(**inputs)
        else:
            with attention_implementation(self.model, CASCADE):
                out = self.model(**inputs, shared_prefix=shared)
            self.stats["cascade_forwards"] += 1
        return out.logits[:, -1].float()


@register_engine("hf", supports_training=True)
def hf_engine(model, chat, device, seed: int = 0, config=None, **_: object) -> HFEngine:
    """The in-process engine on the run's own model (the weights being trained)."""
    kernel = config.model.cpu_decode_kernel if config is not None else "auto"
    return HFEngine(
        model, chat.stop_ids, chat.tokenizer.pad_token_id, device, seed=seed, tokenizer=chat.tokenizer,
        decode_kernel=kernel,
    )  # fmt: skip
