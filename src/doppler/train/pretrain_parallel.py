"""Pretraining on several processes (``doppler pretrain --workers N``): data-parallel workers.

Each of the ``N`` processes runs the same :class:`~doppler.train.pretrain.Pretrainer` on its own stream of
fresh (graph, cluster) pairs (worker 0's is the stream of a run without workers) and its own rollouts,
and before every optimiser step their gradients are averaged (``torch.distributed`` with gloo; the
processes meet through a file, and gloo's sockets are on the loopback device, 127.0.0.1). All start
from the same weights and take the same steps, so they hold the same policy throughout: one update
learns from ``N x pairs_per_update`` pairs, as ``--pairs-per-update`` does in one process, but the
pairs are encoded, decoded and simulated side by side instead of one after another (the rollouts and
the simulator run on the CPU, which is why one process cannot use a machine's other cores).

Worker 0 is the calling process: it reports progress, keeps the clock that every worker follows (so
all decay the learning rate alike and stop on the same update), and writes the checkpoints, which hold
every worker's streams: ``--resume`` continues each of them, and with another worker count the workers
in both continue theirs and new ones begin their own. Counters, history and TensorBoard are worker 0's
(so ``il_episodes`` counts one worker's episodes).

A worker that dies makes the next gradient exchange fail, which ends the run with one line
(:class:`~doppler.train.TrainError`) that names it, and its reason where it could give one; no exchange
waits longer than ``timeout_s`` (:data:`EXCHANGE_TIMEOUT_S`), and no start longer than
``start_timeout_s`` (:data:`START_TIMEOUT_S`): every worker must have joined the process group by then,
or worker 0 stops the run and the workers still there.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from doppler.train.pretrain import Pretrainer
from doppler.util.progress import ProgressFn
from doppler.train.config import TrainConfig, TrainError

#: seconds a gradient exchange may wait for the slowest worker (an update on 1,000 ops with search
#: takes seconds; a dead worker is noticed at once, its socket closes)
EXCHANGE_TIMEOUT_S = 600.0
#: seconds worker 0 waits for the others to start and join the process group (each imports torch)
START_TIMEOUT_S = 180.0
#: seconds the workers get to leave after the last exchange of a run that ended well, before they are
#: stopped (after a failed run they are stopped at once)
LEAVE_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How each worker builds its :class:`Pretrainer`: ``kind`` is ``create`` (``cfg``), ``resume``
    (``path``: the run directory; ``budget_s`` None: the run's own) or ``init`` (``path``: the checkpoint;
    ``seed`` and ``overrides``)."""

    kind: str
    budget_s: float | None
    cfg: TrainConfig | None = None
    path: str | None = None
    seed: int = 0
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self, rank: int) -> Pretrainer:
        if self.kind == "create":
            return Pretrainer.create(self.cfg, self.budget_s, rank=rank)
        if self.kind == "resume":
            return Pretrainer.resume(self.path, budget_s=self.budget_s, rank=rank)
        return Pretrainer.from_init(self.path, self.budget_s, seed=self.seed, rank=rank, **self.overrides)


class GradSync:
    """The collective steps of data-parallel pretraining, on ``group``: every worker, whose collectives
    wait at most the exchange time-out (the default group's is the start time-out)."""

    def __init__(self, world: int, group: Any = None) -> None:
        self.world = world
        self.group = group

    def average(self, params: list[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over the workers (a parameter no worker's loss reached keeps
        no gradient, so Adam leaves it alone as it does in one process)."""
        parts = [p.grad.reshape(-1).to("cpu", torch.float32) if p.grad is not None
                 else torch.zeros(p.numel()) for p in params]  # fmt: skip
        reached = torch.tensor([float(p.grad is not None) for p in params])
        flat = torch.cat([*parts, reached])
        dist.all_reduce(flat, group=self.group)
        reached = flat[-len(params):]
        offset = 0
        for p, hit in zip(params, reached.tolist()):
            if hit > 0:
                mean = (flat[offset:offset + p.numel()] / self.world).view_as(p).to(p.device, p.dtype)
                if p.grad is None:
                    p.grad = mean
                else:
                    p.grad.copy_(mean)
            offset += p.numel()

    def agree(self, elapsed_s: float, save: bool) -> tuple[float, bool]:
        """Worker 0's training time and checkpoint decision, for every worker."""
        t = torch.tensor([elapsed_s, float(save)], dtype=torch.float64)
        dist.broadcast(t, 0, group=self.group)
        return float(t[0]), bool(t[1] > 0)

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every worker, in rank order."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def same_weights(self, params: list[torch.nn.Parameter]) -> bool:
        """Whether every worker holds exactly worker 0's weights."""
        flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in params])
        ref = flat.clone()
        dist.broadcast(ref, 0, group=self.group)
        diff = torch.tensor([float(not torch.equal(flat, ref))])
        dist.all_reduce(diff, group=self.group)
        return bool(diff.item() == 0)


