"""Runs compared by what differs between them: the config keys whose values differ between the ticked runs (as
flat dotted keys, `train.lr`), beside each run's last metrics; and a run's own tags and note, kept in its folder
(RUN/ui.json) so that they travel with it. A run folder is data: its config is read with a size cap as YAML,
and tags and notes written from the page are checked before they are written."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from toolrl.errors import ConfigError
from toolrl.runs.files import read_run_file
from toolrl.text import clip

UI_FILE = "ui.json"
MAX_UI_BYTES = 64 << 10
MAX_TAGS, MAX_TAG_CHARS, MAX_NOTE_CHARS = 20, 40, 2000
TAG = re.compile(r"[\w.:+-]{1,40}")
FINAL_METRICS = ("reward", "success", "tool_calls", "step_s")
"""A run's last training step's metrics shown beside its config in the comparison."""


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys (`{"train": {"lr": 1e-5}}` -> `{"train.lr": 1e-5}`); lists stay values."""
    if not isinstance(value, dict):
        return {prefix: value} if prefix else {}
    out: dict[str, Any] = {}
    for key, inner in value.items():
        out |= flat(inner, f"{prefix}.{key}" if prefix else str(key))
    return out


def read_config(run: Path, max_bytes: int) -> dict[str, Any]:
    """The run's config.yaml as flat keys ({} when it cannot be read or is not a mapping)."""
    try:
        data = yaml.safe_load(read_run_file(run, run / "config.yaml", max_bytes))
    except (OSError, yaml.YAMLError):
        return {}
    return flat(data) if isinstance(data, dict) else {}


def differing(configs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The keys whose values are not the same in every run (a key one run lacks differs), sorted; each with every
    run's value (None where it lacks the key)."""
    keys = sorted({key for config in configs.values() for key in config})
    rows = []
    for key in keys:
        values = {name: config.get(key) for name, config in configs.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            rows.append({"key": key, "values": values})
    return rows


def read_meta(run: Path) -> dict[str, Any]:
    """The run's tags and note (RUN/ui.json); empty ones where there is none or it is not what the page writes."""
    try:
        data = json.loads(read_run_file(run, run / UI_FILE, MAX_UI_BYTES))
    except (OSError, ValueError, RecursionError):
        data = {}
    tags = data.get("tags") if isinstance(data, dict) else None
    note = data.get("note") if isinstance(data, dict) else None
    kept = [t for t in tags if isinstance(t, str) and TAG.fullmatch(t)][:MAX_TAGS] if isinstance(tags, list) else []
    return {"tags": kept, "note": clip(note, MAX_NOTE_CHARS) if isinstance(note, str) else ""}


def write_meta(run: Path, tags: Any, note: Any) -> dict[str, Any]:
    """Save the run's tags and note into RUN/ui.json (replaced atomically); a bad value is a one-line error."""
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        raise ConfigError(f"tags: a list of at most {MAX_TAGS} tags")
    bad = [t for t in tags if not isinstance(t, str) or not TAG.fullmatch(t)]
    if bad:
        raise ConfigError(f"tags: {clip(repr(bad[0]), 60)} is not a tag (1-{MAX_TAG_CHARS} letters, digits, . : + - _)")
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise ConfigError(f"note: text of at most {MAX_NOTE_CHARS} characters")
    # a temporary file of a fresh random name (O_EXCL: a link planted in the folder is never followed), then renamed
    fd, tmp = tempfile.mkstemp(dir=run, prefix=f".{UI_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"tags": list(dict.fromkeys(tags)), "note": note}, f)
        os.replace(tmp, run / UI_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return read_meta(run)
