"""Fuzzing the bounds checked before any work (SECURITY.md, Limits): zip archives (``.pt2`` programs and
checkpoints) whose members declare any sizes and hold any bytes, graph files declaring huge shapes, cluster
files of huge device and link counts, and JSON files that name a key twice, through the commands that read
them. Each command keeps the property of tests/fuzz/common.py; a refusal names the file (and the key)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from doppler import workloads
from doppler.ir.formats import graph_to_json
from doppler.hardware.cluster import MAX_DEVICES
from doppler.importer.files import (MAX_PICKLE_BYTES, MAX_ZIP_MEMBER_BYTES, MAX_ZIP_MEMBERS, MAX_ZIP_TOTAL_BYTES,
                                    ZIP_RATIO_MIN_BYTES, load_plain)  # fmt: skip
from doppler.hardware.presets import cluster

from tests.fuzz.common import FUZZ_EXAMPLES_ENV, ODD_VALUES, fuzz, sandbox
from tests.fuzz.zips import declare_sizes, write_zip, zip_bytes

LONG_RUN = bool(os.environ.get(FUZZ_EXAMPLES_ENV))
TINY_TRAIN = ("--episodes", "4", "--batch", "4", "--search-evals", "0", "--warm-start", "none", "--threads", "1")
#: a tiled graph with specs and workload metadata (inputs A..E of 16 x 16, output Y), and an assignment of it
GRAPH = graph_to_json(workloads.build("chainmm", size="tiny", row_blocks=2, col_blocks=1, inner_blocks=1))
ASSIGNMENT = {"assignment": [i % 2 for i in range(len(GRAPH["ops"]["kind"]))], "method": "manual"}


# ---------------------------------------------------------------------------- zip archives
@pytest.fixture(scope="module")
def archives(train_run) -> dict[str, list[tuple[str, bytes]]]:
    """The members of a real ``.pt2`` program (a small linear layer, exported and saved by torch) and of a
    real training checkpoint."""
    import torch

    from doppler.importer import export_model

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x)) * 2.0

    ep, _ = export_model(Small(), (torch.randn(2, 8),))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    out = {}
    for kind, data in (("pt2", buf.getvalue()), ("checkpoint", (train_run.dir / "checkpoint.pt").read_bytes())):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            out[kind] = [(i.filename, z.read(i)) for i in z.infolist()]
    return out


#: declared sizes worth trying: the edges of every bound, and the largest a non-zip64 table holds
SIZES = [0, 1, 4, 4095, ZIP_RATIO_MIN_BYTES, ZIP_RATIO_MIN_BYTES + 1, MAX_PICKLE_BYTES, MAX_PICKLE_BYTES + 1,
         MAX_ZIP_MEMBER_BYTES, MAX_ZIP_MEMBER_BYTES + 1, MAX_ZIP_TOTAL_BYTES // 2 + 1, MAX_ZIP_TOTAL_BYTES + 1,
         2**32 - 1]  # fmt: skip
#: counts of zeros a member may hold (deflated, a few kB each; the long run adds one past the member bound)
ZEROS = [0, 1, 4096, ZIP_RATIO_MIN_BYTES, ZIP_RATIO_MIN_BYTES + 1, 8 << 20] + ([MAX_ZIP_MEMBER_BYTES + 1] if LONG_RUN else [])


@st.composite
def sized_archive(draw: Any, members: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    """The archive of ``members`` with one member (or a new one) holding drawn bytes or zeros, its declared
    sizes and checksum sometimes rewritten to lie, and sometimes padded with empty members up to the count
    bound; and an account of the change."""
    entries = list(members)
    root = entries[0][0].split("/")[0]
    names = [n for n, _ in entries]
    name = draw(st.sampled_from(names + [f"{root}/extra/blob", f"{root}/data/999"]))
    content: bytes | int = draw(st.one_of(
        st.sampled_from(ZEROS), st.binary(max_size=64), st.just(dict(entries).get(name, b"")),
        st.sampled_from([b"\x80\x02N.", b"\x80\x04" + bytes(100), b"PK\x03\x04" + bytes(30)])))  # fmt: skip
    entries = [(n, c) for n, c in entries if n != name] + [(name, content)]
    many = draw(st.sampled_from([0, 0, 0, MAX_ZIP_MEMBERS - len(entries), MAX_ZIP_MEMBERS + 1 - len(entries)]))
    entries += [(f"{root}/pad/{i}", b"") for i in range(many)]
    data = zip_bytes(entries, compression=draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])))
    size = draw(st.none() | st.sampled_from(SIZES))
    packed = draw(st.none() | st.sampled_from(SIZES) | st.just(size))
    crc = draw(st.none() | st.integers(0, 2**32 - 1))
    if isinstance(content, int) and content >= 1 << 31:
        size = packed = crc = None  # (a zip64 member: its sizes are not where declare_sizes writes)
    data = declare_sizes(data, name, file_size=size, compress_size=packed, crc=crc)
    shown = f"{len(content)} bytes" if isinstance(content, bytes) else f"{content} zeros"
    return data, f"{name}: {shown}, declared {size} / {packed} crc {crc}, {many} more members"


@fuzz(ci=40, share=0.25)
@given(data=st.data())
def test_zip_members_with_any_declared_and_actual_sizes(fuzz_base, archives, train_run, data) -> None:
    kind = data.draw(st.sampled_from(["pt2", "checkpoint"]))
    archive, _how = data.draw(sized_archive(archives[kind]))
    with sandbox(fuzz_base) as box:
        if kind == "pt2":
            path = box.write("m.pt2", archive)
            res = box.run("graph", "import", path, "-o", "g.json", outputs=["g.json"])
        else:
            path = box.write("ck.pt", archive)
            g = box.write("g.json", train_run.graph.read_bytes())
            res = box.run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", path, "-o", "a.json",
                          outputs=["a.json"])  # fmt: skip
            if data.draw(st.booleans()):
                box.run("train", g, "-c", "unit:2", "--init", path, *TINY_TRAIN, "-o", "R", "--json", outputs=["R"])
        if res.exit_code == 2:
            assert path.name in res.error_line, res.error_line


# ---------------------------------------------------------------------------- declared shapes
def _shape_slots(doc: dict) -> list[tuple]:
    """Every place the graph declares a shape: (key path to the shape list)."""
    slots: list[tuple] = [("meta", "inputs", k) for k in doc["meta"]["inputs"]]
    slots += [("meta", "outputs", k, "shape") for k in doc["meta"]["outputs"]]
    for i, spec in enumerate(doc["ops"]["spec"]):
        slots.append(("ops", "spec", i, "shape"))
        slots += [("ops", "spec", i, "inputs", k, "shape") for k in range(len(spec.get("inputs", [])))]
    return slots


HUGE_DIMS = st.one_of(st.integers(0, 2**64), st.sampled_from([2**20, 2**40, 2**40 + 1, 10**9, 10**18, 10**300]))
SHAPES = st.one_of(st.lists(HUGE_DIMS, max_size=6), st.lists(st.integers(1, 4096), min_size=4, max_size=12),
                   st.lists(st.integers(2, 9), min_size=1000, max_size=1000), ODD_VALUES)  # fmt: skip


@fuzz(ci=40, share=0.5)
@given(data=st.data())
def test_huge_declared_shapes_in_graph_files(fuzz_base, data) -> None:
    doc = json.loads(json.dumps(GRAPH))
    for _ in range(data.draw(st.integers(1, 2))):
        *parents, last = data.draw(st.sampled_from(_shape_slots(doc)))
        node = doc
        for k in parents:
            node = node[k]
        node[last] = data.draw(SHAPES)
    with sandbox(fuzz_base) as box:
        g = box.write("g.json", json.dumps(doc))
        a = box.write("a.json", json.dumps(ASSIGNMENT))
        info = box.run("graph", "info", g)
        if info.exit_code == 2:
            assert "g.json" in info.error_line, info.error_line
        for args in (["simulate", g, "-c", "unit:2", "-a", a], ["execute", g, "-a", a, "--repeats", "1", "--warmup", "0"]):
            res = box.run(*args)
            if info.exit_code == 2:
                assert res.exit_code == 2, args


# ---------------------------------------------------------------------------- device and link counts
@st.composite
def counted_cluster(draw: Any) -> tuple[str, int, int]:
    """A cluster file, written compactly, of a drawn device count (about the bound, or far past it) and
    links list length (about the ordered pairs, or far past them)."""
    d = draw(st.sampled_from([1, 2, 3, MAX_DEVICES, MAX_DEVICES + 1, 10**4] + ([10**6] if LONG_RUN else [])))
    full = draw(st.booleans())
    device = '{"name":"d%d","flops_per_s":1e12}' if full else "{}"
    devices = ",".join(device % i if full else device for i in range(d))
    pairs = d * (d - 1)
    n = draw(st.sampled_from([0, min(pairs, 64), pairs + 1 if pairs < 2_000_000 else 10**5, 10**5]))  # (written: <= 100 MB)
    link = '{"src":0,"dst":1,"bandwidth_Bps":1e9,"latency_s":0}'
    text = ('{"devices":[' + devices + '],"default_link":{"bandwidth_Bps":1e9,"latency_s":1e-6},"links":['
            + ",".join([link] * n) + "]}")  # fmt: skip
    return text, d, n


@fuzz(ci=25, share=0.25)
@given(case=counted_cluster())
def test_huge_device_and_link_counts_in_cluster_files(fuzz_base, case) -> None:
    text, devices, links = case
    with sandbox(fuzz_base) as box:
        g = box.write("g.json", json.dumps(GRAPH))
        c = box.write("c.json", text)
        res = box.run("graph", "info", g, "-c", c)
        if devices > MAX_DEVICES or links > devices * (devices - 1):
            assert res.exit_code == 2 and "c.json" in res.error_line, res.error_line
            assert ("'devices' lists" if devices > MAX_DEVICES else "'links' lists") in res.error_line, res.error_line


# ---------------------------------------------------------------------------- duplicate keys
def dumps_with_duplicate(doc: Any, path: tuple, key: str, value: Any) -> str:
    """``doc`` as JSON text in which the object at ``path`` names ``key`` once more (last, with ``value``)."""

    def emit(node: Any, at: tuple) -> str:
        if isinstance(node, dict):
            pairs = [json.dumps(str(k)) + ":" + emit(v, at + (k,)) for k, v in node.items()]
            if at == path:
                pairs.append(json.dumps(key) + ":" + json.dumps(value, allow_nan=True))
            return "{" + ",".join(pairs) + "}"
        if isinstance(node, list):
            return "[" + ",".join(emit(v, at + (i,)) for i, v in enumerate(node)) + "]"
        return json.dumps(node, allow_nan=True)

    return emit(doc, ())


def _objects(doc: Any, at: tuple = ()) -> list[tuple[tuple, list[str]]]:
    """(path, keys) of every object in ``doc``."""
    out = []
    if isinstance(doc, dict):
        out.append((at, list(doc)))
        for k, v in doc.items():
            out += _objects(v, at + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _objects(v, at + (i,))
    return out


DOCS = {"graph": GRAPH, "cluster": cluster("p100x4").to_json(), "assignment": ASSIGNMENT}


@st.composite
def duplicated(draw: Any, doc: Any) -> tuple[str, str]:
    """``doc`` as JSON text with one object naming one of its keys (or a new one) twice; and that key."""
    path, keys = draw(st.sampled_from(_objects(doc)))
    key = draw(st.sampled_from(keys) if keys else st.just("k"))
    if not keys:
        doc = json.loads(json.dumps(doc))
        node = doc
        for k in path:
            node = node[k]
        node["k"] = 0
    value = draw(st.one_of(ODD_VALUES, st.just(_at(doc, path + (key,)))))
    return dumps_with_duplicate(doc, path, key, value), key


def _at(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@fuzz(ci=40, share=0.5)
@given(data=st.data())
def test_a_key_named_twice_in_any_json_file_is_refused_naming_the_file_and_the_key(fuzz_base, data) -> None:
    kind = data.draw(st.sampled_from(sorted(DOCS)))
    text, key = data.draw(duplicated(DOCS[kind]))
    with sandbox(fuzz_base) as box:
        g = box.write("g.json", text if kind == "graph" else json.dumps(GRAPH))
        a = box.write("a.json", text if kind == "assignment" else json.dumps(ASSIGNMENT))
        c = box.write("c.json", text) if kind == "cluster" else "unit:2"
        res = box.run("simulate", g, "-c", c, "-a", a)
        named = {"graph": "g.json", "cluster": "c.json", "assignment": "a.json"}[kind]
        assert res.exit_code == 2 and named in res.error_line and f"key {key!r:.80} appears twice" in res.error_line, (
            res.error_line)


@fuzz(ci=15, share=0.1)
@given(data=st.data())
def test_a_key_named_twice_in_a_checkpoints_json_is_refused_naming_the_field(fuzz_base, train_run, data) -> None:
    import torch

    ck = load_plain(train_run.dir / "checkpoint.pt")
    field = data.draw(st.sampled_from(["config", "cluster", "numpy_rng"]))
    text, key = data.draw(duplicated(json.loads(ck[field])))
    ck[field] = text
    buf = io.BytesIO()
    torch.save(ck, buf)
    with sandbox(fuzz_base) as box:
        path = box.write("ck.pt", buf.getvalue())
        g = box.write("g.json", train_run.graph.read_bytes())
        res = box.run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", path, "-o", "a.json",
                      outputs=["a.json"])  # fmt: skip
        assert res.exit_code == 2 and "ck.pt" in res.error_line and f"the JSON text of {field}" in res.error_line
        assert f"key {key!r:.80} appears twice" in res.error_line, res.error_line


# ---------------------------------------------------------------------------- through the real process
def _bombs(tmp: Path, archives: dict, train_graph: Path) -> dict[str, tuple[list[str], str]]:
    """One probe per class, each a file of a few MB at most: (the command, what its error line names)."""
    pt2, ck = archives["pt2"], archives["checkpoint"]
    root = pt2[0][0].split("/")[0]
    write_zip(tmp / "bomb.pt2", pt2 + [(f"{root}/extra/blob", MAX_ZIP_MEMBER_BYTES + (1 << 20))])
    storage = next(n for n, _ in ck if "/data/" in n and not n.endswith(".pkl"))
    write_zip(tmp / "bomb.pt", [(n, c) for n, c in ck if n != storage] + [(storage, MAX_ZIP_MEMBER_BYTES + (1 << 20))])
    write_zip(tmp / "many.pt", ck + [(f"archive/pad/{i}", b"") for i in range(MAX_ZIP_MEMBERS)])
    doc = json.loads(json.dumps(GRAPH))
    doc["meta"]["inputs"]["A"] = [10**9, 10**9]
    (tmp / "huge.json").write_text(json.dumps(doc))
    (tmp / "a.json").write_text(json.dumps(ASSIGNMENT))
    (tmp / "g.json").write_text(json.dumps(GRAPH))
    (tmp / "c.json").write_text('{"devices":[' + ",".join(["{}"] * 10**6) + "]}")
    (tmp / "dup.json").write_text(dumps_with_duplicate(GRAPH, ("ops",), "kind", []))
    (tmp / "train.json").write_bytes(train_graph.read_bytes())
    ck_args = ["assign", "train.json", "-c", "unit:2", "-m", "doppler", "-o", "out.json", "--checkpoint"]
    return {
        "pt2 bomb": (["graph", "import", "bomb.pt2", "-o", "out.json"], "bomb.pt2: member"),
        "checkpoint bomb": (ck_args + ["bomb.pt"], f"bomb.pt: not a readable doppler checkpoint (member {storage}"),
        "many members": (ck_args + ["many.pt"], "many.pt"),
        "huge input": (["execute", "huge.json", "-a", "a.json"], "huge.json: meta.inputs['A']"),
        "million devices": (["simulate", "g.json", "-c", "c.json", "-a", "a.json"], "c.json: 'devices' lists 1,000,000"),
        "duplicate key": (["graph", "info", "dup.json"], "dup.json: not valid JSON (key 'kind' appears twice"),
    }


def test_each_probe_is_refused_in_one_line_by_a_process_under_2_gb(tmp_path, archives, train_run) -> None:
    """The real ``doppler`` process on one probe per class: exit 2, one ``error:`` line naming the file, no
    output written, and a peak resident size under 2 GB (the kernel's count for that process, from ``wait4``)."""
    probes = _bombs(tmp_path, archives, train_run.graph)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "COLUMNS": "200"}
    for label, (args, named) in probes.items():
        code, err, peak_bytes = _run_measured(args, tmp_path, env)
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], (label, code, err)
        assert not (tmp_path / "out.json").exists(), label
        assert peak_bytes < 2e9, (label, peak_bytes)


#: runs ``doppler ARGV[2:]`` and, as it exits, writes its own peak resident size (``VmHWM``, in kB) to ARGV[1]
_MEASURED_LAUNCH = """
import atexit, sys
report = sys.argv[1]
def _peak():
    with open("/proc/self/status") as f:
        hwm = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(report, "w") as f:
        f.write(hwm)
atexit.register(_peak)
sys.argv = ["doppler", *sys.argv[2:]]
from doppler.cli import main
main()
"""


def _run_measured(args: list[str], cwd: Path, env: dict, timeout_s: float = 120.0) -> tuple[int, str, float]:
    """``doppler ARGS`` run to its end (killed after ``timeout_s``): its exit code, its stderr, and its peak
    resident size in bytes, as the process itself reads it from ``/proc/self/status`` on exit (``VmHWM``: the
    high-water mark of its own memory since it started; ``wait4``'s ``ru_maxrss`` would also count the test
    process's memory at the time it was forked)."""
    report = cwd / ".peak_kb"
    report.unlink(missing_ok=True)
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", _MEASURED_LAUNCH, str(report), *args], cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)  # fmt: skip
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.seek(0)
        return proc.returncode, err.read(), float(report.read_text()) * 1024.0
