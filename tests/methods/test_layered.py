"""sequential_fill and pipeline: whole units in order, within each device's memory budget."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler import cluster, memory, workloads
from doppler.methods import MethodError, assign
from doppler.methods.layered import MAX_UNITS, block_graph, layer_units, repeated_units
from doppler.sim import simulate


def _with_memory(name: str, memory_bytes: float):
    c = cluster(name)
    return dataclasses.replace(c, name=f"{name}@{memory_bytes:g}",
                               devices=[dataclasses.replace(d, memory_bytes=memory_bytes) for d in c.devices])  # fmt: skip


def _unit_devices(g, a):
    names, unit = layer_units(g)
    per_unit = [np.unique(a.devices[unit == k]) for k in range(len(names))]
    assert all(d.size == 1 for d in per_unit), "a unit split across devices"
    return np.array([int(d[0]) for d in per_unit])


def test_units_are_the_layers_and_the_modules_outside_them_in_running_order():
    g = workloads.build("llama_model", size="tiny", layers=3)
    names, unit = layer_units(g)
    assert names == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.norm",
                     "lm_head"]  # fmt: skip
    # every edge runs forward or within a unit
    assert (unit[g.src] <= unit[g.dst]).all()
    assert np.bincount(unit)[1] == np.bincount(unit)[2] == np.bincount(unit)[3]


def test_a_graph_without_modules_is_placed_by_logical_op_or_by_op():
    g = workloads.build("llama_layer", size="tiny")
    names, unit = layer_units(g)
    assert len(names) == len(g.groups) and (unit[g.src] <= unit[g.dst]).all()
    r = workloads.build("random", num_ops=2000, seed=3)
    names, unit = layer_units(r)
    assert len(names) == MAX_UNITS and (unit[r.src] <= unit[r.dst]).all()


@pytest.mark.parametrize("method", ["sequential_fill", "pipeline"])
def test_with_room_to_spare_the_fill_uses_one_device_and_the_pipeline_every_device(method):
    g = workloads.build("llama_model", size="tiny", layers=6)
    a = assign(g, cluster("p100x4"), method)
    order = _unit_devices(g, a)
    assert (np.diff(order) >= 0).all()  # contiguous, in the cluster's order
    assert np.unique(order).tolist() == ([0] if method == "sequential_fill" else [0, 1, 2, 3])


@pytest.mark.parametrize("method", ["sequential_fill", "pipeline"])
def test_each_device_holds_its_units_within_its_budget(method):
    """With memory for about a third of the weights per device, both spread the units in order over the devices
    and every simulated peak is within the budget."""
    g = workloads.build("llama_model", size="small", layers=8)
    need = memory.weight_bytes(g)
    tight = _with_memory("p100x4", need / 2.0 / memory.DEFAULT_MEMORY_FRACTION)
    a = assign(g, tight, method)
    order = _unit_devices(g, a)
    assert (np.diff(order) >= 0).all() and order.max() >= 2
    r = simulate(g, tight, a, trace=True)
    assert (r.peak_memory_bytes <= memory.budget_bytes(tight)).all()
    if method == "sequential_fill":  # each device was full before the next was opened
        res = memory.resident_bytes(g, a.devices, 4)
        assert (res[: order.max()] > 0.6 * memory.budget_bytes(tight)[0]).all()


def test_the_pipeline_balances_compute_time_across_stages():
    g = workloads.build("llama_model", size="small", layers=8)
    c = cluster("p100x4")
    a = assign(g, c, "pipeline")
    compute = c.compute_time_s(g)[np.arange(g.num_ops), a.devices]
    per_stage = np.bincount(a.devices, weights=compute, minlength=4)
    names, unit = layer_units(g)
    even = np.array_split(np.arange(len(names)), 4)  # the split by unit count
    by_count = [compute[np.isin(unit, k)].sum() for k in even]
    assert per_stage.max() <= max(by_count) + 1e-12
    assert per_stage.max() / per_stage.min() < 1.3


@pytest.mark.parametrize("method", ["sequential_fill", "pipeline"])
def test_a_unit_larger_than_any_device_fails_naming_it(method):
    g = workloads.build("llama_model", size="small", layers=4)
    names, unit = layer_units(g)
    one_layer = memory.resident_bytes(g, (unit == 1).astype(np.int64), 2)[1]
    tiny = _with_memory("p100x4", one_layer * 0.5 / memory.DEFAULT_MEMORY_FRACTION * 3)  # total room, not per unit
    with pytest.raises(MethodError) as e:
        assign(g, tiny, method)
    msg = str(e.value)
    assert "\n" not in msg and ("model.layers" in msg or "does not fit" in msg)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), ops=st.integers(2, 400), share=st.floats(0.3, 1.0))
def test_any_graph_gets_a_valid_contiguous_placement_or_a_clear_refusal(seed, ops, share):
    g = workloads.build("random", num_ops=ops, seed=seed)
    c = cluster("unit")
    for method in ("sequential_fill", "pipeline"):
        a = assign(g, c, method)
        names, unit = layer_units(g)
        order = _unit_devices(g, a)
        assert (np.diff(order) >= 0).all()


def test_the_decoder_layers_are_repeats_and_a_changed_layer_is_not():
    g = workloads.build("llama_model", size="tiny", layers=4)
    repeats = repeated_units(g)
    names, unit = layer_units(g)
    assert len(repeats) == 4 and all(set(unit[r]) == {k + 1} for k, r in enumerate(repeats))
    assert repeated_units(workloads.build("llama_model", size="tiny", layers=2)) == []  # fewer than 3
    assert repeated_units(workloads.build("llama_layer", size="tiny")) == []  # no modules
    flops = g.flops.copy()
    flops[repeats[0][5]] *= 2  # one layer costs differently: the other three still repeat
    changed = dataclasses.replace(g, flops=flops)
    assert [r.tolist() for r in repeated_units(changed)] == [r.tolist() for r in repeats[1:]]


def test_a_block_graph_keeps_the_costs_and_the_edges_among_its_ops():
    g = workloads.build("llama_model", size="tiny", layers=3)
    ops = repeated_units(g)[1]
    b = block_graph(g, ops)
    assert b.num_ops == ops.size and np.array_equal(b.flops, g.flops[ops]) and np.array_equal(b.kind, g.kind[ops])
    inside = np.isin(g.src, ops) & np.isin(g.dst, ops)
    assert b.num_edges == int(inside.sum())
    c = cluster("h100x8")  # the roofline charges bytes moved: weights and inputs from outside the block count
    assert np.array_equal(c.compute_time_s(b), c.compute_time_s(g)[ops])


def test_anneal_starts_from_the_repeated_layer_where_that_is_faster():
    """With no search (max_evals 0) anneal returns its start: on a whole model the repeat start, every decoder
    layer placed alike, faster than each cheap method's placement."""
    g = workloads.build("llama_model", size="small", layers=6)
    c = cluster("v100x8")
    a = assign(g, c, "anneal", max_evals=0)
    assert a.info["start_method"] == "repeat"
    repeats = repeated_units(g)
    assert all(np.array_equal(a.devices[ops], a.devices[repeats[0]]) for ops in repeats)
    ms = simulate(g, c, a).makespan_s
    for m in ("critical_path", "heft", "metis"):
        assert ms < simulate(g, c, assign(g, c, m)).makespan_s
    assert assign(g, c, "anneal", max_evals=0, budget_s=5).info["start_method"] != "repeat"  # too short a budget


def test_a_model_of_more_layers_than_units_still_repeats_every_layer():
    """Placing merges units beyond MAX_UNITS; finding the repeats does not."""
    g = workloads.build("llama_model", size="tiny", layers=MAX_UNITS + 4)
    assert len(layer_units(g)[0]) == MAX_UNITS and len(layer_units(g, max_units=None)[0]) == MAX_UNITS + 7
    assert len(repeated_units(g)) == MAX_UNITS + 4
