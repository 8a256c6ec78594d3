"""A small-batch fp32 product kernel for generation on AVX2 and AVX-512 CPUs (small_gemm.c: AVX2 micro-kernels,
and AVX-512 ones where PyTorch runs its AVX-512 code and the CPU has it), built at first use.

A decode step multiplies a few rows (the sequences being sampled) by every weight of the model. On the AVX2
machine this project measures on (AMD EPYC, 2 cores, no AVX-512), oneDNN and MKL ran those products at 40-60
GFLOP/s, reading the weights at 5-7 GB/s of the 16 the machine has; this kernel runs 16 rows through 576 x 1536
in 430-440 us against oneDNN's 600-640 (bench/kernels/decode_kernel.py). On an AVX-512 one (a Xeon with AMX, 2 cores) it
still ran a decode step's products 1.3-1.5x faster at 8-16 rows, 1.0-1.1x at 32 and lost from 64 rows (the output
layer from 16: bench/results/decode_kernel_avx512.json). So the kernel takes only inference products of at most
`max_rows()` rows (ROWS_BY_ISA: 64 on AVX2, 32 on AVX-512); everything else (prefills of many rows, training)
stays on oneDNN.

`model.cpu_decode_kernel` chooses: `auto` builds and uses it where PyTorch's CPU capability is in ROWS_BY_ISA (the
kinds it was measured on), `native` requires it (an error names the field where it cannot be built), `onednn`
never uses it.

The shared library is compiled with the C compiler on PATH ($CC, else cc or gcc) into $TOOLRL_HOME/kernels under
a name that hashes the source, flags and compiler, once per machine (a lock serializes concurrent first uses). A
library file there that another user owns or that others may write is refused, not loaded."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from filelock import FileLock

from toolrl.home import toolrl_home

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("small_gemm.c", "flash.c", "elementwise.c"))
"""Built into one library: the small-batch products, long-prompt attention (flash.c, native/attention.py) and the
SwiGLU backward's elementwise pass (elementwise.c, models/fused.py)."""
HEADERS = tuple(Path(__file__).with_name(name) for name in ("vec.h", "rows.h"))
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c11")
AVX512_FLAGS = ("-mavx512f",)
"""Added where PyTorch runs its AVX-512 code and the CPU reports avx512f: the AVX-512 micro-kernels (12 rows
a block, one multiply-add a row per input feature). ATEN_CPU_CAPABILITY=avx2 keeps the AVX2 build."""
KERNELS = ("auto", "native", "onednn")
BUILD_TIMEOUT_S = 300
ROWS_BY_ISA = {"AVX2": 64, "AVX512": 32}
"""The most rows of a product the kernel takes, by PyTorch's CPU capability (where oneDNN was as fast or faster
above, bench/kernels/decode_kernel.py); `auto` uses the kernel on these capabilities only."""


class KernelUnavailable(RuntimeError):
    """The native kernel cannot be built or loaded here; the message says why."""


def kernel_dir() -> Path:
    return toolrl_home() / "kernels"


def _compiler(env: str = "CC", names: tuple[str, ...] = ("cc", "gcc")) -> str:
    """The compiler $`env` names, else the first of `names`, found on PATH."""
    for name in (os.environ.get(env), *names):
        if name and shutil.which(name):
            return shutil.which(name)
    raise KernelUnavailable(f"no compiler found (${env}, {', '.join(names)} on PATH)")


