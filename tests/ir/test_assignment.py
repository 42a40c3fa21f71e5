"""Assignment files and validation against a graph and a device count."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from doppler.ir.assignment import Assignment, AssignmentError, check_assignment, load_assignment, save_assignment
from doppler.ir.graph import from_edges


@pytest.fixture
def graph():
    return from_edges([1, 2, 3], [(0, 1), (1, 2)], [1, 1, 1], names=["x", "y", "z"])


def test_save_and_load_round_trip(tmp_path: Path, graph) -> None:
    a = Assignment(devices=[0, 1, 1], method="heft", graph_fingerprint=graph.fingerprint())
    save_assignment(a, tmp_path / "a.json")
    back = load_assignment(tmp_path / "a.json", graph)
    assert back.devices.tolist() == [0, 1, 1] and back.method == "heft"


def test_bare_list_is_accepted(tmp_path: Path, graph) -> None:
    (tmp_path / "a.json").write_text("[2, 0, 1]")
    assert load_assignment(tmp_path / "a.json", graph).devices.tolist() == [2, 0, 1]


@pytest.mark.parametrize(
    "content, pattern",
    [
        ("[0, 1]", "has 2 entries but graph 'graph' has 3 ops"),
        ('[0, "a", 1]', r"entry 1 \(op 1\) is 'a', not a device index"),
        ("[0, 1.5, 1]", "non-integer device"),
        ('{"devices": [0, 1, 2]}', 'an object with an "assignment" list'),
        ("[0, 1", "not valid JSON"),
        ('{"assignment": [0, 0, 0], "graph_fingerprint": "abc"}', "made for a different graph"),
        # (found by tests/fuzz: a fingerprint was shown as it was, a list or "\u2028" breaking the error line)
        ('{"assignment": [0, 0, 0], "graph_fingerprint": [1]}', "graph_fingerprint must be a string .or null., got list"),
        ('{"assignment": [0, 0, 0], "graph_fingerprint": "\\u2028"}', r"\(fingerprint '\\u2028', this graph is"),
    ],
)
def test_bad_files(tmp_path: Path, graph, content: str, pattern: str) -> None:
    p = tmp_path / "a.json"
    p.write_text(content)
    with pytest.raises(AssignmentError, match=pattern) as info:
        load_assignment(p, graph)
    assert str(p) in str(info.value)


def test_check_names_the_op_and_the_device_range(graph) -> None:
    with pytest.raises(AssignmentError, match=r"op 2 \('z'\) is assigned to device 4, but the cluster has devices 0..3"):
        check_assignment(graph, np.array([0, 1, 4]), 4)
    with pytest.raises(AssignmentError, match="op 0 .* device -1"):
        check_assignment(graph, np.array([-1, 1, 1]), 4)
    assert check_assignment(graph, [3, 2, 1], 4).tolist() == [3, 2, 1]


def test_saved_file_is_plain_json(tmp_path: Path) -> None:
    save_assignment(Assignment(devices=np.array([1, 0]), method="m"), tmp_path / "a.json")
    obj = json.loads((tmp_path / "a.json").read_text())
    assert obj["assignment"] == [1, 0] and obj["method"] == "m"


def test_readme_python_api() -> None:
    """The Python API exactly as docs/overview.md shows it."""
    import doppler

    g = doppler.workloads.build("ffnn", size="tiny")
    c = doppler.cluster("p100x4")
    a = doppler.assign(g, c, method="critical_path")
    assert isinstance(a.devices, np.ndarray) and a.devices.shape == (g.num_ops,)
    r = doppler.simulate(g, c, a, mode="wc")
    assert r.makespan_s >= doppler.lower_bound(g, c) > 0


def test_readme_training_api(tmp_path) -> None:
    """The DOPPLER lines of the Python API in docs/overview.md (smaller budgets)."""
    import doppler
    from doppler.train import Trainer, TrainConfig

    g = doppler.workloads.build("ffnn", size="tiny")
    c = doppler.cluster("p100x4")
    Trainer.create([g], c, TrainConfig(episodes=16, il_episodes=8, distill_updates=2)).run(tmp_path / "g")
    a = doppler.assign(g, c, method="doppler", checkpoint=tmp_path / "g" / "checkpoint.pt")
    assert a.method == "doppler" and a.devices.shape == (g.num_ops,)


def test_an_assignment_array_that_a_cast_would_rewrite_is_refused() -> None:
    import doppler
    from doppler.ir.assignment import Assignment, AssignmentError
    from doppler.sim import simulate

    g, c = doppler.workloads.build("ffnn", size="tiny"), doppler.cluster("p100x4")
    n = g.num_ops
    for bad, match in [(np.zeros((2, n // 2), np.int64), "1-D list of device indices, got shape"),
                       (np.full(n, 2**63, np.uint64), "not a device index")]:  # fmt: skip
        with pytest.raises(AssignmentError, match=match):
            simulate(g, c, bad)
    for bad, match in [(np.full(n, 0.9), "non-integer device 0.9"), (["a"] * n, "got text"),
                       ([[0], [0, 1]], "ragged or mixed")]:  # fmt: skip
        with pytest.raises(AssignmentError, match=match):
            Assignment(bad)


def test_an_assignment_made_for_another_graph_is_refused_unless_its_devices_are_given() -> None:
    import doppler
    from doppler.ir.assignment import AssignmentError
    from doppler.sim import simulate

    c = doppler.cluster("p100x4")
    g1 = doppler.workloads.build("random", num_ops=40, seed=1)
    g2 = doppler.workloads.build("random", num_ops=40, seed=2)  # as many ops, other costs
    a1 = doppler.assign(g1, c, "heft")
    assert simulate(g1, c, a1).makespan_s > 0
    with pytest.raises(AssignmentError, match="made for another graph"):
        simulate(g2, c, a1)
    assert simulate(g2, c, a1.devices).makespan_s > 0


def test_load_checks_the_device_range_without_a_graph_too(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    p.write_text("[0, 9]")
    assert load_assignment(p).devices.tolist() == [0, 9]
    with pytest.raises(AssignmentError, match="a.json: op 1 is assigned to device 9, but the cluster has devices 0..3"):
        load_assignment(p, num_devices=4)
