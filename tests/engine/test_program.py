"""engine/program.py directly: operands and input tiles, placement copies, transfers, synthetic kernels."""

from __future__ import annotations

import numpy as np
import pytest

from doppler import workloads
from doppler.workloads import references
from doppler.engine.program import MAX_SYNTHETIC_OUTPUT_BYTES, EngineError, Operand, build_program
from doppler.ir.graph import DataflowGraph, from_edges
from doppler.hardware.cluster import homogeneous


def test_real_kernels_in_topological_order_reproduce_the_workload():
    g = workloads.build("chainmm", size="tiny")
    inputs = references.make_inputs(g, seed=4, dtype=np.float64)
    prog = build_program(g, inputs=inputs, dtype=np.float64)
    assert not prog.is_synthetic and len(prog.operands) == g.num_ops
    for v in range(g.num_ops):  # op operands are exactly the spec's op inputs, in order
        want = [ref["op"] for ref in g.specs[v]["inputs"] if "op" in ref]
        assert [o.op for o in prog.operands[v] if o.op >= 0] == want
    # one tile per distinct (input, slice): every tile operand points at a distinct slice
    refs = {(ref["input"], repr(ref.get("slice"))) for s in g.specs for ref in s["inputs"] if "input" in ref}
    assert len(prog.tiles) == len(refs)
    values: list[np.ndarray | None] = [None] * g.num_ops
    for v in np.argsort(g.level, kind="stable"):  # by topological level: inputs first
        args = [values[o.op] if o.op >= 0 else prog.tiles[o.tile] for o in prog.operands[v]]
        values[v] = prog.kernel(v, 0, args)
        assert values[v].shape == prog.output_template(v)[0]
    got = references.assemble_outputs(g, values)
    for name, ref in workloads.reference(g, inputs).items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-10)


def test_place_copies_each_tile_once_per_device_and_lists_transfers():
    g = workloads.build("chainmm", size="tiny")
    prog = build_program(g)
    devices = np.arange(g.num_ops) % 2
    placed = prog.place(devices, 2)
    seen: dict[tuple[int, int], np.ndarray] = {}
    for v, row in enumerate(placed.tile_operands):
        for o, arr in zip(prog.operands[v], row):
            if o.tile < 0:
                assert arr is None
                continue
            key = (o.tile, int(devices[v]))
            assert seen.setdefault(key, arr) is arr  # one copy per (tile, device), shared by its ops
            assert arr is not prog.tiles[o.tile] and np.array_equal(arr, prog.tiles[o.tile])
    assert len({id(a) for a in seen.values()}) == len(seen)
    # a transfer per (producer, remote consumer device), never to the producer's own device
    want = sorted({(u, int(devices[w])) for u in range(g.num_ops) for w in g.successors(u) if devices[w] != devices[u]})
    assert placed.transfers() == want and all(devices[u] != d for u, d in want)
    assert prog.place(np.zeros(g.num_ops, np.int64), 2).transfers() == []


def test_synthetic_kernels_are_sized_to_the_cluster_and_write_real_bytes():
    g = from_edges([2.0, 4.0, 6.0], [(0, 1), (1, 2)], output_bytes=[3, 5, 0])
    cl = homogeneous("h", 2, flops_per_s=1e3, bandwidth_Bps=1.0)
    prog = build_program(g, cluster=cl, time_scale=0.5)
    assert prog.is_synthetic
    np.testing.assert_allclose(prog.synthetic_s, cl.compute_time_s(g) * 0.5)
    assert prog.operands == [[], [Operand(op=0)], [Operand(op=1)]]
    out = prog.kernel(1, 0, [np.zeros(3, np.uint8)])
    assert out.dtype == np.uint8 and out.tolist() == [1] * 5  # filled with the op id
    assert prog.output_template(0) == ((3,), np.uint8)


@pytest.mark.parametrize(
    ("make", "kw", "match"),
    [
        (lambda: from_edges([1.0], []), {}, "no op specs"),
        (lambda: from_edges([1.0], []), {"time_scale": -1.0}, "time_scale"),
        (lambda: from_edges([1.0], []), {"time_scale": float("nan")}, "time_scale"),
        (lambda: from_edges([1.0], [], output_bytes=[MAX_SYNTHETIC_OUTPUT_BYTES + 1]), {}, "synthetic-kernel limit"),
    ],
)
def test_cost_only_graphs_refuse_what_they_cannot_run(make, kw, match):
    cl = None if match == "no op specs" else homogeneous("h", 1, flops_per_s=1.0, bandwidth_Bps=1.0)
    with pytest.raises(EngineError, match=match):
        build_program(make(), cluster=cl, **kw)


def test_spec_graphs_refuse_missing_inputs_and_unspecified_ops():
    g = workloads.build("chainmm", size="tiny")
    inputs = references.make_inputs(g, seed=0)
    name = next(iter(inputs))
    with pytest.raises(EngineError, match=f"input tensor '{name}' was not provided"):
        build_program(g, inputs={k: v for k, v in inputs.items() if k != name})
    specs = list(g.specs)
    specs[3] = None
    half = DataflowGraph.from_arrays(g.flops, g.output_bytes, g.src, g.dst, specs=specs, meta=g.meta)
    with pytest.raises(EngineError, match="has no spec"):
        build_program(half, inputs=inputs)
    with pytest.raises(EngineError, match="dtype"):
        build_program(g, dtype=np.int32)


@pytest.mark.parametrize("ref, match", [
    ("not a predecessor", "operand op .* is not one of its predecessors"),
    (999, "operand op 999 is not one of its predecessors"),
    (True, "operand op True is not one of its predecessors"),
    ({"op": 0, "input": "x"}, "must name exactly one of an op or an input"),
])  # fmt: skip
def test_an_operand_that_no_edge_delivers_is_refused_before_any_run(ref, match):
    g = workloads.build("chainmm", size="tiny")
    v = next(v for v in range(g.num_ops) if any("op" in r for r in g.specs[v]["inputs"]))
    k = next(i for i, r in enumerate(g.specs[v]["inputs"]) if "op" in r)
    if ref == "not a predecessor":  # an op that exists, but sends nothing to v
        preds = set(g.predecessors(v).tolist())
        ref = next(u for u in range(g.num_ops) if u not in preds and u != v)
    specs = [dict(s) for s in g.specs]
    specs[v]["inputs"] = [dict(r) for r in specs[v]["inputs"]]
    specs[v]["inputs"][k] = ref if isinstance(ref, dict) else {**specs[v]["inputs"][k], "op": ref}
    bad = DataflowGraph.from_arrays(g.flops, g.output_bytes, g.src, g.dst, specs=specs, meta=g.meta)
    with pytest.raises(EngineError, match=match):
        build_program(bad)
