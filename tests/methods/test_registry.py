"""The method registry: registration, what a method is given, and its options by name."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from doppler.methods import METHODS, MethodError, assign, get_method, list_methods, option, register


def test_unknown_method_lists_known_ones(g, c):
    with pytest.raises(MethodError) as e:
        assign(g, c, "nope")
    msg = str(e.value)
    assert "nope" in msg and "critical_path" in msg and "anneal" in msg
    assert isinstance(e.value, ValueError)


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
