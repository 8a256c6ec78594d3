"""The input embedding's gradient as the rows it touched, where its weight is the output layer's (tied).

A backward pass through `nn.Embedding` builds a dense [vocab, hidden] zero tensor and adds each token's gradient
into its row, then autograd adds it to the output layer's gradient of the same weight. For the default model's
49,152 x 576 table that is 113 MB of freshly mapped pages, written for the few hundred rows a step's tokens touch.
A GRPO step makes one such pass per micro-batch and one for the step's shared prompt: the zero fills alone were
3 x 162 ms of a 10 s update on this project's AVX-512 machine (torch profiler, bench/train_vs_trl.py's step).

Setting `nn.Embedding.sparse` on the tied module alone is not enough: autograd sums the output layer's dense
gradient and the sparse one out of place (two 113 MB copies, ~0.2 s each, measured). So within
`sparse_tied_embedding(model)` the embedding reads the same storage through a parameter of its own (an alias:
nothing is copied) with a sparse gradient, the passes' gradients for it are kept as the touched rows and added up
as such, and on the way out the module gets its weight back and the rows are added into
the weight's dense gradient in place. The optimizer and gradient clipping see the dense gradient they always did,
equal to float rounding (tests/train/test_embedding_grad.py). Only where the two layers share one trained weight
(not LoRA's frozen one, not an FSDP2 shard)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def tied_embedding(model) -> torch.nn.Embedding | None:
    """The model's input embedding when it is a plain `nn.Embedding` whose trained weight is the output layer's."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if type(inputs) is not torch.nn.Embedding or outputs is None or inputs.max_norm is not None:
        return None
    weight = inputs.weight
    tied = weight is getattr(outputs, "weight", None)
    if not tied or not weight.requires_grad or type(weight.data) is not torch.Tensor:
        return None  # untied, frozen (LoRA) or sharded (a DTensor under FSDP2)
    return inputs


@contextmanager
def sparse_tied_embedding(model, enabled: bool = True) -> Iterator[bool]:
    """Within it, a tied input embedding's backward passes give the rows they touch, added into the weight's
    gradient on the way out; yields whether it does so."""
    embedding = tied_embedding(model) if enabled else None
    if embedding is None:
        yield False
        return
    weight, sparse = embedding.weight, embedding.sparse
    alias = torch.nn.Parameter(weight.detach())  # the same storage
    embedding._parameters["weight"], embedding.sparse = alias, True
    try:
        yield True
    finally:
        embedding._parameters["weight"], embedding.sparse = weight, sparse
        rows = alias.grad
        if rows is not None:
            if weight.grad is None:
                weight.grad = rows.to_dense()
            else:
                weight.grad.add_(rows)
