"""The inputs of an executed graph (doppler.workloads.references): refused before anything is allocated when the
machine cannot hold them."""

from __future__ import annotations

import numpy as np
import pytest

from doppler.workloads import references
from doppler import workloads
from doppler.workloads.tiling import WorkloadError


def test_inputs_past_their_share_of_the_available_memory_are_refused_before_allocating(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")  # five 16 x 16 inputs: 5,120 bytes as float32, and one
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 12_000.0)  # drawn in float64, scaled: 4,096
    monkeypatch.setattr(references.np.random, "default_rng", lambda *a, **k: pytest.fail("an input was made"))
    with pytest.raises(WorkloadError, match="making its inputs takes 9,216 bytes as float32, more than 50% of the 12,000"):
        references.make_inputs(graph, dtype=np.float32)
    with pytest.raises(WorkloadError, match="making its inputs takes 14,336 bytes as float64"):
        references.make_inputs(graph, dtype=np.float64)


def test_inputs_within_their_share_are_made(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 19_000.0)
    assert {k: v.shape for k, v in references.make_inputs(graph, dtype=np.float32).items()} == {
        k: (16, 16) for k in "ABCDE"}


def test_the_available_memory_is_a_positive_number_of_bytes() -> None:
    assert 0 < references.available_memory_bytes() < float("inf")


def test_inputs_past_the_fixed_bound_are_refused_whatever_the_machine_holds(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")
    graph.meta["inputs"]["A"] = [33_000, 33_000]  # (4.4 GB as float32, and a chunk drawn in float64)
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 1e15)
    monkeypatch.setattr(references.np.random, "default_rng", lambda *a, **k: pytest.fail("an input was made"))
    with pytest.raises(WorkloadError, match=f"making its inputs takes 4,423,112,960 bytes as float32, more than the "
                                            f"{references.MAX_INPUT_BYTES:,} doppler makes"):  # fmt: skip
        references.make_inputs(graph, dtype=np.float32)


@pytest.mark.parametrize("workload", ["chainmm", "ffnn", "llama_block", "llama_layer"])
def test_the_layer_sized_workloads_fit_the_fixed_bound_at_their_default_sizes(workload) -> None:
    graph = workloads.build(workload)
    elements = [int(np.prod(s)) for s in graph.meta["inputs"].values()]
    drawn = min(max(elements), references.DRAW_CHUNK) * 16
    assert sum(elements) * 8 + drawn <= references.MAX_INPUT_BYTES  # (execute --check: float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_inputs_are_drawn_a_chunk_at_a_time_as_one_draw_would_make_them(monkeypatch, dtype) -> None:
    """A chunk of the draw at a time, never a float64 copy of a whole input, and the same numbers as one draw
    of the whole shape."""
    import tracemalloc
    import zlib

    graph = workloads.build("chainmm", size="tiny")
    graph.meta["inputs"]["A"] = [1000, 1000]
    graph.meta["input_init"]["A"] = {"init": "normal", "mean": 0.5, "std": 2.0}
    monkeypatch.setattr(references, "DRAW_CHUNK", 999)  # (not a divisor: the last chunk is short)
    tracemalloc.start()
    try:
        got = references.make_inputs(graph, seed=3, dtype=dtype, names=["A"])["A"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    whole = np.random.default_rng([3, zlib.crc32(b"A")]).standard_normal((1000, 1000))
    assert got.dtype == dtype and np.array_equal(got, (0.5 + whole * 2.0).astype(dtype))
    assert peak < got.nbytes + 1_000_000  # (one draw of the whole in float64 would add 8,000,000 bytes)
