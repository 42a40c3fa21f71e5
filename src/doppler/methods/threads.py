"""How many cores a search uses: the cores this process may use, and the share of them that
simulates one batch (both searches that fan a batch out over cores, ``anneal`` and
``heft_lookahead``, ask here)."""

from __future__ import annotations

import os

import numpy as np

from doppler.methods.registry import MethodError

#: the help of a search's ``threads`` option (``anneal``, ``heft_lookahead``, ``doppler --budget-s``)
THREADS_HELP = ("cores that simulate the search's proposals or the rollout's devices (default: every core; the same "
                "result, faster)")


def usable_cores() -> int:
    """The cores this process may use (its CPU affinity where the platform tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def search_threads(threads: int | None, batch_size: int = 8) -> int:
    """Cores that simulate one batch: ``threads``, else every core this process may use; at most
    ``batch_size`` (one row each) and numba's thread pool."""
    if threads is None:
        threads = usable_cores()
    elif isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise MethodError(f"threads must be an integer >= 1, got {threads!r}")
    import numba

    return int(max(1, min(int(threads), batch_size, numba.config.NUMBA_NUM_THREADS)))
