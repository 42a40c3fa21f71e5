"""``doppler`` as an assignment method: load a trained policy (by default the pretrained one
shipped in ``doppler/policy/pretrained/``), decode greedily, or draw K samples in one batch
and keep the best by the simulator, or search for ``budget_s`` seconds from the policy's best decode
(up to 32 samples, drawn while the policy has used less than a tenth of the budget)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from doppler.ir.assignment import Assignment
from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.methods.registry import MethodError, PythonRun, option, register
from doppler.methods.threads import THREADS_HELP
from doppler.util.progress import ProgressEvent
from doppler.policy import LEARNED_HEADS

# torch and the policy's modules are imported when the method runs, not when it registers:
# ``import doppler`` registers it, and torch would add about 2 s to every command.


#: samples drawn for the start set of ``--budget-s`` search (one encoder pass, batches of SAMPLE_CHUNK)
SEARCH_SAMPLES = 32
SAMPLE_CHUNK = 4
#: ``--samples K`` is drawn and simulated in batches of this many, keeping the best, so that memory
#: stays bounded (one batch of 10^8 asked for 715 GiB); K may not exceed MAX_SAMPLES
SAMPLES_BATCH = 256
MAX_SAMPLES = 1_000_000
#: the policy (encoder, greedy decode, samples) stops drawing samples once it has used this share of
#: ``--budget-s``, so that on large graphs the annealer keeps most of the budget
SEARCH_SAMPLE_SHARE = 0.1
#: zero-shot (a graph or cluster the policy was not trained on), the learned device head only breaks
#: the ties of its list schedule's rule (the shipped policy: HEFT's earliest finish); chosen on the
#: shifted validation split (the model card gives the figures). On its own graph and cluster the head
#: chooses freely
ZERO_SHOT_PLC_TIES_ONLY = True


@dataclass(frozen=True)
class LearnedOptions:
    """The options of a learned method (DOPPLER's ablations and the learned baselines)."""

    checkpoint: Path | str | None = option(None, "checkpoint of the policy (doppler without one: the shipped pretrained "
                                     "policy)", flag="--checkpoint")  # fmt: skip
    samples: int | None = option(None, "draw this many samples and keep the best of them and the greedy decode",
                                 flag="--samples")  # fmt: skip
    threads: int | None = option(None, f"--budget-s: {THREADS_HELP}", flag="--threads")


@dataclass(frozen=True)
class DopplerOptions(LearnedOptions):
    """The options of ``doppler``."""

    plc_ties_only: bool | None = option(None, "the device head only breaks the ties of the policy's list-schedule "
                                        "rule (default: zero-shot) or chooses any device (default: on the graph "
                                        "and cluster it was trained on)", flag="--plc-ties/--plc-free")  # fmt: skip


def _greedy_only(options: LearnedOptions, budget_s: float | None) -> bool:
    """One greedy decode by the shipped policy (its numpy twin, :mod:`doppler.policy.infer`): small enough
    to run as Python (:func:`~doppler.methods.placement.runs_as_python`); samples and search compile."""
    return options.checkpoint is None and not options.samples and not budget_s


# (max_work: as Python, a fresh greedy `doppler assign` took 0.94 s at 973 x 8 ops x devices and
# 1.66 s at 2,280 x 8, against 1.8-2.0 s compiled, but 2.98 s at 3,000 x 16 against 2.05 s)
@register("doppler", options=DopplerOptions, description="learned SEL + PLC policy (default: the shipped pretrained "
          "policy, zero-shot; --checkpoint: a trained one; --samples K: best of K; --budget-s S: search from the "
          "policy's best sample)", deterministic=False, python=PythonRun(_greedy_only, max_work=40_000),
          memory_aware=True)  # fmt: skip
def doppler_method(graph: DataflowGraph, cluster: Cluster, options: LearnedOptions, *, seed: int = 0,
                   budget_s: float | None = None, on_progress=None, memory_budget_bytes: np.ndarray | None = None,
                   method: str = "doppler") -> Assignment:  # fmt: skip
    """Greedy decode of a policy (``options``: :class:`DopplerOptions` for ``doppler``, :class:`LearnedOptions`
    for the others); with ``samples`` K, the best of greedy and K samples; with
    ``budget_s``, simulated annealing for that long that starts from the best of the policy's
    decodes and anneal's own start set. ``plc_ties_only`` (``doppler``'s): the device head only breaks the ties
    of its list schedule's rule (default: :data:`ZERO_SHOT_PLC_TIES_ONLY` when zero-shot, else free).
    ``memory_budget_bytes[D]`` (given by :func:`~doppler.methods.assign`): DOPPLER's decodes place each op
    only on a device with room for it (the memory ledger of its list schedule), the best decode that
    fits when simulated is kept, and the search keeps to the budget
    (:func:`~doppler.methods.anneal.anneal_search`). The learned baselines' decodes are not masked; their
    placement is checked.
    ``threads``: cores of the search's simulations (see :func:`~doppler.methods.anneal.anneal_search`)."""
    checkpoint, samples, threads = options.checkpoint, options.samples, options.threads
    plc_ties_only = getattr(options, "plc_ties_only", None)
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, (int, np.integer))):
        raise MethodError(f"--samples must be a whole number, got {samples!r}")
    if samples is not None and not 1 <= samples <= MAX_SAMPLES:
        raise MethodError(f"--samples must be between 1 and {MAX_SAMPLES:,}, got {samples} (for a longer search give "
                          "--budget-s)")  # fmt: skip
    t0 = time.perf_counter()
    from doppler.policy.checkpoint import (
        CheckpointError, check_checkpoint_fits, identity_left_out, resolve_checkpoint, trained_on_graph,
    )  # fmt: skip
    from doppler.policy.decode import RolloutError, make_plan
    from doppler.policy.features import graph_features
    from doppler.sim import context, simulate_many

    fast = None
    if checkpoint is None and method == "doppler":
        from doppler.policy.infer import load_shipped

        fast = load_shipped()
    try:
        path, shipped = resolve_checkpoint(checkpoint)
        if fast is not None:
            meta, made_by = fast.meta, fast.method
        else:
            from doppler.policy.architectures import load_policy

            policy, meta = load_policy(path, cluster)
            made_by = policy.method
        zero_shot = check_checkpoint_fits(meta, graph, cluster, str(path))
        left_out = identity_left_out(meta, cluster)
    except CheckpointError as e:
        raise MethodError(str(e)) from None
    if made_by != method:
        what = "the shipped pretrained policy" if shipped else str(path)
        raise MethodError(f"{what} is a {made_by} checkpoint, not {method}: use --method {made_by}, or give a "
                          f"--checkpoint of `doppler train --method {method}`")  # fmt: skip
    if plc_ties_only is None:  # (the ablations' PLC rule is CRITICAL PATH's own; they have no plc_ties_only)
        plc_ties_only = ZERO_SHOT_PLC_TIES_ONLY and zero_shot and method == "doppler"
    ties_only = bool(plc_ties_only)
    t_policy = time.perf_counter()  # the policy's share is its encoder and decodes, not loading it
    gf = graph_features(graph, cluster)
    plan_kw = {"plc_ties_only": ties_only, "memory_budget_bytes": memory_budget_bytes}
    greedy = make_plan(gf.num_ops, batch=1, mode="greedy", **plan_kw)
    rng = np.random.default_rng(seed) if samples or budget_s else None  # (greedy alone: no numpy.random import)
    if fast is not None:  # the shipped policy's numpy twin: no torch import (doppler.policy.infer)
        decode_plan = functools.partial(fast.decode, gf, heads=fast.heads(gf))
    else:
        import torch

        from doppler.policy.rollout import run_plan

        with torch.no_grad():
            enc = policy.encode(gf)

        def decode_plan(plan):
            with torch.no_grad():  # the learned baselines' decoders run torch per step
                return run_plan(gf, enc, plan)

    def decode(plan):
        try:
            return decode_plan(plan)
        except RolloutError as e:  # (with a memory budget: an op with room nowhere)
            raise MethodError(f"{method}: {e}") from None

    decoded = [decode(greedy).assignment]
    if samples:  # exactly K, in batches (the same uniforms as one batch), keeping the best so far
        for start in range(0, samples, SAMPLES_BATCH):
            batch = np.concatenate([decoded[0], decode(make_plan(
                gf.num_ops, batch=min(SAMPLES_BATCH, samples - start), mode="sample", rng=rng,
                **plan_kw)).assignment])  # fmt: skip
            makespans = simulate_many(graph, cluster, batch)
            decoded[0] = batch[[_best_fitting(graph, cluster, batch, makespans, memory_budget_bytes)]]
            if on_progress is not None:
                drawn = min(start + SAMPLES_BATCH, samples)
                on_progress(ProgressEvent(task="samples", done=drawn, total=samples, unit="samples",
                                          stats={"best_makespan_s": float(makespans.min()), "evals": drawn}))  # fmt: skip
    elif budget_s:  # up to SEARCH_SAMPLES while the policy has used less than its share of the budget
        k = 0  # (batches of SAMPLE_CHUNK draw the same uniforms, in the same order, as one batch)
        while k < SEARCH_SAMPLES and time.perf_counter() - t_policy < SEARCH_SAMPLE_SHARE * budget_s:
            chunk = min(SAMPLE_CHUNK, SEARCH_SAMPLES - k)
            decoded.append(decode(make_plan(gf.num_ops, batch=chunk, mode="sample", rng=rng,
                                            **plan_kw)).assignment)  # fmt: skip
            k += chunk
    candidates = np.concatenate(decoded)
    simulation = None
    if len(candidates) == 1 and not budget_s:  # one decode: its traced run also serves the caller's report
        simulation = (graph, cluster, context(graph, cluster).simulate(candidates[0], trace=True))
        makespans = np.array([simulation[2].makespan_s])
    else:
        makespans = simulate_many(graph, cluster, candidates)
    best = _best_fitting(graph, cluster, candidates, makespans, memory_budget_bytes)
    drawn = samples or len(candidates) - 1
    info = {"zero_shot": zero_shot, "pretrained": shipped, "samples": drawn, "checkpoint": str(path),
            "plc_ties_only": ties_only, "trained_on_graph": trained_on_graph(meta, graph)}  # fmt: skip
    if left_out:  # the devices it learned states for are another cluster's
        info["device_identity_left_out"] = left_out
    if not budget_s:
        return Assignment(devices=candidates[best], estimated_makespan_s=float(makespans[best]), info=info,
                          simulation=simulation)  # fmt: skip
    from doppler.methods.anneal import AnnealOptions, anneal_search

    left = max(budget_s - (time.perf_counter() - t0), 1e-3)
    found = anneal_search(graph, cluster, AnnealOptions(extra_starts={"doppler": candidates[best]}, threads=threads),
                          seed=seed, budget_s=left, on_progress=on_progress,
                          memory_budget_bytes=memory_budget_bytes)  # fmt: skip
    info.update(search=found.info, policy_makespan_s=float(makespans[best]))
    return Assignment(devices=found.devices, estimated_makespan_s=found.estimated_makespan_s, info=info)


