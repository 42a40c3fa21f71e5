"""Keep freed memory in the process for reuse (glibc), instead of handing it back to the kernel.

Both heavy loops of doppler allocate and free the same large buffers over and over:
the real engine (a fresh output array per op) and training (the re-scoring
tensors of every update). Left alone, glibc returns freed memory to the kernel
(``mmap`` for blocks above a moving threshold, heap trimming, per-thread arenas
deleted whole), and the next allocation pays a page fault per 4 kB page: a random
number of faults per engine run, which makes makespans noisy, and many per training
update on large graphs (docs/research/results_log.md has the counts).

:func:`tune_malloc` sets, once per process: ``M_ARENA_MAX=1`` (one arena),
``M_MMAP_THRESHOLD=32 MB`` (blocks below come from the heap) and no trimming. The
process keeps its peak memory; later allocations reuse it. Linux with glibc only;
``DOPPLER_MALLOC=system`` (or the older ``DOPPLER_ENGINE_MALLOC=system``) turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["tune_malloc"]

_MALLOC_TUNED = False


def tune_malloc() -> bool:
    """Apply the settings above (once); True if glibc took them."""
    global _MALLOC_TUNED
    off = "system" in (os.environ.get("DOPPLER_MALLOC", ""), os.environ.get("DOPPLER_ENGINE_MALLOC", ""))
    if _MALLOC_TUNED or off or not sys.platform.startswith("linux"):
        return _MALLOC_TUNED
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
        ok = libc.mallopt(m_mmap_threshold, 32 << 20) == 1
        ok &= libc.mallopt(m_trim_threshold, 2**31 - 1) == 1
        ok &= libc.mallopt(m_arena_max, 1) == 1
    except (OSError, AttributeError):  # not glibc
        return False
    _MALLOC_TUNED = bool(ok)
    return _MALLOC_TUNED
