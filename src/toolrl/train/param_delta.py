"""FTRL's parameter analysis: how much RL moved each layer and module, as the relative change
||W_after - W_before||_F / ||W_before||_F between two checkpoints (by default the run's starting model and its
final model), per layer index and module kind (q_proj, ..., mlp, norms, embeddings)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import torch

LAYER = re.compile(r"\.layers\.(\d+)\.")


def where(name: str) -> tuple[str, str]:
    """(layer, module) of a parameter name: ("7", "q_proj") for model.layers.7.self_attn.q_proj.weight; layer
    "-" for parameters outside the blocks (embeddings, the final norm, the head)."""
    match = LAYER.search(name)
    parts = name.removesuffix(".weight").removesuffix(".bias").split(".")
    return (match.group(1) if match else "-"), parts[-1]


def relative_changes(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter present in both with the same shape: ||after - before|| / ||before|| (0 for a zero tensor
    that stayed zero)."""
    changes = {}
    for name, old in before.items():
        new = after.get(name)
        if new is None or new.shape != old.shape:
            continue
        old, new = old.float(), new.float()
        norm = old.norm().item()
        diff = (new - old).norm().item()
        changes[name] = diff / norm if norm > 0 else float(diff > 0)
    return changes


def by_layer_and_module(changes: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """layer -> module -> mean relative change of its parameters."""
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, change in changes.items():
        layer, module = where(name)
        groups[layer][module].append(change)
    return {
        layer: {module: sum(v) / len(v) for module, v in sorted(modules.items())}
        for layer, modules in sorted(groups.items(), key=lambda kv: (kv[0] == "-", int(kv[0]) if kv[0] != "-" else 0))
    }


def load_weights(name_or_path: str) -> dict[str, torch.Tensor]:
    """A model's parameters on CPU: a folder with *.safetensors, else any model name toolrl resolves (the
    embedded default included)."""
    path = Path(name_or_path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if files:
        from safetensors.torch import load_file

        weights: dict[str, torch.Tensor] = {}
        for file in files:
            weights.update(load_file(str(file)))
        return weights
    from toolrl.models.loading import load_model

    return {k: v.detach() for k, v in load_model(name_or_path, torch.device("cpu")).state_dict().items()}


def write_heatmap(table: Mapping[str, Mapping[str, float]], target: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [layer for layer in table if layer != "-"]
    modules = sorted({m for layer in layers for m in table[layer]})
    grid = [[table[layer].get(m, float("nan")) for m in modules] for layer in layers]
    # room for the rotated module names and the title however few layers changed (tight_layout warns otherwise)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 + 0.9 * len(modules)), max(3.5, 1.0 + 0.28 * len(layers))))
    image = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(modules)), modules, rotation=45, ha="right")
    ax.set_yticks(range(len(layers)), layers)
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="relative change")
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
