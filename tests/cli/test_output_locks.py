"""One writer per output: a long command locks its outputs before any work and holds them to its end, so a
second doppler process writing the same output is refused at once (exit 2, one line naming the holder's pid);
the locks are released when a command ends, however it ends (io_util.OutputLock)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from doppler.cli import app
from doppler.ir.formats import save_graph
from doppler.util.io import LOCK_NAME, OutputLock

runner = CliRunner()


def _refused_naming(res, pid: int, path: Path, inside: Path | None = None) -> str:
    """The one error line of a command refused because process ``pid`` writes ``path`` (or the directory
    ``inside``, which holds ``path``)."""
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "internal error" not in lines[0], res.stderr
    assert f"{path}: another doppler process (pid {pid}" in lines[0] and "give another output" in lines[0], lines[0]
    assert inside is None or f") is writing {inside}, which holds this output" in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def graph(tmp_path: Path) -> Path:
    from doppler import workloads

    g = tmp_path / "g.json"
    save_graph(workloads.build("ffnn", size="tiny"), g)
    return g


def test_train_running_in_a_directory_refuses_a_second_train_and_a_resume(tmp_path: Path, graph: Path) -> None:
    import doppler.train  # noqa: F401  (imported before the clock starts: the refusal is what is timed)

    run_dir = tmp_path / "RUN"
    args = [str(graph), "-c", "unit:2", "--il-episodes", "16", "--batch", "8", "--threads", "1", "-o", str(run_dir)]
    doppler = Path(sys.executable).with_name("doppler")
    first = subprocess.Popen([str(doppler), "train", *args, "--episodes", "1000000"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        lock_file = run_dir / LOCK_NAME
        deadline = time.monotonic() + 120
        while not (lock_file.exists() and lock_file.read_text().startswith(f"{first.pid}\n")):
            assert first.poll() is None and time.monotonic() < deadline, "the first train did not take its lock"
            time.sleep(0.05)
        for extra in ([], ["--resume"]):
            t0 = time.monotonic()
            res = runner.invoke(app, ["train", *args, *extra])
            assert time.monotonic() - t0 < 5  # refused at once, not after the first one's run
            line = _refused_naming(res, first.pid, run_dir)
            assert f"doppler train {graph}" in line  # the holder's command line
        # whoever writes: any other command's output inside the run directory is refused the same way
        out = run_dir / "best_assignment.json"
        before = out.read_bytes() if out.exists() else None
        res = runner.invoke(app, ["assign", str(graph), "-c", "unit:2", "-m", "heft", "-o", str(out)])
        line = _refused_naming(res, first.pid, out, inside=run_dir)
        assert f"doppler train {graph}" in line
        assert (out.read_bytes() if out.exists() else None) == before
        assert first.poll() is None  # the first one is not disturbed
    finally:
        first.kill()
        first.wait()


def _invocations(tmp_path: Path, graph: Path) -> list[tuple[list[str], Path, bool]]:
    """(command line, the output it must lock, a directory?) for every long command."""
    a = tmp_path / "a.json"
    res = runner.invoke(app, ["assign", str(graph), "-c", "p100x4", "-m", "round_robin", "-o", str(a)])
    assert res.exit_code == 0, res.output
    g = str(graph)
    return [
        (["assign", g, "-c", "p100x4", "-m", "anneal", "--budget-s", "60", "-o", str(tmp_path / "b.json")], tmp_path / "b.json", False),
        (["compare", g, "-c", "p100x4", "-m", "heft", "--csv", str(tmp_path / "t.csv")], tmp_path / "t.csv", False),
        (["compare", g, "-c", "p100x4", "-m", "heft", "--save-dir", str(tmp_path / "S")], tmp_path / "S", True),
        (["pretrain", "-o", str(tmp_path / "P"), "--budget-h", "1"], tmp_path / "P", True),
        (["pretrain", "-o", str(tmp_path / "P"), "--resume"], tmp_path / "P", True),
        (["demo", "-o", str(tmp_path / "D"), "--no-engine"], tmp_path / "D", True),
        (["calibrate", "-o", str(tmp_path / "c.json")], tmp_path / "c.json", False),
        (["validate", g, "-c", "p100x4", "--n", "2", "-o", str(tmp_path / "v.json")], tmp_path / "v.json", False),
        (["validate", g, "-c", "p100x4", "--n", "2", "--plot", str(tmp_path / "v.png")], tmp_path / "v.png", False),
        (["execute", g, "-a", str(a), "-c", "p100x4", "--trace", str(tmp_path / "tr.json")], tmp_path / "tr.json", False),
    ]  # fmt: skip


def test_every_long_command_is_refused_on_a_held_output_and_writes_nothing(tmp_path: Path, graph: Path) -> None:
    for args, out, directory in _invocations(tmp_path, graph):
        before = sorted(p.name for p in tmp_path.iterdir())
        with OutputLock(out, directory=directory):  # (another open file in this process: refused the same)
            _refused_naming(runner.invoke(app, args), os.getpid(), out)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, args  # no lock file, no directory left


def test_locks_are_released_however_a_command_ends(tmp_path: Path, graph: Path, monkeypatch) -> None:
    out = tmp_path / "out" / "a.json"
    cmd = ["assign", str(graph), "-c", "p100x4", "-m", "heft", "-o", str(out)]
    res = runner.invoke(app, [cmd[0], str(tmp_path / "nope.json"), *cmd[2:]])  # an error after the lock
    assert res.exit_code == 2 and "nope.json" in res.output, res.output
    import doppler.methods

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(doppler.methods, "assign", interrupted)
    assert runner.invoke(app, cmd).exit_code == 130
    monkeypatch.undo()
    assert not (tmp_path / "out").exists()  # the lock and the directory made for it are gone
    for _ in range(2):  # a normal run, twice in one process: each takes the lock and lets it go
        res = runner.invoke(app, cmd)
        assert res.exit_code == 0, res.output
    assert [p.name for p in out.parent.iterdir()] == ["a.json"]
    save, csv = tmp_path / "S", tmp_path / "S" / "t.csv"  # two outputs in one directory do not block each other
    res = runner.invoke(app, ["compare", str(graph), "-c", "p100x4", "-m", "heft", "--save-dir", str(save), "--csv", str(csv)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in save.iterdir()) == ["heft.json", "t.csv"]


def test_every_output_inside_a_held_run_directory_is_refused_and_a_train_inside_a_written_one(tmp_path: Path,
                                                                                              graph: Path) -> None:
    """One writer per run directory, whoever writes: every command that would write into a directory another
    doppler process holds (here: held through io_util.OutputLock, as `train -o RUN` holds it) is refused in
    one line naming the holder, and writes nothing; a train into a directory where another command writes is
    refused too."""
    run = tmp_path / "RUN"
    a = tmp_path / "a.json"
    assert runner.invoke(app, ["assign", str(graph), "-c", "unit:2", "-m", "round_robin", "-o", str(a)]).exit_code == 0
    g, r = str(graph), str(run)
    cases = [
        (["assign", g, "-c", "unit:2", "-m", "heft", "-o", f"{r}/best_assignment.json"], run / "best_assignment.json"),
        (["simulate", g, "-c", "unit:2", "-a", str(a), "--trace", f"{r}/sub/tr.json"], run / "sub" / "tr.json"),
        (["graph", "build", "ffnn", "--set", "size=tiny", "-o", f"{r}/g.json"], run / "g.json"),
        (["graph", "convert", g, f"{r}/g.txt", "--round"], run / "g.txt"),
        (["compare", g, "-c", "unit:2", "-m", "heft", "--save-dir", f"{r}/S"], run / "S"),
        (["train", g, "-c", "unit:2", "-o", f"{r}/inner"], run / "inner"),
    ]  # fmt: skip
    with OutputLock(run, directory=True):
        for args, out in cases:
            _refused_naming(runner.invoke(app, args), os.getpid(), out, inside=run)
        assert [p.name for p in run.iterdir()] == [LOCK_NAME]
    with OutputLock(run / "x.json"):  # the other order: a command writes inside, then a train starts there
        res = runner.invoke(app, ["train", g, "-c", "unit:2", "-o", r])
        line = _refused_naming(res, os.getpid(), run)
        assert f"is writing {run / 'x.json'}, inside this output" in line
    assert not run.exists()
