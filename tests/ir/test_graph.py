"""The IR: validation errors, topological levels, b/t-levels, critical path, fingerprint."""

from __future__ import annotations

import warnings

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler.ir.analysis import b_level, critical_path, edge_comm_from_ops, t_level
from doppler.ir.graph import DataflowGraph, GraphError, OpKind, TileLayout, from_edges


@st.composite
def random_dags(draw, max_ops: int = 30):
    """A random DAG: edges only go from lower to higher op ids, then ids are permuted."""
    n = draw(st.integers(1, max_ops))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=3 * n)) if pairs else []
    perm = draw(st.permutations(range(n)))
    edges = [(perm[i], perm[j]) for i, j in edges]
    flops = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    out_bytes = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    return from_edges(flops, edges, out_bytes)


def _nx(graph: DataflowGraph, comm: np.ndarray | None = None) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(graph.num_ops))
    for e, (u, v) in enumerate(zip(graph.src.tolist(), graph.dst.tolist())):
        g.add_edge(u, v, comm=0.0 if comm is None else float(comm[e]))
    return g


def _longest_to_exit(graph: DataflowGraph, comm: np.ndarray) -> np.ndarray:
    g = _nx(graph, comm)
    out = np.zeros(graph.num_ops)
    for v in reversed(list(nx.topological_sort(g))):
        best = max((g.edges[v, s]["comm"] + out[s] for s in g.successors(v)), default=0.0)
        out[v] = graph.flops[v] + best
    return out


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_levels_match_networkx(graph: DataflowGraph) -> None:
    g = _nx(graph)
    order = graph.topo_order.tolist()
    assert sorted(order) == list(range(graph.num_ops))
    position = {v: i for i, v in enumerate(order)}
    for u, v in g.edges:
        assert position[u] < position[v]
        assert graph.level[u] < graph.level[v]
    assert graph.depth == nx.dag_longest_path_length(g) + 1


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_b_and_t_levels_are_longest_paths(graph: DataflowGraph) -> None:
    comm = edge_comm_from_ops(graph, graph.output_bytes)
    b = b_level(graph, comm_s=comm)
    assert np.allclose(b, _longest_to_exit(graph, comm))
    t = t_level(graph, comm_s=comm)
    # t-level + b-level of every op is at most the critical path, with equality on it
    cp_len = b.max()
    assert np.all(t + b <= cp_len + 1e-9)
    path = critical_path(graph, comm_s=comm)
    assert graph.in_degree()[path[0]] == 0 and graph.out_degree()[path[-1]] == 0
    length = graph.flops[path].sum() + sum(
        comm[np.flatnonzero((graph.src == u) & (graph.dst == v))[0]] for u, v in zip(path, path[1:])
    )
    assert length == pytest.approx(cp_len)
    assert np.allclose(t[path] + b[path], cp_len)


def test_small_example_by_hand() -> None:
    # 0 -> 1 -> 3, 0 -> 2 -> 3 with compute 1,2,3,4 and each output costing 1 to move
    g = from_edges([1, 2, 3, 4], [(0, 1), (0, 2), (1, 3), (2, 3)], [1, 1, 1, 1])
    comm = edge_comm_from_ops(g, g.output_bytes)
    assert b_level(g).tolist() == [8, 6, 7, 4]
    assert b_level(g, comm_s=comm).tolist() == [10, 7, 8, 4]
    assert t_level(g, comm_s=comm).tolist() == [0, 2, 2, 6]
    assert critical_path(g, comm_s=comm) == [0, 2, 3]
    assert g.depth == 3


def test_cycle_error_names_ops_on_the_cycle() -> None:
    with pytest.raises(GraphError, match=r"cycle: 1 -> 2 -> 3 -> 1"):
        from_edges([1] * 5, [(0, 1), (1, 2), (2, 3), (3, 1), (3, 4)])


def test_cycle_error_uses_op_names() -> None:
    with pytest.raises(GraphError, match="'b'"):
        from_edges([1] * 3, [(0, 1), (1, 2), (2, 1)], names=["a", "b", "c"])


@pytest.mark.parametrize(
    "flops, edges, pattern",
    [
        ([], [], "empty"),
        ([1, 1], [(0, 2)], r"edge 0 \(0 -> 2\) refers to an unknown op"),
        ([1, 1], [(1, 1)], "self-loop on op 1"),
        ([1, float("nan")], [], "op 1 has invalid flops nan"),
        ([1, -3], [], "op 1 has invalid flops -3"),
        ([float("inf"), 1], [], "op 0 has invalid flops inf"),
    ],
)
def test_invalid_graphs(flops, edges, pattern) -> None:
    with pytest.raises(GraphError, match=pattern):
        from_edges(flops, edges)


def test_negative_bytes_and_bad_kind() -> None:
    with pytest.raises(GraphError, match="op 0 has invalid output_bytes"):
        from_edges([1], [], [-1])
    with pytest.raises(GraphError, match="unknown kind code 99"):
        from_edges([1], [], kind=[99])


