"""Giving freed memory back to the operating system.

PyTorch's CPU allocator takes each tensor from malloc. glibc serves large blocks with mmap only up to a
threshold that it raises as blocks are freed (up to 32 MB), so after a training step most activations were
served from the heap, and the heap's freed middle is not returned: a run's resident memory grows with each
step's fragmentation. `trim()` (glibc's malloc_trim) returns free heap pages after a phase; it costs
milliseconds and changes no result. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def trim() -> bool:
    """Return free heap memory to the system; True where glibc did so."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
