"""Training state on disk without pickle: tensors in safetensors, everything else in JSON.

`save_state(path, tree)` writes a nested structure of dicts, lists, tuples, numbers, strings and tensors (an
optimizer's, a scheduler's, RNG states) as `path.safetensors` + `path.json`; `load_state` reads it back exactly
(tuples stay tuples, integer keys stay integers). Loading runs no code from the files, unlike `torch.load`
without `weights_only`, so a run directory from elsewhere cannot execute anything when resumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from toolrl.errors import ConfigError


def _flatten(value: Any, tensors: dict[str, torch.Tensor], storages: set[int]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensor = value.detach().cpu().contiguous()
        if tensor.untyped_storage().data_ptr() in storages:  # safetensors refuses tensors that share storage
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[key] = tensor
        return {"__tensor__": key}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _flatten(v, tensors, storages) for k, v in value.items()}
        return {
            "__items__": [[_flatten(k, tensors, storages), _flatten(v, tensors, storages)] for k, v in value.items()]
        }
    if isinstance(value, tuple):
        return {"__tuple__": [_flatten(v, tensors, storages) for v in value]}
    if isinstance(value, list):
        return [_flatten(v, tensors, storages) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint")


def _unflatten(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_unflatten(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__tuple__" in value:
        return tuple(_unflatten(v, tensors) for v in value["__tuple__"])
    if "__items__" in value:
        return {_unflatten(k, tensors): _unflatten(v, tensors) for k, v in value["__items__"]}
    return {k: _unflatten(v, tensors) for k, v in value.items()}


def save_state(path: Path, tree: Any) -> None:
    """Write `tree` as path.safetensors (its tensors) and path.json (the rest, tensors by reference)."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _flatten(tree, tensors, set())
    save_file(tensors, str(path.with_suffix(".safetensors")))
    path.with_suffix(".json").write_text(json.dumps(structure))


def load_state(path: Path) -> Any:
    """What `save_state` wrote, tensors on the CPU."""
    try:
        tensors = load_file(str(path.with_suffix(".safetensors")))
        structure = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: the checkpoint's training state cannot be read ({exc})") from None
    return _unflatten(structure, tensors)
