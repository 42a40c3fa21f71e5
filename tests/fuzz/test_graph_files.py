"""Fuzzing the graph readers: native JSON graphs (their documents corrupted, their bytes mutated) and the
DOPPLER text format (its lines and tokens edited, its bytes mutated), through every command that reads
a graph file."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from doppler import workloads
from doppler.ir.formats import graph_to_json
from doppler.ir.graph import from_edges

from tests.fuzz.common import corrupted, fuzz, mutated_bytes, sandbox

SMALL_GRAPH = graph_to_json(from_edges([2.0, 1.0, 3.0, 1.0], [(0, 1), (0, 2), (1, 3), (2, 3)], [4.0, 4.0, 4.0, 4.0],
                                       name="fuzz"))  # fmt: skip
#: a tiled graph: op names, groups, block indices and specs (every optional key of the format)
TILED_GRAPH = graph_to_json(workloads.build("chainmm", size="tiny", row_blocks=2, col_blocks=1, inner_blocks=1))
#: a text graph with input nodes (ids 4 and 5) and optypes (docs/formats.md)
TEXT_GRAPH = "6\n4,5\n0,0,1,2\n1,2,3,3\n2,4,einsummable\n1,4,formation\n3,4,fill\n1,0,select\n"
ASSIGNMENT = json.dumps({"assignment": [0, 1, 0, 1], "method": "manual"})


def _through_graph_commands(box, g: Path) -> None:
    """Every command that reads ``g``: each ends with exit 0 or 2 and one error line naming the file."""
    a = box.write("a.json", ASSIGNMENT)
    info = box.run("graph", "info", g)
    if info.exit_code == 2:
        assert g.name in info.error_line, info.error_line  # a refused graph file is named
    commands = [
        (["graph", "info", g, "--json"], []),
        (["graph", "convert", g, "out.json"], ["out.json"]),
        (["graph", "convert", g, "out.txt", "--round"], ["out.txt"]),
        (["assign", g, "-c", "unit:2", "-m", "critical_path", "-o", "cp.json"], ["cp.json"]),
        (["assign", g, "-c", "unit:2", "-m", "doppler", "-o", "dp.json"], ["dp.json"]),
        (["simulate", g, "-c", "unit:2", "-a", a], []),
        (["compare", g, "-c", "unit:2", "-m", "round_robin,heft"], []),
    ]
    for args, outputs in commands:
        res = box.run(*args, outputs=outputs)
        if info.exit_code == 2:  # a graph file refused by one command is refused by all
            assert res.exit_code == 2, args
        elif args[0] == "graph":  # one read by one is read by all, and converted
            assert res.exit_code == 0, (args, res.stderr)


@fuzz(ci=100)
@given(doc=st.sampled_from([SMALL_GRAPH, TILED_GRAPH]).flatmap(corrupted))
def test_corrupted_json_graphs(fuzz_base, doc) -> None:
    with sandbox(fuzz_base) as box:
        _through_graph_commands(box, box.write("g.json", doc))


@fuzz(ci=60)
@given(data=st.sampled_from([json.dumps(SMALL_GRAPH).encode(), json.dumps(TILED_GRAPH).encode()]).flatmap(mutated_bytes))
def test_mutated_json_graph_bytes(fuzz_base, data) -> None:
    with sandbox(fuzz_base) as box:
        _through_graph_commands(box, box.write("g.json", data))


ODD_TOKENS = st.one_of(
    st.sampled_from(["", "-1", "0", "1e3", "nan", "inf", "1.5", "x", "9" * 19, "9" * 301, "9" * 5000, "input",
                     "einsummable", "unknown", "bogus", "\u0663", "\u00b2", "1 2", ",,", "0x1f", "+3", "\x00"]),
    st.integers(-5, 50).map(str), st.text(max_size=4),
)  # fmt: skip


@st.composite
def edited_text(draw, base: str) -> str:
    """``base`` (a text graph) with one to three of its lines edited: a token replaced, a line deleted,
    repeated, swapped with another, blanked, its separators changed, or a line added."""
    lines = base.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["token", "token", "delete", "repeat", "swap", "blank", "separators", "add"]))
        if how == "token":
            parts = re.split(r"([,\s]+)", lines[i])
            k = draw(st.integers(0, len(parts) - 1))
            parts[k] = draw(ODD_TOKENS)
            lines[i] = "".join(parts)
        elif how == "delete" and len(lines) > 1:
            del lines[i]
        elif how == "repeat":
            lines.insert(i, lines[i])
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "blank":
            lines[i] = draw(st.sampled_from(["", " ", "\t", "\r"]))
        elif how == "separators":
            lines[i] = lines[i].replace(",", draw(st.sampled_from([" ", ";", ", ", "\t", ",,", ""])))
        else:
            lines.insert(i, ",".join(draw(st.lists(ODD_TOKENS, max_size=4))))
    return "\n".join(lines)


@fuzz(ci=100)
@given(text=edited_text(TEXT_GRAPH))
def test_edited_text_graphs(fuzz_base, text) -> None:
    with sandbox(fuzz_base) as box:
        _through_graph_commands(box, box.write("g.txt", text))


@fuzz(ci=60)
@given(data=mutated_bytes(TEXT_GRAPH.encode()))
def test_mutated_text_graph_bytes(fuzz_base, data) -> None:
    with sandbox(fuzz_base) as box:
        _through_graph_commands(box, box.write("g.txt", data))
