"""The `container` provider: boxes as podman or docker containers, driven through their command line.

A box is a container started from the task's image (`BoxSpec.image`, or the image built once from its folder's
Dockerfile) that sleeps until stopped, with no network unless the spec allows it, its memory, processes and CPUs
bounded, and a label (`toolrl.box`) by which leftovers are found. Commands run with `exec` under coreutils'
`timeout` (so a command past its limit is killed inside, not only its client); copies are tar streams through
`exec -i` (never `cp`, which follows links the box's code may have made); stop is `rm -f`, which kills what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import signal
import uuid
from collections.abc import Mapping, Sequence

from pydantic import Field

from toolrl.envs.code.output import BoundedOutput
from toolrl.errors import ConfigError
from toolrl.sandbox.provider import Box, BoxSpec, BuiltOnce, ProviderOptions, SandboxProvider, register_provider

log = logging.getLogger(__name__)

LABEL = "toolrl.box"
BUILD_TIMEOUT_S = 1800.0
CLI_TIMEOUT_S = 120.0
"""Starting and removing a container: past this the command line is taken as hung."""


class ContainerOptions(ProviderOptions):
    program: str | None = None
    """podman or docker (a name on PATH or a path); None: podman, else docker."""
    extra_args: list[str] = Field(default_factory=list)
    """Added to each `run` (a runtime, a storage option)."""


async def _cli(argv: Sequence[str], stdin: bytes = b"", timeout_s: float = CLI_TIMEOUT_S, limit: int = 2**24,
               stderr: bool = True) -> tuple[int | None, bytes]:  # fmt: skip
    """Run one command line on the host: (exit code or None past `timeout_s`, stdout (+ stderr) up to `limit`)."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if stderr else asyncio.subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stdin is not None
    data = bytearray()

    async def feed() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(stdin)
            await process.stdin.drain()
        process.stdin.close()

    async def read() -> None:
        while chunk := await process.stdout.read(65536):
            data.extend(chunk[: max(0, limit - len(data))])
            if len(data) >= limit:
                process.kill()
        await process.wait()

    try:
        await asyncio.wait_for(asyncio.gather(feed(), read()), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        await process.wait()
        return None, bytes(data)
    return process.returncode, bytes(data)


class ContainerBox(Box):
    def __init__(self, spec: BoxSpec, provider: ContainerProvider, name: str):
        super().__init__(spec)
        self.provider, self.name = provider, name
        self.stopped = False

    async def _run(self, argv: Sequence[str], stdin: bytes, timeout_s: float, cwd: str, env: Mapping[str, str],
                   raw: bool):  # fmt: skip
        if self.stopped:
            raise RuntimeError("the box is stopped")
        variables = [arg for key, value in {**self.spec.env, **env}.items() for arg in ("-e", f"{key}={value}")]
        inside = ["timeout", "-s", "KILL", f"{timeout_s:g}", *argv]
        command = [self.provider.program, "exec", "-i", "-w", cwd, *variables, self.name, *inside]
        limit = self.spec.max_file_mb * 2**20
        status, data = await _cli(command, stdin, timeout_s + 10, limit, stderr=not raw)
        if status == 137 or status == 124:  # timeout's own code, or the KILL it sent
            status = None
        if raw:
            return status, data, False
        text = BoundedOutput(self.spec.max_output_chars, limit)
        text.add(data)
        return status, text.text(), False

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            status, output = await _cli([self.provider.program, "rm", "-f", self.name])
            if status != 0:
                log.warning("removing container %s failed: %s", self.name, output.decode(errors="replace")[-200:])
            self.provider.boxes.discard(self)


@register_provider("container")
class ContainerProvider(SandboxProvider):
    Options = ContainerOptions

    def __init__(self, options: ContainerOptions):
        super().__init__(options)
        self.options: ContainerOptions = options
        found = shutil.which(options.program) if options.program else shutil.which("podman") or shutil.which("docker")
        if found is None:
            wanted = options.program or "podman or docker"
            raise ConfigError(f"env.options.sandbox.program: {wanted} is not installed here; install one, or use "
                              "sandbox provider local")  # fmt: skip
        self.program = found
        self.images: BuiltOnce[str] = BuiltOnce()
        self.boxes: set[ContainerBox] = set()
        self.run_id = uuid.uuid4().hex[:8]

    async def image(self, spec: BoxSpec) -> str:
        if spec.image is not None:
            return spec.image
        if spec.build is None:
            raise ConfigError("a container box needs an image or a folder with a Dockerfile")
        build = spec.build

        async def build_image(key: str) -> str:
            where, _, digest = key.rpartition(":")
            tag = f"toolrl-task-{hashlib.sha256(where.encode()).hexdigest()[:12]}:{digest}"
            status, output = await _cli([self.program, "build", "-q", "-t", tag, str(build)], timeout_s=BUILD_TIMEOUT_S)
            if status != 0:
                tail = output.decode(errors="replace").strip()[-300:]
                raise ConfigError(f"{build / 'Dockerfile'}: {self.program} build failed: {tail}")
            return tag

        return await self.images.get(build, build_image)

    async def start(self, spec: BoxSpec) -> ContainerBox:
        image = await self.image(spec)
        name = f"toolrl-{self.run_id}-{uuid.uuid4().hex[:10]}"
        command = [
            self.program, "run", "-d", "--name", name, "--label", f"{LABEL}={self.run_id}",
            *([] if spec.network else ["--network", "none"]),
            "--memory", f"{spec.memory_mb}m", "--pids-limit", str(spec.max_processes), "--cpus", f"{spec.cpus:g}",
            "-w", spec.workdir, *self.options.extra_args, image, "sleep", "infinity",
        ]  # fmt: skip
        status, output = await _cli(command)
        if status != 0:
            await _cli([self.program, "rm", "-f", name])  # a half-made one
            raise OSError(f"{self.program} could not start a box from {image}: "
                          f"{output.decode(errors='replace').strip()[-300:]}")  # fmt: skip
        box = ContainerBox(spec, self, name)
        self.boxes.add(box)
        folders = " ".join(f"'{f}'" for f in (spec.workdir, *spec.folders))
        made = await box.exec(f"mkdir -p {folders}", cwd="/")
        if not made.ok:
            await box.stop()
            raise OSError(f"the box's folders could not be made in {image}: {made.output.strip()[-200:]}")
        return box

    def leftovers(self) -> list[str]:
        import subprocess

        listed = subprocess.run(
            [self.program, "ps", "-a", "--filter", f"label={LABEL}={self.run_id}", "--format", "{{.Names}}"],
            capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        )  # fmt: skip
        return [f"container {name}" for name in listed.stdout.split()]

    def close(self) -> None:
        import subprocess

        for box in list(self.boxes):
            subprocess.run([self.program, "rm", "-f", box.name], capture_output=True, timeout=CLI_TIMEOUT_S)
            self.boxes.discard(box)
        for tag in self.images.built.values():
            subprocess.run([self.program, "rmi", "-f", tag], capture_output=True, timeout=CLI_TIMEOUT_S)
        self.images.built.clear()
