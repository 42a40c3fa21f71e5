"""Data-parallel pretraining (``doppler pretrain --workers N``): the gradient average, each worker's own
streams, one policy across workers, resume, and a worker that dies."""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from typer.testing import CliRunner

from doppler.cli import app
from doppler.policy.architectures import read_checkpoint
from doppler.train.pretrain import Pretrainer, pretrain_config
from doppler.train.pretrain_parallel import Recipe, _join, run_workers
from doppler.train import TrainError

TINY = dict(hidden=16, mlp_hidden=16, mp_steps=2, il_episodes=16, batch=4, search_evals=50, torch_threads=1)
runner = CliRunner()


def _average_probe(rank: int, world: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    sync = _join(rank, world, store, 60.0)
    both = torch.nn.Parameter(torch.zeros(3))
    both.grad = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)  # worker 0: 1,2,3; worker 1: 2,4,6
    neither = torch.nn.Parameter(torch.zeros(2))  # no gradient anywhere: keeps none
    one = torch.nn.Parameter(torch.zeros(2))
    one.grad = torch.tensor([4.0, 8.0]) if rank == 1 else None  # only worker 1's loss reached it
    sync.average([both, neither, one])
    torch.save({"both": both.grad, "neither": neither.grad, "one": one.grad}, f"{out_dir}/{rank}.pt")
    dist.destroy_process_group()


def test_gradients_are_averaged_over_the_workers(tmp_path):
    mp.start_processes(_average_probe, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        assert torch.equal(got["both"], torch.tensor([1.5, 3.0, 4.5]))  # the mean, not the sum
        assert got["neither"] is None
        assert torch.equal(got["one"], torch.tensor([2.0, 4.0]))  # as in one process: the missing pair adds 0


def test_each_worker_draws_its_own_pairs_and_worker_zero_the_usual_ones():
    cfg = pretrain_config(**TINY)
    plain, w0, w1 = (Pretrainer.create(cfg, 3600), Pretrainer.create(cfg, 3600, rank=0),
                     Pretrainer.create(cfg, 3600, rank=1))  # fmt: skip
    first = [(p.trainer.tasks[0].graph.name, p.trainer.tasks[0].graph.num_ops, p.trainer.tasks[0].cluster.name)
             for p in (plain, w0, w1)]  # fmt: skip
    assert first[0] == first[1]
    draws = [[p.corpus_rng.random() for _ in range(4)] for p in (plain, w0, w1)]
    assert draws[0] == draws[1] and draws[1] != draws[2]
    assert plain.trainer.rng.random() == w0.trainer.rng.random() != w1.trainer.rng.random()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="--workers 2 needs 2 cores")
def test_two_workers_train_one_policy_checkpoint_and_resume(tmp_path):
    out = tmp_path / "PT"
    res = _cli("pretrain", "-o", out, "--budget-h", "0.001", "--workers", "2", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["workers"] == 2 and s["workers_in_sync"] is True and s["updates"] >= 1 and s["pairs_per_update"] == 2
    meta = json.loads(read_checkpoint(out)["pretrain"])
    assert meta["workers"] == 2 and len(meta["worker_streams"]) == 1
    # worker 1 drew pairs of its own stream: it moved from where a fresh worker 1 starts
    fresh = Pretrainer.create(pretrain_config(seed=0), 3600, rank=1).corpus_rng.bit_generator.state
    assert meta["worker_streams"][0]["corpus_rng"] != fresh
    # resumed, worker 1 continues its saved streams, and a worker the run did not have starts its own
    back = Pretrainer.resume(out, rank=1)
    assert back.corpus_rng.bit_generator.state == meta["worker_streams"][0]["corpus_rng"]
    assert back.trainer.rng.bit_generator.state == meta["worker_streams"][0]["numpy_rng"]
    new = Pretrainer.resume(out, rank=2)  # seed 0: worker 2's streams are seeded (1, 2) and (0, 2)
    assert new.corpus_rng.bit_generator.state == np.random.default_rng([1, 2]).bit_generator.state
    assert new.trainer.rng.bit_generator.state == np.random.default_rng([0, 2]).bit_generator.state
    res = _cli("pretrain", "-o", out, "--budget-h", "0.002", "--resume", "--json")  # the run's own count
    assert res.exit_code == 0, res.output
    s2 = json.loads(res.stdout)
    assert s2["workers"] == 2 and s2["workers_in_sync"] is True and s2["updates"] > s["updates"]
    assert json.loads(read_checkpoint(out)["pretrain"])["worker_streams"] != meta["worker_streams"]
    res = _cli("pretrain", "-o", out, "--budget-h", "0.0025", "--resume", "--workers", "1", "--json")  # fewer
    assert res.exit_code == 0 and json.loads(res.stdout)["workers"] == 1, res.output


@pytest.mark.parametrize("workers", ["0", "100000"])
def test_workers_out_of_range_exit_2_before_any_work(tmp_path, workers):
    res = _cli("pretrain", "-o", tmp_path / "PT", "--budget-h", "0.001", "--workers", workers)
    assert res.exit_code == 2 and "--workers" in res.stderr and not (tmp_path / "PT").exists(), res.output


def test_a_worker_that_fails_stops_the_run_with_one_error(tmp_path):
    cfg = pretrain_config(**TINY)
    pt = Pretrainer.create(cfg, 3600)
    broken = Recipe("resume", 3600, path=str(tmp_path / "missing"))  # worker 1 cannot build its Pretrainer
    with pytest.raises(TrainError, match="worker 1: CheckpointError: .*missing"):
        run_workers(pt, broken, 2, tmp_path / "PT", timeout_s=60)


@dataclasses.dataclass(frozen=True)
class _FailsThenExitsSlowly(Recipe):
    """A worker whose build fails and whose process then takes 5 s to exit (as on a loaded machine)."""

    def build(self, rank: int) -> Pretrainer:
        atexit.register(time.sleep, 5.0)
        raise TrainError("no pretrainer for this worker")


def test_a_failing_worker_is_named_with_its_reason_however_slowly_it_exits(tmp_path):
    pt = Pretrainer.create(pretrain_config(**TINY), 3600)
    with pytest.raises(TrainError, match="worker 1: TrainError: no pretrainer for this worker"):
        run_workers(pt, _FailsThenExitsSlowly("create", 3600), 2, tmp_path / "PT", timeout_s=60)


def _exit_at_once() -> None:
    raise SystemExit(3)


def test_a_worker_gone_before_it_joins_is_named_at_once(tmp_path):
    ctx = mp.get_context("spawn")
    gone = ctx.Process(target=_exit_at_once, name="worker 1")
    gone.start()
    gone.join(30)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="worker 1 exited before it joined"):
        _join(0, 2, str(tmp_path / "store"), 10.0, [gone])
    assert time.monotonic() - t0 < 10  # not the start timeout


