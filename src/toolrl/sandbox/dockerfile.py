"""The part of a Dockerfile a box without containers can follow (the `local` provider): each instruction is
taken, or refused with its file and line; none is skipped unsaid.

- FROM: the image is the host's own programs (read-only /usr): noted once, since nothing is pulled;
- WORKDIR, ENV: the box's working folder and variables;
- COPY / ADD of files from the build folder (no URLs, no --from): copied in;
- RUN (shell form or JSON form): run inside the box, without network, when the template is built;
- CMD, ENTRYPOINT, EXPOSE, LABEL, USER, ARG, SHELL, VOLUME, STOPSIGNAL, HEALTHCHECK, ONBUILD: what a long-running
  container needs, not a box whose commands are run one by one: reported in `ignored` (logged once per task).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from toolrl.errors import ConfigError

IGNORED = {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "USER", "ARG", "SHELL", "VOLUME", "STOPSIGNAL", "HEALTHCHECK",
           "ONBUILD", "MAINTAINER"}  # fmt: skip


@dataclass
class Step:
    kind: str
    """copy or run."""
    args: list[str]
    line: int
    workdir: str


@dataclass
class Recipe:
    base: str | None = None
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """`LINE: INSTRUCTION` for each instruction taken as noted, not followed."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with continuations joined and comments dropped."""
    lines, current, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append((start, current))
        current = ""
    if current:
        lines.append((start, current))
    return lines


def _words(rest: str) -> list[str]:
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return shlex.split(rest)


def parse(path: Path) -> Recipe:
    """The recipe a Dockerfile gives; ConfigError naming `path:LINE` for what a local box cannot follow."""
    recipe = Recipe()
    context = path.parent.resolve()
    for number, line in _logical_lines(path.read_text(encoding="utf-8")):
        word, _, rest = line.partition(" ")
        instruction, rest = word.upper(), rest.strip()
        where = f"{path}:{number}"
        if instruction == "FROM":
            recipe.base = rest.split()[0] if rest else None
        elif instruction == "WORKDIR":
            recipe.workdir = str(PurePosixPath(recipe.workdir) / rest)
        elif instruction == "ENV":
            words = shlex.split(rest)
            pairs = [w.split("=", 1) for w in words] if all("=" in w for w in words) else [rest.split(None, 1)]
            recipe.env.update({k: v for k, v in pairs})
        elif instruction in ("COPY", "ADD"):
            words = [w for w in _words(rest) if not w.startswith("--chown") and not w.startswith("--chmod")]
            if any(w.startswith("--") for w in words) or len(words) < 2:
                raise ConfigError(
                    f"{where}: {instruction} {rest!r}: a local box copies files of the build folder only (no "
                    "--from, no flags); use sandbox provider container for this task"
                )
            for source in words[:-1]:
                if "://" in source or not (context / source).resolve().is_relative_to(context):
                    raise ConfigError(f"{where}: {instruction} {source!r} is not a file of the build folder")
            recipe.steps.append(Step("copy", words, number, recipe.workdir))
        elif instruction == "RUN":
            command = _words(rest) if rest.startswith("[") else ["bash", "-c", rest]
            recipe.steps.append(Step("run", command, number, recipe.workdir))
        elif instruction in IGNORED:
            recipe.ignored.append(f"{number}: {instruction}")
        else:
            raise ConfigError(f"{where}: unknown instruction {instruction!r}")
    return recipe
