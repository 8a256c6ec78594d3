"""Scores of the trained tokens of a batch of trajectories (log-probs, entropy, values), with their shared
prefix computed once.

The prefix (system prompt, tool schemas, examples) runs through the model once; every row's suffix attends to
its keys and values (a read-only cache, so gradient checkpointing can replay the suffix pass), so the gradient
of every sample flows back through one prefix. Under gradient checkpointing the prefix pass is replayed too (its
cache keeps the first pass's keys and values and ignores a replay's), so a long prompt's activations are not
kept for the backward pass. Logits are computed only at positions that predict a trained
token, never for the prompt, and a block of them at a time (train/vocab_logprobs.py: only their softmax is
kept for the backward pass, up to train.vocab_keep_mb) unless the entropy is a loss term. Vision-language
policies the same way: positions are the model's own (M-RoPE for the Qwen2-VL family), and the images of the
shared prefix (a group's task image) are encoded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from toolrl.algos import entropy_from_logits
from toolrl.models.cache_arg import cache_arg
from toolrl.models.linear import OneDNNLinear
from toolrl.models.loading import transformer_blocks
from toolrl.models.vision import image_safe_prefix, is_vision_config, model_inputs, multimodal_base, sequence_positions
from toolrl.rollout.engine import common_prefix_length
from toolrl.rollout.trajectory import Trajectory
from toolrl.train.packed import KEYWORD, PackedRows, lend_alike, packable
from toolrl.train.vocab_logprobs import DEFAULT_BLOCKS, VocabBlocks, target_logprobs, tempered


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices into `lengths` grouped so that rows x longest length <= max_tokens, shortest first.

    `lengths` are the tokens each trajectory has beyond the prefix shared by all; sorting keeps padding small.
    A trajectory longer than the budget gets a batch of its own.
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class _PrefixLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int):
        super().__init__()
        self.keys, self.values, self.rows = keys, values, rows
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # always initialized
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """The prefix's keys and values, then the new ones; nothing is stored, so a replay gives the same."""
        shape = (self.rows, -1, -1, -1)
        keys = torch.cat([self.keys.expand(shape), key_states], dim=2)
        return keys, torch.cat([self.values.expand(shape), value_states], dim=2)

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2] + query_length, 0

    def get_max_length(self) -> int:
        return -1


class _PrefixWriteLayer(_PrefixLayer):
    """The prefix pass's cache under gradient checkpointing: the first pass hands its keys and values over (`take`);
    a replay (the backward recomputing the layer) gets its own back and changes nothing, so the pass can be
    replayed. The layer keeps nothing after `take`: the checkpointed graph holds the cache, so keys kept here would
    hold the graph that made them, a cycle through autograd's C++ nodes that Python's collector cannot free (a
    prefix pass dropped without its backward leaked its whole graph: 0.9 GB at a 2k-token prompt)."""

    def __init__(self):
        CacheLayerMixin.__init__(self)
        self.keys = self.values = None
        self.written = False
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.written:
            self.keys, self.values, self.written = key_states, value_states, True
        return key_states, value_states

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        taken, self.keys, self.values = (self.keys, self.values), None, None
        return taken

    def get_seq_length(self) -> int:
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0


class PrefixWriteCache(Cache):
    def __init__(self, num_layers: int):
        super().__init__(layers=[_PrefixWriteLayer() for _ in range(num_layers)])


class PrefixCache(Cache):
    """A one-row prefix's keys and values that every row of a batch reads; never written to."""

    def __init__(self, prefix_layers: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: int):
        super().__init__(layers=[_PrefixLayer(k, v, rows) for k, v in prefix_layers])


@dataclass
class TokenScores:
    logprobs: torch.Tensor
    """[tokens] log-probs of the trained tokens (flat, in trajectory order)."""
    counts: list[int]
    """Trained tokens per trajectory."""
    entropy: torch.Tensor | None = None
    """[tokens] entropy of the (tempered) next-token distribution at each trained token."""
    values: torch.Tensor | None = None
    """[tokens] the value head's estimate at each trained token's state."""