def _kill_a_worker_once_training(pt: Pretrainer, stop: threading.Event) -> None:
    while not stop.is_set():
        kids = [p for p in mp.active_children() if p.name.startswith("worker")]
        if kids and pt.updates >= 3:  # every worker has joined and trains
            os.kill(kids[0].pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def test_a_worker_killed_mid_run_stops_it_with_one_error_not_a_hang(tmp_path):
    pt = Pretrainer.create(pretrain_config(**TINY), 300)
    stop = threading.Event()
    threading.Thread(target=_kill_a_worker_once_training, args=(pt, stop), daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TrainError, match="worker 1 stopped"):
            run_workers(pt, Recipe("create", 300, cfg=pt.cfg), 2, tmp_path / "PT", timeout_s=120)
    finally:
        stop.set()
    assert 3 <= pt.updates and time.monotonic() - t0 < 120  # noticed when its socket closed, not at a timeout


def _there_but_never_joins(store_path: str) -> None:
    """A worker that says it is there, then never joins the process group (hung, or stopped, in between)."""
    import torch.distributed as dist

    dist.FileStore(store_path, 2).set("worker 1", "here")
    open(store_path + ".said", "w").close()
    time.sleep(3600)


def _never_there() -> None:
    time.sleep(3600)


@pytest.mark.parametrize("lurker, message", [(_never_there, "did not start within 2 s"),
                                             (_there_but_never_joins, "did not all join within 2 s")])  # fmt: skip
def test_a_worker_that_never_joins_stops_worker_zero_within_the_start_timeout(tmp_path, lurker, message):
    store = str(tmp_path / "store")
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=lurker, args=(store,) if lurker is _there_but_never_joins else (), name="worker 1",
                    daemon=True)  # fmt: skip
    p.start()
    try:
        while lurker is _there_but_never_joins and not os.path.exists(store + ".said") and p.is_alive():
            time.sleep(0.05)  # (a spawned process takes seconds to start on a loaded machine)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=message):
            _join(0, 2, store, 600.0, [p], start_timeout_s=2.0)  # not the exchange time-out
        assert time.monotonic() - t0 < 10
    finally:
        p.terminate()
        p.join(10)


@dataclasses.dataclass(frozen=True)
class _NeverStarts(Recipe):
    """A recipe whose worker hangs before it can join (its arguments take for ever to arrive)."""

    def __reduce__(self):
        return time.sleep, (3600,)


def test_run_workers_stops_a_worker_that_never_joins_and_ends_at_once(tmp_path):
    pt = Pretrainer.create(pretrain_config(**TINY), 3600)
    t0 = time.monotonic()
    with pytest.raises(TrainError, match="did not start within 3 s"):
        run_workers(pt, _NeverStarts("create", 3600), 2, tmp_path / "PT", timeout_s=600, start_timeout_s=3.0)
    assert time.monotonic() - t0 < 15  # the start time-out, not the exchange's, nor a wait for the worker to leave
    assert not [c for c in mp.active_children() if c.name.startswith("worker")]


def test_the_workers_help_states_the_time_outs() -> None:
    import typer

    from doppler.train.pretrain_parallel import EXCHANGE_TIMEOUT_S, START_TIMEOUT_S

    cmd = typer.main.get_command(app).commands["pretrain"]
    text = next(p.help for p in cmd.params if p.name == "workers")
    assert f"within {START_TIMEOUT_S:g} s" in text and f"over {EXCHANGE_TIMEOUT_S:g} s" in text
