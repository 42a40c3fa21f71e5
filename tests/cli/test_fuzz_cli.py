"""Fuzzing the command line: corrupted graph, cluster and assignment files and odd option values
through every command must end with exit code 0 or 2 and one clean line, never a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from doppler.cli import app
from doppler.formats import graph_to_json
from doppler.graph import from_edges
from doppler.presets import cluster

runner = CliRunner()

BASE_GRAPH = graph_to_json(from_edges([2.0, 1.0, 3.0, 1.0], [(0, 1), (0, 2), (1, 3), (2, 3)], [4.0, 4.0, 4.0, 4.0],
                                      name="fuzz"))  # fmt: skip
BASE_CLUSTER = cluster("unit:2").to_json()
BASE_ASSIGNMENT = {"assignment": [0, 1, 0, 1], "method": "manual"}

ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5), st.lists(st.integers(-3, 5), max_size=6), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip


def _paths(doc) -> list[tuple]:
    """Every (nested) key path of a JSON document."""
    out: list[tuple] = []

    def walk(node, path):
        out.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (i,))

    walk(doc, ())
    return out


@st.composite
def corrupted(draw, base):
    """``base`` with a few of its values replaced by odd ones, keys deleted, or the text truncated."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(ODD_VALUES)
        except (KeyError, IndexError, TypeError):
            continue
    text = json.dumps(doc, allow_nan=True)
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text


def _check(res) -> None:
    assert res.exit_code in (0, 2), f"exit {res.exit_code}: {res.output[-500:]}"
    assert "Traceback" not in res.output
    if res.exit_code == 2 and "Usage:" not in res.output:  # (a usage error: click names the bad option)
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, res.output


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(graph=corrupted(BASE_GRAPH), assignment=corrupted(BASE_ASSIGNMENT), clus=corrupted(BASE_CLUSTER))
def test_corrupted_files_through_every_command(tmp_path_factory, graph, assignment, clus) -> None:
    d: Path = tmp_path_factory.mktemp("fuzz")
    g, a, c = d / "g.json", d / "a.json", d / "c.json"
    g.write_text(graph)
    a.write_text(assignment)
    c.write_text(clus)
    good_g = d / "good.json"
    good_g.write_text(json.dumps(BASE_GRAPH))
    commands = [
        ["graph", "info", g],
        ["simulate", g, "-c", "unit:2", "-a", a],
        ["simulate", good_g, "-c", c, "-a", a],
        ["simulate", good_g, "-c", "unit:2", "-a", a, "--json"],
        ["assign", g, "-c", c, "-m", "critical_path", "-o", d / "out.json"],
        ["compare", g, "-c", "unit:2", "-m", "round_robin,heft"],
        ["diff", good_g, a, a, "-c", "unit:2"],
        ["execute", good_g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6", "--repeats", "1", "--warmup", "0"],
    ]
    for args in commands:
        _check(runner.invoke(app, [str(x) for x in args]))


@FUZZ
@given(option=st.sampled_from(["--noise", "--seed", "--budget-s", "--repeats", "--timeout", "--devices"]),
       value=st.one_of(st.integers(-(2**40), 2**40).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
                       st.text(max_size=6)))  # fmt: skip
def test_odd_option_values(tmp_path_factory, option, value) -> None:
    d: Path = tmp_path_factory.mktemp("opts")
    g, a = d / "g.json", d / "a.json"
    g.write_text(json.dumps(BASE_GRAPH))
    a.write_text(json.dumps(BASE_ASSIGNMENT))
    per_command = {
        "--noise": ["simulate", g, "-c", "unit:2", "-a", a],
        "--seed": ["simulate", g, "-c", "unit:2", "-a", a],
        "--budget-s": ["compare", g, "-c", "unit:2", "-m", "anneal"],
        "--repeats": ["execute", g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6"],
        "--timeout": ["execute", g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6", "--repeats", "1"],
        "--devices": ["execute", g, "-a", a, "--time-scale", "1e-6", "--repeats", "1"],
    }
    if option == "--budget-s":
        try:
            if float(value) > 0.2:  # keep anneal short
                value = "0.2"
        except ValueError:
            pass
    if option == "--repeats":
        try:
            if float(value) > 3:  # "1e7" or "10000000.0" too: the CLI accepts them as integers
                value = "3"
        except ValueError:
            pass
    if option == "--devices":
        try:
            if float(value) > 8:
                value = "8"
        except ValueError:
            pass
    commands = [per_command[option]]
    if option == "--seed":  # every command that takes a seed
        commands += [["assign", g, "-c", "unit:2", "-m", "random", "-o", d / "r.json"],
                     ["compare", g, "-c", "unit:2", "-m", "random"],
                     ["execute", g, "-a", a, "-c", "unit:2", "--time-scale", "1e-6", "--repeats", "1"]]  # fmt: skip
    for args in commands:
        _check(runner.invoke(app, [str(x) for x in args + [option, value]]))
