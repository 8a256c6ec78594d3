"""The `local` provider: boxes in this machine's sandbox (bubblewrap, else unshare: envs/code/sandbox.py).

A box is a host folder per writable folder of its spec (the working folder, /logs, /tests, ...), bound into the
sandbox at each command; everything else is the host's programs, read-only, with no network. Every command runs in
fresh namespaces with the box's limits (time, memory of all its processes together, processes, file size), so
nothing it starts outlives it. A Dockerfile (`BoxSpec.build`) is followed as sandbox/dockerfile.py says, once per
task: its result is a template folder that each box starts from (copied, links kept as links).

Folders are made by the host for the sandbox's user (a user id of its own when toolrl runs as root) and removed
when the box stops; the host never reads or writes a path inside them otherwise (copies go through tar inside).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Literal

from toolrl.envs.code.memory import cgroups_left
from toolrl.envs.code.output import BoundedOutput
from toolrl.envs.code.sandbox import MEMORY_NOTE, Sandbox, SandboxLimits, resolve_isolation
from toolrl.errors import ConfigError
from toolrl.sandbox.dockerfile import Recipe, parse
from toolrl.sandbox.provider import Box, BoxSpec, BuiltOnce, ProviderOptions, SandboxProvider, register_provider

log = logging.getLogger(__name__)

_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="toolrl-box")
"""Box commands block a thread each (pipes and a deadline); many boxes run at once."""
BUILD_TIMEOUT_S = 600.0


class LocalOptions(ProviderOptions):
    isolation: Literal["auto", "bubblewrap", "unshare"] = "auto"
    """How boxes are isolated (auto: bubblewrap, else unshare; without either, local boxes cannot start)."""
    memory_bound: Literal["auto", "cgroup", "watch"] = "auto"
    """How a command's memory_mb is held for all its processes together (envs/code/memory.py)."""


class RawOutput:
    """A command's stdout kept whole, up to `limit` bytes (past it the command is stopped)."""

    def __init__(self, limit: int):
        self.limit, self.data, self.over_limit = limit, bytearray(), False

    def add(self, chunk: bytes) -> None:
        self.data += chunk[: max(0, self.limit - len(self.data))]
        self.over_limit = self.over_limit or len(self.data) >= self.limit


def _folder_name(inside: str) -> str:
    return "_".join(PurePosixPath(inside).parts[1:])


def _own(root: Path, uid: int) -> None:
    """Give a box's folders to the sandbox's user, never following a link."""
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
    os.chown(root, uid, uid)


class LocalBox(Box):
    def __init__(self, spec: BoxSpec, provider: LocalProvider, template: Path | None):
        super().__init__(spec)
        self.provider = provider
        self.root = Path(tempfile.mkdtemp(prefix="toolrl-box-"))
        binds = {}
        for inside in dict.fromkeys((spec.workdir, *spec.folders)):
            host = self.root / _folder_name(inside)
            if template is not None and (template / host.name).is_dir():
                shutil.copytree(template / host.name, host, symlinks=True)
            else:
                host.mkdir()
            binds[inside] = str(host)
        limits = SandboxLimits(
            timeout_s=spec.timeout_s, memory_mb=spec.memory_mb, max_output_chars=spec.max_output_chars,
            max_file_mb=spec.max_file_mb, max_processes=spec.max_processes, isolation=provider.isolation,
            disk_mb=spec.disk_mb, memory_bound=provider.options.memory_bound,
        )  # fmt: skip
        self.sandbox = Sandbox(limits, check=False, binds=binds)
        if self.sandbox.uid is not None:
            for host in binds.values():
                _own(Path(host), self.sandbox.uid)

    def _call(self, argv, stdin, timeout_s, cwd, env, raw):
        sink = RawOutput(self.spec.max_file_mb * 2**20) if raw else None
        text = BoundedOutput(self.spec.max_output_chars, self.spec.max_file_mb * 2**20)
        env = {**self.spec.env, **env}
        status, exceeded = self.sandbox.exec(list(argv), stdin, sink or text, cwd, env, timeout_s, stderr=not raw)
        if raw:
            return status, bytes(sink.data), exceeded
        output = text.text() + (f"\n{MEMORY_NOTE.format(mb=self.spec.memory_mb)}" if exceeded else "")
        return status, output, exceeded

    async def _run(self, argv: Sequence[str], stdin: bytes, timeout_s: float, cwd: str, env: Mapping[str, str],
                   raw: bool):  # fmt: skip
        if self.sandbox is None:
            raise RuntimeError("the box is stopped")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_POOL, self._call, argv, stdin, timeout_s, cwd, env, raw)

    def close(self, keep_folders: bool = False) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        if not keep_folders:
            shutil.rmtree(self.root, ignore_errors=True)  # fd-based: never follows a link the box left
        self.provider.boxes.discard(self)

    async def stop(self) -> None:
        self.close()


