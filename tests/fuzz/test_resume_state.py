"""Fuzzing what ``--resume`` loads, one value at a time: every tensor of a real run's saved state (the weights,
the optimizer's moments and step counts, torch's generator state, distillation's best weights) made NaN, inf,
misshapen, of another dtype or a view larger than its bytes, every number of it (baselines, best makespans,
counters, the generators' and pretraining's numbers) made odd, and every count of a run's configuration made
huge, in its checkpoint, in its ``config.json`` or on the command line.

The property (besides tests/fuzz/common.py's): ``train --resume`` (``pretrain --resume``) either resumes to a
checkpoint that loads, with finite weights, and that ``assign --checkpoint`` uses, or exits 2 in one line and
leaves every file of the run directory byte for byte as it was."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from doppler.ir.formats import load_graph
from doppler.importer.files import load_plain
from doppler.policy.architectures import load_policy
from doppler.policy.checkpoint import CheckpointError
from doppler.hardware.presets import cluster
from doppler.train import Trainer, TrainError

from tests.fuzz.checkpoints import rewrite_checkpoint, torch_bytes
from tests.fuzz.common import FUZZ_EXAMPLES_ENV, fuzz, sandbox

#: what a tensor is made: a NaN in it, an inf, another shape, another dtype, a view of ten billion elements over
#: one element's bytes (a cast of it, as the optimizer's loader makes, once allocated 40 GB)
TENSOR_DAMAGE = ("nan", "inf", "shape", "dtype", "view")
DTYPES = (torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64, torch.uint8)
#: what a number is made
ODD_NUMBERS = (float("nan"), float("inf"), float("-inf"), -1, -1.5, 0, 1.5, 10**30, 2**64, 1e300, "7", None, True, [1])
#: huge or negative counts (every count's bound is below 10**10; seeds are below 2**32)
HUGE = (10**10, 10**15, 10**30, 2**63, 1e15, 1e30, -1)
#: the counts of a run's configuration (TrainConfig fields) and the options that set them on the command line
COUNT_FIELDS = {"episodes": "--episodes", "il_episodes": "--il-episodes", "real_episodes": "--real-episodes",
                "batch": "--batch", "il_batch": None, "search_every": "--search-every", "search_evals": "--search-evals",
                "distill_updates": None, "checkpoint_every": None, "torch_threads": "--threads", "seed": "--seed",
                "hidden": None, "mlp_hidden": None, "mp_steps": None, "pairs_per_update": None}  # fmt: skip


class Runs(dict):
    """Per run kind (``train``, ``pretrain``): the run and its loaded checkpoint."""

    def __repr__(self) -> str:  # (Hypothesis prints a failing example's arguments)
        return "<train_run and pretrain_run>"


@pytest.fixture(scope="module")
def runs(train_run, pretrain_run) -> Runs:
    return Runs({kind: (run, load_plain(run.dir / "checkpoint.pt"))
                 for kind, run in (("train", train_run), ("pretrain", pretrain_run))})  # fmt: skip


def with_distill_best(ck: dict) -> dict:
    """``ck`` as saved during distillation: with its best weights so far (a copy of its own)."""
    return {**ck, "distill_best": {"score": 1.25, "state_dict": {k: v.clone() for k, v in ck["state_dict"].items()}}}


def tensor_slots(ck: dict) -> list[tuple]:
    """The path of every tensor of a checkpoint's training state."""
    out: list[tuple] = [("state_dict", k) for k in ck["state_dict"]]
    out += [("optimizer", "state", p, k) for p, st_ in ck["optimizer"]["state"].items() for k in st_]
    out.append(("torch_rng",))
    out += [("distill_best", "state_dict", k) for k in ck.get("distill_best", {}).get("state_dict", {})]
    return out


def number_slots(ck: dict) -> list[tuple]:
    """The path of every number of a checkpoint's training state (a JSON field's numbers by the path inside it)."""
    out: list[tuple] = [(k,) for k in ("il_episode", "episode", "distill_step", "real_episode")]
    out += [("graphs", i, k) for i in range(len(ck["graphs"])) for k in ("baseline", "best_makespan_s", "oracle_calls")]
    out += [("numpy_rng", "state", "state"), ("numpy_rng", "state", "inc"), ("numpy_rng", "has_uint32"),
            ("numpy_rng", "uinteger"), ("distill_best", "score")]  # fmt: skip
    out += [("optimizer", "param_groups", 0, k) for k in ("lr", "eps", "weight_decay", "betas", "amsgrad", "maximize")]
    if "pretrain" in ck:
        out += [("pretrain", k) for k in ("budget_s", "elapsed_s", "updates", "workers")]
        out += [("pretrain", "corpus_rng", "state", "inc"), ("pretrain", "corpus_rng", "uinteger")]
    return out


