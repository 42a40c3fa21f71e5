"""ANNEAL: simulated annealing over assignments, scored by the WC simulator (the obvious answer to "why RL?").

* Start: the best (by simulated makespan) of every cheap method: ``critical_path``, ``heft``, ``enumerative``,
  ``round_robin_block`` and ``metis``; of the expert's ``tensor_parallel`` and ``tp_pipeline`` where the graph
  has a layer structure (a transformer's decoder layers); and of ``heft_lookahead`` where its rollout is cheap
  (``|V|^2 (D-1) <= ROLLOUT_START_MAX_WORK``; ties: in that order, the rollout last), or an explicit
  ``start`` assignment (``doppler assign -m anneal --init A.json``).
  Where the graph repeats a layer (a whole model's decoder layers) and the budget allows
  (``REPEAT_MIN_BUDGET_S``), one layer is annealed alone (from the best start's placement of it, among
  others) and its placement copied onto every repeat of the best start: the ``repeat`` start.
* *Tied search* (where the ``repeat`` start is built): first, an annealer as below whose every move also
  moves the copies of the ops it moves in every other repeat (the repeats stay placed alike), each proposal
  simulated on the whole graph; from the fastest start whose repeats are placed alike (else the fastest, each
  repeat placed as the first), for ``TIED_EVALS`` evaluations and ``TIED_BUDGET_SHARE`` of the budget and of
  ``max_evals`` (its own constants and random stream). The search below continues from the best so far.
* Each iteration proposes ``batch_size`` neighbours of the current assignment and scores them in one
  :func:`doppler.sim.simulate_many` call. Moves:
  - *op*: one op to a random other device, or to the device of one of its neighbours (a predecessor or
    successor);
  - *swap*: two ops on different devices exchange devices;
  - *chain*: a path segment (a random walk of up to 16 ops along successors, from a random op) moves to one
    device;
  - *group*: all tiles of one logical op (``graph.group``) move to one device, or their devices rotate by a
    random offset (graphs without groups: an op and all its neighbours move to one device);
  - *critical* (``critical_share`` of the proposals, default :data:`CRITICAL_SHARE`): a step of the current
    schedule's critical chain, the ops that set its makespan, each held back by the next (the op that freed
    its device, or the producer of its last input). A step across two devices is a transfer on the chain: one
    of its two ops joins the other's device. A step on one device: one of the two leaves for a random other
    device. The chain is found again (one traced simulation) when the current assignment has changed and
    ``CRITICAL_REFRESH`` batches have passed.
* *Pools*: each proposal is the best of ``pool`` (default :data:`POOL`) moves drawn as above, by the compute
  time plus the transfer time (latency + bytes / bandwidth on each edge of the moved ops) that the move adds,
  less is better, computed without simulating. Only that move is simulated.
* The best proposal of the batch is accepted if it is no worse, otherwise with probability
  ``exp(-relative_increase / T)``. ``T`` cools geometrically from ``t_start`` to ``t_end`` over a *cycle* of
  ``cycle_evals`` evaluations (default ``max(5000, 1000 * num_ops)``, capped at ``max_evals``); each new cycle
  restarts (reheats) from the best assignment found so far.
* Stops after ``budget_s`` seconds of wall clock (default 10 s, the start evaluation included) or
  ``max_evals`` simulator evaluations, whichever comes first (the time is checked between compiled calls of
  about ``CHUNK_S`` of search), or as soon as the best makespan equals the lower bound (it is then optimal).

Each proposal is simulated only as far as it can still matter (``prune``, on by default): it stops once a lower
bound on its makespan (its critical path after the ops already started, and each device's work left) is above
the best proposal before it on its core, or above the makespan under which the Metropolis rule would accept it
(its uniform is drawn before the batch is simulated). Only the batch's best proposal, and only if it may be
accepted, enters the search, so pruning changes the speed, never the search.

Each batch is simulated on ``threads`` cores (default: every core the process may use, at most ``batch_size``),
one row per core at a time: the same numbers, so the same search, as on one core.

Every decision depends only on the seed and on counts of evaluations, never on the clock (but for one: where
the budget runs out while the start set is being built, on a graph of tens of thousands of ops, the set stops
growing there), so a run is deterministic for a given seed and a given number of evaluations (pass
``max_evals`` without ``budget_s`` for results independent of machine speed), and a longer budget continues
the exact trajectory of a shorter one (the ``repeat`` start and the tied search aside: they need a budget of
REPEAT_MIN_BUDGET_S, and the tied search stops at its share of it).

The measurements behind the defaults (start set, tied search, critical share, pools, batches and cycles) and the
speed of each part are in docs/research/anneal.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from doppler.ir.assignment import Assignment, check_assignment
from doppler.methods.layered import block_graph, repeated_units
from doppler.methods.placement import place_within
from doppler.methods.registry import MethodError, get_method, option, register
from doppler.methods.threads import THREADS_HELP, search_threads
from doppler.ir.graph import DataflowGraph, _csr
from doppler.util.progress import ProgressEvent, ProgressFn
from doppler.sim import SimContext

#: the cheap methods whose best assignment a search starts from (anneal's start set, and the first
#: incumbent of DOPPLER's Stage II)
WARM_START_METHODS = ("critical_path", "heft", "enumerative", "round_robin_block", "metis")
#: anneal's start set also holds the expert's placements where the graph has a layer structure (elsewhere they
#: refuse, and are left out)
EXPERT_START_METHODS = ("tensor_parallel", "tp_pipeline")
#: anneal's start set also holds HEFT_LOOKAHEAD's assignment where its rollout is cheap: ``|V|^2 (D-1)``
#: (its ``|V| (D-1)`` HEFT completions times the ops each places) at most this: about 320 ops on 8
#: devices or 840 on 2. A size rule, not a clock, so a seed and an evaluation count still fix the search
ROLLOUT_START_MAX_WORK = 7e5
#: where the graph repeats one layer (:func:`~doppler.methods.layered.repeated_units`), the start set also holds
#: the ``repeat`` start: the best start with every repeat placed as one of them is placed when annealed alone,
#: for this many op simulations (evaluations x the block's ops, the evaluations within REPEAT_BLOCK_EVALS)
REPEAT_BLOCK_WORK = 2e7
REPEAT_BLOCK_EVALS = (5_000, 100_000)
#: ... and only when the search has no time budget or at least this many seconds (the block search costs
#: a few seconds), the block search stopping at this share of the budget if its evaluations take longer
REPEAT_MIN_BUDGET_S = 20.0
REPEAT_BUDGET_SHARE = 0.25

#: where the repeat start is built (:data:`REPEAT_MIN_BUDGET_S`), a *tied* search comes next: an annealer whose
#: moves move an op's copy in every repeat with it (the repeats placed alike), each proposal simulated on the
#: whole graph, so the layer boundaries are in the score; for at most TIED_EVALS evaluations (cycles of
#: TIED_CYCLE_EVALS from TIED_T_START, pools of TIED_POOL moves) and TIED_BUDGET_SHARE of the budget (of
#: ``budget_s``, and of ``max_evals``)
TIED_EVALS = 20_000
TIED_CYCLE_EVALS = 1_500
TIED_T_START = 0.002
TIED_POOL = 16
TIED_BUDGET_SHARE = 0.9

DEFAULT_BUDGET_S = 10.0
#: seconds of search per compiled call: the budget is checked between calls, and overshot by at most this
CHUNK_S = 0.01
#: share of the proposals that are critical-chain moves, and batches between two searches for the chain
CRITICAL_SHARE = 0.25
CRITICAL_REFRESH = 4
#: moves drawn per proposal, of which the one that adds the least compute and transfer time is
#: simulated (:func:`~doppler.methods._anneal_loops.time_added`)
POOL = 4


_NO_TIES = (np.empty(0, np.int64), np.zeros(1, np.int64), np.empty(0, np.int64))


class _Moves:
    """ANNEAL's move generator on one graph: the arrays :func:`~doppler.methods._anneal_loops.apply_move`
    reads (all randomness from one numpy Generator)."""

    def __init__(self, graph: DataflowGraph, nd: int, rng: np.random.Generator) -> None:
        self.nd = nd
        self.rng = rng
        self.graph_arrays = tuple(np.ascontiguousarray(x, dtype=np.int64)
                                  for x in (graph.succ_ptr, graph.succ_idx, graph.pred_ptr, graph.pred_idx))  # fmt: skip
        tiles = np.flatnonzero(graph.group >= 0)
        ptr, members, _ = _csr(graph.group[tiles], tiles, len(graph.groups))  # each logical op's tiles
        counts = np.diff(ptr)
        many = counts > 1  # groups of one tile are single-op moves already
        self.grp_ptr = np.concatenate([[0], np.cumsum(counts[many])]).astype(np.int64)
        self.grp_ops = members[np.repeat(many, counts)]

    def args(self) -> tuple:
        """The loop arguments after the generator: device count, graph arrays, groups."""
        return (self.nd, *self.graph_arrays, self.grp_ptr, self.grp_ops)

    def apply(self, a: np.ndarray) -> None:
        """Mutate ``a`` (int64) in place with one random move (always changes something when D > 1)."""
        from doppler.methods._anneal_loops import apply_move

        apply_move(a, self.rng, *self.args(), np.empty(0, np.int64))


@dataclass(frozen=True)
class AnnealOptions:
    """The options of ``anneal`` (the module docstring says what each does)."""

    max_evals: int | None = option(None, "stop after this many simulator evaluations (without --budget-s: a search "
                                   "that does not depend on the machine's speed)")  # fmt: skip
    batch_size: int = option(8, "proposals simulated per iteration")
    cycle_evals: int | None = option(None, "evaluations per cooling cycle (default: max(5000, 1000 x ops), at most "
                                     "max_evals)")  # fmt: skip
    t_start: float = option(0.02, "temperature at the start of a cycle (a relative makespan increase)")
    t_end: float = option(1e-4, "temperature at the end of a cycle")
    start: np.ndarray | None = option(None, "the assignment to start from, instead of the start set", flag="--init")
    extra_starts: dict[str, np.ndarray] | None = option(None, "assignments that join the start set, by name (e.g. a "
                                                        "policy's decodes)")  # fmt: skip
    threads: int | None = option(None, THREADS_HELP, flag="--threads")
    critical_share: float | None = option(None, f"share of the proposals that are critical-chain moves (default "
                                          f"{CRITICAL_SHARE}; 0: only the blind moves)")  # fmt: skip
    prune: bool = option(True, "simulate each proposal only as far as it can still matter (the speed, never the "
                         "search)")  # fmt: skip
    pool: int = option(POOL, "moves drawn per proposal, of which the one adding the least compute and transfer time "
                       "is simulated (1: every drawn move)")  # fmt: skip


@register(
    "anneal",
    options=AnnealOptions,
    description="simulated annealing in the WC simulator from the best cheap method or, on small graphs, "
                "heft_lookahead (or --init)",
    deterministic=False,
    memory_aware=True,
    memory_retries=False,
)
def anneal_search(graph: DataflowGraph, cluster, options: AnnealOptions = AnnealOptions(), *, seed: int = 0,
                  budget_s: float | None = None, on_progress: ProgressFn | None = None,
                  memory_budget_bytes: np.ndarray | None = None) -> Assignment:  # fmt: skip
    """Simulated annealing (see the module docstring) with ``options`` (:class:`AnnealOptions`). Returns the best
    assignment found.

    ``memory_budget_bytes[D]`` (given by :func:`~doppler.methods.assign`): the search starts from the best
    start that fits it (simulated), and accepts no proposal holding more weight bytes on a device than
    the budget less the live activations its start had there; the best found is simulated, and if the
    live activations then put a device over its budget, the start is returned instead
    (``info["memory_fallback"]``).

    ``on_progress`` gets a :class:`~doppler.util.progress.ProgressEvent` about four times a second: the
    time used of the budget (or the evaluations of ``max_evals``), and in ``stats`` the evaluation
    count and the best makespan so far."""
    t0 = time.perf_counter()
    max_evals, batch_size, cycle_evals, pool = options.max_evals, options.batch_size, options.cycle_evals, options.pool
    t_start, t_end, start, critical_share = options.t_start, options.t_end, options.start, options.critical_share
    if max_evals is not None and (isinstance(max_evals, bool) or not isinstance(max_evals, (int, np.integer))
                                  or max_evals < 0):  # fmt: skip
        raise MethodError(f"max_evals must be an integer >= 0, got {max_evals!r}")
    if batch_size < 1:
        raise MethodError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(pool, bool) or not isinstance(pool, (int, np.integer)) or pool < 1:
        raise MethodError(f"pool must be an integer >= 1, got {pool!r}")
    threads = search_threads(options.threads, batch_size)
    critical_share = CRITICAL_SHARE if critical_share is None else float(critical_share)
    if not 0.0 <= critical_share <= 1.0:
        raise MethodError(f"critical_share must be in [0, 1], got {critical_share}")
    for name, temp in (("t_start", t_start), ("t_end", t_end)):
        if not (isinstance(temp, (int, float, np.floating, np.integer)) and 0.0 < float(temp) < math.inf):
            raise MethodError(f"{name} must be a finite temperature > 0, got {temp!r}")
    if budget_s is None and max_evals is None:
        budget_s = DEFAULT_BUDGET_S
    deadline = math.inf if budget_s is None else t0 + float(budget_s)
    nd = int(cluster.num_devices)
    n = graph.num_ops
    rng = np.random.default_rng(seed)
    ctx = SimContext(graph, cluster)  # every evaluation reuses it
    repeat = start is None and (budget_s is None or float(budget_s) >= REPEAT_MIN_BUDGET_S)
    repeat_s = (None if budget_s is None else REPEAT_BUDGET_SHARE * float(budget_s)) if repeat else 0.0
    start_name, walk, mem, starts = _starting_point(ctx, seed, start, options.extra_starts, threads, memory_budget_bytes,
                                                    repeat_s, deadline)  # fmt: skip
    start_ms, start_devices = walk.cur_ms, walk.cur.copy()
    if cycle_evals is None:
        cycle_evals = max(5000, 1000 * n)
        if max_evals is not None:
            cycle_evals = max(1, min(cycle_evals, int(max_evals)))
    cycle_evals = max(1, int(cycle_evals))
    moves = _Moves(graph, nd, rng)
    from doppler.methods import _anneal_loops as K

    sim = (ctx.arrays, *ctx.noise(0.0, 0))
    next_report = time.perf_counter()  # progress reports only; no decision depends on the clock
    optimal_ms = float(ctx.lower_bound()) * (1.0 + 1e-12)  # nothing can beat the lower bound

    def search(w: _Walk, r: np.random.Generator, mv: _Moves, ties: tuple, stop_evals: int, stop_s: float,
               cycle: int, t_hot: float, moves_per_proposal: int) -> None:
        """Anneal ``w`` in place until ``stop_evals`` evaluations (-1: none) or the clock at ``stop_s``."""
        nonlocal next_report
        chunk = 1  # batches per compiled call: grown to about CHUNK_S of work, so the clock is read often enough
        while nd > 1 and n > 0 and w.best_ms > optimal_ms:
            if (stop_evals >= 0 and w.counts[K.EVALS] >= stop_evals) or time.perf_counter() >= stop_s:
                break
            t_call = time.perf_counter()
            K.anneal_batches(sim, w.cur, w.best, w.crit, w.counts, w.values, chunk, batch_size, stop_evals, cycle,
                             t_hot, math.log(t_end / t_hot), optimal_ms, r, *mv.args(), threads, critical_share,
                             CRITICAL_REFRESH, bool(options.prune), moves_per_proposal, mem, ties)  # fmt: skip
            took = time.perf_counter() - t_call
            chunk = max(1, min(chunk * 4, int(chunk * CHUNK_S / took) if took > 0 else chunk * 4))
            if on_progress is not None and time.perf_counter() >= next_report:
                next_report = time.perf_counter() + 0.25
                on_progress(_progress_event(t0, w.evals, budget_s, max_evals, w, start_ms))

    tied_evals = 0
    if repeat and nd > 1 and (max_evals is None or walk.evals < TIED_BUDGET_SHARE * max_evals):
        tied = _tied_start(ctx, starts)
        if tied is not None:
            stop = walk.evals + TIED_EVALS
            if max_evals is not None:
                stop = min(stop, int(TIED_BUDGET_SHARE * max_evals))
            stop_s = deadline if budget_s is None else min(deadline, t0 + TIED_BUDGET_SHARE * float(budget_s))
            ties, first, first_ms = tied
            tw = (_Walk(first, first_ms, walk.evals) if first_ms is not None
                  else _Walk(first, float(ctx.makespan(first)), walk.evals + 1))  # fmt: skip
            rt = np.random.default_rng([seed, 1])  # its own stream: the search after it draws as without it
            search(tw, rt, _Moves(graph, nd, rt), ties, stop, stop_s, TIED_CYCLE_EVALS, TIED_T_START,
                   max(int(pool), TIED_POOL))
            tied_evals = tw.evals - walk.evals
            kept = tw if tw.best_ms < walk.best_ms else walk
            walk = _Walk(kept.best, kept.best_ms, tw.evals)
    search(walk, rng, moves, _NO_TIES, -1 if max_evals is None else int(max_evals), deadline, cycle_evals, t_start,
           int(pool))
    if on_progress is not None:  # the last word, also when the budget ran out before the first move
        on_progress(_progress_event(t0, walk.evals, budget_s, max_evals, walk, start_ms))
    devices, best_ms = walk.best, walk.best_ms
    fallback = memory_budget_bytes is not None and not ctx.fits_memory(devices, memory_budget_bytes)
    if fallback:
        devices, best_ms = start_devices, start_ms
    return Assignment(
        devices=devices,
        estimated_makespan_s=best_ms,
        info={
            "memory_fallback": fallback,
            "start_method": start_name,
            "start_makespan_s": start_ms,
            "evals": walk.evals,
            "tied_evals": tied_evals,
            "accepted": int(walk.counts[K.ACCEPTED]),
            "improvements": int(walk.counts[K.IMPROVED]),
            "restarts": int(walk.counts[K.RESTARTS]),
            "reached_lower_bound": walk.best_ms <= optimal_ms,
            "cycle_evals": cycle_evals,
            "threads": threads,
            "critical_share": critical_share,
            "pool": int(pool),
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


class _Walk:
    """The annealer's state, in the arrays the compiled loop updates in place: the current and the
    best assignment, the current one's critical chain, counters (``_anneal_loops.EVALS`` ...) and
    makespans (``CUR_MS``, ``BEST_MS``)."""

    def __init__(self, start: np.ndarray, start_ms: float, evals: int) -> None:
        self.cur = np.ascontiguousarray(start, dtype=np.int64).copy()
        self.best = self.cur.copy()
        from doppler.methods import _anneal_loops as K

        self.counts = np.zeros(K.NUM_COUNTS, np.int64)  # evals, cycle evals, accepted, improved, restarts, chain
        self.counts[K.EVALS] = evals
        self.counts[K.STALE] = 1
        self.crit = np.empty(len(self.cur), np.int64)  # the critical chain of ``cur`` (its first counts[NCRIT])
        self.values = np.array([start_ms, start_ms])  # current, best

    @property
    def evals(self) -> int:
        return int(self.counts[0])

    @property
    def cur_ms(self) -> float:
        return float(self.values[0])

    @property
    def best_ms(self) -> float:
        return float(self.values[1])


def _starting_point(ctx: SimContext, seed: int, start: np.ndarray | None, extra_starts: dict[str, np.ndarray] | None,
                    threads: int, budget: np.ndarray | None, repeat_s: float | None = 0.0,
                    deadline: float = math.inf) -> tuple[str, _Walk, tuple, list]:  # fmt: skip
    """The best of the start set (``start``, else the warm-start methods; plus ``extra_starts``;
    then, without ``start`` and where it is cheap (:data:`ROLLOUT_START_MAX_WORK`), HEFT_LOOKAHEAD on
    ``threads`` cores; ties to the first) that fits ``budget`` (None: any), then unless ``repeat_s`` is 0 the
    ``repeat`` start made from it (:func:`_repeat_start`, its block search stopped after ``repeat_s`` seconds;
    None: no limit) where that is faster and fits: its name, a walk from it
    that counts the evaluations spent, the memory caps of the compiled loop (:func:`_memory_caps`), and every
    start that fits with its makespan, fastest first.
    Once the clock has passed ``deadline`` (``time.perf_counter()``), no further warm-start method runs
    if the set holds a start already: on a large graph a short budget is not spent twice."""
    graph, cluster, nd = ctx.graph, ctx.cluster, ctx.num_devices
    if start is not None:
        cands = {"start": check_assignment(graph, np.asarray(start), nd)}
    else:
        cands = {}
        for m in WARM_START_METHODS + EXPERT_START_METHODS:  # (memory-aware ones within the budget; each start
            # is checked below)
            if (cands or extra_starts) and time.perf_counter() >= deadline:
                break
            try:
                cands[m] = place_within(get_method(m), graph, cluster, budget, seed=seed)[0].devices
            except MethodError:  # no room: this start does not fit
                continue
    for name, a in (extra_starts or {}).items():
        cands[name] = check_assignment(graph, np.asarray(a), nd)
    if start is None and nd > 1 and float(graph.num_ops) ** 2 * (nd - 1) <= ROLLOUT_START_MAX_WORK:
        from doppler.methods.lookahead import heft_lookahead_schedule

        try:
            cands["heft_lookahead"] = heft_lookahead_schedule(graph, cluster, threads=threads,
                                                              memory_budget_bytes=budget)[0]  # fmt: skip
        except MethodError:  # (its HEFT start found no room)
            pass
    names = [k for k in cands if budget is None or ctx.fits_memory(cands[k], budget)]
    if not names:
        raise MethodError(f"anneal: none of its starts ({', '.join(cands)}) fits the memory budget")
    ms = ctx.simulate_many(np.stack([cands[k] for k in names]))
    i0 = int(np.argmin(ms))
    name, first, first_ms, evals = names[i0], cands[names[i0]], float(ms[i0]), len(names)
    starts = [(cands[k], float(m)) for k, m in zip(names, ms)]
    tiled = _repeat_start(ctx, seed, first, threads, repeat_s) if repeat_s != 0.0 else None
    if tiled is not None and (budget is None or ctx.fits_memory(tiled, budget)):
        tiled_ms, evals = float(ctx.simulate(tiled).makespan_s), evals + 1
        starts.append((tiled, tiled_ms))
        if tiled_ms < first_ms:
            name, first, first_ms = "repeat", tiled, tiled_ms
    starts.sort(key=lambda s: s[1])  # (stable: ties in the set's order)
    return name, _Walk(first, first_ms, evals), _memory_caps(ctx, first, budget), starts


def _repeat_start(ctx: SimContext, seed: int, base: np.ndarray, threads: int,
                  budget_s: float | None) -> np.ndarray | None:  # fmt: skip
    """``base`` with every repeat of the graph's repeated layer placed as one of them is placed when annealed
    alone (:data:`REPEAT_BLOCK_WORK`; the block's inputs taken as present everywhere; ``base``'s placement of it
    among its starts), or None where the graph repeats no layer."""
    repeats = repeated_units(ctx.graph)
    if not repeats:
        return None
    ref = repeats[len(repeats) // 2]
    lo, hi = REPEAT_BLOCK_EVALS
    evals = int(min(max(REPEAT_BLOCK_WORK // ref.size, lo), hi))
    block = anneal_search(block_graph(ctx.graph, ref), ctx.cluster,
                          AnnealOptions(max_evals=evals, threads=threads, extra_starts={"base": base[ref]}), seed=seed,
                          budget_s=budget_s)  # fmt: skip
    out = base.copy()
    for ops in repeats:
        out[ops] = block.devices
    return out


def _tied_start(ctx: SimContext, starts: list) -> tuple[tuple, np.ndarray, float | None] | None:
    """The tie classes of the tied search (:func:`~doppler.methods._anneal_loops.tie_move`: position ``i`` of
    every repeat, one class per ``i``) and its start with its makespan: the fastest of ``starts`` ((assignment,
    makespan), fastest first) whose repeats are placed alike, else the fastest with every repeat placed as its
    first (makespan None: not simulated). None where the graph repeats no layer
    (:func:`~doppler.methods.layered.repeated_units`)."""
    repeats = repeated_units(ctx.graph)
    if not repeats or not starts:
        return None
    members = np.stack(repeats)  # [repeat, position]
    tie_ops = np.ascontiguousarray(members.T.ravel(), dtype=np.int64)  # class i: position i of every repeat
    tie_ptr = np.arange(0, tie_ops.size + 1, len(repeats), dtype=np.int64)
    tie_of = np.full(ctx.num_ops, -1, np.int64)
    tie_of[tie_ops] = np.repeat(np.arange(members.shape[1]), len(repeats))
    ties = (tie_of, tie_ptr, tie_ops)
    for a, ms in starts:
        if all(np.array_equal(a[ops], a[repeats[0]]) for ops in repeats):
            return ties, a, ms
    first = starts[0][0].copy()
    for ops in repeats:
        first[ops] = starts[0][0][repeats[0]]
    return ties, first, None


def _memory_caps(ctx: SimContext, start: np.ndarray, budget: np.ndarray | None) -> tuple:
    """The compiled loop's memory arguments (:func:`~doppler.methods._anneal_loops.over_caps`): the weight
    slices each op reads and, per device, the budget less the live activations ``start`` has there (no
    budget: no caps)."""
    s = ctx.input_slices()
    if budget is None:
        return (s.op_ptr, s.slice_idx, s.nbytes, np.empty(0))
    ops, sl = s.op_slices()
    w = s.weight[sl]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(ops[w], minlength=ctx.num_ops))]).astype(np.int64)
    r = ctx.simulate(start, trace=True)
    return (ptr, np.ascontiguousarray(sl[w]), s.nbytes, budget - (r.peak_memory_bytes - r.resident_bytes))