def _join(rank: int, world: int, store_path: str, timeout_s: float, procs: list | None = None,
          start_timeout_s: float = START_TIMEOUT_S) -> GradSync:  # fmt: skip
    """Join the process group: the rendezvous is a file (no listening socket), and gloo's own sockets are
    on the loopback device. Worker 0 waits for the others to say they are there, stopping at once if one
    of ``procs`` has exited instead, then for all to join; both within ``start_timeout_s`` in all (the
    default group's rendezvous is bounded by its own time-out, not the store's). The exchanges run on a
    group of the same workers whose collectives wait at most ``timeout_s``."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # 127.0.0.1 only, whatever the hostname resolves to
    deadline = time.monotonic() + start_timeout_s
    store = dist.FileStore(store_path, world)
    store.set_timeout(datetime.timedelta(seconds=start_timeout_s))
    if rank:
        store.set(f"worker {rank}", "here")
    elif procs:
        while not store.check([p.name for p in procs]):
            gone = [p.name for p in procs if p.exitcode is not None]
            if gone:
                raise RuntimeError(f"{gone[0]} exited before it joined")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not start within {start_timeout_s:g} s")
            time.sleep(0.05)
    left_s = max(deadline - time.monotonic(), 1.0)  # every worker said it is there: joining takes moments
    try:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=left_s))  # fmt: skip
    except RuntimeError as e:  # gloo's "Wait timeout", or a peer's closed socket
        raise RuntimeError(f"the workers did not all join within {start_timeout_s:g} s ({_first_line(str(e))})") from e
    return GradSync(world, dist.new_group(timeout=datetime.timedelta(seconds=timeout_s)))


def _attach(pt: Pretrainer, sync: GradSync) -> None:
    """Hook ``sync`` into ``pt`` and start every worker from worker 0's weights."""
    pt.sync = sync
    pt.trainer.grad_sync = sync.average
    for p in pt.trainer.policy.parameters():
        with torch.no_grad():
            buf = p.detach().to("cpu").clone()
            dist.broadcast(buf, 0, group=sync.group)
            p.copy_(buf.to(p.device))


def _worker(recipe: Recipe, rank: int, world: int, store_path: str, timeout_s: float, errors: Any,
            start_timeout_s: float = START_TIMEOUT_S) -> None:  # fmt: skip
    """Entry point of workers 1..N-1 (a spawned process). If it fails, its reason goes to worker 0 (the
    ``errors`` queue) before its sockets close, so worker 0, which notices the closed socket, finds the
    reason there however long this process takes to exit; it exits with code 2; Ctrl-C ends it quietly."""
    sync = None
    try:
        sync = _join(rank, world, store_path, timeout_s, start_timeout_s=start_timeout_s)
        pt = recipe.build(rank)
        _attach(pt, sync)
        pt.run(None)
        sync.same_weights(list(pt.trainer.policy.parameters()))
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - any failure: worker 0 names it and stops the run
        errors.put((rank, f"worker {rank}: {type(e).__name__}: {_first_line(str(e))}"[:300]))
        errors.close()
        errors.join_thread()  # the reason is in the pipe before the group (below) closes the sockets
        sys.exit(2)
    finally:
        if sync is not None:
            dist.destroy_process_group()


