"""How much of ANNEAL's time is simulation: its evaluations per second beside the simulator's alone,
and how much more it scores on every core than on one.

    python benchmarks/anneal_speed.py [--seconds S] [--large]

For each graph, in one process and one after the other: the rate of ``anneal`` for S seconds, and
the rate of ``SimContext.simulate_many`` alone on what the annealer scores: batches of 8
neighbours (one op moved) of the assignment it found, each simulated to the end. Without pruning
(below) the ratio is the share of the annealer's time spent simulating; the rest is its own loop
(moves, acceptance). With the loop in Python it was 0.29-0.52 (072e1ea); compiled, 0.74-0.98:
1.7-2.4x the evaluations per second. With pruning the annealer cuts most proposals short, so the
ratio can pass 1.

Then the annealer with ``threads=1`` and with every core (``threads=None``, the default), one after
the other; the ratio is the speed-up of scoring each batch on several cores. Both runs are the
same search (same seed, same makespans), so the faster one just gets further.

Last, pruning (``prune``, on by default): the same number of evaluations on one core with and
without it, twice each, alternating; the ratio of the faster times. A proposal is simulated only
until it is sure to lose to an earlier one of its batch or to be refused by the Metropolis rule,
so both runs are the same search, which the script checks (same best assignment, same counts).

``--large`` adds three rows of the held-out split above 1,000 ops. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from doppler import workloads
from doppler.methods import assign
from doppler.methods.threads import search_threads
from doppler.hardware.presets import cluster
from doppler.sim import SimContext

CASES = (("llama_layer", "v100x8"), ("llama_block", "p100x4"), ("ffnn", "h100x8"), ("chainmm", "p100x4"))
LARGE = ("llama_block-2k/v100x8", "chainmm-2k/mixed3x8", "random-3k/h100x8:16")


def anneal_rate(g, c, seconds: float, threads: int | None) -> tuple[float, np.ndarray]:
    """The annealer's evaluations per second (its assignment too) with ``threads`` cores."""
    t0 = time.perf_counter()
    a = assign(g, c, "anneal", budget_s=seconds, seed=0, threads=threads)
    return a.info["evals"] / (time.perf_counter() - t0), a.devices


def pruning_speedup(g, c, evals: int) -> tuple[float, float]:
    """Seconds of ``evals`` evaluations on one core without and with pruning (best of two each,
    alternating), after checking that both are the same search."""
    times: dict[bool, list[float]] = {False: [], True: []}
    runs = {}
    for prune in (False, True, False, True):
        t0 = time.perf_counter()
        runs[prune] = assign(g, c, "anneal", max_evals=evals, seed=0, threads=1, prune=prune)
        times[prune].append(time.perf_counter() - t0)
    a, b = runs[False], runs[True]
    keys = ("evals", "accepted", "improvements", "restarts")
    if not (np.array_equal(a.devices, b.devices) and [a.info[k] for k in keys] == [b.info[k] for k in keys]):
        raise SystemExit(f"{g.name}: pruning changed the search")
    return min(times[False]), min(times[True])


def sim_rate(ctx: SimContext, around: np.ndarray, nd: int, seconds: float) -> float:
    """Evaluations per second of the simulator alone, batches of 8 neighbours of ``around``."""
    rng = np.random.default_rng(0)
    batches = np.repeat(around[None, None, :], 64 * 8, axis=0).reshape(64, 8, -1)
    ops = rng.integers(0, ctx.num_ops, (64, 8))
    for b in range(64):
        batches[b, np.arange(8), ops[b]] = (batches[b, np.arange(8), ops[b]] + rng.integers(1, nd, 8)) % nd
    ctx.simulate_many(batches[0])
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        ctx.simulate_many(batches[k % 64])
        k += 1
    return 8 * k / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--large", action="store_true", help="add three held-out rows of 1,568-3,000 ops")
    args = ap.parse_args()
    cases = [(f"{name} / {preset}", workloads.build(name), cluster(preset)) for name, preset in CASES]
    if args.large:
        from doppler.workloads.corpus import held_out_split

        cases += [(h.name, h.graph, h.cluster) for h in held_out_split() if h.name in LARGE]
    cores = search_threads(None)
    print(f"| graph / cluster | ops | simulator alone (evals/s) | anneal, 1 core (evals/s) | anneal / simulator "
          f"| anneal, {cores} cores (evals/s) | {cores} cores / 1 | 1 core without pruning (s) | with pruning (s) "
          f"| x |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, g, c in cases:
        for threads in (1, None):  # compile outside the timing
            assign(g, c, "anneal", max_evals=100, threads=threads)
        rate, found = anneal_rate(g, c, args.seconds, 1)
        sim = sim_rate(SimContext(g, c), found, c.num_devices, args.seconds)
        par, _ = anneal_rate(g, c, args.seconds, None)
        off, on = pruning_speedup(g, c, max(1000, int(rate * args.seconds)))
        print(f"| {label} | {g.num_ops} | {sim:,.0f} | {rate:,.0f} | {rate / sim:.2f} | {par:,.0f} | {par / rate:.2f} "
              f"| {off:.2f} | {on:.2f} | {off / on:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
