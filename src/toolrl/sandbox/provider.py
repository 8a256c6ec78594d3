"""The provider interface: start a box from a spec, run commands in it, copy files in and out, stop it.

Copies go through tar run inside the box: into the box, a stream the host made from its own files; out of it, a
stream the box's tar wrote, which the host unpacks with Python's `data` filter (no absolute paths, no links that
leave the destination, no devices). A member the filter refuses is skipped and reported (`Copied.refused`), never
followed: whatever the box's code left (a link to the host's /etc/passwd) is data, not a path the host opens.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import tarfile
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from toolrl.errors import ConfigError
from toolrl.registry import Registry

log = logging.getLogger(__name__)
T = TypeVar("T")


class ProviderOptions(BaseModel):
    """What every provider takes (`env.options.sandbox`); a provider's own options subclass it."""

    model_config = ConfigDict(extra="forbid")
    provider: str = "local"
    """local (bubblewrap or unshare on this machine), container (podman or docker), or one registered by a plugin."""


@dataclass(frozen=True)
class BoxSpec:
    """What a box is made of and bounded by."""

    workdir: str = "/app"
    """Where commands start; writable, kept for the box's life."""
    folders: tuple[str, ...] = ("/logs", "/tests", "/solution", "/tmp")
    """Other writable folders (absolute, one level: /logs, not /logs/verifier)."""
    image: str | None = None
    """A container image (container providers); None: built from `build`."""
    build: Path | None = None
    """A folder with a Dockerfile: the box starts from what it describes (local: sandbox/dockerfile.py's subset)."""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    """One command's wall-clock limit unless the call gives its own."""
    memory_mb: int = 1024
    max_processes: int = 128
    cpus: float = 1.0
    disk_mb: int = 256
    max_output_chars: int = 4000
    """What a command's output keeps (its head and tail)."""
    max_file_mb: int = 16
    """Largest file a command may write, most output it may print, largest copy out of the box."""
    network: bool = False

    def __post_init__(self) -> None:
        for path in (self.workdir, *self.folders):
            pure = PurePosixPath(path)
            if not pure.is_absolute() or ".." in pure.parts or len(pure.parts) < 2:
                raise ConfigError(f"a box's folders are absolute paths below /, without '..': not {path!r}")


@dataclass(frozen=True)
class ExecResult:
    status: int | None
    """The exit code; -N: killed by signal N; None: it ran past its time limit and was stopped."""
    output: str
    """stdout and stderr together, within the spec's max_output_chars (head and tail)."""
    memory_exceeded: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 0


@dataclass
class Copied:
    """What a copy out of a box wrote on the host, and what it refused (members the data filter rejected)."""

    files: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    truncated: bool = False
    """The stream was cut at max_file_mb."""


