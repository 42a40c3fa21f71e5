"""Fuzzing the run directories that ``--resume`` reads: a real ``doppler train`` run and a real ``doppler
pretrain`` run, copied, then damaged (their checkpoint as tests/fuzz/checkpoints.py damages one, their
config.json corrupted or replaced, files deleted or replaced by directories or links), and resumed.
Everything under the run directory is the command's output; nothing may appear beside it."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from doppler.importer.files import load_plain

from tests.fuzz.checkpoints import code_checkpoint, content_mutated, zip_mutated
from tests.fuzz.common import corrupted, fuzz, mutated_bytes, sandbox


class Runs(dict):
    """Per run kind (``train``, ``pretrain``): the run, its checkpoint's bytes and contents, its config.json."""

    def __repr__(self) -> str:  # (Hypothesis prints a failing example's arguments)
        return "<train_run and pretrain_run>"


@pytest.fixture(scope="module")
def runs(train_run, pretrain_run) -> Runs:
    out = Runs()
    for kind, run in (("train", train_run), ("pretrain", pretrain_run)):
        ck = run.dir / "checkpoint.pt"
        out[kind] = (run, ck.read_bytes(), load_plain(ck), json.loads((run.dir / "config.json").read_text()))
    return out


@st.composite
def damage(draw, kind: str, runs: Runs):
    """``(what, apply)``: a description of the damage and a function that does it to a copied run directory."""
    run, ck_bytes, ck, config = runs[kind]
    files = sorted(p.name for p in run.dir.iterdir())
    how = draw(st.sampled_from(["checkpoint", "checkpoint", "checkpoint", "config", "missing", "replaced"]))
    if how == "checkpoint":
        data = draw(st.one_of(zip_mutated(ck_bytes), content_mutated(ck), code_checkpoint(ck_bytes)))
        return f"checkpoint.pt: {data!r}", lambda d: (d / "checkpoint.pt").write_bytes(data)
    if how == "config":
        text = draw(st.one_of(corrupted(config), mutated_bytes(json.dumps(config, indent=2).encode())))
        data = text.encode() if isinstance(text, str) else text
        return f"config.json: {data[:300]!r}", lambda d: (d / "config.json").write_bytes(data)
    name = draw(st.sampled_from(files))
    if how == "missing":
        return f"{name} deleted", lambda d: shutil.rmtree(d / name) if (d / name).is_dir() else (d / name).unlink()
    into = draw(st.sampled_from(["directory", "dangling link", "empty file", "fifo"]))

    def replace(d):
        p = d / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        if into == "directory":
            p.mkdir()
        elif into == "dangling link":
            p.symlink_to(d / "nowhere")
        elif into == "fifo":
            os.mkfifo(p)
        else:
            p.write_bytes(b"")

    return f"{name} replaced by a {into}", replace


def _resume(box, kind: str, runs: Runs, extend: bool):
    run = runs[kind][0]
    d = box.root / "RUN"
    shutil.copytree(run.dir, d, symlinks=True)
    if kind == "train":
        g = box.write("g.json", run.graph.read_bytes())
        more = ("--episodes", "12") if extend else ()  # (4 more Stage II episodes than the run did)
        return d, ["train", g, "-c", "unit:2", "--resume", *more, "--threads", "1", "-o", d, "--json"]
    budget_h = (run.elapsed_s + (0.05 if extend else 0.0)) / 3600  # spent already, or one update more
    return d, ["pretrain", "--resume", "--budget-h", f"{budget_h:.9f}", "-o", d, "--json"]


@fuzz(ci=80, share=0.5)
@given(kind=st.sampled_from(["train", "pretrain"]), extend=st.booleans(), data=st.data())
def test_resume_damaged_runs(fuzz_base, runs, kind, extend, data) -> None:
    what, apply = data.draw(damage(kind, runs), label="damage")
    with sandbox(fuzz_base) as box:
        d, args = _resume(box, kind, runs, extend)
        apply(d)
        res = box.run(*args, outputs=[d])
        if res.exit_code == 2:
            assert "RUN" in res.error_line or "--resume" in res.error_line, (what, res.error_line)  # it names the run


@pytest.mark.parametrize("kind", ["train", "pretrain"])
def test_the_damage_starts_from_runs_that_resume(fuzz_base, runs, kind) -> None:
    """The undamaged runs resume (exit 0), extended or not: the fuzzer above damages real ones."""
    for extend in (False, True):
        with sandbox(fuzz_base) as box:
            d, args = _resume(box, kind, runs, extend)
            res = box.run(*args, outputs=[d])
            assert res.exit_code == 0, res.stderr
