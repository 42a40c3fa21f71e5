"""``doppler`` as an assignment method: load a trained policy (by default the pretrained one
shipped in ``doppler/policy/pretrained/``), decode greedily, or draw K samples in one batch
and keep the best by the simulator, or search for ``budget_s`` seconds guided by the policy."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from doppler.assignment import Assignment
from doppler.baselines import MethodError, register
from doppler.graph import DataflowGraph
from doppler.hardware import Cluster
from doppler.policy.features import graph_features
from doppler.policy.rollout import evaluate_actions, rollout
from doppler.simulate import simulate_many


def check_checkpoint_fits(meta: dict, graph: DataflowGraph, cluster: Cluster, where: str) -> bool:
    """Raise if a checkpoint cannot serve ``graph`` on ``cluster``; True if its use is zero-shot.

    A pretrained policy, or one trained on several graphs, serves any graph and cluster. A
    policy trained on one graph with position-free op features (``structural``, as fine-tuned
    from the pretrained one) serves any graph and cluster zero-shot too; one with the ``full``
    features (op ids, block coordinates: memorised positions) serves only its own graph and cluster."""
    graphs = meta["graphs"]
    transferable = meta.get("policy_config", {}).get("op_features", "full") != "full"
    if any(graph.matches_fingerprint(g["fingerprint"]) for g in graphs):
        if len(graphs) == 1 and json.loads(meta["cluster"]) != cluster.to_json():
            if transferable:
                return True
            trained_on = json.loads(meta["cluster"])
            raise MethodError(
                f"{where}: trained on cluster {trained_on.get('name', '?')!r}, not {cluster.name!r} "
                "(train on this cluster, or fine-tune the pretrained policy: `doppler train --init pretrained`)"
            )
        return False
    if len(graphs) == 1 and not transferable:
        raise MethodError(
            f"{where}: trained on graph {graphs[0]['name']!r} ({graphs[0]['num_ops']} ops), which is not "
            f"{graph.name!r} ({graph.num_ops} ops): fingerprints differ (the shipped pretrained policy, "
            "--method doppler without --checkpoint, places any graph)"
        )
    return True


#: share of guided moves in ``--budget-s`` search (benchmarks/generalization.py measures 0 against this)
GUIDED_SHARE = 0.3
#: samples drawn for the start set of ``--budget-s`` search (one batch, one encoder pass)
SEARCH_SAMPLES = 32


def resolve_checkpoint(checkpoint: str | Path | None) -> tuple[Path, bool]:
    """The checkpoint to load, and whether it is the shipped pretrained policy (``checkpoint`` None)."""
    if checkpoint is not None:
        return Path(checkpoint), False
    from doppler.pretrain import PRETRAINED_CHECKPOINT

    if not PRETRAINED_CHECKPOINT.is_file():
        raise MethodError(f"the shipped pretrained policy is missing ({PRETRAINED_CHECKPOINT}): reinstall doppler, "
                          "or pass --checkpoint")  # fmt: skip
    return PRETRAINED_CHECKPOINT, True


def device_preferences(gf, enc, ro) -> np.ndarray:
    """``[n, D]``: the PLC head's probabilities of each device for each op, at the step it was placed in ``ro[0]``."""
    sc = evaluate_actions(enc, ro)
    prefs = np.empty((gf.num_ops, gf.num_devices))
    prefs[ro.order[0]] = torch.exp(sc.plc_logp[0]).double().cpu().numpy()
    return prefs


@register("doppler", description="learned SEL + PLC policy (default: the shipped pretrained policy, zero-shot; "
          "--checkpoint: a trained one; --samples K: best of K; --budget-s S: policy-guided search)",
          deterministic=False, uses_budget=True)  # fmt: skip
def doppler_method(
    graph: DataflowGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    budget_s: float | None = None,
    checkpoint: str | Path | None = None,
    samples: int | None = None,
    guided_share: float = GUIDED_SHARE,
    on_progress=None,
) -> Assignment:
    """Greedy decode of a policy; with ``samples`` K, the best of greedy and K samples; with
    ``budget_s``, simulated annealing for that long that starts from the best of the policy's
    decodes and the cheap methods and draws a share of its moves from the policy's device preferences."""
    from doppler.train import TrainError, load_policy

    if samples is not None and samples < 1:
        raise MethodError(f"--samples must be >= 1, got {samples}")
    t0 = time.perf_counter()
    path, shipped = resolve_checkpoint(checkpoint)
    try:
        policy, meta = load_policy(path)
    except TrainError as e:
        raise MethodError(str(e)) from None
    zero_shot = check_checkpoint_fits(meta, graph, cluster, str(path))
    gf = graph_features(graph, cluster)
    k = samples or (SEARCH_SAMPLES if budget_s else 0)
    with torch.no_grad():
        enc = policy.encode(gf)
        ro = rollout(gf, enc, batch=1, mode="greedy")
        candidates = ro.assignment
        if k:
            ro_s = rollout(gf, enc, batch=k, mode="sample", rng=np.random.default_rng(seed))
            candidates = np.concatenate([candidates, ro_s.assignment])
        prefs = device_preferences(gf, enc, ro) if budget_s else None
    makespans = simulate_many(graph, cluster, candidates)
    best = int(np.argmin(makespans))
    info = {"zero_shot": zero_shot, "pretrained": shipped, "samples": k, "checkpoint": str(path)}
    if not budget_s:
        return Assignment(devices=candidates[best], estimated_makespan_s=float(makespans[best]), info=info)
    from doppler.baselines.anneal import anneal_search

    left = max(budget_s - (time.perf_counter() - t0), 1e-3)
    found = anneal_search(graph, cluster, seed=seed, budget_s=left, device_prefs=prefs, guided_share=guided_share,
                          extra_starts={"doppler": candidates[best]}, on_progress=on_progress)  # fmt: skip
    info.update(search=found.info, policy_makespan_s=float(makespans[best]))
    return Assignment(devices=found.devices, estimated_makespan_s=found.estimated_makespan_s, info=info)