def damaged_tensor(t: torch.Tensor, how: str, pick: int) -> torch.Tensor:
    """``t`` with a NaN or an inf at one place (as a float tensor, if it held integers), of another shape, of
    another dtype, or a view repeating one element (``pick`` chooses the place, the sign, the shape, the dtype or
    the view's dtype)."""
    if how in ("nan", "inf"):
        out = t.detach().clone().to(t.dtype if t.is_floating_point() else torch.float32)
        flat = out.view(-1) if out.numel() else out
        if out.numel():
            flat[pick % out.numel()] = float("nan") if how == "nan" else (-1) ** pick * float("inf")
        return out
    if how == "shape":
        shaped = [t.reshape(-1)[: max(t.numel() - 1, 0)], t.unsqueeze(0), t.reshape(-1).repeat(2), torch.zeros(())]
        shaped = [v for v in shaped if v.shape != t.shape]  # (a scalar step's zeros(()) is a step of 0, not a shape)
        return shaped[pick % len(shaped)]
    if how == "view":
        one = t.detach().reshape(-1)[:1].clone() if t.numel() else torch.zeros(1, dtype=t.dtype)
        return (one.double() if pick % 2 else one).expand(100_000, 100_000)
    dtype = DTYPES[pick % len(DTYPES)]
    return torch.complex(t.float(), torch.ones_like(t.float())) if dtype.is_complex else t.to(dtype)


def set_at(ck: dict, path: tuple, change) -> dict:
    """``ck`` (a copy: tensors shared) with the value at ``path`` replaced by ``change(value)``; a path that enters
    a JSON text field (``numpy_rng``, ``pretrain``, ...) changes the JSON it carries."""
    def put(node: Any, rest: tuple) -> Any:
        if isinstance(node, str):  # a JSON field
            return json.dumps(put(json.loads(node), rest), allow_nan=True)
        if not rest:
            return change(node)
        if isinstance(node, dict):
            return {**node, rest[0]: put(node.get(rest[0]), rest[1:])}
        if isinstance(node, (list, tuple)):
            items = list(node)
            items[rest[0]] = put(items[rest[0]], rest[1:])
            return type(node)(items) if isinstance(node, tuple) else items
        return change(node)

    return put(ck, path)


