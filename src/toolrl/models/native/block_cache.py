"""Freed large CPU blocks kept mapped for the next allocation of their size (block_cache.cpp, PyTorch's CPU
allocator while installed), built at first use with the C++ compiler on PATH like the kernels.

Long sequences map every block above 1 MiB (toolrl/memory.py: with glibc's moving threshold the heap's
fragmentation was the peak, 8.2 GB against 2.5 GB on a 6.5k-token warm start). Mapped blocks cost a page fault
per 4 KB each time they are taken again: a 4.9k-token GRPO step faulted 4-8 million times, 12-13% of its CPU time
in the kernel. A forward or backward pass asks for the same sizes layer after layer, so a freed block is kept, by
its exact (page-rounded) size, for the next request of that size. What bounds the memory it keeps:
- what is mapped (blocks in use and kept) never exceeds the most that was in use at once: before a new block would
  take it past that, the oldest kept blocks are unmapped, so the cache adds nothing to the large blocks' peak;
- at most `max_mb` MB; past it, the oldest kept blocks are unmapped;
- a kept block no request took within `max_age` large allocations and frees (a few layers' worth) is unmapped,
  so sizes that stopped recurring (another sequence length, another phase) leave on their own;
- memory.trim() at the end of a phase unmaps everything kept.

Counted (`stats`): hits, misses, blocks evicted or expired, bytes mapped and kept, the peak in use.
Where the library cannot be built or loaded (no C++ compiler, no PyTorch headers, not x86-64 Linux), nothing is
installed and the reason is logged once: long sequences still map and unmap each block, as before."""

from __future__ import annotations

import ctypes
import logging
import sys
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

import torch

from toolrl.models.native import Build, KernelUnavailable, _compiler, x86_posix

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("block_cache.cpp")
MIN_BYTES = 1 << 20
"""Blocks this large and larger are mapped and kept; smaller ones go to malloc as in PyTorch's default."""
MAX_AGE = 256
"""Large allocations and frees after which an unused kept block is unmapped."""


def _torch_dir() -> Path:
    return Path(torch.__file__).parent


def build() -> Build:
    include, lib = _torch_dir() / "include", _torch_dir() / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = ("-O2", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}")
    link = (f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}")
    return Build("block_cache", (SOURCE,), (), flags, link, key=torch.__version__)


@cache
def load() -> ctypes.CDLL:
    """The built library; KernelUnavailable says why it cannot be had."""
    x86_posix()
    if sys.platform != "linux":
        raise KernelUnavailable(f"the block cache is written for Linux, not {sys.platform}")
    if not (_torch_dir() / "include" / "c10" / "core" / "CPUAllocator.h").exists():
        raise KernelUnavailable(f"PyTorch's C++ headers are not in {_torch_dir() / 'include'}")
    lib = build().load(_compiler("CXX", ("c++", "g++")))
    lib.toolrl_block_cache_install.argtypes = [ctypes.c_uint64] * 3
    for name in ("install", "uninstall", "installed"):
        getattr(lib, f"toolrl_block_cache_{name}").restype = ctypes.c_int
    lib.toolrl_block_cache_stats.argtypes = [ctypes.c_void_p]
    lib.toolrl_block_cache_stats.restype = None
    lib.toolrl_block_cache_flush.restype = None
    return lib


@dataclass(frozen=True)
class Stats:
    hits: int
    misses: int
    evicted: int
    expired: int
    mapped_bytes: int
    kept_bytes: int
    peak_in_use_bytes: int
    """The most bytes of large blocks in use at once since the cache was last installed: what is mapped stays
    within it."""


def install(max_mb: int, max_age: int | None = None, min_bytes: int = MIN_BYTES) -> bool:
    """Make the cache PyTorch's CPU allocator, keeping at most `max_mb` MB (0: uninstall) for at most `max_age`
    (MAX_AGE) large allocations and frees. True where it now is; False, with the reason logged once, where it
    cannot be built here."""
    if max_mb <= 0:
        uninstall()
        return False
    try:
        lib = load()
    except KernelUnavailable as exc:
        _log_once(str(exc))
        return False
    done = bool(lib.toolrl_block_cache_install(min_bytes, max_mb << 20, MAX_AGE if max_age is None else max_age))
    log.info("long sequences: freed blocks of %d KiB and more are kept for reuse, up to %d MB", min_bytes >> 10, max_mb)
    return done


def loaded() -> bool:
    return load.cache_info().currsize > 0


def installed() -> bool:
    return loaded() and bool(load().toolrl_block_cache_installed())


def uninstall() -> None:
    """PyTorch's previous CPU allocator again; every kept block unmapped (blocks in use are when freed)."""
    if loaded():
        load().toolrl_block_cache_uninstall()


def flush() -> None:
    """Unmap every kept block (blocks in use stay)."""
    if loaded():
        load().toolrl_block_cache_flush()


def stats() -> Stats | None:
    """The counts since the process started; None where the cache was never loaded."""
    if not loaded():
        return None
    out = (ctypes.c_uint64 * len(fields(Stats)))()  # in the order toolrl_block_cache_stats writes them
    load().toolrl_block_cache_stats(out)
    return Stats(*out)


@cache
def _log_once(reason: str) -> None:
    log.warning("freed large blocks are not kept for reuse (more page faults on long sequences): %s", reason)