def test_duplicate_edges_are_merged_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="merged 2 duplicate"):
        g = from_edges([1, 1, 1], [(0, 1), (1, 2), (0, 1), (0, 1)])
    assert g.num_edges == 2
    assert g.src.tolist() == [0, 1] and g.dst.tolist() == [1, 2]
    # the first occurrence is kept, in insertion order (not sorted by endpoint)
    with pytest.warns(UserWarning, match="merged 1 duplicate"):
        g = from_edges([1, 1, 1], [(1, 2), (0, 1), (1, 2)])
    assert g.src.tolist() == [1, 0] and g.dst.tolist() == [2, 1]


def test_fingerprint_is_stable_and_content_sensitive() -> None:
    g1 = from_edges([1, 2, 3], [(0, 1), (1, 2)], [4, 5, 6], names=["a", "b", "c"])
    g2 = from_edges([1, 2, 3], [(1, 2), (0, 1)], [4, 5, 6])  # same content, other edge order, no names
    assert g1.fingerprint() == g2.fingerprint()
    g3 = from_edges([1, 2, 3.5], [(0, 1), (1, 2)], [4, 5, 6])
    g4 = from_edges([1, 2, 3], [(0, 1), (0, 2)], [4, 5, 6])
    assert len({g1.fingerprint(), g3.fingerprint(), g4.fingerprint()}) == 3


def test_op_kinds_parse_and_label() -> None:
    assert OpKind.parse("Matmul") is OpKind.MATMUL
    assert OpKind.MASK_FILL.label == "mask_fill"
    with pytest.raises(GraphError, match="unknown op kind 'conv'"):
        OpKind.parse("conv")


def test_large_random_graph_builds() -> None:
    rng = np.random.default_rng(0)
    n = 20000
    src = rng.integers(0, n - 1, 3 * n)
    dst = np.minimum(src + 1 + rng.integers(0, 100, 3 * n), n - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = DataflowGraph.from_arrays(rng.random(n), rng.random(n), src, dst)
    b = b_level(g)
    # every edge respects b-level monotonicity: b(u) >= flops(u) + b(v)
    assert np.all(b[g.src] >= g.flops[g.src] + b[g.dst] - 1e-9)


def test_fingerprint_survives_json_text_json_and_legacy_ones_still_match(tmp_path) -> None:
    from doppler import workloads
    from doppler.ir.formats import load_graph, save_graph

    g = workloads.build("ffnn", size="tiny")
    save_graph(g, tmp_path / "g.txt")
    back = load_graph(tmp_path / "g.txt")
    save_graph(back, tmp_path / "g.json")
    again = load_graph(tmp_path / "g.json")
    assert back.kind_labels() != g.kind_labels()  # the text format's optypes are coarser than our kinds ...
    assert again.fingerprint() == g.fingerprint()  # ... and the fingerprint does not depend on them
    assert g.matches_fingerprint(g.legacy_fingerprint()) and not again.matches_fingerprint(g.legacy_fingerprint())
    assert not g.matches_fingerprint("0" * 16)


@pytest.mark.parametrize("kw, match", [
    (dict(src=[0.5]), "src must hold whole numbers, got 0.5"),
    (dict(kind=np.array([257, 1])), "kind holds 257, outside 0..127"),
    (dict(tiles=TileLayout(group=np.array([2**32 - 1, -1]))), "group holds 4294967295"),
    (dict(flops=[[1, 2], [3, 4]], output_bytes=[1, 1, 1, 1]), "flops must be a 1-D array"),
    (dict(src=[[0]], dst=[[1]]), "src must be a 1-D array"),
    (dict(flops=["a", 2]), "flops must hold numbers"),
    (dict(src=[2**63]), "src holds 9223372036854775808, outside"),
    (dict(names=[1, 2]), "names must be strings: op 0's is 1"),
])  # fmt: skip
def test_from_arrays_refuses_what_a_cast_would_rewrite(kw, match) -> None:
    args = dict(flops=[1.0, 1.0], output_bytes=[1.0, 1.0], src=[0], dst=[1]) | kw
    with pytest.raises(GraphError, match=match):
        DataflowGraph.from_arrays(**args)


@pytest.mark.parametrize("seed", [0, 1])
def test_deep_graphs_compiled_level_passes_match_the_vectorised_ones(monkeypatch, seed) -> None:
    from doppler.ir import graph as graph_module
    from doppler import workloads

    def passes(g):
        comm = np.random.default_rng(seed).random(g.num_edges)
        return (g.topo_order, g.level, b_level(g), b_level(g, comm_s=comm), t_level(g, comm_s=comm),
                np.array(critical_path(g, comm_s=comm)))  # fmt: skip

    build = dict(num_ops=3000, width=4, max_fan_in=3, seed=seed)
    vectorised = passes(workloads.build("random", **build))
    monkeypatch.setattr(graph_module, "DEEP_MIN_OPS", 1)  # every graph runs the compiled passes
    monkeypatch.setattr(graph_module, "DEEP_LEVELS", 0)
    g = workloads.build("random", **build)
    assert g.deep
    for a, b in zip(vectorised, passes(g)):
        assert np.array_equal(a, b)  # the same order and the same sums, bit for bit
    with pytest.raises(GraphError, match="cycle"):
        from_edges([1, 1, 1], [(0, 1), (1, 2), (2, 1)])
