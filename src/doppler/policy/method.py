"""``doppler`` as an assignment method: load a trained policy, decode greedily (or
draw K samples in one batch and keep the best by the simulator)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from doppler.assignment import Assignment
from doppler.baselines import MethodError, register
from doppler.graph import DataflowGraph
from doppler.hardware import Cluster
from doppler.policy.features import graph_features
from doppler.policy.rollout import rollout
from doppler.simulate import simulate_many


def check_checkpoint_fits(meta: dict, graph: DataflowGraph, cluster: Cluster, where: str) -> bool:
    """Raise if a single-graph checkpoint is applied to another graph or cluster; True if zero-shot.

    A policy trained on several graphs may be applied to any graph (zero-shot)."""
    graphs = meta["graphs"]
    if any(graph.matches_fingerprint(g["fingerprint"]) for g in graphs):
        if len(graphs) == 1:
            trained_on = json.loads(meta["cluster"])
            if trained_on != cluster.to_json():
                raise MethodError(
                    f"{where}: trained on cluster {trained_on.get('name', '?')!r}, not {cluster.name!r} "
                    "(train on this cluster, or train on several graphs for a transferable policy)"
                )
        return False
    if len(graphs) == 1:
        raise MethodError(
            f"{where}: trained on graph {graphs[0]['name']!r} ({graphs[0]['num_ops']} ops), which is not "
            f"{graph.name!r} ({graph.num_ops} ops): fingerprints differ (a policy trained on several graphs "
            "may be applied zero-shot)"
        )
    return True


@register("doppler", description="learned SEL + PLC policy (needs --checkpoint; --samples K: best of K)", deterministic=False)
def doppler_method(
    graph: DataflowGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    budget_s: float | None = None,
    checkpoint: str | Path | None = None,
    samples: int | None = None,
) -> Assignment:
    """Greedy decode of a trained policy; with ``samples`` K, the best of greedy and K samples."""
    from doppler.train import TrainError, load_policy

    if checkpoint is None:
        raise MethodError("method 'doppler' needs a trained policy: pass --checkpoint RUN_DIR/checkpoint.pt "
                          "(train one with `doppler train`)")
    if samples is not None and samples < 1:
        raise MethodError(f"--samples must be >= 1, got {samples}")
    try:
        policy, meta = load_policy(checkpoint)
    except TrainError as e:
        raise MethodError(str(e)) from None
    zero_shot = check_checkpoint_fits(meta, graph, cluster, str(checkpoint))
    gf = graph_features(graph, cluster)
    with torch.no_grad():
        enc = policy.encode(gf)
        ro = rollout(gf, enc, batch=1, mode="greedy")
        candidates = ro.assignment
        if samples:
            ro_s = rollout(gf, enc, batch=samples, mode="sample", rng=np.random.default_rng(seed))
            candidates = np.concatenate([candidates, ro_s.assignment])
    makespans = simulate_many(graph, cluster, candidates)
    best = int(np.argmin(makespans))
    info = {"zero_shot": zero_shot, "samples": samples or 0, "checkpoint": str(checkpoint)}
    return Assignment(devices=candidates[best], estimated_makespan_s=float(makespans[best]), info=info)
