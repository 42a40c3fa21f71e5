"""Fuzzing the checkpoint reader: a real training checkpoint and a real pretraining checkpoint, damaged
(tests/fuzz/checkpoints.py), through every command that loads one: ``assign --checkpoint``,
``compare --checkpoint``, ``train --init`` and ``pretrain --init``. No pickle in them ever runs."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from doppler.importer.files import load_plain

from tests.fuzz.checkpoints import code_checkpoint, content_mutated, zip_mutated
from tests.fuzz.common import FUZZ_EXAMPLES_ENV, fuzz, sandbox

TINY_TRAIN = ("--episodes", "4", "--batch", "4", "--search-evals", "0", "--warm-start", "none", "--threads", "1")


class Bases(dict):
    """Per checkpoint kind (``train``, ``pretrain``): its bytes and its loaded contents."""

    def __repr__(self) -> str:  # (Hypothesis prints a failing example's arguments)
        return "<the checkpoints of train_run and pretrain_run>"


@pytest.fixture(scope="module")
def bases(train_run, pretrain_run) -> Bases:
    out = Bases()
    for kind, run in (("train", train_run), ("pretrain", pretrain_run)):
        path = run.dir / "checkpoint.pt"
        out[kind] = (path.read_bytes(), load_plain(path))
    return out


def _through_checkpoint_commands(box, data: bytes, graph, trainer: str | None) -> None:
    """``assign`` and ``compare`` (milliseconds), and ``trainer`` (``train`` or ``pretrain``, ``--init``: a tiny
    run, about a second where the checkpoint loads; the fuzzers draw one of them, or both in the long run)."""
    ck = box.write("ck.pt", data)
    g = box.write("g.json", graph.read_bytes())
    assign = box.run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", ck, "-o", "a.json", outputs=["a.json"])
    if assign.exit_code == 2 and "checkpoint" in assign.error_line:
        assert "ck.pt" in assign.error_line, assign.error_line  # a refused checkpoint is named
    box.run("compare", g, "-c", "unit:2", "-m", "critical_path,doppler", "--checkpoint", ck)
    if trainer in ("train", "both"):
        box.run("train", g, "-c", "unit:2", "--init", ck, *TINY_TRAIN, "-o", "R", "--json", outputs=["R"])
    if trainer in ("pretrain", "both"):
        box.run("pretrain", "--init", ck, "--budget-h", "1e-6", "-o", "P", "--json", outputs=["P"])


KINDS = st.sampled_from(["train", "pretrain"])
TRAINERS = st.sampled_from(["train", "pretrain", "both" if os.environ.get(FUZZ_EXAMPLES_ENV) else "train"])


@fuzz(ci=60, share=0.5)
@given(kind=KINDS, trainer=TRAINERS, data=st.data())
def test_zip_damaged_checkpoints(fuzz_base, train_run, bases, kind, trainer, data) -> None:
    damaged = data.draw(zip_mutated(bases[kind][0]))
    with sandbox(fuzz_base) as box:
        _through_checkpoint_commands(box, damaged, train_run.graph, trainer)


@fuzz(ci=80, share=0.5)
@given(kind=KINDS, trainer=TRAINERS, data=st.data())
def test_checkpoints_with_odd_contents(fuzz_base, train_run, bases, kind, trainer, data) -> None:
    damaged = data.draw(content_mutated(bases[kind][1]))
    with sandbox(fuzz_base) as box:
        _through_checkpoint_commands(box, damaged, train_run.graph, trainer)


@fuzz(ci=40, share=0.25)
@given(kind=KINDS, data=st.data())
def test_checkpoints_that_pickle_code(fuzz_base, train_run, bases, kind, data) -> None:
    """A pickle that would create the sentinel file is refused, through every command (the sandbox checks the
    sentinel after each one)."""
    damaged = data.draw(code_checkpoint(bases[kind][0]))
    with sandbox(fuzz_base) as box:
        _through_checkpoint_commands(box, damaged, train_run.graph, "both")


def test_the_mutations_start_from_checkpoints_every_command_reads(fuzz_base, train_run, bases) -> None:
    """The undamaged checkpoints pass through every command (exit 0): the fuzzers above damage real ones."""
    for kind in ("train", "pretrain"):
        with sandbox(fuzz_base) as box:
            ck = box.write("ck.pt", bases[kind][0])
            g = box.write("g.json", train_run.graph.read_bytes())
            assert box.run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", ck, "-o", "a.json",
                           outputs=["a.json"]).exit_code == 0  # fmt: skip
            assert box.run("compare", g, "-c", "unit:2", "-m", "critical_path,doppler", "--checkpoint", ck).exit_code == 0
            if kind == "train":
                res = box.run("train", g, "-c", "unit:2", "--init", ck, *TINY_TRAIN, "-o", "R", outputs=["R"])
            else:
                res = box.run("pretrain", "--init", ck, "--budget-h", "1e-6", "-o", "P", outputs=["P"])
            assert res.exit_code == 0, res.stderr
