"""The method registry and the errors of assign()."""

from __future__ import annotations

import numpy as np
import pytest

from doppler.assignment import Assignment
from doppler.methods import METHODS, MethodError, assign, get_method, list_methods, register
from doppler.graph import from_edges
from doppler.hardware import homogeneous


@pytest.fixture
def g():
    return from_edges([1, 2, 3], [(0, 1), (1, 2)], output_bytes=[1, 1, 1])


@pytest.fixture
def c():
    return homogeneous("h", 2, flops_per_s=1.0, bandwidth_Bps=1.0)


def test_unknown_method_lists_known_ones(g, c):
    with pytest.raises(MethodError) as e:
        assign(g, c, "nope")
    msg = str(e.value)
    assert "nope" in msg and "critical_path" in msg and "anneal" in msg
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf"), "x"])
def test_bad_budget(g, c, budget):
    with pytest.raises(MethodError, match="budget"):
        assign(g, c, "anneal", budget_s=budget)


def test_unknown_option(g, c):
    with pytest.raises(MethodError, match="does not accept"):
        assign(g, c, "heft", checkpoint="x.pt")


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
    from doppler.assignment import AssignmentError

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
