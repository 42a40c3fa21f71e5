"""Fuzzing the cluster and assignment readers (documents corrupted, bytes mutated), all three file kinds
corrupted at once through every command, and odd option values."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from doppler.ir.formats import graph_to_json
from doppler.ir.graph import from_edges
from doppler.hardware.presets import cluster

from tests.fuzz.common import corrupted, fuzz, mutated_bytes, sandbox

BASE_GRAPH = graph_to_json(from_edges([2.0, 1.0, 3.0, 1.0], [(0, 1), (0, 2), (1, 3), (2, 3)], [4.0, 4.0, 4.0, 4.0],
                                      name="fuzz"))  # fmt: skip
#: a homogeneous preset (a default link) and a heterogeneous one (per-kind rates, memory, every link listed)
CLUSTERS = [cluster("unit:2").to_json(), cluster("p100x4").to_json()]
BASE_ASSIGNMENT = {"assignment": [0, 1, 0, 1], "method": "manual"}
ASSIGNMENTS = [BASE_ASSIGNMENT, [0, 1, 1, 0],
               {"assignment": [1, 1, 0, 0], "method": "heft", "graph_fingerprint": None, "assign_time_s": 0.1}]  # fmt: skip


def _through_cluster_commands(box, c) -> None:
    g = box.write("g.json", json.dumps(BASE_GRAPH))
    a = box.write("a.json", json.dumps(BASE_ASSIGNMENT))
    info = box.run("graph", "info", g, "-c", c)
    if info.exit_code == 2:  # a refused cluster file is named (or, valid alone but not with the graph, the cluster)
        assert c.name in info.error_line or "cluster '" in info.error_line, info.error_line
    for args, outputs in [
        (["simulate", g, "-c", c, "-a", a], []),
        (["assign", g, "-c", c, "-m", "heft", "-o", "h.json"], ["h.json"]),
        (["compare", g, "-c", c, "-m", "round_robin,critical_path"], []),
    ]:
        res = box.run(*args, outputs=outputs)
        if info.exit_code == 2:
            assert res.exit_code == 2, args


@fuzz(ci=80)
@given(doc=st.sampled_from(CLUSTERS).flatmap(corrupted))
def test_corrupted_cluster_files(fuzz_base, doc) -> None:
    with sandbox(fuzz_base) as box:
        _through_cluster_commands(box, box.write("c.json", doc))


@fuzz(ci=50)
@given(data=st.sampled_from([json.dumps(c).encode() for c in CLUSTERS]).flatmap(mutated_bytes))
def test_mutated_cluster_bytes(fuzz_base, data) -> None:
    with sandbox(fuzz_base) as box:
        _through_cluster_commands(box, box.write("c.json", data))


def _through_assignment_commands(box, a) -> None:
    g = box.write("g.json", json.dumps(BASE_GRAPH))
    sim = box.run("simulate", g, "-c", "unit:2", "-a", a)
    if sim.exit_code == 2:
        assert a.name in sim.error_line, sim.error_line  # a refused assignment file is named
    for args in (["simulate", g, "-c", "unit:2", "-a", a, "--json", "--ignore-fingerprint"],
                 ["diff", g, a, a, "-c", "unit:2"]):  # fmt: skip
        box.run(*args)


@fuzz(ci=80)
@given(doc=st.sampled_from(ASSIGNMENTS).flatmap(corrupted))
def test_corrupted_assignment_files(fuzz_base, doc) -> None:
    with sandbox(fuzz_base) as box:
        _through_assignment_commands(box, box.write("a.json", doc))


@fuzz(ci=50)
@given(data=st.sampled_from([json.dumps(a).encode() for a in ASSIGNMENTS]).flatmap(mutated_bytes))
def test_mutated_assignment_bytes(fuzz_base, data) -> None:
    with sandbox(fuzz_base) as box:
        _through_assignment_commands(box, box.write("a.json", data))


@fuzz(ci=40, share=0.25)
@given(graph=corrupted(BASE_GRAPH), assignment=corrupted(BASE_ASSIGNMENT), clus=corrupted(CLUSTERS[0]))
def test_corrupted_files_through_every_command(fuzz_base, graph, assignment, clus) -> None:
    with sandbox(fuzz_base) as box:
        g, a, c = box.write("g.json", graph), box.write("a.json", assignment), box.write("c.json", clus)
        good_g = box.write("good.json", json.dumps(BASE_GRAPH))
        commands = [
            ["graph", "info", g],
            ["simulate", g, "-c", "unit:2", "-a", a],
            ["simulate", good_g, "-c", c, "-a", a],
            ["simulate", good_g, "-c", "unit:2", "-a", a, "--json"],
            ["assign", g, "-c", c, "-m", "critical_path", "-o", "out.json"],
            ["compare", g, "-c", "unit:2", "-m", "round_robin,heft"],
            ["diff", good_g, a, a, "-c", "unit:2"],
            ["execute", good_g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6", "--repeats", "1", "--warmup", "0"],
        ]
        for args in commands:
            box.run(*args, outputs=["out.json"])


def _capped(value: str, cap: float) -> str:
    """``value``, or ``cap`` where it is a number above it (the CLI reads "1e7" or "10000000.0" as integers too)."""
    try:
        return str(cap) if float(value) > cap else value
    except ValueError:
        return value


@fuzz(ci=40, share=0.25)
@given(option=st.sampled_from(["--noise", "--seed", "--budget-s", "--repeats", "--timeout", "--devices"]),
       value=st.one_of(st.integers(-(2**40), 2**40).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
                       st.text(max_size=6)))  # fmt: skip
def test_odd_option_values(fuzz_base, option, value) -> None:
    """Option values through the commands that take them; an anneal budget, a repeat count and a device
    count are capped (0.2 s, 3, 8: the values above them are valid and only take longer)."""
    value = _capped(value, {"--budget-s": 0.2, "--repeats": 3, "--devices": 8}.get(option, float("inf")))
    with sandbox(fuzz_base) as box:
        g, a = box.write("g.json", json.dumps(BASE_GRAPH)), box.write("a.json", json.dumps(BASE_ASSIGNMENT))
        per_command = {
            "--noise": ["simulate", g, "-c", "unit:2", "-a", a],
            "--seed": ["simulate", g, "-c", "unit:2", "-a", a],
            "--budget-s": ["compare", g, "-c", "unit:2", "-m", "anneal"],
            "--repeats": ["execute", g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6"],
            "--timeout": ["execute", g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6", "--repeats", "1"],
            "--devices": ["execute", g, "-a", a, "--time-scale", "1e-6", "--repeats", "1"],
        }
        commands = [per_command[option]]
        if option == "--seed":  # every command that takes a seed
            commands += [["assign", g, "-c", "unit:2", "-m", "random", "-o", "r.json"],
                         ["compare", g, "-c", "unit:2", "-m", "random"],
                         ["execute", g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6", "--repeats", "1"]]  # fmt: skip
        for args in commands:
            box.run(*args, option, value, outputs=["r.json"])
