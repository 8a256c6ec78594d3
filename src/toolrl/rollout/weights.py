"""The trainer's weights as a file an engine reloads from: a safetensors file written atomically, in shared
memory by default (engines in other processes on this machine read it without a copy through a socket)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch


def shared_folder(prefix: str) -> Path:
    """A new folder in /dev/shm where there is one, else in the temporary directory."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() else None))


def write_weights(weights: dict[str, torch.Tensor], folder: Path) -> Path:
    """folder/model.safetensors with `weights` (a HF state dict; tied tensors stored once each, as safetensors
    requires), renamed into place so that a reader never sees half a file."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in weights.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.untyped_storage().data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
    partial = folder / "model.safetensors.partial"
    save_file(tensors, str(partial))
    return partial.replace(folder / "model.safetensors")
