"""Data-parallel training under torchrun, on torch.distributed and FSDP2 (`fully_shard`), gloo on CPU and
nccl on CUDA.

`torchrun --nproc-per-node N -m toolrl train CONFIG` starts N processes; each rolls out its share of the step's
groups (whole groups, so a group's samples are together) with the seeds a single process would give them,
the advantage estimator sees every sample of the step (the inputs are gathered, so step-wide statistics such
as REINFORCE++'s whitening are exact), each rank's loss is over the step's global denominators and FSDP2 sums
the gradients, so one step equals one process doing all the groups (fp32 tolerance). Generation runs on an
unsharded copy of the policy in each process, refreshed from the sharded weights after every optimizer step
(FSDP's collectives need every rank in step, and rollouts of different lengths are not). Metrics are reduced
across ranks and logged once, by rank 0, which also evaluates and writes the run directory.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from toolrl.errors import ConfigError
from toolrl.models.loading import transformer_blocks

log = logging.getLogger(__name__)

SUMMED = ("loss", "pg_loss", "kl", "entropy", "value_loss", "trained_trajectories", "fault_masked", "generated_tokens",
          "trajectories")  # fmt: skip
"""Step metrics that add up over ranks (losses are already over the global denominators); the others average."""


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def on(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


SINGLE = Dist()


def from_env() -> Dist:
    """The process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK), initialised once; one process
    without torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():  # a rank that dies makes the others fail at the timeout, never hang
        timeout = timedelta(seconds=float(os.environ.get("TOOLRL_DIST_TIMEOUT_S", "900")))
        dist.init_process_group(backend, timeout=timeout)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local)
    return Dist(dist.get_rank(), dist.get_world_size(), local, backend)


def close(ctx: Dist) -> None:
    """End the process group once every rank is done: a rank that exits with it open can leave gloo's threads
    running into the interpreter's exit (seen as `terminate called without an active exception`, SIGABRT)."""
    if ctx.on and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def device_for(ctx: Dist, device: torch.device) -> torch.device:
    return torch.device(f"cuda:{ctx.local_rank}") if ctx.on and device.type == "cuda" else device


def decoder_layers(model) -> list[torch.nn.Module]:
    """The transformer blocks to shard one by one: every block transformers marks as one (a checkpointing
    layer: the decoder's, and a vision-language model's vision blocks too), else the first `layers`
    ModuleList (Llama/Qwen/Mistral-style `model.layers`), under peft too."""
    blocks = transformer_blocks(model)
    if blocks:
        return blocks
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) and module is not model:
            return list(layers)
    raise ConfigError("torchrun: cannot find the model's decoder layers (a `layers` ModuleList) to shard")


def shard(model, ctx: Dist) -> None:
    """FSDP2: each decoder layer, then the whole model; gradients summed across ranks (every rank's loss is
    already divided by the step's global token or sequence count)."""
    import types

    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from toolrl.scoring.tokens import hidden_and_logits

    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for unit in (*layers, model):  # each unit reduces its own gradients: sum, never the mean
        unit.set_gradient_divide_factor(1.0)
        if ctx.backend == "gloo":  # gloo has no pre-multiplied sum
            unit.set_force_sum_reduction_for_comms(True)
    # scoring runs the decoder and the head on selected positions, not `forward`: gather the weights for it
    model.toolrl_hidden_and_logits = types.MethodType(hidden_and_logits, model)
    register_fsdp_forward_method(model, "toolrl_hidden_and_logits")


def full_state(model) -> dict[str, torch.Tensor]:
    """The sharded model's full state dict (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))


def gather(ctx: Dist, value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (on every rank)."""
    if not ctx.on:
        return [value]
    out: list[Any] = [None] * ctx.world
    dist.all_gather_object(out, value)
    return out


