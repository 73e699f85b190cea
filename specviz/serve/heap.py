"""Giving freed memory back to the system.

glibc keeps freed heap pages for reuse; after a burst (a big batch's KV caches, a large upload parsed,
many worker threads each with its own arena) a long-running classroom server would stay at its peak
resident size for good. `trim_heap` asks glibc to return what it can; `limit_arenas` caps the per-thread
arenas (gradio runs handlers on up to 160 threads). Both do nothing where the C library is not glibc.
`freeze_long_lived` hides the objects a loaded pair keeps for good from Python's cyclic collector.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

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


def freeze_long_lived() -> int:
    """Collect, then move every object alive now (models, tokenizers, their modules: ~380,000 objects for
    the offline SmolLM2 pair) out of the cyclic collector's sight, so its full collections no longer walk
    them. Those collections come every few hundred steps of a 64-row batch, and whichever step allocates
    more (adaptive verification's bookkeeping) pays them, so identical work timed ~2 % apart; frozen, it
    times level and every step is ~3 % faster. Called once the pairs a process keeps for good are loaded:
    anything frozen is never collected as a cycle, so a pair that was later dropped would stay (the app
    keeps its pairs; see ui/server.py MAX_TYPED_PAIRS).
    Returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
