"""What a run can check before it loads a model or makes its run directory: the files and folders its config
names and the context the model has room for. Each check that fails is one line naming the key and what to do,
within a second or two, and no run folder is left behind (`toolrl train` and `toolrl sft` call it first)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from toolrl.config.schema import RunConfig
from toolrl.errors import ConfigError, ToolRLError
from toolrl.registry import Registry
from toolrl.text import clip, clip_path

CHECKS: Registry[Callable[[RunConfig], None]] = Registry("preflight check", "preflight")
"""Checks run before a model loads; a plug-in may register one of its own (register_preflight)."""


NO_SFT_FILE = 'sft.file: sft.source is file; give the path of a JSONL of {"messages": [...]} records'
"""The error of a file warm start without its file (here before loading, and in train/sft.py's file source)."""


def register_preflight(name: str):
    return CHECKS.register(name)


def preflight(cfg: RunConfig) -> None:
    """Every registered check, in order; the first failure raises its one-line ConfigError."""
    for name in CHECKS:
        CHECKS[name](cfg)


def _file(key: str, value: str | None, what: str) -> None:
    if value is None:
        return
    path = Path(value).expanduser()
    if not path.exists():
        raise ConfigError(f"{key}: {clip_path(path, 200)} does not exist; give the path of {what}")
    if path.is_dir() and what.endswith("file"):
        raise ConfigError(f"{key}: {clip_path(path, 200)} is a folder; give the path of {what}")


@register_preflight("files")
def _files(cfg: RunConfig) -> None:
    """Every file the config names exists (a tool config file is also read and validated: nothing started)."""
    _file("env.train_file", cfg.env.train_file, "a task file")
    _file("env.test_file", cfg.env.test_file, "a task file")
    for path in dict.fromkeys(p for p in (cfg.env.train_file, cfg.env.test_file) if p):
        from toolrl.envs.tasks import load_tasks

        load_tasks(path)  # read and checked here: a bad row is a one-line error before the run directory exists
    _file("tools.file", cfg.tools.file, "a tool config file")
    if cfg.tools.file:
        from toolrl.tools.toolset import read_tool_file

        read_tool_file(Path(cfg.tools.file).expanduser())
    if cfg.sft.source == "file" and (cfg.train.warm_start or cfg.train.steps == 0):
        if not cfg.sft.file:
            raise ConfigError(NO_SFT_FILE)
        _file("sft.file", cfg.sft.file, "a JSONL file of conversations")


@register_preflight("output_dir")
def _output_dir(cfg: RunConfig) -> None:
    """The run directory can be made: output_dir is (or can become) a writable folder. Nothing is made here: a run
    refused by a later check leaves no folder behind (the folder, or its nearest existing parent, is written to
    with a temporary file that is gone at once)."""
    out = Path(cfg.output_dir).expanduser()
    try:
        there = out
        while not there.exists() and there != there.parent:
            there = there.parent
        if there.exists() and not there.is_dir():
            raise NotADirectoryError(20, "a file is in the way", str(there))
        with tempfile.TemporaryFile(dir=there):
            pass
    except OSError as exc:
        raise ConfigError(
            f"output_dir: {clip(str(out), 200)} cannot hold runs ({exc.strerror or exc}); pick a folder you can write"
        ) from None


@register_preflight("model")
def _model(cfg: RunConfig) -> None:
    """The policy (and a distillation teacher) resolve to a folder on this machine, the policy's with weights and
    a tokenizer, and the response budget fits its context (config.json's max_position_embeddings): nothing is
    loaded, and each folder is resolved once."""
    from toolrl.models.resolve import resolve_model

    folder = resolve_model(cfg.model.name)
    check_model_folder("model.name", folder)
    check_context(cfg, folder)
    if cfg.train.kl.teacher:
        try:
            resolve_model(cfg.train.kl.teacher, "train.kl.teacher")
        except ToolRLError as exc:
            raise ConfigError(f"train.kl.teacher: {exc}") from None


def check_model_folder(key: str, folder: Path) -> None:
    """A model folder holds weights and a tokenizer (loading would otherwise fail after the run folder exists)."""
    names = {p.name for p in folder.iterdir()}
    if not any(n.endswith((".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json")) for n in names):
        raise ConfigError(f"{key}: {clip_path(folder, 200)} holds no weights (*.safetensors); save the model there "
                          "with save_pretrained")  # fmt: skip
    if not names & {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json"}:
        raise ConfigError(f"{key}: {clip_path(folder, 200)} holds no tokenizer (tokenizer.json); save the "
                          "tokenizer there with tokenizer.save_pretrained")  # fmt: skip


def check_context(cfg: RunConfig, folder: Path) -> None:
    """The response budget leaves room for a prompt in the model's context."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return  # loading says what is wrong with the folder
    limit = config.get("max_position_embeddings")
    if isinstance(limit, int) and cfg.rollout.max_response_tokens >= limit:
        raise ConfigError(
            f"rollout.max_response_tokens: {cfg.rollout.max_response_tokens} leaves no room for a prompt in "
            f"{cfg.model.name}'s context of {limit} tokens; set it below {limit}"
        )
