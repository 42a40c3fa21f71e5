"""The inputs of an executed graph (doppler.references): refused before anything is allocated when the
machine cannot hold them."""

from __future__ import annotations

import numpy as np
import pytest

from doppler import references, workloads
from doppler.tiling import WorkloadError


def test_inputs_past_their_share_of_the_available_memory_are_refused_before_allocating(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")  # five 16 x 16 inputs: 5,120 bytes as float32, and one
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 12_000.0)  # drawn in float64 first: 2,048
    monkeypatch.setattr(references.np.random, "default_rng", lambda *a, **k: pytest.fail("an input was made"))
    with pytest.raises(WorkloadError, match="making its inputs takes 7,168 bytes as float32, more than 50% of the 12,000"):
        references.make_inputs(graph, dtype=np.float32)
    with pytest.raises(WorkloadError, match="making its inputs takes 12,288 bytes as float64"):
        references.make_inputs(graph, dtype=np.float64)


def test_inputs_within_their_share_are_made(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 14_400.0)
    assert {k: v.shape for k, v in references.make_inputs(graph, dtype=np.float32).items()} == {
        k: (16, 16) for k in "ABCDE"}


def test_the_available_memory_is_a_positive_number_of_bytes() -> None:
    assert 0 < references.available_memory_bytes() < float("inf")


def test_inputs_past_the_fixed_bound_are_refused_whatever_the_machine_holds(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")
    graph.meta["inputs"]["A"] = [30_000, 30_000]  # (3.6 GB as float32, drawn in float64 first: 10.8 GB in all)
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 1e15)
    monkeypatch.setattr(references.np.random, "default_rng", lambda *a, **k: pytest.fail("an input was made"))
    with pytest.raises(WorkloadError, match=f"making its inputs takes 10,800,004,096 bytes as float32, more than the "
                                            f"{references.MAX_INPUT_BYTES:,} doppler makes"):  # fmt: skip
        references.make_inputs(graph, dtype=np.float32)


@pytest.mark.parametrize("workload", ["chainmm", "ffnn", "llama_block", "llama_layer"])
def test_the_layer_sized_workloads_fit_the_fixed_bound_at_their_default_sizes(workload) -> None:
    graph = workloads.build(workload)
    elements = [int(np.prod(s)) for s in graph.meta["inputs"].values()]
    assert sum(elements) * 8 + max(elements) * 8 <= references.MAX_INPUT_BYTES  # (execute --check: float64)
