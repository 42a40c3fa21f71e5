"""Symbolic links at every path a command writes (SECURITY.md, Writes): each output of each command, each
member of a run directory (a new one and one given to ``--resume``) and each lock file is planted as a link
to a sentinel file or directory outside the sandbox, or as a dangling link into it. Every command must
refuse in one line naming the link (exit 2), before any work, and the sentinel must keep its bytes: nothing
is ever written through a link. The planted paths come from the commands' own outputs and
:data:`~doppler.policy.checkpoint.RUN_DIR_MEMBERS`, whose completeness is checked against real runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from doppler.util.io import LOCK_NAME, LOCK_SUFFIX
from doppler.policy.checkpoint import RUN_DIR_MEMBERS

from tests.fuzz.common import Sandbox, fuzz, sandbox

EXAMPLE_MODELS = Path(__file__).resolve().parents[2] / "examples" / "models.py"
#: what each planted link points to: a file with the sentinel's bytes, a directory holding it, nothing yet
LINK_KINDS = ("file", "directory", "dangling")
SENTINEL_BYTES = b"the sentinel: doppler must never write here\n" * 4


def _lock(path: Path, directory: bool) -> Path:
    """The lock file of an output (io_util.OutputLock)."""
    return path / LOCK_NAME if directory else path.parent / f".{path.name}{LOCK_SUFFIX}"


@dataclass(frozen=True)
class Command:
    """A command line in a sandbox, the paths it writes (outputs, members, lock files) and the outputs it is
    given (all it may leave behind)."""

    args: list
    writes: list[Path]
    outputs: list[Path]


def _files(box: Sandbox, *names: str) -> tuple[list[Path], list[Path]]:
    """File outputs in the sandbox: (each with its lock file, the outputs)."""
    outs = [box.root / n for n in names]
    return [p for o in outs for p in (o, _lock(o, False))], outs


def _run_dir(d: Path, members) -> list[Path]:
    return [d, _lock(d, True), *(d / m for m in members)]


def _inputs(box: Sandbox, runs) -> dict[str, Path]:
    g = box.root / "g.json"
    shutil.copy(runs["graph"], g)
    a = box.root / "a.json"
    a.write_text("[" + ", ".join(str(i % 2) for i in range(runs["num_ops"])) + "]")
    return {"g": g, "a": a}


def _copy_run(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to, symlinks=True)
    return to


#: every command that writes, as a function of (sandbox, runs) -> Command
COMMANDS: dict[str, Callable[[Sandbox, dict], Command]] = {}


def command(name: str):
    def register(fn):
        COMMANDS[name] = fn
        return fn

    return register


@command("graph build")
def _(box, runs):
    writes, outs = _files(box, "out.json")
    return Command(["graph", "build", "ffnn", "--set", "size=tiny", "-o", outs[0]], writes, outs)


@command("graph import")
def _(box, runs):
    writes, outs = _files(box, "imported.json")
    return Command(["graph", "import", f"{EXAMPLE_MODELS}:mlp", "-o", outs[0]], writes, outs)


@command("graph convert")
def _(box, runs):
    i = _inputs(box, runs)
    writes, outs = _files(box, "out.txt")
    return Command(["graph", "convert", i["g"], outs[0], "--round"], writes, outs)


@command("graph draw")
def _(box, runs):
    i = _inputs(box, runs)
    writes, outs = _files(box, "g.png")
    return Command(["graph", "draw", i["g"], "-o", outs[0]], writes, outs)


@command("assign")
def _(box, runs):
    i = _inputs(box, runs)
    writes, outs = _files(box, "out.json")
    return Command(["assign", i["g"], "-c", "unit:2", "-m", "heft", "-o", outs[0]], writes, outs)


@command("compare")
def _(box, runs):
    i = _inputs(box, runs)
    writes, outs = _files(box, "t.csv")
    save = box.root / "S"
    writes += _run_dir(save, ["heft.json", "critical_path.json"])
    args = ["compare", i["g"], "-c", "unit:2", "-m", "heft,critical_path", "--csv", outs[0], "--save-dir", save]
    return Command(args, writes, [*outs, save])


@command("simulate")
def _(box, runs):
    i = _inputs(box, runs)
    writes, outs = _files(box, "gantt.png", "tr.json", "chrome.json", "ops.csv")
    flags = [x for flag, o in zip(("--gantt", "--trace", "--chrome-trace", "--ops-csv"), outs) for x in (flag, o)]
    return Command(["simulate", i["g"], "-c", "unit:2", "-a", i["a"], *flags], writes, outs)


@command("execute")
def _(box, runs):
    i = _inputs(box, runs)
    writes, outs = _files(box, "gantt.png", "tr.json", "chrome.json", "ops.csv")
    flags = [x for flag, o in zip(("--gantt", "--trace", "--chrome-trace", "--ops-csv"), outs) for x in (flag, o)]
    return Command(["execute", i["g"], "-c", "unit:2", "-a", i["a"], "--repeats", "1", *flags], writes, outs)


@command("calibrate")
def _(box, runs):
    writes, outs = _files(box, "cal.json")
    return Command(["calibrate", "-o", outs[0], "--runs", "1", "--sizes", "32"], writes, outs)


@command("validate")
def _(box, runs):
    i = _inputs(box, runs)
    writes, outs = _files(box, "v.png", "v.json")
    return Command(["validate", i["g"], "-c", "unit:2", "--n", "2", "--repeats", "1", "--plot", outs[0], "-o", outs[1]],
                   writes, outs)  # fmt: skip


@command("train")
def _(box, runs):
    i = _inputs(box, runs)
    d = box.root / "RUN"
    return Command(["train", i["g"], "-c", "unit:2", "--il-episodes", "4", "--batch", "4", "--episodes", "4",
                    "--threads", "1", "-o", d], _run_dir(d, RUN_DIR_MEMBERS), [d])  # fmt: skip


@command("train --resume")
def _(box, runs):
    i = _inputs(box, runs)
    d = _copy_run(runs["train"], box.root / "RUN")
    return Command(["train", i["g"], "-c", "unit:2", "--resume", "--episodes", "12", "--threads", "1", "-o", d],
                   _run_dir(d, RUN_DIR_MEMBERS), [d])  # fmt: skip


@command("pretrain")
def _(box, runs):
    d = box.root / "PRE"
    return Command(["pretrain", "-o", d, "--budget-h", "0.000001"], _run_dir(d, RUN_DIR_MEMBERS), [d])


@command("pretrain --resume")
def _(box, runs):
    d = _copy_run(runs["pretrain"], box.root / "PRE")
    return Command(["pretrain", "--resume", "-o", d, "--budget-h", "1"], _run_dir(d, RUN_DIR_MEMBERS), [d])


@command("demo")
def _(box, runs):
    d = box.root / "D"
    members = ["chainmm_graph.png", "llama_layer_gantt_heft.png", "ffnn_gantt_doppler zero-shot.png",
               "doppler_llama_block", "doppler_chainmm/checkpoint.pt", "doppler_ffnn/tensorboard",
               "engine_cluster.json", "ffnn_small_engine_gantt_metis.png"]  # (a sample of its names)
    return Command(["demo", "-o", d, "--budget-s", "0.01", "--train-episodes", "4", "--il-episodes", "4"],
                   _run_dir(d, members), [d])  # fmt: skip


@pytest.fixture(scope="module")
def runs(train_run, pretrain_run) -> dict:
    from doppler.ir.formats import load_graph

    return {"graph": train_run.graph, "num_ops": load_graph(train_run.graph).num_ops, "train": train_run.dir,
            "pretrain": pretrain_run.dir}  # fmt: skip


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A directory outside every sandbox, with the sentinel file in it."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "sentinel").write_bytes(SENTINEL_BYTES)
    return d


def _plant(at: Path, kind: str, outside: Path) -> None:
    """Replace whatever is at ``at`` with a link of ``kind`` (its directory made if missing)."""
    at.parent.mkdir(parents=True, exist_ok=True)
    if at.is_symlink() or at.is_file():
        at.unlink()
    elif at.is_dir():
        shutil.rmtree(at)
    at.symlink_to({"file": outside / "sentinel", "directory": outside, "dangling": outside / "made"}[kind])


def _untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["sentinel"], "a file was made outside through a link"
    assert (outside / "sentinel").read_bytes() == SENTINEL_BYTES, "the sentinel was written through a link"


def _refused_naming(res, planted: list[Path], where: str) -> None:
    assert res.exit_code == 2, f"{where}: exit {res.exit_code}, the links were not refused\n{res.stderr[-2000:]}"
    assert any(str(p) in res.error_line for p in planted), f"{where}: {res.error_line}"
    assert "symbolic link" in res.error_line, f"{where}: {res.error_line}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_link_at_any_path_a_command_writes_is_refused_untouched(fuzz_base, runs, outside, name) -> None:
    """Every written path of the command, one at a time, for every kind of link."""
    with sandbox(fuzz_base) as box:
        n_writes = len(COMMANDS[name](box, runs).writes)
    for i in range(n_writes):
        for kind in LINK_KINDS:
            with sandbox(fuzz_base) as box:
                cmd = COMMANDS[name](box, runs)
                at = cmd.writes[i]
                _plant(at, kind, outside)
                res = box.run(*cmd.args, outputs=cmd.outputs)
                _refused_naming(res, [at], f"doppler {name}, {at.relative_to(box.root)} a link to a {kind}")
                assert at.is_symlink()  # the link itself left as it was
            _untouched(outside)


@fuzz(ci=30)
@given(name=st.sampled_from(list(COMMANDS)), data=st.data())
def test_links_at_several_written_paths_at_once(fuzz_base, runs, tmp_path_factory, name, data) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "sentinel").write_bytes(SENTINEL_BYTES)
    with sandbox(fuzz_base) as box:
        cmd = COMMANDS[name](box, runs)
        ats = data.draw(st.lists(st.sampled_from(cmd.writes), min_size=1, max_size=4, unique=True), label="links")
        ats = [a for a in ats if not any(b in a.parents for b in ats)]  # (a link inside a link is no path)
        for at in ats:
            _plant(at, data.draw(st.sampled_from(LINK_KINDS), label=f"kind of {at.name}"), outside)
        res = box.run(*cmd.args, outputs=cmd.outputs)
        _refused_naming(res, ats, f"doppler {name}, links at {[str(a.relative_to(box.root)) for a in ats]}")
    _untouched(outside)


def test_the_run_directory_members_name_everything_a_run_writes(runs, tmp_path: Path) -> None:
    """RUN_DIR_MEMBERS, which the links are planted at, lists every name a real run leaves (the fixtures'
    runs, and a ``doppler train`` through the command line, which adds the training curve)."""
    from typer.testing import CliRunner

    from doppler.cli import app

    d = tmp_path / "RUN"
    res = CliRunner().invoke(app, ["train", str(runs["graph"]), "-c", "unit:2", "--il-episodes", "4", "--batch", "4",
                                   "--episodes", "4", "--threads", "1", "--set", "hidden=8", "-o", str(d)])  # fmt: skip
    assert res.exit_code == 0, res.output
    for run_dir in (runs["train"], runs["pretrain"], d):
        assert {p.name for p in run_dir.iterdir()} <= set(RUN_DIR_MEMBERS), run_dir
    assert {p.name for p in d.iterdir()} == set(RUN_DIR_MEMBERS)


def test_a_linked_checkpoint_through_the_real_process(runs, outside, tmp_path: Path) -> None:
    """The issue's case end to end, in a real ``doppler`` process: ``train --resume`` on a run directory whose
    checkpoint is a link to a file elsewhere (and, separately, a lock file planted beside an output)."""
    doppler = Path(sys.executable).with_name("doppler")
    d = _copy_run(runs["train"], tmp_path / "RUN")
    _plant(d / "checkpoint.pt", "file", outside)
    g = tmp_path / "g.json"
    shutil.copy(runs["graph"], g)
    _plant(tmp_path / ".out.json.doppler.lock", "file", outside)
    for args, named in ((["train", g, "-c", "unit:2", "--resume", "--threads", "1", "-o", d], d / "checkpoint.pt"),
                        (["assign", g, "-c", "unit:2", "-m", "heft", "-o", tmp_path / "out.json"],
                         tmp_path / ".out.json.doppler.lock")):  # fmt: skip
        res = subprocess.run([str(doppler), *map(str, args)], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ") and str(named) in lines[0] and "symbolic link" in lines[0], lines[0]
        assert res.stdout == ""
    _untouched(outside)
    assert not (tmp_path / "out.json").exists()

