"""`doppler train` killed with SIGKILL at three points resumes to the uninterrupted run's checkpoint, and every
file a kill leaves is whole (benchmarks/fault_injection.py kills train, pretrain and compare at many more)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from typer.testing import CliRunner

from doppler.ir.assignment import load_assignment
from doppler.cli import app
from doppler.ir.formats import load_graph
from doppler.policy.architectures import read_checkpoint

ARGS = ("-c", "unit:2", "--episodes", "32", "--il-episodes", "8", "--batch", "8", "--search-evals", "300",
        "--threads", "1", "--json")  # fmt: skip


def _temps(run: Path) -> list[Path]:
    return [p for p in run.glob(".*.tmp") if p.is_file()]


def _kill_when(argv: list[str], ready: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Run ``argv`` and SIGKILL it (its process group) as soon as ``ready()``; fail if it ends first."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    t0 = time.perf_counter()
    while proc.poll() is None and not ready():
        assert time.perf_counter() - t0 < timeout_s, "the run did not reach its kill point in time"
        time.sleep(0.001)
    assert proc.poll() is None, f"the run ended before its kill point: {proc.stderr.read().decode()[-500:]}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()


def _changed(path: Path, before: int | None) -> Callable[[], bool]:
    """Whether ``path`` exists with another modification time than ``before`` (None: it did not exist)."""
    def check() -> bool:
        try:
            return path.stat().st_mtime_ns != before
        except FileNotFoundError:
            return False

    return check


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None


def _assert_whole(run: Path, graph) -> None:
    """What a kill left is whole: the checkpoint loads; config.json, the best assignment, the curve are each
    absent (not written yet: the checkpoint is written first) or whole."""
    read_checkpoint(run / "checkpoint.pt")
    torch.load(run / "checkpoint.pt", weights_only=True)
    if (run / "config.json").exists():
        assert isinstance(json.loads((run / "config.json").read_text()), dict)
    if (run / "best_assignment.json").exists():
        load_assignment(run / "best_assignment.json", graph, 2)
    if (run / "training_curve.png").exists():
        assert (run / "training_curve.png").read_bytes().endswith(b"IEND\xaeB`\x82")


def _comparable(path: Path) -> dict:
    ck = torch.load(path, weights_only=True)
    ck["history"] = [{k: v for k, v in row.items() if k != "episodes_per_s"} for row in json.loads(ck["history"])]
    return ck


def _assert_same(a, b, where: str = "checkpoint") -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def test_train_killed_three_times_resumes_to_the_uninterrupted_checkpoint(tmp_path: Path) -> None:
    g = tmp_path / "g.json"
    res = CliRunner().invoke(app, ["graph", "build", "random", "--set", "num_ops=20", "--set", "seed=1", "-o", str(g)])
    assert res.exit_code == 0, res.output
    graph = load_graph(g)
    full = tmp_path / "full"
    res = CliRunner().invoke(app, ["train", str(g), *ARGS, "-o", str(full)])
    assert res.exit_code == 0, res.output

    run = tmp_path / "killed"
    ckpt = run / "checkpoint.pt"
    train = [sys.executable, "-m", "doppler", "train", str(g), *ARGS, "-o", str(run)]
    # 1. as Stage I's checkpoint lands (Stage II under way); 2. the resumed run, as its next checkpoint is
    # being written (a temp file appears, or the checkpoint changes); 3. the next resume, after its next one
    _kill_when(train, _changed(ckpt, None))
    _assert_whole(run, graph)
    before, stale = _mtime(ckpt), set(_temps(run))  # (a kill leaves its temp file behind)
    _kill_when([*train, "--resume"], lambda: bool(set(_temps(run)) - stale) or _changed(ckpt, before)())
    _assert_whole(run, graph)
    before = _mtime(ckpt)
    _kill_when([*train, "--resume"], _changed(ckpt, before))
    _assert_whole(run, graph)
    done = subprocess.run([*train, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    _assert_same(_comparable(full / "checkpoint.pt"), _comparable(ckpt))
    for name in ("config.json", "best_assignment.json"):
        assert json.loads((run / name).read_text()) == json.loads((full / name).read_text()), name