def hidden_and_logits(
    model, ids, attention, positions, prefix_len, rows_idx, cols_idx, prefix_images, images, step_prefix=None
):
    """The model over the shared prefix (`ids[0, :prefix_len]` with `prefix_images`) once and every row's
    suffix (with `images`, the suffixes' images in row order), then the hidden states and logits at the
    selected positions (counted from the suffix's start) only. Under FSDP2 it is registered as a forward
    method of the sharded model (distributed.shard), so that calling it gathers the weights as `forward`
    would."""
    selected = selected_hidden(
        model, ids, attention, positions, prefix_len, rows_idx, cols_idx, prefix_images, images, step_prefix
    )
    return selected, model.get_output_embeddings()(selected).float()


def _prefix_pass(model, ids, positions, images) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's keys and values of a one-row prefix. Under gradient checkpointing the pass is replayed in the
    backward pass (its cache keeps the first pass's keys and values and ignores a replay's), so a long prompt's
    activations (1.5k tokens: ~2 GB) are recomputed, not kept."""
    decoder = model.get_decoder()
    body = multimodal_base(model) if is_vision_config(model.config) else decoder
    layers = transformer_blocks(decoder)
    saved = [(layer.gradient_checkpointing, layer._can_checkpoint_with_cache) for layer in layers]
    try:
        if any(replays for replays, _ in saved):
            once = PrefixWriteCache(len(layers))
            for layer in layers:
                layer._can_checkpoint_with_cache = True
        else:
            once = DynamicCache()  # given, not asked for
        body(input_ids=ids, position_ids=positions, **cache_arg(body, once), use_cache=True, **images)
    finally:
        for layer, (replays, with_cache) in zip(layers, saved, strict=True):
            layer.gradient_checkpointing, layer._can_checkpoint_with_cache = replays, with_cache
    return [layer.take() if isinstance(layer, _PrefixWriteLayer) else (layer.keys, layer.values)
            for layer in once.layers]  # fmt: skip


class StepPrefix:
    """The prompt all of a step's trajectories share, through the model once for all its micro-batches rather than
    once per micro-batch: each micro-batch reads its keys and values as leaves, whose gradients add up over the
    micro-batches' backward passes; `backward()` then carries the sum through the prefix pass once. On a 5k-token
    prompt with 8 suffixes of a few hundred tokens, the prompt was most of every micro-batch's work."""

    def __init__(self, model, ids: Sequence[int]):
        self.ids = list(ids)
        """The prompt's token ids."""
        self.length = len(self.ids)
        device = next(model.parameters()).device
        prompt = torch.tensor([self.ids], device=device)
        positions = torch.arange(self.length, device=device)[None]
        self.outputs = _prefix_pass(model, prompt, positions, {})
        self.leaves = [(k.detach().requires_grad_(k.requires_grad), v.detach().requires_grad_(v.requires_grad))
                       for k, v in self.outputs]  # fmt: skip

    @classmethod
    def of(cls, model, trajs: Sequence[Trajectory], batches: Sequence[Sequence[int]]) -> StepPrefix | None:
        """One for `trajs` when they make more than one micro-batch and share a prefix; None where a micro-batch
        computes its own (one micro-batch, a vision-language policy, a sharded model)."""
        length = cls.usable_length(model, trajs) if len(batches) > 1 else 0
        return cls(model, trajs[0].token_ids[:length]) if length > 0 else None

    @staticmethod
    def usable_length(model, trajs: Sequence[Trajectory]) -> int:
        """The longest step prefix `trajs` can read (it ends before their first scored position), or 0 where
        they cannot read one (no trajectory, one with nothing to score, a vision-language policy, a sharded
        model)."""
        if is_vision_config(model.config) or hasattr(model, "toolrl_hidden_and_logits"):
            return 0
        if not trajs or not all(sum(t.loss_mask) for t in trajs):
            return 0
        return shared_prefix_length(trajs, min(t.loss_mask.index(1) for t in trajs) - 1)

    def cache(self, rows: int) -> PrefixCache:
        return PrefixCache(self.leaves, rows)

    def backward(self) -> None:
        """The micro-batches' gradients of the prefix's keys and values, through the prefix pass."""
        pairs = [(out, leaf.grad) for outs, leaves in zip(self.outputs, self.leaves, strict=True)
                 for out, leaf in zip(outs, leaves, strict=True) if leaf.grad is not None]  # fmt: skip
        self.outputs = self.leaves = []
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])


