"""Where toolrl keeps what it makes outside a run: converted models, built corpora, logs ($TOOLRL_HOME)."""

from __future__ import annotations

import os
from pathlib import Path


def toolrl_home() -> Path:
    """$TOOLRL_HOME, by default ~/.cache/toolrl."""
    return Path(os.environ.get("TOOLRL_HOME", Path.home() / ".cache" / "toolrl"))
