"""The method registry and the errors of assign()."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from doppler.assignment import Assignment
from doppler.methods import METHODS, MethodError, assign, get_method, list_methods, option, register
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


def test_unknown_option_is_refused_by_name_before_the_method_runs(g, c):
    with pytest.raises(MethodError, match=r"method 'heft' has no option 'checkpoint' \(it takes no options\)"):
        assign(g, c, "heft", checkpoint="x.pt")
    calls = []

    @dataclass(frozen=True)
    class Opts:
        depth: int = option(2, "how deep")
        wide: bool = option(False, "how wide")

    @register("test_opts", options=Opts)
    def fn(graph, cluster, options):
        calls.append(options)
        return np.zeros(graph.num_ops, dtype=np.int64)

    try:
        with pytest.raises(MethodError, match=r"method 'test_opts' has no option 'deep' \(its options: depth, wide\)"):
            assign(g, c, "test_opts", deep=3)
        assert calls == []  # refused before it ran
        assign(g, c, "test_opts", depth=3)
        assign(g, c, "test_opts", options=Opts(wide=True), depth=4)  # an instance, with values by name on top
        assert calls == [Opts(depth=3), Opts(depth=4, wide=True)]
        with pytest.raises(MethodError, match="takes Opts, got AnnealOptions"):
            from doppler.methods.anneal import AnnealOptions

            assign(g, c, "test_opts", options=AnnealOptions())
    finally:
        METHODS.pop("test_opts", None)


def test_a_method_is_given_only_what_its_signature_asks_for(g, c):
    """The registry reads the call's arguments a method takes from its signature, once, at registration."""
    seen = {}

    @register("test_seed_only")
    def seeded(graph, cluster, *, seed):
        seen["seeded"] = seed
        return np.zeros(graph.num_ops, dtype=np.int64)

    @register("test_bare")
    def bare(graph, cluster):
        seen["bare"] = True
        return np.zeros(graph.num_ops, dtype=np.int64)

    try:
        assert get_method("test_seed_only").takes == {"seed"} and not get_method("test_seed_only").uses_budget
        assert get_method("test_bare").takes == frozenset()
        assign(g, c, "test_seed_only", seed=5, budget_s=1.0, on_progress=print)
        assign(g, c, "test_bare", seed=5, budget_s=1.0)
        assert seen == {"seeded": 5, "bare": True}
    finally:
        METHODS.pop("test_seed_only", None)
        METHODS.pop("test_bare", None)


def test_register_refuses_a_signature_that_does_not_fit():
    @dataclass
    class Loose:
        x: int = 1

    with pytest.raises(TypeError, match="memory-aware but takes no memory_budget_bytes"):
        register("test_x", memory_aware=True)(lambda graph, cluster: None)
    with pytest.raises(TypeError, match="go together"):
        register("test_x")(lambda graph, cluster, options: None)
    with pytest.raises(TypeError, match="frozen dataclass"):
        register("test_x", options=Loose)(lambda graph, cluster, options: None)
    assert "test_x" not in METHODS


def test_every_builtin_asks_for_what_it_uses():
    """Methods that ignore the seed or the time budget do not take them; the searches do."""
    assert {m for m in list_methods() if get_method(m).uses_budget} >= {"anneal", "heft_lookahead", "doppler"}
    for m in ("single", "round_robin", "critical_path", "heft", "lookahead", "enumerative", "pipeline"):
        assert not get_method(m).takes & {"seed", "budget_s"}, m
    assert get_method("random").takes == {"seed"} and "seed" in get_method("metis").takes
    assert get_method("heft").options is None and get_method("heft").option_names() == []
    assert "max_evals" in get_method("anneal").option_names() and get_method("tp_pipeline").option_names() == ["tp"]


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