def selected_hidden(
    model, ids, attention, positions, prefix_len, rows_idx, cols_idx, prefix_images, images, step_prefix=None
):
    """hidden_and_logits' hidden states at the selected positions, without the output layer. With `step_prefix`
    (its length is `prefix_len`), the prefix's keys and values are read from it, not computed."""
    device = ids.device
    decoder = model.get_decoder()
    body = multimodal_base(model) if is_vision_config(model.config) else decoder  # reads ids and images
    layers = transformer_blocks(decoder)
    saved = [(layer.gradient_checkpointing, layer._can_checkpoint_with_cache) for layer in layers]
    lengths = (attention.sum(1) - prefix_len).tolist()
    packed = None
    if not images and packable(model):  # rows alike before their first scored position share that part
        caps = [length - 1 for length in lengths]
        for row, col in zip(rows_idx, cols_idx, strict=True):
            caps[row] = min(caps[row], col)
        borrows = lend_alike(ids[:, prefix_len:].tolist(), caps)
        if len(set(lengths)) > 1 or any(n for _, n in borrows):
            packed = PackedRows(lengths, device, borrows)
    rows = 1 if packed is not None else ids.shape[0]  # packed: one row of every row's tokens
    cache = None
    if step_prefix is not None:
        cache = step_prefix.cache(rows)
    elif prefix_len:
        cache = PrefixCache(_prefix_pass(model, ids[:1, :prefix_len], positions[..., :1, :prefix_len], prefix_images),
                            rows)  # fmt: skip
    if packed is not None:  # no linear layer computes a padding position (train/packed.py)
        packed_ids, packed_positions = packed.pack(prefix_len, ids, positions)
        inputs = {"input_ids": packed_ids, "position_ids": packed_positions, KEYWORD: packed}
    else:
        inputs = {"input_ids": ids[:, prefix_len:], "attention_mask": attention,
                  "position_ids": positions[..., prefix_len:], **images}  # fmt: skip
    try:
        for layer in layers if cache is not None else ():
            layer._can_checkpoint_with_cache = True  # the suffix pass only reads the prefix cache
        hidden = body(**inputs, **cache_arg(body, cache), use_cache=cache is not None).last_hidden_state
    finally:
        for layer, (replays, with_cache) in zip(layers, saved, strict=True):
            layer.gradient_checkpointing, layer._can_checkpoint_with_cache = replays, with_cache
    if packed is not None:
        packed.check(len(layers))
        return hidden[0, packed.index(rows_idx, cols_idx)]
    return hidden[torch.tensor(rows_idx, device=device), torch.tensor(cols_idx, device=device)]


def shared_prefix_length(trajs: Sequence[Trajectory], at_most: int | None = None) -> int:
    """The tokens at the start of every row that are computed once: the common prefix of their ids (at most
    `at_most`), cut where it would split an image or hold images that differ between rows (image_safe_prefix)."""
    length = common_prefix_length([t.token_ids for t in trajs])
    if at_most is not None:
        length = min(length, at_most)
    return image_safe_prefix([t.images for t in trajs], length)