def _first_line(message: str) -> str:
    """The first line of a message, without the ``[source/path.cc:123]`` gloo puts in front."""
    return re.sub(r"^\[[^\]]*\]\s*", "", message.splitlines()[0] if message else "")


def _reason(errors: Any, procs: list, message: str, grace_s: float = 2.0) -> str:
    """Why the run failed: the reason a worker gave (the first in rank order; a failing worker queues it
    before its sockets close), else the workers of ``procs`` that exited with an error (waiting up to
    ``grace_s`` for one to show) with ``message``, worker 0's error; "" if neither."""
    reasons = {}
    while True:
        try:
            rank, line = errors.get(timeout=0.5)
        except queue.Empty:
            break
        reasons[rank] = line
    if reasons:
        return reasons[min(reasons)]
    dead = _failed_workers(procs, grace_s)
    return f"{', '.join(p.name for p in dead)} stopped ({_first_line(message)[:160]})" if dead else ""


def _failed_workers(procs: list, grace_s: float = 2.0) -> list:
    """The workers that have exited with an error, waiting up to ``grace_s`` for one to show (a process
    closes its sockets a moment before its exit code can be read)."""
    deadline = time.monotonic() + grace_s
    while True:
        dead = [p for p in procs if p.exitcode not in (0, None)]
        if dead or time.monotonic() > deadline:
            return dead
        time.sleep(0.05)


def run_workers(pt: Pretrainer, recipe: Recipe, workers: int, run_dir: str | Path,
                on_progress: ProgressFn | None = None, timeout_s: float = EXCHANGE_TIMEOUT_S,
                start_timeout_s: float = START_TIMEOUT_S) -> bool:  # fmt: skip
    """Pretrain with ``workers`` processes: ``pt`` (already built by ``recipe.build(0)``, so that bad input
    fails before any process starts) is worker 0, in this process; the others are spawned and build
    theirs from ``recipe``. Returns whether every worker ended with the same weights. Every worker must
    join within ``start_timeout_s``; an exchange waits at most ``timeout_s``."""
    import torch.multiprocessing as mp

    if workers < 2:
        raise TrainError(f"run_workers needs at least 2 workers, got {workers}")
    rendezvous = tempfile.mkdtemp(prefix="doppler-workers-")
    store_path = os.path.join(rendezvous, "store")
    ctx = mp.get_context("spawn")  # a fresh interpreter: no torch or numba thread pools copied by fork
    errors = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(recipe, r, workers, store_path, timeout_s, errors, start_timeout_s),
                         daemon=True, name=f"worker {r}") for r in range(1, workers)]  # fmt: skip
    for p in procs:
        p.start()
    ended_well = False
    try:
        try:
            sync = _join(0, workers, store_path, timeout_s, procs, start_timeout_s)
        except RuntimeError as e:  # a worker exited before it joined, or none came in time
            why = _reason(errors, procs, str(e), grace_s=0.0) or _first_line(str(e))
            raise TrainError(f"pretraining workers: {why}") from None
        try:
            _attach(pt, sync)
            pt.run(run_dir, on_progress)
            in_sync = sync.same_weights(list(pt.trainer.policy.parameters()))
            ended_well = True
            return in_sync
        except (RuntimeError, ConnectionError) as e:  # a peer closed its socket, a timeout, or worker 0's own
            why = _reason(errors, procs, str(e)) or f"worker 0: {type(e).__name__}: {_first_line(str(e))[:200]}"
            raise TrainError(f"pretraining workers: {why}; the last checkpoint in {run_dir}, if any, is intact "
                             "(--resume continues it)") from None  # fmt: skip
        finally:
            dist.destroy_process_group()
    finally:  # the workers leave after the last exchange; any still there after LEAVE_TIMEOUT_S in all are stopped
        deadline = time.monotonic() + (LEAVE_TIMEOUT_S if ended_well else 0.0)
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
        shutil.rmtree(rendezvous, ignore_errors=True)
