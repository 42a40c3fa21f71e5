"""The tiling machinery: TileBuilder's checks (the workloads built with it: test_workloads.py)."""

from __future__ import annotations

import pytest

from doppler.tiling import TileBuilder, WorkloadError


def test_tile_builder_checks_shapes_and_letters():
    b = TileBuilder("custom")
    with pytest.raises(WorkloadError, match=r"custom: tensor 'A' axis 1: 3 blocks do not divide size 8"):
        b.input("A", (4, 8), (2, 3))
    A = b.input("A", (4, 8), (2, 2))
    B = b.input("B", (8, 6), (4, 1))
    with pytest.raises(WorkloadError, match=r"mm: letter 'k' is size 8 in 2 blocks in 'A' but size 8 in 4 blocks in 'B'"):
        b.contract("ik,kj->ij", A, B, name="mm")
    C = b.input("C", (8, 6), (2, 3))
    out = b.contract("ik,kj->ij", A, C, name="mm2")
    assert out.grid == (2, 3) and out.shape == (4, 6)
    assert len(b.flops) == 2 * 3 * 2 + 2 * 3  # partials + aggregations
    with pytest.raises(WorkloadError, match="two logical ops are named 'mm2'"):
        b.contract("ik,kj->ij", A, C, name="mm2")
    with pytest.raises(WorkloadError, match="must lie inside one block"):
        b.select(out, [(1, 3), None], name="bad_select")
