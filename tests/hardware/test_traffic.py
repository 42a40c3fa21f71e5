"""The graph's side of the roofline: bytes each op moves and the number format it computes in, checked
against a direct reading of the op specs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from doppler import workloads
from doppler.ir.graph import GraphError, OpKind, from_edges
from doppler.ir.kernels import DTYPE_BYTES
from doppler.hardware.traffic import op_traffic


def _reference_bytes(g, inputs_only: bool = False) -> list[float]:
    """Per op: its output, every producer's output once, every distinct input slice it names (spec by spec);
    ``inputs_only``: the input slices alone."""
    itemsize = DTYPE_BYTES[g.meta.get("dtype", "float32")]
    out = []
    for v, spec in enumerate(g.specs):
        producers = {int(u) for u in g.pred_idx[g.pred_ptr[v]:g.pred_ptr[v + 1]]}
        slices = set()
        for ref in spec.get("inputs", ()):
            if "input" in ref:
                bounds = tuple(tuple(b) for b in ref["slice"]) if "slice" in ref else tuple(ref["shape"])
                extent = [hi - lo for lo, hi in ref["slice"]] if "slice" in ref else ref["shape"]
                slices.add((ref["input"], bounds, math.prod(extent) * itemsize))
        read = sum(s[2] for s in slices)
        out.append(read if inputs_only else g.output_bytes[v] + sum(g.output_bytes[u] for u in producers) + read)
    return out


@pytest.mark.parametrize("name", ["llama_model", "llama_layer", "ffnn"])
def test_bytes_moved_are_the_operand_slices_read_plus_the_output(name: str) -> None:
    g = workloads.build(name, size="tiny")
    t = op_traffic(g)
    np.testing.assert_allclose(t.bytes_moved, _reference_bytes(g), rtol=1e-12)
    np.testing.assert_allclose(t.input_bytes, _reference_bytes(g, inputs_only=True), rtol=1e-12)
    assert t.input_bytes.any() and (t.input_bytes < t.bytes_moved).all()  # weights are read; every op writes
    assert t.dtype_names == (g.meta["dtype"],) and not t.dtype.any()
    assert not t.bytes_moved.flags.writeable and op_traffic(g) is t  # found once, read-only


def test_weights_count_in_the_bytes_of_the_op_that_reads_them() -> None:
    g = workloads.build("llama_model", size="tiny")
    t = op_traffic(g)
    q = next(v for v, n in enumerate(g.names) if n.startswith("layers.0.q_proj"))
    w = next(ref for ref in g.specs[q]["inputs"] if ref.get("input") == "layers.0.w_q")
    weight = math.prod(hi - lo for lo, hi in w["slice"]) * DTYPE_BYTES[g.meta["dtype"]]
    producers = g.pred_idx[g.pred_ptr[q]:g.pred_ptr[q + 1]]
    assert t.bytes_moved[q] == pytest.approx(weight + g.output_bytes[producers].sum() + g.output_bytes[q])


def test_the_dtype_is_the_specs_else_the_graphs_else_float32() -> None:
    specs = [{"dtype": "bfloat16"}, None, {"kernel": "x"}]
    t = op_traffic(from_edges([1.0, 1.0, 1.0], [], specs=specs, meta={"dtype": "float16"}))
    assert [t.dtype_names[i] for i in t.dtype] == ["bfloat16", "float16", "float16"]
    assert op_traffic(from_edges([1.0], [])).dtype_names == ("float32",) and op_traffic(from_edges([1.0], [])).float32_matmul == "float32"
    assert op_traffic(from_edges([1.0], [], meta={"float32_matmul": "tf32"})).float32_matmul == "tf32"


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        (dict(specs=[{"dtype": 16}]), r"op 0.*spec's dtype must be a string"),
        (dict(meta={"dtype": ["float16"]}), "meta.dtype must be a string"),
        (dict(meta={"float32_matmul": "fast"}), "meta.float32_matmul must be one of float32, tf32"),
    ],
)
def test_a_bad_dtype_is_an_error_naming_the_op_or_key(kwargs: dict, msg: str) -> None:
    with pytest.raises(GraphError, match=msg):
        op_traffic(from_edges([1.0], [], kind=[OpKind.MATMUL], **kwargs))