@register_provider("local")
class LocalProvider(SandboxProvider):
    Options = LocalOptions

    def __init__(self, options: LocalOptions):
        super().__init__(options)
        self.options: LocalOptions = options
        self.isolation = resolve_isolation(options.isolation)
        self.boxes: set[LocalBox] = set()
        self.templates: BuiltOnce[Path] = BuiltOnce()
        self.started = 0

    async def start(self, spec: BoxSpec) -> LocalBox:
        template = await self._template(spec) if spec.build is not None else None
        box = LocalBox(spec, self, template)  # ~4 ms of Python and a few syscalls: a thread would only add its hop
        self.boxes.add(box)
        self.started += 1
        return box

    async def _template(self, spec: BoxSpec) -> Path:
        assert spec.build is not None
        return await self.templates.get(spec.build, lambda key: self._build(spec, parse(spec.build / "Dockerfile")))

    async def _build(self, spec: BoxSpec, recipe: Recipe) -> Path:
        dockerfile = spec.build / "Dockerfile"
        if recipe.ignored:
            log.info("%s: a local box does not follow %s (container settings)", dockerfile, ", ".join(recipe.ignored))
        box = LocalBox(spec, self, None)
        writable = [spec.workdir, *spec.folders]
        try:
            for step in recipe.steps:
                where = f"{dockerfile}:{step.line}"
                if step.kind == "run":
                    result = await box.exec(step.args, cwd=step.workdir, timeout_s=BUILD_TIMEOUT_S, env=recipe.env)
                    if not result.ok:
                        raise ConfigError(f"{where}: RUN failed in a local box (exit {result.status}): "
                                          f"{result.output.strip()[-200:]}")  # fmt: skip
                    continue
                *sources, dest = step.args
                dest = str(PurePosixPath(step.workdir) / dest)
                if not any(dest == w or dest.startswith(w.rstrip("/") + "/") for w in writable):
                    raise ConfigError(f"{where}: COPY to {dest}: a local box writes only under {', '.join(writable)}")
                for source in sources:
                    path = spec.build / source
                    into_folder = step.args[-1].endswith("/") or len(sources) > 1 or path.is_dir()
                    await box.put(path, f"{dest}/{path.name}" if into_folder and path.is_file() else dest)
        except BaseException:
            box.close()
            raise
        box.close(keep_folders=True)
        return box.root

    def leftovers(self) -> list[str]:
        left = [f"box folder {box.root}" for box in self.boxes if box.root.exists()]
        left += [f"cgroup {c}" for c in cgroups_left()]
        left += [f"process {pid} ({name})" for pid, name in _children() if name in ("bwrap", "unshare")]
        return left

    def close(self) -> None:
        for box in list(self.boxes):
            box.close()
        for template in self.templates.built.values():
            shutil.rmtree(template, ignore_errors=True)
        self.templates.built.clear()


def _children() -> list[tuple[int, str]]:
    """(pid, name) of this process's child processes."""
    found, me = [], str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            name = (entry / "comm").read_text().strip()
        except (OSError, IndexError):
            continue
        if fields[1] == me:
            found.append((int(entry.name), name))
    return found
