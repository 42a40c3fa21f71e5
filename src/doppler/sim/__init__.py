"""The work-conserving (WC) simulator, its bulk-synchronous (BSP) variant, lower bounds and traces.

Semantics (docs/design.md, Execution semantics), exactly:

* Device ``d`` runs up to ``streams[d]`` ops at once (1 by default), each at
  full speed: op ``v`` takes ``flops[v] / rate(kind[v], d)`` seconds.
* An op is *ready* on its device once every input has *arrived* there. Among
  its ready ops an idle device (a free stream) takes the one that became ready
  first (FIFO), ties broken by the lower op id.
* ``dispatch="priority"`` (WC only) replaces that FIFO rule: among its ready
  ops an idle device takes the one with the smallest static ``priority[v]``
  (one number per op, lower runs first; the op id by default), ties broken by
  the lower op id. When an op became ready no longer matters (the trace still
  records it in ``op_ready``); everything else below is unchanged.
* When ``u`` finishes on device ``a``, its output is sent once to every other
  device ``b`` that holds a consumer of ``u`` (one transfer per (op, device),
  however many consumers sit there). The transfer starts at ``u``'s finish and
  takes ``latency[a, b] + output_bytes[u] / bandwidth[a, b]``; consumers on
  ``a`` itself get it at ``u``'s finish.
* Links are contention-free by default. With ``link_contention=True`` every
  ordered link ``a -> b`` carries one transfer at a time (latency included),
  in FIFO order of request (= producer finish) time, ties by (producer op id,
  destination device).
* A destination device ``b`` with ``copies_inbound`` (a CPU worker: no copy
  engine) makes every transfer into it itself: the transfer joins ``b``'s
  ready queue at its request time, FIFO with ``b``'s ops (on equal times ops
  go first, then transfers by producer op id), and occupies one of ``b``'s
  streams for its duration, whatever ``link_contention`` says. FIFO dispatch
  only.
* Time advances from event to event. At each timestamp the simulator first
  processes *every* completion and arrival at that time (and any zero-length
  transfer they trigger), and only then lets idle devices (and free links)
  pick their next op (transfer). If zero-duration ops finish "at the same
  time", that repeats in further rounds at the same timestamp. The result
  never depends on the order in which simultaneous events are processed.
* ``noise_sigma > 0`` multiplies every op duration and every transfer
  duration by an independent lognormal factor ``exp(sigma * z - sigma**2 / 2)``
  (mean 1), ``z ~ N(0, 1)`` drawn from ``numpy.random.default_rng(seed)``: one
  draw per op, and one per successor slot (CSR order) for transfers (a
  transfer ``(u, b)`` uses the draw of the first successor of ``u`` on ``b``).
  So the same seed gives the same durations whatever the assignment
  (common random numbers: ``simulate_many`` uses the same draws for every row).
* ``mode="bsp"``: ops are grouped by topological level (``graph.level``).
  Level ``k + 1`` is released (all its ops become ready at once) when every op
  of level ``k`` and every transfer sent by an op of level ``k`` has finished;
  inside a level, devices run their ops FIFO (= op id order, since they are
  all ready at the release time).
* Makespan = finish time of the last op. (Trailing transfers are never
  needed: a transfer only exists when some op consumes it.)

Parts: :mod:`~doppler.sim.loops` (the event loop, compiled), :mod:`~doppler.sim.simulator` (a
:class:`SimContext` holds one (graph, cluster)'s arrays; the public functions), :mod:`~doppler.sim.bounds`.
The tests check it against a pure-Python and a SimPy implementation (``tests/reference/``): bit-identical.
"""

from __future__ import annotations

from doppler.sim.bounds import critical_path_bound, work_bound
from doppler.sim.simulator import (
    DISPATCHES,
    MAX_NOISE_SIGMA,
    MODES,
    SimContext,
    SimResult,
    SimulationError,
    check_dispatch,
    check_options,
    context,
    lower_bound,
    simulate,
    simulate_many,
    traced,
)

__all__ = [
    "DISPATCHES",
    "MAX_NOISE_SIGMA",
    "MODES",
    "SimContext",
    "SimResult",
    "SimulationError",
    "check_dispatch",
    "check_options",
    "context",
    "critical_path_bound",
    "lower_bound",
    "simulate",
    "simulate_many",
    "traced",
    "work_bound",
]
