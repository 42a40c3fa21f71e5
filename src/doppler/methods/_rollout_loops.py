"""The numba loop of HEFT_LOOKAHEAD's step, on every core (imported lazily: numba is slow to import).

One step of the rollout tries an op on every device but HEFT's own: each try is a HEFT completion
(:func:`doppler.listsched.heft_completion`) and a simulation. The tries are independent, so
threads take them side by side, as the annealer's threads take its proposals
(:mod:`doppler.methods._anneal_loops`, whose notes on ``prange`` and numba's cache hold here too).
"""

from __future__ import annotations

import numba
import numpy as np

from doppler.util import jit as _jit

_jit.start()  # the step calls compiled loops: numba must have started (doppler.util.jit)

from doppler.listsched import heft_completion  # noqa: E402
from doppler.methods._anneal_loops import PRANGE_ONLY  # noqa: E402
from doppler.sim.loops import sim_rows  # noqa: E402


@numba.njit(cache=True)
def _branches(t, chunks, order, h, own, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt,
              out):  # pragma: no cover - compiled  # fmt: skip
    """Rows ``t, t + chunks, ...`` of :func:`heft_rollout_step`'s completions (row ``j``: device ``j``, or
    ``j + 1`` from HEFT's own device ``own`` on)."""
    for j in range(t, out.shape[0], chunks):
        heft_completion(order, h, j + (j >= own), pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts,
                    ends, cnt, out[j])  # fmt: skip


@numba.njit(cache=True, parallel=PRANGE_ONLY)
def heft_rollout_step(order, h, own, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt,
                      sim, threads, cap, out, vals):  # pragma: no cover - compiled  # fmt: skip
    """Op ``order[h]`` on every device but ``own``, in device order: HEFT's completion of the partial
    schedule (``dev`` ... ``cnt``) into ``out[j]`` and its simulated makespan into ``vals[j]``, on
    ``threads`` cores; returns the index of the least. A simulation stops early (``inf``) once it is
    sure to end above ``cap`` or above an earlier row of its thread (:func:`~doppler.sim.loops.sim_rows`):
    the least makespan, when it is below ``cap``, and the first row that reaches it are exact, which
    is all the rollout uses."""
    arrays, op_f, edge_f = sim  # the simulator's arrays (doppler.sim.loops) and its noise factors
    chunks = max(1, min(threads, out.shape[0]))
    for t in numba.prange(chunks):
        _branches(t, chunks, order, h, own, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends,
                  cnt, out)  # fmt: skip
    for t in numba.prange(chunks):
        sim_rows(arrays, out, op_f, edge_f, False, False, None, t, chunks, vals, True, cap)
    return np.argmin(vals)


@numba.njit(cache=True)
def heft_rollout_step_serial(order, h, own, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends,
                             cnt, sim, cap, out, vals):  # pragma: no cover - compiled  # fmt: skip
    """:func:`heft_rollout_step` on one core, outside any parallel region: the same numbers."""
    arrays, op_f, edge_f = sim
    _branches(0, 1, order, h, own, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt, out)
    sim_rows(arrays, out, op_f, edge_f, False, False, None, 0, 1, vals, True, cap)
    return np.argmin(vals)


def rollout_step(order, h, own, arrays, state, sim, threads: int, cap: float, out, vals) -> int:
    """:func:`heft_rollout_step` on ``threads`` cores, or its serial twin where one core serves (one thread,
    or one row: entering a parallel region costs more than a small step on a busy machine)."""
    if min(threads, out.shape[0]) <= 1:
        return int(heft_rollout_step_serial(order, h, own, *arrays, *state, sim, cap, out, vals))
    return int(heft_rollout_step(order, h, own, *arrays, *state, sim, threads, cap, out, vals))