def score_tokens(
    model,
    trajs: Sequence[Trajectory],
    temperature: float = 1.0,
    entropy: bool | str = False,
    value_head=None,
    vocab: VocabBlocks = DEFAULT_BLOCKS,
    step_prefix: StepPrefix | None = None,
) -> TokenScores:
    """Log-probs of the tokens with loss_mask 1 (and, when asked, entropy and values at them). `entropy`:
    True for a differentiable entropy (a loss term), "measure" for its value only (logged; no activations
    kept for a backward pass). Vision-language policies too: the positions are the model's own (M-RoPE for
    Qwen2-VL), and an image in the shared prefix (the task's) is encoded once for all rows. `vocab`: how the output
    layer is scored (train/vocab_logprobs.py; rows 0: all at once, the plain log_softmax). `step_prefix`: the
    prompt computed once for the step's micro-batches (StepPrefix), read rather than computed here."""
    device = next(model.parameters()).device
    vision = is_vision_config(model.config)
    first_trained = min(t.loss_mask.index(1) for t in trajs)
    # Every scored position (first_trained - 1 onward) must lie in the suffix, after the shared prefix.
    sharded = getattr(model, "toolrl_hidden_and_logits", None) is not None
    # sharded (FSDP2): each layer runs once per pass, as its gradient hooks expect, so no prefix pass
    prefix_len = 0 if sharded else shared_prefix_length(trajs, first_trained - 1)
    if step_prefix is not None:
        prefix_len = step_prefix.length
    rows, width = len(trajs), max(len(t.token_ids) for t in trajs)
    ids = torch.zeros(rows, width, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    for i, t in enumerate(trajs):
        ids[i, : len(t.token_ids)] = torch.tensor(t.token_ids)
        attention[i, : len(t.token_ids)] = 1
    ids, attention = ids.to(device), attention.to(device)
    if vision:
        positions = sequence_positions(model, ids, attention, [im for t in trajs for im in t.images])
    else:
        positions = torch.arange(width, device=device).expand(rows, -1)
    prefix_images = [im for im in trajs[0].images if im.start < prefix_len]
    images = [im for t in trajs for im in t.images if im.start >= prefix_len]

    rows_idx, cols_idx, targets, counts = [], [], [], []
    for i, t in enumerate(trajs):
        trained = [p for p, m in enumerate(t.loss_mask) if m]
        rows_idx += [i] * len(trained)
        cols_idx += [p - 1 - prefix_len for p in trained]
        targets += [t.token_ids[p] for p in trained]
        counts.append(len(trained))
    inputs = (ids, attention, positions, prefix_len, rows_idx, cols_idx, model_inputs(prefix_images, device),
              model_inputs(images, device))  # fmt: skip
    head = model.get_output_embeddings()
    # a plain linear output layer (on oneDNN or torch's kernels); a wrapped one (LoRA) is scored whole
    if vocab.rows and not sharded and entropy is not True and type(head) in (torch.nn.Linear, OneDNNLinear):
        selected = selected_hidden(model, *inputs, step_prefix)
        targets_ = torch.tensor(targets, device=device)
        logprobs, measured = target_logprobs(selected, head, targets_, temperature, vocab.rows, vocab.keep_mb)
        return TokenScores(
            logprobs,
            counts,
            measured if entropy == "measure" else None,
            value_head(selected).squeeze(-1).float() if value_head is not None else None,
        )
    if sharded:
        selected, logits = model.toolrl_hidden_and_logits(*inputs)
    else:
        selected, logits = hidden_and_logits(model, *inputs, step_prefix)
    logits = tempered(logits, temperature)
    logp = torch.log_softmax(logits, dim=-1)
    return TokenScores(
        logp.gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1),
        counts,
        measured_entropy(logp) if entropy == "measure" else entropy_from_logits(logits) if entropy else None,
        value_head(selected).squeeze(-1).float() if value_head is not None else None,
    )


def measured_entropy(logp: torch.Tensor, rows: int = 1024) -> torch.Tensor:
    """[tokens] entropy of each row of log-probs, without gradient, a block of rows at a time (no second
    vocabulary-sized tensor of all rows at once)."""
    with torch.no_grad():
        return torch.cat([-(part.exp() * part).sum(-1) for part in logp.detach().split(rows)])


def trained_token_logprobs(
    model, trajs: Sequence[Trajectory], temperature: float = 1.0
) -> tuple[torch.Tensor, list[int]]:
    """Log-probs (flat, in trajectory order) of the tokens with loss_mask 1, and the count per trajectory."""
    scores = score_tokens(model, trajs, temperature)
    return scores.logprobs, scores.counts