@cache
def cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@cache
def _cpu_flags() -> frozenset[str]:
    line = next((line for line in cpuinfo().splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def flags() -> tuple[str, ...]:
    """The compiler flags for this machine: AVX-512 where PyTorch uses it and the CPU has it, else AVX2."""
    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512" and "avx512f" in _cpu_flags()
    return FLAGS + AVX512_FLAGS if avx512 else FLAGS


@dataclass(frozen=True)
class Build:
    """A shared library built from `sources` once per machine into kernel_dir(), under a name that hashes the
    sources, headers, flags, `key` and the compiler's version."""

    stem: str
    sources: tuple[Path, ...]
    headers: tuple[Path, ...]
    flags: tuple[str, ...]
    """Before the sources."""
    link: tuple[str, ...] = ()
    """After the sources (libraries)."""
    key: str = ""

    @property
    def names(self) -> str:
        return " and ".join(source.name for source in self.sources)

    def path(self, compiler: str) -> Path:
        try:
            version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise KernelUnavailable(f"the compiler {compiler} does not run: {exc}") from exc
        texts = [source.read_text() for source in (*self.sources, *self.headers)]
        digest = hashlib.sha256("\0".join([*texts, *self.flags, *self.link, self.key, version]).encode()).hexdigest()
        return kernel_dir() / f"{self.stem}-{digest[:16]}.so"

    def build(self, compiler: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with FileLock(str(target) + ".lock"):
            if target.exists():
                return
            partial = target.with_suffix(f".{os.getpid()}.tmp")
            log.info("building %s (once per machine): %s", self.names, target)
            command = [compiler, *self.flags, *map(str, self.sources), *self.link, "-o", str(partial)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError) as exc:
                raise KernelUnavailable(f"{compiler} failed to build {self.names}: {exc}") from exc
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise KernelUnavailable(f"{compiler} failed to build {self.names}: {last}")
            partial.chmod(0o700)
            os.replace(partial, target)

    def load(self, compiler: str) -> ctypes.CDLL:
        """The library, built first if needed; KernelUnavailable says why it cannot be had."""
        path = self.path(compiler)
        try:
            if not path.exists():
                self.build(compiler, path)
        except OSError as exc:  # a read-only or full $TOOLRL_HOME
            raise KernelUnavailable(f"cannot build into {path.parent}: {exc}") from exc
        if not _trusted(path):
            raise KernelUnavailable(f"{path} is not owned by this user or others may write it: not loaded (delete it)")
        try:
            return ctypes.CDLL(str(path))
        except OSError as exc:
            raise KernelUnavailable(f"cannot load {path} ({exc}): delete it to build it again") from exc


def _trusted(path: Path) -> bool:
    """Owned by this user and writable by no one else (a library planted by another user is not loaded)."""
    info = path.stat()
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def x86_posix() -> None:
    """KernelUnavailable unless this is an x86-64 POSIX machine (what the native code is written for)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or os.name != "posix":
        raise KernelUnavailable(f"the native code is written for x86-64 POSIX machines, not {platform.machine()}")


def kernels() -> Build:
    return Build("small_gemm", SOURCES, HEADERS, flags())


@cache
def load() -> ctypes.CDLL:
    """The built library (built first if needed); KernelUnavailable says why it cannot be had."""
    x86_posix()
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        raise KernelUnavailable(f"this CPU has no AVX2 (PyTorch reports {torch.backends.cpu.get_cpu_capability()})")
    lib = kernels().load(_compiler())
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.toolrl_pack.argtypes = [pointer, size, size, pointer]
    lib.toolrl_pack.restype = None
    lib.toolrl_gemm.argtypes = [pointer, size, size, pointer, size, pointer, pointer, ctypes.c_int]
    lib.toolrl_gemm.restype = ctypes.c_int
    lib.toolrl_max_rows.restype = ctypes.c_int
    views = [pointer, size, size] * 3  # q, k, v: data, head stride, token stride
    lib.toolrl_flash_forward.argtypes = [*views, size, size, size, size, size, size, ctypes.c_float, pointer, size,
                                         size, pointer, ctypes.c_int]  # fmt: skip
    lib.toolrl_flash_backward.argtypes = [*views, pointer, size, size, pointer, pointer, size, size, size, size, size,
                                          size, ctypes.c_float, pointer, pointer, pointer, ctypes.c_int]  # fmt: skip
    lib.toolrl_flash_decode.argtypes = [pointer, size, size, pointer, pointer, size, size, size, size, size, size,
                                        size, ctypes.c_float, pointer, size, size, pointer, ctypes.c_int]  # fmt: skip
    lib.toolrl_flash_pack_keys.argtypes = [pointer, size, size, size, size, size, pointer, ctypes.c_int]
    lib.toolrl_flash_pack_keys.restype = None
    for name in ("forward", "backward", "decode", "tile", "key_block"):
        getattr(lib, f"toolrl_flash_{name}").restype = ctypes.c_int
    lib.toolrl_swiglu_backward.argtypes = [pointer] * 6 + [size, ctypes.c_int]
    lib.toolrl_swiglu_backward.restype = None
    return lib


def wanted(kernel: str) -> bool:
    """Whether `model.cpu_decode_kernel` = `kernel` uses the native kernel on this machine; `native` where it
    cannot be built raises KernelUnavailable, `auto` logs why once and keeps oneDNN."""
    if kernel not in KERNELS:
        raise ValueError(f"model.cpu_decode_kernel: {kernel!r} is not one of {', '.join(KERNELS)}")
    if kernel == "onednn" or (kernel == "auto" and torch.backends.cpu.get_cpu_capability() not in ROWS_BY_ISA):
        return False
    try:
        load()
    except KernelUnavailable as exc:
        if kernel == "native":
            raise KernelUnavailable(f"model.cpu_decode_kernel: native: {exc}; set it to auto or onednn") from exc
        _log_once(str(exc))
        return False
    return True


@cache
def _log_once(reason: str) -> None:
    log.warning("the small-batch product kernel is not used, generation keeps oneDNN: %s", reason)


def max_rows() -> int:
    """The most rows a product runs on the kernel here: the kernel's own limit, lowered on AVX-512 (ROWS_BY_ISA)."""
    limit = load().toolrl_max_rows()
    return min(limit, ROWS_BY_ISA.get(torch.backends.cpu.get_cpu_capability(), limit))


class NativeWeight:
    """A linear layer's weight [out, in] packed for toolrl_gemm: y = x @ weight^T + bias for x of at most
    max_rows() rows (fp32, CPU)."""

    def __init__(self, weight: torch.Tensor, rows: int | None = None):
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"the native kernel takes 2-D fp32 CPU weights, not {weight.dtype} on {weight.device}")
        self.lib = lib = load()
        weight = weight.detach().contiguous()
        self.out_features, self.in_features = weight.shape
        self.rows = max_rows() if rows is None else min(rows, lib.toolrl_max_rows())
        """The most rows it takes: max_rows(), or `rows` up to the kernel's own limit
        (bench/kernels/decode_kernel.py)."""
        self.data = torch.empty((self.out_features + 15) // 16, self.in_features, 16)
        lib.toolrl_pack(weight.data_ptr(), self.out_features, self.in_features, self.data.data_ptr())

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def takes(self, x: torch.Tensor) -> bool:
        return x.numel() <= self.rows * self.in_features and x.dtype == torch.float32 and x.device.type == "cpu"

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        if rows.shape[0] > self.rows:
            raise RuntimeError(f"toolrl_gemm refused {rows.shape[0]} rows: at most {self.rows} here (max_rows)")
        out = torch.empty(rows.shape[0], self.out_features)
        if bias is not None:
            bias = bias.detach().contiguous()
        code = self.lib.toolrl_gemm(
            rows.data_ptr(),
            rows.shape[0],
            self.in_features,
            self.data.data_ptr(),
            self.out_features,
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if code != 0:
            raise RuntimeError(f"toolrl_gemm refused {rows.shape[0]} rows x {self.in_features} (code {code})")
        return out.reshape(*x.shape[:-1], self.out_features)
