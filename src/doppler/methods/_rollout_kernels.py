"""numba kernel of HEFT_LOOKAHEAD's step, on every core (imported lazily: numba is slow to import).

One step of the rollout tries an op on every device but HEFT's own: each try is a HEFT completion
(:func:`doppler.methods._kernels.heft_branch`) and a simulation. The tries are independent, so
threads take them side by side, as the annealer's threads take its proposals
(:mod:`doppler.methods._anneal_kernels`, whose notes on ``prange`` and numba's cache hold here too).
"""

from __future__ import annotations

import importlib

import numba
import numpy as np

from doppler import _jit

_jit.start()  # the step calls compiled kernels: numba must have started (doppler._jit)

from doppler.methods._anneal_kernels import PRANGE_ONLY  # noqa: E402
from doppler.methods._kernels import heft_branch  # noqa: E402

_simulate = importlib.import_module("doppler.simulate")


@numba.njit(cache=True, parallel=PRANGE_ONLY)
def heft_rollout_step(order, h, own, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt,
                      sim, threads, cap, out, vals):  # pragma: no cover - compiled  # fmt: skip
    """Op ``order[h]`` on every device but ``own``, in device order: HEFT's completion of the partial
    schedule (``dev`` ... ``cnt``) into ``out[j]`` and its simulated makespan into ``vals[j]``, on
    ``threads`` cores. A simulation stops early (``inf``) once it is sure to end above ``cap`` or above
    an earlier row of its thread (``doppler.simulate._sim_rows``): the least makespan, when it is
    below ``cap``, and the first row that reaches it are exact, which is all the rollout uses."""
    m = out.shape[0]
    (s_succ_ptr, s_succ_idx, indeg, level, lvl_ptr, lvl_ops, s_comp, out_bytes, s_lat, bw, streams, op_f, edge_f,
     copies_in) = sim  # fmt: skip
    chunks = max(1, min(threads, m))
    for t in numba.prange(chunks):
        for j in range(t, m, chunks):
            heft_branch(order, h, j + (j >= own), pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish,
                        starts, ends, cnt, out[j])  # fmt: skip
    for t in numba.prange(chunks):
        _simulate._sim_rows(s_succ_ptr, s_succ_idx, indeg, level, lvl_ptr, lvl_ops, s_comp, out_bytes, s_lat, bw,
                            streams, out, op_f, edge_f, False, False, copies_in, None, t, chunks, vals, True, cap)  # fmt: skip
    return np.argmin(vals)
