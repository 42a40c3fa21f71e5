"""``.pt2`` archives are read without running anything in them (doppler.importer.pt2).

Each hostile archive carries a payload that creates a sentinel file if it runs; for the ones that
``torch.export.load`` runs, the test first shows that it does (so the payload is live), then that
doppler refuses the file in one line and the sentinel never appears."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doppler.ir.formats import graph_to_json
from doppler.importer import GraphImportError, export_model, import_model, lower_program
from doppler.importer.pt2 import Pt2Error, read_pt2

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import models  # noqa: E402


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("shift", torch.arange(8.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2.0 + self.shift


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    ep, _ = export_model(_Small(), (torch.randn(2, 8),))
    path = tmp_path_factory.mktemp("pt2") / "good.pt2"
    torch.export.save(ep, path)
    return path


def _members(path: Path) -> tuple[str, dict[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    root = next(n.split("/")[0] for n in members if n.endswith("/archive_format"))
    return root, members


def _write(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for k, v in members.items():
            z.writestr(k, v)
    return path


class _Touch:
    """A pickle that, when loaded by a full unpickler, creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _raw_pickle(sentinel: Path) -> bytes:
    return pickle.dumps(_Touch(sentinel), protocol=2)


def _torch_pickle(sentinel: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(_Touch(sentinel), buf)
    return buf.getvalue()


def _edit_json(members: dict, member: str, edit) -> dict:
    doc = json.loads(members[member])
    edit(doc)
    return {**members, member: json.dumps(doc).encode()}


def _hostile(kind: str, good: Path, sentinel: Path) -> dict[str, bytes]:
    root, m = _members(good)
    r = f"{root}/"
    if kind == "sample_inputs_torch_pickle":
        return {**m, r + "data/sample_inputs/model.pt": _torch_pickle(sentinel)}
    if kind == "sample_inputs_raw_pickle":
        return {**m, r + "data/sample_inputs/model.pt": _raw_pickle(sentinel)}
    if kind == "unread_member_pickle":
        return {**m, r + ".data/version": _raw_pickle(sentinel)}
    if kind == "pickled_weight":
        def edit(d):
            d["config"]["lin.weight"]["use_pickle"] = True
        return _edit_json({**m, r + "data/weights/weight_0": _torch_pickle(sentinel)},
                          r + "data/weights/model_weights_config.json", edit)  # fmt: skip
    if kind == "opaque_constant":
        def edit(d):
            d["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
        return _edit_json({**m, r + "data/constants/opaque_obj_0": _raw_pickle(sentinel)},
                          r + "data/constants/model_constants_config.json", edit)  # fmt: skip
    if kind == "sympy_expression":
        def edit(d):
            code = f"__import__('pathlib').Path({str(sentinel)!r}).touch()"
            d["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {"as_expr": {"expr_str": code, "hint": None}}
        return _edit_json(m, r + "models/model.json", edit)
    if kind == "target_outside_aten":
        def edit(d):
            node = d["graph_module"]["graph"]["nodes"][0]
            node["target"] = "torch.os.system"
            node["inputs"] = [{"name": "command", "arg": {"as_string": f"touch {sentinel}"}, "kind": 1}]
        return _edit_json(m, r + "models/model.json", edit)
    if kind == "legacy_layout":
        return {"version": b"8.0", "serialized_exported_program.json": b"{}",
                "serialized_state_dict.pt": _torch_pickle(sentinel), "serialized_constants.pt": _raw_pickle(sentinel)}  # fmt: skip
    raise AssertionError(kind)


#: hostile archives whose payload torch.export.load runs (checked below, so the payloads are live)
RUN_BY_TORCH = ["sample_inputs_torch_pickle", "sample_inputs_raw_pickle", "pickled_weight", "opaque_constant",
                "sympy_expression"]  # fmt: skip
HOSTILE = RUN_BY_TORCH + ["unread_member_pickle", "target_outside_aten", "legacy_layout"]


def _torch_export_load_in_a_child(path: Path) -> None:
    code = "import logging, sys, torch\nlogging.disable(logging.CRITICAL)\ntry:\n    torch.export.load(sys.argv[1])\nexcept Exception:\n    pass\n"
    subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=300, check=False)


@pytest.mark.parametrize("kind", RUN_BY_TORCH)
def test_the_payloads_are_live_under_torch_export_load(tmp_path: Path, good: Path, kind: str) -> None:
    sentinel = tmp_path / "SENTINEL"
    path = _write(tmp_path / f"{kind}.pt2", _hostile(kind, good, sentinel))
    _torch_export_load_in_a_child(path)
    assert sentinel.exists(), f"{kind}: the payload did not run under torch.export.load; the test would prove nothing"


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_archive_is_refused_in_one_line_and_runs_nothing(tmp_path: Path, good: Path, kind: str) -> None:
    sentinel = tmp_path / "SENTINEL"
    path = _write(tmp_path / f"{kind}.pt2", _hostile(kind, good, sentinel))
    with pytest.raises(GraphImportError) as e:
        import_model(str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    assert not sentinel.exists()


def test_the_cli_refuses_the_crafted_file_with_exit_2_and_one_line(tmp_path: Path, good: Path) -> None:
    sentinel = tmp_path / "SENTINEL"
    path = _write(tmp_path / "evil.pt2", _hostile("sample_inputs_raw_pickle", good, sentinel))
    out = tmp_path / "g.json"
    res = subprocess.run([sys.executable, "-m", "doppler", "graph", "import", str(path), "-o", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error:"), res.stderr
    assert "needs more than torch's weights-only loader" in res.stderr and "GLOBAL" in res.stderr
    assert not sentinel.exists() and not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["evil.pt2"]


@pytest.mark.parametrize("name", ["mlp", "llama_block"])
def test_a_saved_program_imports_exactly_as_the_exported_one(tmp_path: Path, name: str) -> None:
    module, example = getattr(models, name)()
    ep, _ = export_model(module, example)
    torch.export.save(ep, tmp_path / "m.pt2")
    blocks = {256: 2, 64: 2}
    direct = graph_to_json(lower_program(ep, blocks=blocks, name=name))
    via_file = graph_to_json(lower_program(read_pt2(tmp_path / "m.pt2"), blocks=blocks, name=name))
    assert json.dumps(via_file, sort_keys=True) == json.dumps(direct, sort_keys=True)


def test_a_symbolic_size_reads_as_its_example_value(tmp_path: Path) -> None:
    x = torch.randn(4, 8)
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(_Small().eval(), (x,), dynamic_shapes={"x": {0: batch}}, strict=False)
    torch.export.save(ep, tmp_path / "dyn.pt2")
    prog = read_pt2(tmp_path / "dyn.pt2")
    (x_node,) = [n for n in prog.graph_module.graph.nodes if n.op == "placeholder" and n.name == "x"]
    assert tuple(x_node.meta["val"].shape) == (4, 8)


def test_weights_are_the_saved_values(tmp_path: Path, good: Path) -> None:
    prog = read_pt2(good)
    ep = torch.export.load(good)  # our own file, made above: safe to load with torch to compare
    assert set(prog.state_dict) == set(ep.state_dict)
    for k, v in ep.state_dict.items():
        assert torch.equal(prog.state_dict[k], v.detach())


def test_a_view_past_its_bytes_is_refused(tmp_path: Path, good: Path) -> None:
    root, m = _members(good)

    def edit(d):
        d["config"]["lin.weight"]["tensor_meta"]["storage_offset"] = {"as_int": 1000}

    path = _write(tmp_path / "over.pt2", _edit_json(m, f"{root}/data/weights/model_weights_config.json", edit))
    with pytest.raises(Pt2Error, match="weight lin.weight: its shape reaches element"):
        read_pt2(path)


def test_a_view_repeating_its_elements_is_refused(tmp_path: Path, good: Path) -> None:
    """Strides of 0 shape a weight of 64 stored elements as 2**40 of them, every one inside its bytes: the
    importer's mean and std of it, in float64, once tried to allocate 8 TB."""
    root, m = _members(good)

    def edit(d):
        meta = d["config"]["lin.weight"]["tensor_meta"]
        meta["sizes"], meta["strides"] = [{"as_int": 1 << 20}] * 2, [{"as_int": 0}] * 2

    path = _write(tmp_path / "zero.pt2", _edit_json(m, f"{root}/data/weights/model_weights_config.json", edit))
    with pytest.raises(Pt2Error, match=r"weight lin.weight: its shape \[1048576, 1048576\] holds 1,099,511,627,776 "
                                       r"elements, more than the 64 stored"):  # fmt: skip
        read_pt2(path)


# ---------------------------------------------------------------------------- bounds
def _archive(tmp_path: Path, good: Path, extra: list, name: str = "m.pt2", declared: dict | None = None) -> Path:
    """``good``'s members and ``extra`` (name under the root, bytes or a count of deflated zeros), with what
    ``declared`` says (name under the root -> uncompressed size, compressed size[, checksum]) rewritten."""
    from tests.fuzz.zips import declare_sizes, zip_bytes

    root, m = _members(good)
    data = zip_bytes(list(m.items()) + [(f"{root}/{n}", c) for n, c in extra])
    for member, (size, packed, *crc) in (declared or {}).items():
        data = declare_sizes(data, f"{root}/{member}", file_size=size, compress_size=packed, crc=(crc or [None])[0])
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


def test_a_member_declaring_gigabytes_is_refused_before_anything_is_read(tmp_path, good, monkeypatch) -> None:
    import doppler.importer.pt2 as pt2

    path = _archive(tmp_path, good, [("extra/blob", b"x")], declared={"extra/blob": (3 << 30, 3 << 20)})
    monkeypatch.setattr(pt2, "read_member", lambda *a: pytest.fail("a member was read"))
    with pytest.raises(Pt2Error, match=r"^member \S+/extra/blob declares 3,221,225,472 bytes \(3 GiB\) uncompressed"):
        read_pt2(path)


def test_a_deflated_bomb_under_the_member_limit_is_refused_by_its_ratio(tmp_path, good) -> None:
    path = _archive(tmp_path, good, [("extra/blob", 8 << 20)])
    with pytest.raises(Pt2Error, match=r"extra/blob declares 8,388,608 bytes .* compression ratio over 100"):
        read_pt2(path)


def test_a_member_never_used_is_read_no_further_than_its_first_bytes(tmp_path, good) -> None:
    """A member of 1 MiB with a wrong checksum: reading it whole would fail the check; the pickle check reads
    its first bytes only, so the program imports."""
    path = _archive(tmp_path, good, [("extra/blob", b"x" * (1 << 20))], declared={"extra/blob": (None, None, 1234)})
    assert read_pt2(path).state_dict.keys() == read_pt2(good).state_dict.keys()


def test_a_weight_whose_bytes_lie_about_their_size_is_refused_naming_it(tmp_path, good) -> None:
    root, m = _members(good)
    weight = next(n for n in m if "/data/weights/weight_" in n)[len(root) + 1:]
    for declared, words in [((10, None), "is damaged .*CRC"), ((300 << 20, 300 << 20), "(fewer than|ends before) the")]:
        path = _archive(tmp_path, good, [], declared={weight: declared})
        with pytest.raises(Pt2Error, match=rf"^member {root}/{weight} {words}"):
            read_pt2(path)


def test_a_json_member_past_its_limit_is_refused_unread(tmp_path, good) -> None:
    from doppler.importer.pt2 import MAX_JSON_BYTES

    path = _archive(tmp_path, good, [], declared={"models/model.json": (MAX_JSON_BYTES + 1, MAX_JSON_BYTES + 1)})
    with pytest.raises(Pt2Error, match=r"^member \S+/models/model.json declares 33,554,433 bytes .* more than the 33,554,432"):
        read_pt2(path)


def test_a_program_naming_a_key_twice_is_refused_naming_the_key(tmp_path, good) -> None:
    root, m = _members(good)
    text = m[f"{root}/models/model.json"].decode()
    m[f"{root}/models/model.json"] = text.replace('{"graph_module": {', '{"graph_module": {"graph": 0, ', 1).encode()
    assert m[f"{root}/models/model.json"].decode() != text
    with pytest.raises(Pt2Error, match="member models/model.json is not valid JSON .key 'graph' appears twice"):
        read_pt2(_write(tmp_path / "dup.pt2", m))


def test_a_pickle_member_is_checked_on_the_meta_device_and_a_large_one_is_refused(tmp_path, good, monkeypatch) -> None:
    import doppler.importer.pt2 as pt2

    calls = []
    real = pt2.load_plain
    monkeypatch.setattr(pt2, "load_plain", lambda data, meta=False: calls.append(meta) or real(data, meta=meta))
    read_pt2(good)
    assert calls == [True]  # (its sample inputs: a torch.save file)
    path = _archive(tmp_path, good, [("extra/big.pkl", b"\x80\x04" + bytes(17 << 20))])
    with pytest.raises(Pt2Error, match="member extra/big.pkl is a pickle of 17,825,794 bytes, more than the 16,777,216"):
        read_pt2(path)


# ---------------------------------------------------------------------------- fuzzing
ODD = st.one_of(st.none(), st.booleans(), st.integers(-(2**66), 2**66), st.floats(allow_nan=True),
                st.text(max_size=8), st.sampled_from(["torch.os.system", "torch.ops.aten.__class__.__init__",
                                                      "_operator.attrgetter", "torch.ops.higher_order.cond",
                                                      "__import__('os')", "as_graph", "as_custom_obj"]),
                st.lists(st.integers(-2, 3), max_size=3), st.dictionaries(st.sampled_from(["as_int", "as_expr", "name"]),
                                                                           st.integers(-3, 3), max_size=2))  # fmt: skip


def _json_paths(doc, path=()):
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _json_paths(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _json_paths(v, path + (i,))


@st.composite
def mutated_archive(draw, good_members: tuple[str, dict[str, bytes]], sentinel: Path) -> dict[str, bytes]:
    root, members = good_members
    members = dict(members)
    names = sorted(members)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["json", "json", "json", "pickle", "bytes", "delete", "truncate"]))
        name = draw(st.sampled_from(names))
        data = members.get(name, b"")
        if how == "json" and name.endswith(".json") and data:
            try:
                doc = json.loads(data)
            except ValueError:  # an earlier mutation broke it
                continue
            paths = [p for p in _json_paths(doc) if p]
            if not paths:
                continue
            path = draw(st.sampled_from(paths))
            parent = doc
            for k in path[:-1]:
                parent = parent[k]
            if isinstance(parent, dict) and draw(st.booleans()):
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(ODD)
            members[name] = json.dumps(doc).encode()
        elif how == "pickle":
            members[name] = draw(st.sampled_from([_raw_pickle(sentinel), _torch_pickle(sentinel)]))
        elif how == "bytes" and data:
            i = draw(st.integers(0, len(data) - 1))
            members[name] = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
        elif how == "delete":
            members.pop(name, None)
        elif how == "truncate":
            members[name] = data[: draw(st.integers(0, len(data)))]
    return members


@settings(deadline=None, suppress_health_check=list(HealthCheck))  # examples: the profile's (make fuzz: more)
@given(data=st.data())
def test_fuzz_a_mutated_archive_imports_or_fails_in_one_line(tmp_path_factory, good: Path, data) -> None:
    d = tmp_path_factory.mktemp("fuzz")
    sentinel = good.parent / "SENTINEL"  # one path for every example: the drawn bytes must not depend on the directory
    members = data.draw(mutated_archive(_members(good), sentinel))
    path = _write(d / "m.pt2", members)
    if data.draw(st.integers(0, 9)) == 0:  # the archive itself cut short
        raw = path.read_bytes()
        path.write_bytes(raw[: data.draw(st.integers(0, len(raw)))])
    before = sorted(os.listdir(d))
    try:
        import_model(str(path))
    except GraphImportError as e:
        assert "\n" not in str(e)
    assert not sentinel.exists()
    assert sorted(os.listdir(d)) == before
