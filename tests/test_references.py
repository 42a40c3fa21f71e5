"""The inputs of an executed graph (doppler.references): refused before anything is allocated when the
machine cannot hold them."""

from __future__ import annotations

import numpy as np
import pytest

from doppler import references, workloads
from doppler.tiling import WorkloadError


def test_inputs_past_their_share_of_the_available_memory_are_refused_before_allocating(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")  # five 16 x 16 inputs: 5,120 bytes as float32
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 10_000.0)
    monkeypatch.setattr(references.np.random, "default_rng", lambda *a, **k: pytest.fail("an input was made"))
    with pytest.raises(WorkloadError, match="its inputs take 5,120 bytes as float32, more than 50% of the 10,000"):
        references.make_inputs(graph, dtype=np.float32)
    with pytest.raises(WorkloadError, match="its inputs take 10,240 bytes as float64"):
        references.make_inputs(graph, dtype=np.float64)


def test_inputs_within_their_share_are_made(monkeypatch) -> None:
    graph = workloads.build("chainmm", size="tiny")
    monkeypatch.setattr(references, "available_memory_bytes", lambda: 11_000.0)
    assert {k: v.shape for k, v in references.make_inputs(graph, dtype=np.float32).items()} == {
        k: (16, 16) for k in "ABCDE"}


def test_the_available_memory_is_a_positive_number_of_bytes() -> None:
    assert 0 < references.available_memory_bytes() < float("inf")
