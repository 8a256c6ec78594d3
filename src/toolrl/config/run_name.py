"""The rule for a run's name, which names its folder under output_dir: the config's check and the UI's launch
form both use it."""

from __future__ import annotations

import re

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A run's name: one folder name under output_dir (never '.', '..', a path or hidden), matched whole (fullmatch:
with ^...$, a trailing newline got through)."""


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot name a run's folder (one folder name inside output_dir), or None."""
    if RUN_NAME.fullmatch(name):
        return None
    return (f"{name[:60]!r} is not one folder name: use letters, digits, '.', '_' or '-' (up to 100, starting with "
            "a letter or digit)")  # fmt: skip
