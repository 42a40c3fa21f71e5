"""Graph files: native JSON and DOPPLER text, round trips and error messages."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doppler.ir.formats import (graph_from_json, graph_from_json_text, graph_from_text, graph_to_json, graph_to_text, load_graph, save_graph)
from doppler.ir.graph import GraphError, Group, OpKind, TileLayout, from_edges

TEXT = """7
5,6
0,0,1,2
1,2,3,3
10,2,einsummable
20,3,formation
30,4,select
5,1,einsummable
3,0,input
"""


def test_text_parse() -> None:
    g = graph_from_text(TEXT, name="t")
    assert g.num_ops == 5 and g.num_edges == 4
    assert g.flops.tolist() == [10, 20, 30, 5, 3]
    assert g.output_bytes.tolist() == [2, 3, 4, 1, 0]
    assert [OpKind(int(k)).label for k in g.kind] == ["einsummable", "formation", "select", "einsummable", "input"]


def test_text_round_trips_through_json_unchanged(tmp_path: Path) -> None:
    src = tmp_path / "g.txt"
    src.write_text(TEXT)
    save_graph(load_graph(src), tmp_path / "g.json")
    save_graph(load_graph(tmp_path / "g.json"), tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == TEXT


def test_text_with_loose_separators_and_no_optypes() -> None:
    text = "4\n3\n0 1, 0,\n 1 2 2 \n1,1\n2,2\n3,3\n"
    g = graph_from_text(text)
    assert g.src.tolist() == [0, 1, 0] and g.dst.tolist() == [1, 2, 2]
    assert all(k == OpKind.UNKNOWN for k in g.kind)
    again = graph_from_text(graph_to_text(g))
    assert again.equals(g) and "," not in graph_to_text(g).splitlines()[4][3:]


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("", "needs at least 4 header lines"),
        ("x\n\n\n\n1,1\n", r":1: total node count: 'x' is not an integer"),
        ("2\n\n0\n\n1,1\n1,1\n", r":4: 0 edge destinations but line 3 has 1"),
        ("2\n\n0\n5\n1,1\n1,1\n", r":4: edge 0 refers to node 5, but ops are 0..1"),
        ("2\n\n0\n1\n1,1\n", "expected 2 op lines"),
        ("2\n\n0\n1\n1,1\n-1,1\n", r":6: op 1: compute '-1' is not a non-negative integer"),
        ("2\n\n0\n1\n1,1,input\n1,1,conv\n", r":6: op 1: unknown optype 'conv'"),
        ("2\n\n0\n1\n1,1,input\n1,1\n", r":6: op 1: some op lines have an optype"),
        ("3\n\n0,1,2\n1,2,0\n1,1\n1,1\n1,1\n", r"g.txt: the graph has a cycle: 0 -> 1 -> 2 -> 0"),
        ("2\n0,1\n\n\n", "leave no ops"),
        ("3\n5\n0\n1\n1,1\n1,1\n", r":2: input node id 5 is not a node \(ids are 0..2\)"),
        ("2\n\n0\n1\n" + "9" * 5000 + ",1\n1,1\n", r":5: op 0: compute '9{40}'\.\.\. \(5000 characters\) is not"),
        ("2\n\n0\n" + "9" * 5000 + "\n1,1\n1,1\n", r":4: edge destinations: '9{40}'\.\.\. \(5000 characters\)"),
        ("4\n3,3\n0\n1\n1,1\n1,1\n", r":2: an input node id is listed twice"),
    ],
)
def test_text_errors_name_file_and_line(tmp_path: Path, text: str, pattern: str) -> None:
    p = tmp_path / "g.txt"
    p.write_text(text)
    with pytest.raises(GraphError, match=pattern) as info:
        load_graph(p)
    assert str(p) in str(info.value)


def _rich_graph():
    return from_edges(
        [1.5, 2.25, 1e12 / 3, 0.0],
        [(0, 1), (1, 2), (0, 2), (2, 3)],
        [8, 16, 32, 0.1],
        kind=[OpKind.MATMUL, OpKind.ADD, OpKind.SOFTMAX, OpKind.SELECT],
        tiles=TileLayout(group=[0, 0, -1, -1], block=[[0, 1], [1, 0], [-1, -1], [-1, -1]],
                         groups=[Group("mm", "matmul", (2, 2))]),
        names=["a", "b", "c", "d"],
        specs=[{"kernel": "einsum", "eq": "ik,kj->ij"}, None, {"kernel": "map", "fn": "exp"}, None],
        name="rich",
        meta={"workload": "x", "params": {"n": 4}},
    )


def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    g = _rich_graph()
    save_graph(g, tmp_path / "g.json")
    back = load_graph(tmp_path / "g.json")
    assert back.equals(g)
    assert back.fingerprint() == g.fingerprint()
    assert not list(tmp_path.glob(".*tmp")), "atomic write left a temp file"


def test_text_export_of_a_workload_style_graph_maps_kinds() -> None:
    text = graph_to_text(from_edges([1, 2], [(0, 1)], [3, 4], kind=[OpKind.MATMUL, OpKind.MASK_FILL]))
    assert text.splitlines()[-2:] == ["1,3,einsummable", "2,4,fill"]
    with pytest.raises(GraphError, match="non-integer flops"):
        graph_to_text(_rich_graph())


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda d: d.update(format="other"), "not a doppler graph"),
        (lambda d: d.update(version=99), "unsupported graph format version 99"),
        (lambda d: d.update(extra=1), r"unknown key\(s\) \['extra'\]"),
        (lambda d: d["ops"].pop("flops"), "missing ops.flops"),
        (lambda d: d["ops"]["flops"].__setitem__(1, "x"), r"ops.flops\[1\] is 'x', not a number"),
        (lambda d: d["ops"]["kind"].__setitem__(2, "conv"), r"ops.kind\[2\] is 'conv'"),
        (lambda d: d["ops"]["output_bytes"].pop(), "ops.output_bytes has 3 entries, expected 4"),
        (lambda d: d["edges"]["dst"].__setitem__(0, 9), r"edge 0 \(0 -> 9\) refers to an unknown op"),
        (lambda d: d["edges"]["src"].__setitem__(0, 1.5), r"edges.src\[0\] is 1.5, not an integer"),
        (lambda d: d["ops"]["flops"].__setitem__(0, -1), "op 0 \\('a'\\) has invalid flops -1"),
    ],
)
def test_json_errors(mutate, pattern) -> None:
    doc = json.loads(json.dumps(graph_to_json(_rich_graph())))
    mutate(doc)
    with pytest.raises(GraphError, match=pattern):
        graph_from_json(doc, source="g.json")


_ENTRIES = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([2**62, 2**62 - 1, -(2**62), -(2**62) + 1, -(2**63), 10**301, int(1e300), int(1e300) + 1,
                                                        -int(1e300) - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([True, False, None, "1", 1.5, 2.0, 1e301]),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_ENTRIES, max_size=6), as_int=st.booleans())
def test_number_columns_checked_in_bulk_as_entry_by_entry(values, as_int) -> None:
    """A column read in bulk (the common case) gives the array, or the error, that the per-entry checks give."""
    from doppler.ir import formats

    dtype = np.int64 if as_int else np.float64

    def read(bulk: bool):
        original = formats._checked_in_bulk
        if not bulk:
            formats._checked_in_bulk = lambda values, dtype: None
        try:
            return formats._number_column(values, "ops.flops", None, "g.json", dtype)
        except (GraphError, OverflowError, ValueError, TypeError) as e:
            return f"{type(e).__name__}: {e}"
        finally:
            formats._checked_in_bulk = original

    bulk, each = read(True), read(False)
    if isinstance(each, str):
        assert bulk == each
    else:
        np.testing.assert_array_equal(bulk, each)
        assert bulk.dtype == each.dtype == dtype


def test_json_syntax_error_names_line(tmp_path: Path) -> None:
    p = tmp_path / "g.json"
    p.write_text('{\n  "format": "doppler-graph",\n  "version": 1,\n  oops\n}')
    with pytest.raises(GraphError, match=r"g.json:4: not valid JSON"):
        load_graph(p)


@pytest.mark.parametrize("text, words", [
    ('{"ops": [' + "9" * 5000 + "]}", "integer string conversion"),  # past Python's 4,300 digits
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])  # fmt: skip
def test_json_that_python_cannot_parse_is_one_error_naming_the_file(tmp_path: Path, text: str, words: str) -> None:
    from doppler.ir.assignment import AssignmentError, load_assignment
    from doppler.hardware.files import load_cluster
    from doppler.hardware.cluster import ClusterError

    p = tmp_path / "x.json"
    p.write_text(text)
    for load, error in ((load_graph, GraphError), (lambda q: load_assignment(q, None, 2), AssignmentError),
                        (load_cluster, ClusterError)):  # fmt: skip
        with pytest.raises(error, match=f"x.json: unreadable JSON .*{words}"):
            load(p)


def test_graphs_clusters_and_assignments_are_saved_and_loaded_alike(tmp_path: Path) -> None:
    """One style for the three file kinds: ``doppler.save_X(x, path)`` writes, ``doppler.load_X(path)`` reads
    back an equal object, and none of the three types has a save method of its own."""
    import doppler

    g = from_edges([1.0, 2.5, 3.0], [(0, 1), (0, 2)], [4.0, 5.0, 6.0])
    cl = doppler.cluster("v100x8")
    a = doppler.Assignment(devices=np.array([0, 7, 3]), method="m", graph_fingerprint=g.fingerprint())
    doppler.save_graph(g, tmp_path / "g.json")
    doppler.save_cluster(cl, tmp_path / "c.json")
    doppler.save_assignment(a, tmp_path / "a.json")
    assert doppler.load_graph(tmp_path / "g.json").fingerprint() == g.fingerprint()
    back = doppler.load_cluster(tmp_path / "c.json")
    assert back.devices == cl.devices and np.array_equal(back.bandwidth_Bps, cl.bandwidth_Bps)
    assert doppler.load_assignment(tmp_path / "a.json", g, cl.num_devices).devices.tolist() == [0, 7, 3]
    assert not any(hasattr(t, name) for t in (doppler.DataflowGraph, doppler.Cluster, doppler.Assignment)
                   for name in ("save", "load"))  # fmt: skip


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="unknown graph file extension"):
        load_graph(tmp_path / "g.csv")
    with pytest.raises(GraphError, match="no such graph file"):
        load_graph(tmp_path / "missing.json")


# -------------------------------------------------------------- fuzzing
@st.composite
def text_graphs(draw):
    n = draw(st.integers(1, 12))
    k = draw(st.integers(0, 3))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=2 * n)) if pairs else []
    with_type = draw(st.booleans())
    lines = [str(n + k), ",".join(str(n + i) for i in range(k)),
             ",".join(str(u) for u, _ in edges), ",".join(str(v) for _, v in edges)]
    for _ in range(n):
        row = f"{draw(st.integers(0, 10**12))},{draw(st.integers(0, 10**9))}"
        if with_type:
            row += "," + draw(st.sampled_from(["input", "formation", "complexer", "squeezer", "fill", "select",
                                               "einsummable", "unknown"]))
        lines.append(row)
    return "\n".join(lines) + "\n"


@settings(max_examples=80, deadline=None)
@given(text_graphs())
def test_fuzz_valid_text_round_trips(text: str) -> None:
    g = graph_from_text(text)
    assert graph_to_text(g) == text
    assert graph_from_json(json.loads(json.dumps(graph_to_json(g)))).equals(g)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text_graphs(), st.data())
def test_fuzz_corrupted_text_raises_only_graph_error(text: str, data) -> None:
    pos = data.draw(st.integers(0, len(text)))
    junk = data.draw(st.text(alphabet="0123456789,- x\n.", max_size=6))
    cut = data.draw(st.integers(0, 3))
    corrupted = text[:pos] + junk + text[pos + cut:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            g = graph_from_text(corrupted)
        except GraphError:
            return
    assert g.num_ops >= 1 and np.all(g.flops >= 0)


@settings(max_examples=150, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
))
def test_fuzz_random_json_raises_only_graph_error(doc) -> None:
    try:
        graph_from_json(doc)
    except GraphError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_fuzz_corrupted_json_document(data) -> None:
    doc = json.loads(json.dumps(graph_to_json(_rich_graph())))
    section = data.draw(st.sampled_from(["ops", "edges"]))
    key = data.draw(st.sampled_from(sorted(doc[section])))
    doc[section][key] = data.draw(st.one_of(
        st.none(), st.integers(), st.text(max_size=3),
        st.lists(st.one_of(st.integers(-3, 9), st.floats(), st.text(max_size=2), st.none()), max_size=6),
    ))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            graph_from_json_text(json.dumps(doc))
        except GraphError:
            pass


def test_module_paths_round_trip_and_a_bad_one_is_refused(tmp_path):
    from doppler.ir.formats import load_graph, save_graph
    from doppler.workloads import build

    g = build("llama_model", size="tiny", layers=1)
    path = tmp_path / "g.json"
    save_graph(g, path)
    back = load_graph(path)
    assert back.op_modules()[0] == g.op_modules()[0] and (back.op_modules()[1] == g.op_modules()[1]).all()
    doc = json.loads(path.read_text())
    doc["groups"][0]["module"] = 7
    path.write_text(json.dumps(doc))
    with pytest.raises(GraphError, match="invalid groups entry .*module must be a string"):
        load_graph(path)


@pytest.mark.parametrize("groups", [[None], ["mm"], "ab", [[1, 2]]])
def test_a_groups_entry_that_is_not_an_object_is_refused_in_one_line(tmp_path, groups):
    from doppler.ir.formats import load_graph, save_graph
    from doppler.workloads import build

    path = tmp_path / "g.json"
    save_graph(build("chainmm", size="tiny"), path)
    doc = json.loads(path.read_text())
    doc["groups"] = groups
    path.write_text(json.dumps(doc))
    with pytest.raises(GraphError, match=r"g\.json: invalid groups entry \(a group must be an object"):
        load_graph(path)


@pytest.mark.parametrize("name", [[], {"a": 1}, 3])
@pytest.mark.parametrize("with_slice", [True, False])
def test_an_operand_naming_no_input_is_refused_in_one_line(tmp_path, name, with_slice):
    from doppler.ir.formats import load_graph, save_graph
    from doppler.workloads import build

    path = tmp_path / "g.json"
    save_graph(build("chainmm", size="tiny"), path)
    doc = json.loads(path.read_text())
    ref = next(r for spec in doc["ops"]["spec"] for r in spec["inputs"] if "input" in r)
    ref["input"] = name
    if not with_slice:
        del ref["slice"]
    path.write_text(json.dumps(doc))
    with pytest.raises(GraphError, match=r"g\.json: op \d+ .*: an operand's input .* is not an input name"):
        load_graph(path)


# ---------------------------------------------------------------------------- declared shapes, duplicate keys
def _chainmm_doc() -> dict:
    from doppler import workloads

    return graph_to_json(workloads.build("chainmm", size="tiny"))


def _shape_at(where: str):
    def put(doc: dict, shape) -> None:
        if where == "input":
            doc["meta"]["inputs"]["A"] = shape
        elif where == "output":
            doc["meta"]["outputs"]["Y"]["shape"] = shape
        elif where == "spec":
            doc["ops"]["spec"][3]["shape"] = shape
        else:
            doc["ops"]["spec"][3]["inputs"][1]["shape"] = shape

    return put


NAMED = {"input": "meta.inputs['A']", "output": "meta.outputs['Y'].shape", "spec": "op 3 ('DE[0,1]k0'): its spec's shape",
         "operand": "op 3 ('DE[0,1]k0'): operand 1's shape"}  # fmt: skip


@pytest.mark.parametrize("where", list(NAMED))
@pytest.mark.parametrize("shape, words", [
    ([10**9, 10**9], "describes more than 1,099,511,627,776 elements"),
    ([2**20, 2**20, 2], "describes more than"),
    ([10] * 13, "describes more than"),
    ([7] * 100_000 + [10**4000], "describes more than"),
    ([1e9, 1e9], "is [1000000000.0, 1000000000.0], not a list of whole numbers >= 0"),
    ([-1, 4], "not a list of whole numbers"),
    ([True, 2], "not a list of whole numbers"),
    ("16x16", "not a list of whole numbers"),
])  # fmt: skip
def test_a_declared_shape_past_the_limit_is_refused_as_the_file_is_read(tmp_path, where, shape, words) -> None:
    doc = _chainmm_doc()
    _shape_at(where)(doc, shape)
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(GraphError) as e:
        load_graph(p)
    assert str(e.value).startswith(f"{p}: {NAMED[where]}") and words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("where", list(NAMED))
def test_a_shape_at_the_limit_or_with_a_zero_reads(tmp_path, where) -> None:
    from doppler.ir.graph import MAX_TENSOR_ELEMENTS

    for shape in ([MAX_TENSOR_ELEMENTS], [2**20, 2**20], [0, 10**30, 10**30], []):
        doc = _chainmm_doc()
        _shape_at(where)(doc, shape)
        if where == "output":  # (its tiles must lie within it)
            for info in doc["meta"]["outputs"].values():
                info["tiles"] = [[info["tiles"][0][0], [[0, min(d, 1)] for d in shape]]]
        graph_from_json(doc, source="g.json")  # (what the shapes mean is checked where they are used)


@pytest.mark.parametrize("mutate", [
    lambda out: out.update(shape=[]),  # a scalar the tiles index in two dimensions
    lambda out: out["tiles"][0][1][0].__setitem__(1, 10**6),  # a tile past the output's end
    lambda out: out["tiles"][0].__setitem__(0, 10**6),  # no such op
    lambda out: out.update(tiles=None),
])  # fmt: skip
def test_output_tiles_that_do_not_lie_within_the_declared_output_are_refused_naming_it(mutate) -> None:
    doc = _chainmm_doc()
    name, out = next(iter(doc["meta"]["outputs"].items()))
    mutate(out)
    with pytest.raises(GraphError) as e:
        graph_from_json(doc, source="g.json")
    assert str(e.value).startswith(f"g.json: meta.outputs[{name!r}].tiles") and "\n" not in str(e.value), str(e.value)


def test_a_graph_file_naming_a_key_twice_is_refused_naming_the_key(tmp_path) -> None:
    text = json.dumps(_chainmm_doc())
    p = tmp_path / "g.json"
    p.write_text(text.replace('"edges": {', '"edges": {"src": [0], ', 1))
    with pytest.raises(GraphError) as e:
        load_graph(p)
    assert str(e.value) == f"{p}: not valid JSON (key 'src' appears twice in one object)"