def _best_fitting(graph: DataflowGraph, cluster: Cluster, rows: np.ndarray, makespans: np.ndarray,
                  budget: np.ndarray | None) -> int:
    """The row of least makespan among those that fit ``budget`` (simulated, in order of makespan), or of
    least makespan where none fits or there is no budget."""
    order = np.argsort(makespans, kind="stable")
    if budget is not None:
        from doppler.sim import context

        ctx = context(graph, cluster)
        for i in order:
            if ctx.fits_memory(rows[i], budget):
                return int(i)
    return int(order[0])


#: the other learned methods: the single-head ablations (the other head follows CRITICAL PATH's rule), then
#: the learned baselines
_DESCRIPTIONS = {
    LEARNED_HEADS["sel"]: "ablation: learned SEL head, earliest-start PLC",
    LEARNED_HEADS["plc"]: "ablation: learned PLC head, largest-b-level SEL",
    "single_policy": "ablation: one softmax over every (ready op, device) pair, DOPPLER's encoder and features",
    "gdp": "GDP (Zhou et al. 2019): GraphSAGE + transformer, every op's device in one shot (fixed device count)",
    "placeto": "PLACETO (Addanki et al. 2019): fixed op order, graph re-embedded at every step (fixed device count)",
}
for _name, _what in _DESCRIPTIONS.items():
    register(_name, options=LearnedOptions, description=f"{_what} (needs --checkpoint of `doppler train --method "
             f"{_name}`)", deterministic=False)(functools.partial(doppler_method, method=_name))  # fmt: skip
