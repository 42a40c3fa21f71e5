"""Running methods: assign()'s checks, the errors it names, and compare()."""

from __future__ import annotations

import numpy as np
import pytest

from doppler.ir.assignment import Assignment
from doppler.ir.graph import from_edges
from doppler.hardware.cluster import homogeneous
from doppler.methods import METHODS, MethodError, assign, compare, get_method, list_methods, register


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf"), "x"])
def test_bad_budget(g, c, budget):
    with pytest.raises(MethodError, match="budget"):
        assign(g, c, "anneal", budget_s=budget)


def test_register_and_min_devices(g, c):
    @register("test_two_dev", min_devices=3)
    def fn(graph, cluster, *, seed=0, budget_s=None):
        return np.ones(graph.num_ops, dtype=np.int64)

    try:
        assert "test_two_dev" in list_methods()
        assert get_method("test_two_dev").min_devices == 3
        with pytest.raises(MethodError, match="at least 3 devices"):
            assign(g, c, "test_two_dev")
        big = homogeneous("h", 3, flops_per_s=1.0, bandwidth_Bps=1.0)
        a = assign(g, big, "test_two_dev")
        assert isinstance(a, Assignment) and a.method == "test_two_dev"
        assert a.devices.tolist() == [1, 1, 1]
    finally:
        METHODS.pop("test_two_dev", None)


def test_method_returning_a_bad_assignment_is_caught(g, c):
    from doppler.ir.assignment import AssignmentError

    @register("test_bad")
    def fn(graph, cluster, *, seed=0, budget_s=None):
        return np.full(graph.num_ops, 5)

    try:
        with pytest.raises(AssignmentError):
            assign(g, c, "test_bad")
    finally:
        METHODS.pop("test_bad", None)


def test_assign_is_exported():
    import doppler

    a = doppler.assign(from_edges([1, 1], [(0, 1)]), homogeneous("h", 2, flops_per_s=1.0, bandwidth_Bps=1.0))
    assert a.method == "critical_path"


def test_assign_names_a_graph_that_is_not_one():
    from doppler import cluster
    from doppler.methods import MethodError, assign

    with pytest.raises(MethodError, match="expected a DataflowGraph, got str"):
        assign("g.json", cluster("unit:2"), "heft")


def test_compare_refuses_an_unknown_option_before_any_method_runs(g, c):
    events = []
    with pytest.raises(MethodError, match=r"method 'anneal' has no option 'max_eval' \(its options: max_evals, "):
        compare(g, c, ["heft", "anneal"], method_options={"anneal": {"max_eval": 5}}, on_progress=events.append)
    assert events == []  # (nothing ran)
    rows = compare(g, c, ["heft", "anneal"], method_options={"anneal": {"max_evals": 16, "batch_size": 4}})
    assert [r.method for r in rows] == ["heft", "anneal"]
    assert rows[1].assignment.info["cycle_evals"] == 16  # (a cycle is at most max_evals: the option reached it)


def test_placement_is_the_module_behind_the_package_names():
    from doppler.methods import placement, registry

    assert assign is placement.assign and compare is placement.compare and get_method is registry.get_method
    assert not hasattr(registry, "assign") and not hasattr(registry, "place_within")