def files(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` and its bytes (the TensorBoard events too)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def resume_args(box, kind: str, run, d: Path) -> list:
    """The command that resumes the run in ``d`` for one more update (its graph copied into the sandbox)."""
    if kind == "train":
        g = box.write("g.json", run.graph.read_bytes())
        return ["train", g, "-c", "unit:2", "--resume", "--episodes", "12", "--threads", "1", "-o", d, "--json"]
    return ["pretrain", "--resume", "--budget-h", f"{(run.elapsed_s + 0.05) / 3600:.9f}", "-o", d, "--json"]


def check_resume(box, kind: str, run, d: Path, what: str) -> None:
    """The property: resumed to a loadable checkpoint of finite weights that assign uses, or exit 2 with the run
    directory as it was."""
    before = files(d)
    res = box.run(*resume_args(box, kind, run, d), outputs=[d])
    event(f"{kind} --resume: exit {res.exit_code}")
    if res.exit_code == 2:
        assert files(d) == before, f"{what}: exit 2, but the run directory changed"
        assert str(d) in res.error_line or "--resume" in res.error_line, (what, res.error_line)  # it names the run
        return
    policy, _ = load_policy(d)
    assert all(bool(torch.isfinite(w).all()) for w in policy.state_dict().values()), what
    g = box.write("g.json", (run.graph or run_graph_for_pretrain(box)).read_bytes())
    res = box.run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", d / "checkpoint.pt", "-o", "a.json",
                  outputs=["a.json"])  # fmt: skip
    assert res.exit_code == 0, f"{what}: resumed, but assign refused its checkpoint: {res.stderr}"


def run_graph_for_pretrain(box) -> Path:
    """A small graph for a pretraining run's policy (it serves any graph)."""
    from doppler import workloads
    from doppler.ir.formats import save_graph

    path = box.root / "pg.json"
    save_graph(workloads.build("random", size="tiny", num_ops=8), path)
    return path


@st.composite
def poisoned_state(draw, ck: dict) -> tuple[str, dict]:
    """A description and ``ck`` with one tensor or one number of its training state damaged."""
    if draw(st.booleans()):
        ck = with_distill_best(ck)
    if draw(st.integers(0, 2)):  # (tensors: two thirds)
        path = draw(st.sampled_from(tensor_slots(ck)))
        how, pick = draw(st.sampled_from(TENSOR_DAMAGE)), draw(st.integers(0, 10**6))
        return f"{path}: {how} ({pick})", set_at(ck, path, lambda t: damaged_tensor(t, how, pick))
    path, value = draw(st.sampled_from(number_slots(ck))), draw(st.sampled_from(ODD_NUMBERS))
    return f"{path} = {value!r}", set_at(ck, path, lambda _: value)


@fuzz(ci=30, share=0.5)
@given(kind=st.sampled_from(["train", "train", "pretrain"]), data=st.data())
def test_a_poisoned_resume_state_resumes_finite_or_exits_2_writing_nothing(fuzz_base, runs, kind, data) -> None:
    run, ck = runs[kind]
    what, poisoned = data.draw(poisoned_state(ck), label="poisoned")
    with sandbox(fuzz_base) as box:
        d = box.root / "RUN"
        shutil.copytree(run.dir, d, symlinks=True)
        (d / "checkpoint.pt").write_bytes(torch_bytes(poisoned))
        check_resume(box, kind, run, d, what)


@st.composite
def huge_count(draw) -> tuple[str, str, Any]:
    """(where, field, value): a count of the run's configuration made huge or negative in its checkpoint, in its
    config.json, in both, or on the command line (a train run's own option, or ``--set`` where it has none)."""
    field = draw(st.sampled_from(sorted(COUNT_FIELDS)))
    where = draw(st.sampled_from(["checkpoint", "config.json", "both", "command line"]))
    return where, field, draw(st.sampled_from(HUGE))


@fuzz(ci=40, share=0.25)
@given(kind=st.sampled_from(["train", "pretrain"]), data=st.data())
def test_a_huge_count_is_refused_in_one_line_writing_nothing(fuzz_base, runs, kind, data) -> None:
    """A checkpoint whose configuration said 1e15 episodes, or ``train --episodes 1e15``, once ran until it was
    killed; a config.json that says otherwise than the checkpoint was overwritten."""
    run, _ = runs[kind]
    where, field, value = data.draw(huge_count(), label="count")
    with sandbox(fuzz_base) as box:
        d = box.root / "RUN"
        shutil.copytree(run.dir, d, symlinks=True)
        args = resume_args(box, kind, run, d)
        if where in ("checkpoint", "both"):
            rewrite_checkpoint(d / "checkpoint.pt",
                               lambda ck: ck.update(config=json.dumps({**json.loads(ck["config"]), field: value})))  # fmt: skip
        if where in ("config.json", "both"):
            config = json.loads((d / "config.json").read_text())
            (d / "config.json").write_text(json.dumps({**config, field: value}))
        if where == "command line":
            if kind == "pretrain":  # (its one count on the command line is its budget, in hours)
                args[args.index("--budget-h") + 1] = str(value)
            elif field == "episodes":
                args[args.index("--episodes") + 1] = str(value)
            elif COUNT_FIELDS[field] is not None:
                args += [COUNT_FIELDS[field], str(value)]
            else:
                args += ["--set", f"{field}={value}"]
        before = files(d)
        res = box.run(*args, outputs=[d])
        assert res.exit_code == 2, f"{where} {field}={value!r}: exit {res.exit_code}"
        assert files(d) == before, f"{where} {field}={value!r}: the run directory changed"


def test_every_tensor_of_a_resumed_state_poisoned_is_refused_or_resumes_finite(tmp_path, runs) -> None:
    """Every tensor of a train run's state, in turn: made NaN, inf, misshapen or a view larger than its bytes it is
    refused naming the checkpoint; of another dtype, refused too, or resumed (a float64 moment is cast as torch loads it) to a run
    whose checkpoint loads with finite weights. The short run gives each tensor one damage in turn, ``make fuzz``
    every damage (a library-level sweep: milliseconds per tensor, where the command line takes a second)."""
    run, ck = runs["train"]
    ck = with_distill_best(ck)
    g = load_graph(run.graph)
    every = bool(os.environ.get(FUZZ_EXAMPLES_ENV))
    d = tmp_path / "RUN"
    shutil.copytree(run.dir, d)
    config = (d / "config.json").read_bytes()
    resumed = 0
    for i, path in enumerate(tensor_slots(ck)):
        for how in TENSOR_DAMAGE if every else (TENSOR_DAMAGE[i % len(TENSOR_DAMAGE)],):
            data = torch_bytes(set_at(ck, path, lambda t: damaged_tensor(t, how, i)))
            (d / "checkpoint.pt").write_bytes(data)
            (d / "config.json").write_bytes(config)
            try:
                trainer = Trainer.resume(d, [g], cluster("unit:2"), episodes=12)
            except (TrainError, CheckpointError) as e:
                assert str(e).startswith(str(d / "checkpoint.pt")), (path, how, str(e))
                assert (d / "checkpoint.pt").read_bytes() == data
                continue
            assert how == "dtype", f"{path}: {how} was not refused"
            trainer.run(d)
            policy, _ = load_policy(d)
            assert all(bool(torch.isfinite(w).all()) for w in policy.state_dict().values()), (path, how)
            resumed += 1
    assert 0 < resumed < len(tensor_slots(ck)) // 2  # (both outcomes met: most damage refused, float dtypes cast)
