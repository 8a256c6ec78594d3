"""Sharded checkpoints of data-parallel runs, with torch.distributed.checkpoint (DCP).

Under torchrun every rank writes its shards of the trainable weights (and the value head) and of the optimizer
state into CHECKPOINT/dcp/ (a collective; the folder must be on a file system every rank sees), keyed by
parameter name, so a run resumes at any world size (DCP reshards on load), one process included, and
`toolrl export` turns any checkpoint into a plain Hugging Face folder. The rest of the state (step, data order,
scheduler, RNG) is the same on every rank and is written by rank 0 as for one process.

DCP reads its metadata file with pickle; `SafeReader` reads it with an unpickler that builds only DCP's own
metadata classes and plain containers, so a checkpoint from elsewhere cannot run code when resumed.
"""

from __future__ import annotations

import importlib
import io
import pickle
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader

from toolrl.errors import ConfigError

DCP = "dcp"

_ALLOWED_MODULES = ("torch.distributed.checkpoint.",)
_ALLOWED = {
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("torch", "Size"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes (classes only: no function of those modules), paths, tensor sizes,
    dtypes and layouts; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_ALLOWED_MODULES):
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type) and found.__module__.startswith(_ALLOWED_MODULES):
                return found
        if (module, name) in _ALLOWED:
            return getattr(importlib.import_module(module), name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), torch.dtype | torch.layout | torch.memory_format
        ):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


class SafeReader(FileSystemReader):
    """DCP's file system reader with a metadata unpickler limited to metadata classes."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            data = stream.read()
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, AttributeError, ImportError, EOFError) as exc:
            raise ConfigError(f"{path}: refused, not a checkpoint's metadata ({exc})") from None
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


@contextmanager
def _one_process_quietly():
    """Without a process group DCP works in one process and warns that it assumes so: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def is_sharded(folder: Path) -> bool:
    return (folder / DCP / ".metadata").is_file()


def _modules(model, value_head) -> torch.nn.Module:
    """What the state dicts are taken over: names `policy.*` and `value_head.*`, the same at any world size."""
    modules = {"policy": model}
    if value_head is not None:
        modules["value_head"] = value_head
    return torch.nn.ModuleDict(modules)


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, **kwargs)


def save(folder: Path, model, value_head, optimizer) -> None:
    """Every rank's shards of the trainable weights and the optimizer state into folder/dcp (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(_modules(model, value_head), optimizer, options=_options())
    with _one_process_quietly():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / DCP))


def load(folder: Path, model, value_head, optimizer=None) -> None:
    """Load folder/dcp into this process's model (sharded or not) and optimizer, resharded as needed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

    modules = _modules(model, value_head)
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = {"model": get_model_state_dict(modules, options=_options())}
    else:
        model_state, optim_state = get_state_dict(modules, optimizer, options=_options())
        state = {"model": model_state, "optim": optim_state}
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _one_process_quietly():
            dcp.load(state, checkpoint_id=str(folder / DCP), storage_reader=SafeReader(str(folder / DCP)))
    except (CheckpointException, RuntimeError, ValueError, KeyError) as exc:  # a rank's failure, wrapped
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise ConfigError(
            f"{folder / DCP}: cannot load the sharded checkpoint: {lines[-1] if lines else exc}"
        ) from None
    if optimizer is None:
        set_model_state_dict(modules, state["model"], options=_options(strict=False))
    else:
        set_state_dict(
            modules,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=_options(strict=False),
        )


def load_full(trainable: Path, optimizer_state: dict, model, value_head, optimizer) -> None:
    """A checkpoint written by one process (full tensors; the optimizer's state keyed by parameter index) into
    a sharded model and optimizer: every rank reads the files and keeps its shards."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    modules = _modules(model, value_head)
    weights = {f"policy.{k}" if not k.startswith("value_head.") else k: v for k, v in load_file(str(trainable)).items()}
    set_model_state_dict(modules, weights, options=_options(full_state_dict=True, strict=False))
    names = [f"policy.{n}" for n, p in model.named_parameters() if p.requires_grad]
    if value_head is not None:
        names += [f"value_head.{n}" for n, _ in value_head.named_parameters()]
    by_name = {
        "state": {names[i]: state for i, state in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]} for group in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(modules, optimizer, by_name, options=_options(full_state_dict=True))