class Box(ABC):
    """One running sandbox. `exec` is the one primitive a provider writes (`_run`); copies are built on it."""

    def __init__(self, spec: BoxSpec):
        self.spec = spec

    @abstractmethod
    async def _run(
        self, argv: Sequence[str], stdin: bytes, timeout_s: float, cwd: str, env: Mapping[str, str], raw: bool
    ) -> tuple[int | None, bytes | str, bool]:
        """Run argv inside: (status, output, memory exceeded). raw: stdout alone as bytes (up to max_file_mb,
        stderr dropped); else stdout and stderr as bounded text."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop everything running in the box and remove what it holds; a second call does nothing."""

    def close(self) -> None:
        """`stop`, from synchronous code (an episode's close), with or without an event loop running in this
        thread: on a loop of its own in a helper thread. A box that can stop without a loop overrides it."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolrl-box-stop") as pool:
            pool.submit(asyncio.run, self.stop()).result()

    async def exec(
        self, command: str | Sequence[str], *, stdin: bytes = b"", timeout_s: float | None = None,
        cwd: str | None = None, env: Mapping[str, str] | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run a shell command (a string: bash -c) or an argv inside the box."""
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        status, output, exceeded = await self._run(
            argv, stdin, timeout_s or self.spec.timeout_s, cwd or self.spec.workdir, dict(env or {}), False
        )
        return ExecResult(status, str(output), exceeded)

    async def put(self, source: Path, dest: str) -> None:
        """Copy a host file or folder (its contents) to `dest` inside the box, made if missing."""
        data = pack(source, PurePosixPath(dest).name)
        if not source.is_dir():
            dest = str(PurePosixPath(dest).parent)
        script = 'mkdir -p -- "$1" && tar -x --no-same-owner -C "$1"'
        result = await self.exec(["sh", "-c", script, "put", dest], stdin=data)
        if not result.ok:
            raise OSError(f"copying {source.name} into the box's {dest} failed: {result.output.strip()[-200:]}")

    async def get(self, source: str, dest: Path) -> Copied:
        """Copy `source` (a folder's contents, or a file) out of the box into the host folder `dest`."""
        script = (
            'if [ -d "$1" ]; then tar -c -C "$1" .; else tar -c -C "$(dirname -- "$1")" -- "$(basename -- "$1")"; fi'
        )
        status, data = await self.run_raw(["sh", "-c", script, "get", source])
        if status != 0 and not data:
            raise FileNotFoundError(f"{source} could not be read from the box (exit {status})")
        return unpack(data, dest, source, self.spec.max_file_mb * 2**20)

    async def run_raw(
        self, argv: Sequence[str], stdin: bytes = b"", timeout_s: float | None = None
    ) -> tuple[int | None, bytes]:
        """Run argv inside from the root folder: (status, its stdout as bytes up to max_file_mb; stderr dropped)."""
        status, data, _ = await self._run(argv, stdin, timeout_s or self.spec.timeout_s, "/", {}, True)
        return status, bytes(data)

    async def __aenter__(self) -> Box:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def pack(source: Path, name: str | None = None) -> bytes:
    """A tar stream of a host folder's contents (or of one file, stored as `name`); links stay links."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        if source.is_dir():
            for child in sorted(source.iterdir()):
                tar.add(child, arcname=child.name)
        else:
            tar.add(source, arcname=name or source.name)
    return stream.getvalue()


def unpack(data: bytes, dest: Path, source: str, limit: int) -> Copied:
    """Unpack a tar stream a box wrote into the host folder `dest`, member by member through the data filter."""
    copied = Copied(truncated=len(data) >= limit)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                try:
                    tar.extract(member, dest, filter="data")
                except (tarfile.FilterError, OSError) as exc:
                    copied.refused.append(f"{member.name}: {type(exc).__name__}")
                    continue
                if member.isfile():
                    copied.files.append(dest / member.name)
    except tarfile.ReadError as exc:  # cut short: what was read before stands
        copied.refused.append(f"(stream) {exc}")
    if copied.refused:
        log.warning("copy of %s out of a box refused %d member(s): %s", source, len(copied.refused),
                    "; ".join(copied.refused[:3]))  # fmt: skip
    return copied


def folder_digest(folder: Path) -> str:
    """What a build folder holds (names and bytes), so that a changed task builds again."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class BuiltOnce(Generic[T]):
    """What a provider builds from a task's build folder (a template folder, an image), once a run per folder and
    contents however many boxes start from it at once. A folder is hashed once a run (at every start it cost 25 ms)."""

    def __init__(self) -> None:
        self.built: dict[str, T] = {}
        self._digests: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def key(self, folder: Path) -> str:
        """`resolved folder:digest of its contents`."""
        where = str(folder.resolve())
        if where not in self._digests:
            self._digests[where] = folder_digest(folder)
        return f"{where}:{self._digests[where]}"

    async def get(self, folder: Path, build: Callable[[str], Awaitable[T]]) -> T:
        """The thing built from `folder`: `await build(key)` the first time, what it gave after."""
        key = self.key(folder)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self.built:
                self.built[key] = await build(key)
        return self.built[key]


class SandboxProvider(ABC):
    """Starts boxes. One per environment; `close()` removes what it keeps for the run (built templates, images)."""

    Options: type[ProviderOptions] = ProviderOptions

    def __init__(self, options: ProviderOptions):
        self.options = options

    @abstractmethod
    async def start(self, spec: BoxSpec) -> Box: ...

    def leftovers(self) -> list[str]:
        """What this provider's stopped boxes left on the host (processes, mounts, folders, containers); [] when
        clean. Tests and bench/harbor.py check it."""
        return []

    def close(self) -> None:  # noqa: B027 - most providers keep nothing for the run
        """Remove what the provider keeps for the run."""


PROVIDERS: Registry[Callable[..., SandboxProvider]] = Registry(
    "sandbox provider", "env.options.sandbox.provider", options_attribute="Options"
)
register_provider = PROVIDERS.register


def make_provider(options: Mapping | ProviderOptions | None = None) -> SandboxProvider:
    """The provider `options["provider"]` names, its options validated by its own model."""
    from pydantic import ValidationError

    from toolrl.validation import format_validation_error

    raw = options.model_dump(exclude_unset=True) if isinstance(options, BaseModel) else dict(options or {})
    name = raw.get("provider", "local")
    cls = PROVIDERS.lookup(name)
    model = getattr(cls, "Options", ProviderOptions)
    try:
        validated = model.model_validate({**raw, "provider": name})
    except ValidationError as exc:
        message = format_validation_error(exc, f"sandbox provider {name}", model, "env.options.sandbox.")
        raise ConfigError(message) from None
    return cls(validated)


__all__ = ["Box", "BoxSpec", "Copied", "ExecResult", "ProviderOptions", "SandboxProvider"]
