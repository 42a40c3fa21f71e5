"""ANNEAL: simulated annealing over assignments, scored by the WC simulator.

The obvious answer to "why RL?": search assignments directly in the simulator.

* Start: the best (by simulated makespan) of every cheap method: ``critical_path``,
  ``heft``, ``enumerative``, ``round_robin_block`` and ``metis`` (ties: in that
  order), or an explicit ``start`` assignment (``doppler assign -m anneal --init A.json``).
* Each iteration proposes ``batch_size`` neighbours of the current assignment
  and scores them in one :func:`doppler.simulate.simulate_many` call. Moves:
  - *op*: one op to a random other device, or to the device of one of its
    neighbours (a predecessor or successor);
  - *swap*: two ops on different devices exchange devices;
  - *chain*: a path segment (a random walk of up to 16 ops along successors,
    from a random op) moves to one device;
  - *group*: all tiles of one logical op (``graph.group``) move to one device,
    or their devices rotate by a random offset (graphs without groups: an op
    and all its neighbours move to one device).
* The best proposal of the batch is accepted if it is no worse, otherwise with
  probability ``exp(-relative_increase / T)``. ``T`` cools geometrically from
  ``t_start`` to ``t_end`` over a *cycle* of ``cycle_evals`` evaluations
  (default ``max(5000, 1000 * num_ops)``, capped at ``max_evals``); each
  new cycle restarts (reheats) from the best assignment found so far.
* Defaults (``batch_size=8``, cycles of ``1000 * num_ops`` evaluations) were
  chosen with ``benchmarks/anneal_quality.py`` on the paper workloads. On
  p100x4 with 10x slower links, 60 s runs reached 14.78 ms on llama_layer with
  the earlier defaults (batches of 32, cycles of ``100 * num_ops``), and
  13.98 ms with these. On the fast cluster the two are within 0.3%.
* Stops after ``budget_s`` seconds of wall clock (default 10 s, the start
  evaluation included) or ``max_evals`` simulator evaluations, whichever comes
  first (the time is only checked between batches), or as soon as the best
  makespan equals the lower bound (it is then optimal).

Every decision depends only on the seed and on counts of evaluations, never on
the clock, so a run is deterministic for a given seed and a given number of
evaluations (pass ``max_evals`` without ``budget_s`` for results independent of
machine speed), and a longer budget continues the exact trajectory of a shorter
one. The best simulated makespan is reported as ``estimated_makespan_s``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from doppler.assignment import Assignment, check_assignment
from doppler.methods.registry import MethodError, assign, register
from doppler.graph import DataflowGraph
from doppler.progress import ProgressEvent, ProgressFn
from doppler.simulate import SimContext

#: the cheap methods whose best assignment a search starts from (anneal's start set, and the first
#: incumbent of DOPPLER's Stage II): measured, this start made the greedy decode at least as good as
#: enumerative in 8 of 8 settings (5 of 8 without) and within 10% of a 60 s anneal in 6 of 8 (3 of 8),
#: benchmarks/doppler_quality.py
WARM_START_METHODS = ("critical_path", "heft", "enumerative", "round_robin_block", "metis")

DEFAULT_BUDGET_S = 10.0


class _Moves:
    """Proposal generator (all randomness from one numpy Generator)."""

    def __init__(self, graph: DataflowGraph, nd: int, rng: np.random.Generator,
                 device_prefs: np.ndarray | None = None, guided_share: float = 0.0):  # fmt: skip
        self.g = graph
        # guided moves: one op to a device drawn from a learned per-op preference (cumulative rows)
        self.pref_cdf = None if device_prefs is None else np.cumsum(device_prefs, axis=1)
        self.guided_share = guided_share if device_prefs is not None else 0.0
        self.nd = nd
        self.rng = rng
        self.n = graph.num_ops
        self.succ_ptr = graph.succ_ptr
        self.succ_idx = graph.succ_idx
        self.pred_ptr = graph.pred_ptr
        self.pred_idx = graph.pred_idx
        grp = graph.group
        if (grp >= 0).any():
            order = np.argsort(grp, kind="stable")
            order = order[grp[order] >= 0]
            gids, starts, counts = np.unique(grp[order], return_index=True, return_counts=True)
            self.groups = [order[s : s + c] for s, c in zip(starts, counts) if c > 1]
        else:
            self.groups = []

    def _other_device(self, d: int) -> int:
        x = int(self.rng.integers(0, self.nd - 1))
        return x + (x >= d)

    def _neighbours(self, v: int) -> np.ndarray:
        return np.concatenate(
            [
                self.pred_idx[self.pred_ptr[v] : self.pred_ptr[v + 1]],
                self.succ_idx[self.succ_ptr[v] : self.succ_ptr[v + 1]],
            ]
        )

    def apply(self, a: np.ndarray) -> None:
        """Mutate ``a`` in place with one random move (always changes something when D > 1)."""
        rng, n = self.rng, self.n
        if self.guided_share > 0 and rng.random() < self.guided_share:
            v = int(rng.integers(n))
            cdf = self.pref_cdf[v]
            d = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), self.nd - 1)
            a[v] = d if d != a[v] else self._other_device(int(a[v]))
            return
        r = rng.random()
        if r < 0.35:  # single op
            v = int(rng.integers(n))
            nb = self._neighbours(v)
            if nb.size and rng.random() < 0.5:
                d = int(a[nb[int(rng.integers(nb.size))]])
                if d == a[v]:
                    d = self._other_device(int(a[v]))
            else:
                d = self._other_device(int(a[v]))
            a[v] = d
        elif r < 0.55:  # swap
            v = int(rng.integers(n))
            w = int(rng.integers(n))
            if a[v] == a[w]:
                a[v] = self._other_device(int(a[v]))
            else:
                a[v], a[w] = a[w], a[v]
        elif r < 0.8:  # chain
            v = int(rng.integers(n))
            length = int(rng.integers(2, 17))
            seg = [v]
            for _ in range(length - 1):
                lo, hi = self.succ_ptr[v], self.succ_ptr[v + 1]
                if hi == lo:
                    break
                v = int(self.succ_idx[lo + int(rng.integers(hi - lo))])
                seg.append(v)
            seg_a = np.asarray(seg)
            d = int(rng.integers(self.nd))
            if np.all(a[seg_a] == d):
                d = self._other_device(d)
            a[seg_a] = d
        else:  # group / neighbourhood
            if self.groups:
                ops = self.groups[int(rng.integers(len(self.groups)))]
                if rng.random() < 0.5:
                    d = int(rng.integers(self.nd))
                    if np.all(a[ops] == d):
                        d = self._other_device(d)
                    a[ops] = d
                else:
                    shift = int(rng.integers(1, self.nd))
                    a[ops] = (a[ops] + shift) % self.nd
            else:
                v = int(rng.integers(n))
                ops = np.concatenate([[v], self._neighbours(v)])
                d = int(rng.integers(self.nd))
                if np.all(a[ops] == d):
                    d = self._other_device(d)
                a[ops] = d


@register(
    "anneal",
    description="simulated annealing in the WC simulator from the best cheap method (or --init)",
    uses_budget=True,
    deterministic=False,
)
def anneal_search(
    graph: DataflowGraph,
    cluster,
    *,
    seed: int = 0,
    budget_s: float | None = None,
    max_evals: int | None = None,
    batch_size: int = 8,
    cycle_evals: int | None = None,
    t_start: float = 0.02,
    t_end: float = 1e-4,
    start: np.ndarray | None = None,
    extra_starts: dict[str, np.ndarray] | None = None,
    device_prefs: np.ndarray | None = None,
    guided_share: float = 0.0,
    on_progress: ProgressFn | None = None,
) -> Assignment:
    """Simulated annealing (see the module docstring). Returns the best assignment found.

    ``extra_starts`` join the start set (e.g. a policy's decodes); with ``device_prefs[n, D]``
    (a learned preference of each op for each device) a share ``guided_share`` of the moves
    puts one op on a device drawn from its row instead of a blind move.

    ``on_progress`` gets a :class:`~doppler.progress.ProgressEvent` about four times a second: the
    time used of the budget (or the evaluations of ``max_evals``), and in ``stats`` the evaluation
    count and the best makespan so far."""
    t0 = time.perf_counter()
    if max_evals is not None and int(max_evals) < 0:
        raise MethodError(f"max_evals must be >= 0, got {max_evals}")
    if batch_size < 1:
        raise MethodError(f"batch_size must be >= 1, got {batch_size}")
    if budget_s is None and max_evals is None:
        budget_s = DEFAULT_BUDGET_S
    deadline = math.inf if budget_s is None else t0 + float(budget_s)
    nd = int(cluster.num_devices)
    n = graph.num_ops
    rng = np.random.default_rng(seed)
    ctx = SimContext(graph, cluster)  # every evaluation reuses it
    start_name, walk, evals = _starting_point(ctx, seed, start, extra_starts)
    start_ms = walk.cur_ms
    if cycle_evals is None:
        cycle_evals = max(5000, 1000 * n)
        if max_evals is not None:
            cycle_evals = max(1, min(cycle_evals, int(max_evals)))
    cycle_evals = max(1, int(cycle_evals))
    moves = _Moves(graph, nd, rng, device_prefs, guided_share)
    next_report = time.perf_counter()  # progress reports only; no decision depends on the clock
    log_ratio = math.log(t_end / t_start)
    optimal_ms = float(ctx.lower_bound()) * (1.0 + 1e-12)  # nothing can beat the lower bound
    while nd > 1 and n > 0 and walk.best_ms > optimal_ms:
        if (max_evals is not None and evals >= max_evals) or time.perf_counter() >= deadline:
            break
        b = batch_size if max_evals is None else min(batch_size, int(max_evals) - evals)
        batch = np.repeat(walk.cur[None, :], b, axis=0)
        for row in batch:
            moves.apply(row)
        vals = ctx.simulate_many(batch)
        evals += b
        walk.cycle_evals += b
        j = int(np.argmin(vals))
        temp = t_start * math.exp(log_ratio * min(1.0, walk.cycle_evals / cycle_evals))
        walk.offer(batch[j], float(vals[j]), temp, rng.random())  # u always drawn: one stream for every branch
        if walk.cycle_evals >= cycle_evals:
            walk.restart()
        if on_progress is not None and time.perf_counter() >= next_report:
            next_report = time.perf_counter() + 0.25
            on_progress(_progress_event(t0, evals, budget_s, max_evals, walk, start_ms))
    if on_progress is not None:  # the last word, also when the budget ran out before the first move
        on_progress(_progress_event(t0, evals, budget_s, max_evals, walk, start_ms))
    return Assignment(
        devices=walk.best,
        estimated_makespan_s=walk.best_ms,
        info={
            "start_method": start_name,
            "start_makespan_s": start_ms,
            "evals": evals,
            "accepted": walk.accepted,
            "improvements": walk.improved,
            "restarts": walk.restarts,
            "reached_lower_bound": walk.best_ms <= optimal_ms,
            "cycle_evals": cycle_evals,
            "search_time_s": time.perf_counter() - t0,
        },
    )


def _progress_event(t0: float, evals: int, budget_s: float | None, max_evals: int | None, walk: "_Walk",
                    start_ms: float) -> ProgressEvent:  # fmt: skip
    """Time used of the budget (or evaluations of ``max_evals``), with the best makespan so far."""
    stats = {"evals": evals, "best_makespan_s": walk.best_ms, "start_makespan_s": start_ms}
    if budget_s is None and max_evals is not None:
        return ProgressEvent("anneal", evals, max_evals, "evals", stats)
    elapsed_s = time.perf_counter() - t0
    return ProgressEvent("anneal", elapsed_s if budget_s is None else min(elapsed_s, budget_s), budget_s, "s", stats)


@dataclass
class _Walk:
    """The annealer's state: the current and the best assignment, and its counters."""

    cur: np.ndarray
    cur_ms: float
    best: np.ndarray
    best_ms: float
    accepted: int = 0
    improved: int = 0
    restarts: int = 0
    cycle_evals: int = 0  # evaluations into the current cooling cycle

    def offer(self, cand: np.ndarray, cand_ms: float, temp: float, u: float) -> None:
        """Metropolis: take ``cand`` if it is no worse, else with probability exp(-relative loss / temp)."""
        delta = (cand_ms - self.cur_ms) / max(self.cur_ms, 1e-300)
        if delta <= 0 or u < math.exp(-delta / temp):
            self.cur, self.cur_ms = cand.copy(), cand_ms
            self.accepted += 1
            if cand_ms < self.best_ms:
                self.best, self.best_ms = cand.copy(), cand_ms
                self.improved += 1

    def restart(self) -> None:
        """End of a cooling cycle: reheat and continue from the best assignment."""
        self.cycle_evals = 0
        self.restarts += 1
        self.cur, self.cur_ms = self.best.copy(), self.best_ms


def _starting_point(ctx: SimContext, seed: int, start: np.ndarray | None,
                    extra_starts: dict[str, np.ndarray] | None) -> tuple[str, _Walk, int]:  # fmt: skip
    """The best of the start set (``start``, else the warm-start methods; plus ``extra_starts``):
    (its name, a walk from it, the evaluations spent)."""
    graph, cluster, nd = ctx.graph, ctx.cluster, ctx.num_devices
    if start is not None:
        cands = {"start": check_assignment(graph, np.asarray(start), nd)}
    else:
        cands = {m: assign(graph, cluster, m, seed=seed).devices for m in WARM_START_METHODS}
    for name, a in (extra_starts or {}).items():
        cands[name] = check_assignment(graph, np.asarray(a), nd)
    names = list(cands)
    ms = ctx.simulate_many(np.stack([cands[k] for k in names]))
    i0 = int(np.argmin(ms))
    cur = cands[names[i0]].astype(np.int64).copy()
    return names[i0], _Walk(cur, float(ms[i0]), cur.copy(), float(ms[i0])), len(names)
