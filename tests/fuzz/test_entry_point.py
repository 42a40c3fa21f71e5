"""The fuzzers run the commands in-process (fast); here one bad input per reader goes through the real
``doppler`` process, with a hard timeout: exit 2, exactly one ``error:`` line on stderr (a usage error
too, which in-process shows click's own box), nothing on stdout, no file made, no code run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from doppler.ir.formats import graph_to_json
from doppler.ir.graph import from_edges

from tests.fuzz.checkpoints import code_pickles
from tests.fuzz.common import ABSOLUTE_SENTINEL, SENTINEL

TIMEOUT_S = 120
GOOD_GRAPH = json.dumps(graph_to_json(from_edges([2.0, 1.0, 3.0], [(0, 1), (1, 2)], [4.0, 4.0, 4.0], name="g")))


def _code_checkpoint(sentinel: str) -> bytes:
    """A zip archive like torch.save's whose data.pkl would run ``touch SENTINEL`` if unpickled unsafely."""
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", code_pickles(sentinel)[0])
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


CASES = {
    "graph json": ({"g.json": '{"format": "doppler-graph", "vers'}, ["graph", "info", "g.json"], "g.json"),
    "text graph": ({"g.txt": "4\n3\n0,1\n1,2\n2,1e9\n1,1\n1,1\n"}, ["graph", "info", "g.txt"], "g.txt:5"),
    "cluster": ({"good.json": GOOD_GRAPH, "c.json": '{"devices": []}'}, ["graph", "info", "good.json", "-c", "c.json"],
                "c.json"),
    "assignment": ({"good.json": GOOD_GRAPH, "a.json": '[0, "x", 1]'},
                   ["simulate", "good.json", "-c", "unit:2", "-a", "a.json"], "a.json"),
    "checkpoint": ({"good.json": GOOD_GRAPH, "ck.pt": _code_checkpoint(SENTINEL)},
                   ["assign", "good.json", "-c", "unit:2", "-m", "doppler", "--checkpoint", "ck.pt", "-o", "out.json"],
                   "ck.pt"),
    "run directory": ({"RUN/checkpoint.pt": _code_checkpoint(str(ABSOLUTE_SENTINEL))[:300]},
                      ["pretrain", "--resume", "-o", "RUN", "--budget-h", "0.001"], "RUN"),
    "workload parameters": ({}, ["graph", "build", "llama_block", "--set", "size=tiny", "--set", "seq_len=300",
                                 "--set", "seq_blocks=300", "-o", "g.json"], "2,577,000 tile ops"),
    "usage": ({"good.json": GOOD_GRAPH, "a.json": "[0, 1, 0]"},
              ["simulate", "good.json", "-c", "unit:2", "-a", "a.json", "--seed", "notanumber"], "--seed"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_one_bad_input_per_reader_through_the_real_process(tmp_path: Path, case: str) -> None:
    files, args, named = CASES[case]
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-m", "doppler", *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=TIMEOUT_S, env=env)  # fmt: skip
    lines = res.stderr.splitlines()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], res.stderr
    assert res.stdout == ""
    assert not (tmp_path / SENTINEL).exists() and not ABSOLUTE_SENTINEL.exists()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