def reduce_metrics(ctx: Dist, metrics: dict[str, Any]) -> dict[str, Any]:
    """Step metrics over ranks: sums for SUMMED, extremes for the ratios' max and min, means for the other
    numbers (over the ranks that logged them: a task category only some ranks drew), rank 0's for the rest."""
    if not ctx.on:
        return metrics
    every = gather(ctx, metrics)
    out = dict(metrics)
    for m in every:  # then the keys rank 0 lacks
        for key, value in m.items():
            out.setdefault(key, value)
    for key, value in list(out.items()):
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if key in SUMMED:
            out[key] = sum(m.get(key, 0) for m in every)
            continue
        values = [m[key] for m in every if key in m]
        if all(v == value for v in values):  # the same on every rank (the step): kept as it is
            continue
        elif key.endswith("max_ratio"):
            out[key] = max(values)
        elif key.endswith("min_ratio"):
            out[key] = min(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def broadcast(ctx: Dist, value: Any) -> Any:
    """Rank 0's `value`, on every rank."""
    if not ctx.on:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def max_over_ranks(ctx: Dist, value: int) -> int:
    return max(gather(ctx, value)) if ctx.on else value


def barrier(ctx: Dist) -> None:
    if ctx.on:
        dist.barrier()


def shard_module(module: torch.nn.Module, ctx: Dist) -> None:
    """A small module of its own (the value head) sharded the same way."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(module)
    module.set_gradient_divide_factor(1.0)
    if ctx.backend == "gloo":
        module.set_force_sum_reduction_for_comms(True)


def _cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def step_advantages(ctx: Dist, estimate, inputs):
    """Advantages over the whole step: every rank's inputs gathered (ranks hold whole groups, in rank order,
    as one process would), the estimator run on all of them, this rank's tokens kept."""
    from dataclasses import replace

    from toolrl.algos import Advantages

    fields = ("rewards", "counts", "token_rewards", "values", "valid", "turns", "roles")
    mine = {name: _cpu(getattr(inputs, name)) for name in fields}
    every = gather(ctx, mine)
    device = inputs.rewards.device

    def joined(name):
        parts = [e[name] for e in every]
        if all(p is None for p in parts):
            return None
        if name == "roles":  # a rank whose trajectories played one role sent None: name it as step_roles does
            return [r for p, e in zip(parts, every, strict=True) for r in (p or [""] * len(e["counts"]))]
        if name in ("counts", "turns"):
            return [x for p in parts for x in p]
        if name == "valid":
            parts = [
                p if p is not None else torch.ones(len(e["counts"]), dtype=torch.bool)
                for p, e in zip(parts, every, strict=True)
            ]
        return torch.cat(parts).to(device)

    whole = replace(inputs, **{name: joined(name) for name in fields}, **_joined_components(ctx, inputs))
    est = estimate(whole)
    start = sum(sum(e["counts"]) for e in every[: ctx.rank])
    end = start + sum(mine["counts"])
    returns = est.returns[start:end] if est.returns is not None else None
    return Advantages(est.advantages[start:end], returns)


def _joined_components(ctx: Dist, inputs) -> dict:
    """Every rank's reward components as one matrix, their columns lined up by name (a rank whose trajectories
    lack a component has 0 there)."""
    names = inputs.component_names or []
    rows = inputs.components.tolist() if inputs.components is not None else [[] for _ in inputs.counts]
    weights = inputs.component_weights.tolist() if inputs.component_weights is not None else []
    every = gather(ctx, (names, rows, weights))
    union = {name: w for ns, _, ws in every for name, w in zip(ns, ws, strict=True)}
    if not union:
        return {"components": None, "component_weights": None, "component_names": None}
    order = list(union)
    joined = [[dict(zip(ns, row, strict=True)).get(name, 0.0) for name in order] for ns, rs, _ in every for row in rs]
    device = inputs.rewards.device
    return {"components": torch.tensor(joined, device=device), "component_names": order,
            "component_weights": torch.tensor([union[n] for n in order], device=device)}  # fmt: skip


def global_totals(ctx: Dist, totals):
    """The loss denominators over every rank's trajectories."""
    if not ctx.on:
        return totals
    from toolrl.algos import StepTotals

    every = gather(ctx, (totals.tokens, totals.sequences))
    return StepTotals(tokens=max(sum(t for t, _ in every), 1), sequences=max(sum(s for _, s in every), 1))
