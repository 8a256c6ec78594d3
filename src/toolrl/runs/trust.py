"""A run directory is data: what resuming it would import or start is said first, one line each, and a run
made elsewhere (another machine or another owner) is resumed only when the user says they trust it."""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path
from typing import Any

from toolrl.errors import ConfigError
from toolrl.text import clip


def _names(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value] if isinstance(value, list) else []


def code_to_run(data: dict[str, Any]) -> list[str]:
    """What a config (its mapping, read but not validated: validating imports env.module) makes toolrl import
    or start, one line each: modules (plugins, env.module), and the commands and modules of its tool config
    file's servers."""
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    tools = data.get("tools") if isinstance(data.get("tools"), dict) else {}
    lines = [f"import module {m} (plugins)" for m in _names(data.get("plugins"))]
    lines += [f"import module {m} (env.module)" for m in _names(env.get("module"))]
    if isinstance(tools.get("file"), str):
        from toolrl.tools.toolset import read_tool_file

        file = tools["file"]
        for name, entry in read_tool_file(Path(file)).mcp_servers.items():
            where = f"(tools.file {file}, server {name})"
            if entry.command:
                lines.append(f"start command {shlex.join([entry.command, *entry.args])} {where}")
            for kind in ("python", "agent"):
                if getattr(entry, kind):
                    lines.append(f"import {getattr(entry, kind)} {where}")
    return [clip(line, 300) for line in lines]


def foreign(run: Path, status: dict) -> str | None:
    """Why `run` may come from elsewhere (None when it was made here, by this user)."""
    me = os.geteuid()
    for path in (run, run / "config.yaml"):
        owner = path.stat().st_uid
        if owner != me:
            return f"{path.name} is owned by user id {owner}, not by you ({me})"
    host = status.get("host")
    if host != socket.gethostname():
        return f"it was made on {clip(str(host), 60)!r}, not on this machine" if host else "its origin is unknown"
    return None


def check_trusted(run: Path, status: dict, trusted: bool) -> None:
    """ConfigError when `run` may come from elsewhere and the user has not said they trust it."""
    reason = foreign(run, status)
    if reason is not None and not trusted:
        raise ConfigError(
            f"{run}: {reason}; resuming runs the code its config names (listed above): read them, then pass --trust-run"
        )
