"""Giving freed memory back to the system.

glibc keeps freed heap pages for reuse; after a burst (a big batch's KV caches, a large upload parsed,
many worker threads each with its own arena) a long-running classroom server would stay at its peak
resident size for good. `trim_heap` asks glibc to return what it can; `limit_arenas` caps the per-thread
arenas (gradio runs handlers on up to 160 threads). Both do nothing where the C library is not glibc.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_ARENA_MAX = -8        # mallopt parameter (glibc malloc.h)


@functools.lru_cache(maxsize=1)
def _glibc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def trim_heap() -> bool:
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def limit_arenas(n: int = 4) -> bool:
    libc = _glibc()
    return bool(libc.mallopt(M_ARENA_MAX, n)) if libc is not None else False
