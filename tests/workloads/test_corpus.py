"""The corpus: seeded, inside its stated ranges, and disjoint from the held-out split."""

from __future__ import annotations

import numpy as np
import pytest

from doppler.workloads.corpus import (SHIFTS, TOPOLOGIES, TRAIN_DEVICES, TRAIN_OPS, CorpusError, held_out_split, make_cluster, sample_cluster, sample_graph, sample_pair, shifted_cluster, shifted_validation_split, validation_split)


def _draw(seed: int, k: int):
    rng = np.random.default_rng(seed)
    return [sample_pair(rng) for _ in range(k)]


def test_same_seed_same_pairs_and_other_seed_other_pairs():
    a, b, c = _draw(3, 6), _draw(3, 6), _draw(4, 6)
    assert [g.fingerprint() for g, _ in a] == [g.fingerprint() for g, _ in b]
    assert [cl.to_json() for _, cl in a] == [cl.to_json() for _, cl in b]
    assert [g.fingerprint() for g, _ in a] != [g.fingerprint() for g, _ in c]


def test_training_pairs_stay_in_range_and_out_of_the_held_out_split():
    pairs = _draw(0, 120)
    families = {g.name for g, _ in pairs}
    assert "llama_layer" not in families
    assert {"chainmm", "ffnn", "llama_block", "random"} <= families
    for g, cl in pairs:
        assert TRAIN_OPS[0] <= g.num_ops <= TRAIN_OPS[1]
        assert TRAIN_DEVICES[0] <= cl.num_devices <= TRAIN_DEVICES[1]
        rates = {d.flops_per_s for d in cl.devices}
        assert len(rates) <= 2  # mixes of at most two speeds; three are held out
        assert cl.name not in ("v100x8", "h100x8")
        h100_like = cl.name.startswith("h100") and cl.meta["topology"] == "all_to_all" and len(rates) == 1
        assert not h100_like  # h100x8's NVSwitch all-to-all is held out
    topologies = {cl.meta["topology"] for _, cl in pairs}
    assert topologies == {"all_to_all", "ring", "two_nodes", "partial_mesh"}
    assert any(len({d.flops_per_s for d in cl.devices}) == 2 for _, cl in pairs)


def test_topologies_shape_the_links():
    rng = np.random.default_rng(0)
    ring = make_cluster("r", [1e12] * 6, 1e11, 10e9, 1e-6, "ring", rng)
    assert ring.bandwidth_Bps[0, 1] == pytest.approx(10e9) and ring.bandwidth_Bps[0, 3] == pytest.approx(10e9 / 3)
    two = make_cluster("t", [1e12] * 4, 1e11, 10e9, 1e-6, "two_nodes", rng, slow_factor=0.1)
    assert two.bandwidth_Bps[0, 1] == pytest.approx(10e9) and two.bandwidth_Bps[0, 2] == pytest.approx(1e9)
    # NVLink-style partial meshes: every GPU has a fast link; pairs have one or two links (as in a
    # DGX-1), or go over the slow path
    speeds = set()
    for seed in range(20):
        mesh = make_cluster("m", [1e12] * 8, 1e11, 10e9, 1e-6, "partial_mesh", np.random.default_rng(seed),
                            slow_factor=0.1)  # fmt: skip
        off = mesh.bandwidth_Bps[~np.eye(8, dtype=bool)]
        speeds |= {round(float(b) / 1e9, 6) for b in off}
        assert (mesh.bandwidth_Bps >= 10e9 - 1).sum(axis=1).min() >= 1
        np.testing.assert_array_equal(mesh.bandwidth_Bps, mesh.bandwidth_Bps.T)
    assert speeds == {1.0, 10.0, 20.0}
    with pytest.raises(CorpusError, match="topology"):
        make_cluster("x", [1e12] * 4, 1e11, 10e9, 1e-6, "torus", rng)


def test_held_out_split_covers_what_it_claims():
    cases = held_out_split()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    assert any(c.graph.name == "llama_layer" for c in cases)
    assert any(c.graph.num_ops > TRAIN_OPS[1] for c in cases)
    assert any(c.cluster.num_devices > TRAIN_DEVICES[1] for c in cases)
    assert any(len({d.flops_per_s for d in c.cluster.devices}) == 3 for c in cases)
    assert {"v100x8", "h100x8"} <= {c.cluster.name for c in cases}


def test_sample_graph_reports_impossible_ranges():
    with pytest.raises(CorpusError, match="no graph"):
        sample_graph(np.random.default_rng(0), families=("chainmm",), ops=(5, 6))
    with pytest.raises(CorpusError, match="unknown graph family"):
        sample_graph(np.random.default_rng(0), families=("resnet",))
    assert sample_cluster(np.random.default_rng(1), devices=(3, 3)).num_devices == 3


def test_shifted_validation_is_outside_training_and_the_held_out_split():
    cases = shifted_validation_split(k=24)
    assert [c.name for c in cases] == [c.name for c in shifted_validation_split(k=24)]  # seeded
    held = {c.cluster.name for c in held_out_split()}
    training_like = 0
    for c in cases:
        g, cl = c.graph, c.cluster
        assert TRAIN_OPS[0] <= g.num_ops <= TRAIN_OPS[1] and g.name != "llama_layer"  # training graphs
        assert cl.name not in held and cl.num_devices != 32
        rates = {d.flops_per_s for d in cl.devices}
        shifted = (cl.num_devices > TRAIN_DEVICES[1], cl.meta["topology"] not in TOPOLOGIES, len(rates) >= 3)
        training_like += not any(shifted)
        if "devices" in c.why:
            assert 17 <= cl.num_devices <= 24 and not (cl.name.startswith("h100") and cl.meta["topology"] == "all_to_all")
    assert training_like == 0
    assert {c.why for c in cases} == {f"shifted validation ({s})" for s in SHIFTS}
    assert not {c.name for c in cases} & {c.name for c in validation_split(k=40)}


def test_four_nodes_is_never_drawn_in_training_and_shapes_the_links():
    rng = np.random.default_rng(5)
    assert all(sample_cluster(rng).meta["topology"] in TOPOLOGIES for _ in range(200))
    four = make_cluster("f", [1e12] * 8, 1e11, 10e9, 1e-6, "four_nodes", rng, slow_factor=0.1)
    assert four.bandwidth_Bps[0, 1] == pytest.approx(10e9) and four.bandwidth_Bps[1, 2] == pytest.approx(1e9)
    with pytest.raises(CorpusError, match="unknown shift"):
        shifted_cluster(rng, "bigger")
