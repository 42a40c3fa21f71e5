"""Kill -9 at random points during ``doppler train``, ``doppler pretrain`` and ``doppler compare --save-dir``.

    python benchmarks/fault_injection.py [--quick] [--points 20] [--seed 0] [--rekill 0.25]
        [--commands train,pretrain,pretrain_api,compare] [--keep DIR]

The property (issue #50): every run either resumes to the same end as an uninterrupted run with the same
seed, or refuses with one line (exit 2); no half-written file is left where a reader would take it whole.

For each command, two uninterrupted runs first (the first also fills the kernel caches; the second is
watched: every change among its output files is counted); the two must end alike. Then ``--points``
times: start the command in a fresh directory and SIGKILL its process group at a point drawn from a
seeded generator: even points at a time uniform over an uninterrupted run (the median of the last three
whole runs' durations: the machine's load changes), odd points 0-20 ms after the k-th change among its
output files, k uniform over the watched run's changes (there a kill can catch a file half-written: a
temporary file appearing is a change); check every file left; rerun
(``--resume`` for train and pretrain, the same command for compare), that rerun itself killed again with
probability ``--rekill`` at a uniform time (at most three kills), until a run exits:

* after each kill, ``checkpoint.pt`` must load (``torch.load(weights_only=True)`` and doppler's reader),
  ``config.json`` parse, an assignment file load (its length, its devices in range), a PNG be whole;
  ``.NAME.*.tmp`` files (writes the kill cut short, never renamed into place) and lock files are counted,
  TensorBoard's event logs are not checked (an appended record log: a cut last record is skipped);
* exit 0 must end where the reference ended; exit 2 must be one line on stderr ("refused clearly"),
  after which a fresh run in the same directory must end where the reference ended;
* ``train``: the final ``checkpoint.pt`` equals the reference's: every tensor (weights, Adam's state, the
  RNG states), the counters, the best assignment, the history less its timings; ``config.json`` and
  ``best_assignment.json`` too;
* ``pretrain``: its end is a wall-clock budget, so two runs end after different numbers of updates: the
  final checkpoint is compared with an uninterrupted pretraining in this process after the same number of
  updates (weights, Adam's and the RNGs' states, the corpus stream's state, counters, history; not the
  elapsed time). ``doppler pretrain`` checkpoints every 180 s and at its end, so in a short run its only
  checkpoint is the last: ``pretrain`` kills the command as it is (a kill before the end leaves nothing to
  resume: refused). ``pretrain_api`` runs the same pretraining through :class:`doppler.train.pretrain.Pretrainer`
  with a checkpoint every 2 s (the command has no option for it) and resumes it with
  ``doppler pretrain --resume``: resumes from checkpoints in the middle of the run;
* ``compare``: every ``METHOD.json`` left must be whole and equal to the reference's; a rerun's files
  equal the reference's (its methods are deterministic; anneal, whose budget is wall time, is left out).

Prints a table (points, resumed identical, refused clearly, not killed: the run ended before its kill
time, failures, kills that left a temp file: caught a write), then every failure with its kill times.
``--quick``: 5 points and smaller runs (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from doppler.ir.assignment import AssignmentError, load_assignment
from doppler.ir.formats import load_graph
from doppler.policy.architectures import read_checkpoint
from doppler.policy.checkpoint import CheckpointError

DOPPLER = [sys.executable, "-m", "doppler"]
TIMED = {"episodes_per_s", "elapsed_s"}  # history fields that measure time, not training
TEMP = re.compile(r"^\..+\.tmp$")  # io_util.atomic_write_bytes' temporary file
LOCK = re.compile(r"(^|\.)doppler\.lock$")
PNG_END = b"IEND\xaeB`\x82"
MAX_KILLS = 3
RUN_TIMEOUT_S = 900.0

#: pretraining in a process of its own with a checkpoint every ``every_s`` seconds (argv: dir budget_s seed every_s)
API_PRETRAIN = """
import sys
from doppler.train.pretrain import Pretrainer, pretrain_config
out, budget_s, seed, every_s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
Pretrainer.create(pretrain_config(seed=seed, device="cpu", torch_threads=1), budget_s, checkpoint_every_s=every_s).run(out)
"""


# ---------------------------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Kill:
    """When to SIGKILL a run: ``at_s`` seconds after its start, or ``delay_s`` after the ``after_write``-th
    change seen among its output files (counted from 1: a file that appears or changes, a temp file that
    appears). In a plan, ``at_frac`` of an uninterrupted run's duration (:meth:`timed` makes it ``at_s``)."""

    at_s: float | None = None
    after_write: int | None = None
    delay_s: float = 0.0
    at_frac: float | None = None

    def timed(self, wall_s: float) -> "Kill":
        return self if self.at_frac is None else Kill(at_s=self.at_frac * wall_s)

    def __str__(self) -> str:
        if self.after_write is None:
            return f"{self.at_s:.2f} s"
        return f"{self.delay_s * 1000:.0f} ms after write {self.after_write}"


@dataclass
class Launch:
    """One process: its exit status (None: killed by us), wall time, stderr, when it changed a file, and
    when it was killed."""

    rc: int | None
    wall_s: float
    stderr: str
    writes_s: list[float] = field(default_factory=list)
    killed_at_s: float | None = None


def _snapshot(out: Path) -> dict[str, tuple[int, int] | None]:
    """Size and modification time of every file under ``out`` but TensorBoard's logs and lock files (a temp
    file: None, its presence only, so that one write counts the same however often it is seen growing)."""
    snap = {}
    for root, dirs, files in os.walk(out):
        dirs[:] = [d for d in dirs if d != "tensorboard"]
        for name in files:
            if LOCK.search(name):
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            snap[os.path.join(root, name)] = None if TEMP.match(name) else (st.st_size, st.st_mtime_ns)
    return snap


def launch(argv: list[str], out: Path, kill: Kill | None = None, watch: bool = False) -> Launch:
    """Run ``argv`` in its own process group and SIGKILL the group as ``kill`` says, if it is still running.
    ``watch`` (implied by a kill after a write): note the times at which files under ``out`` change."""
    watch = watch or (kill is not None and kill.after_write is not None)
    kill_at = kill.at_s if kill is not None else None
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        seen: dict[str, tuple[int, int] | None] = {}
        writes: list[float] = []
        rc: int | None = None
        killed_at = None
        while True:
            rc = proc.poll()
            now = time.perf_counter() - t0
            if rc is not None:
                break
            if (kill_at is not None and now >= kill_at) or now > RUN_TIMEOUT_S:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc, killed_at = (None, now) if now <= RUN_TIMEOUT_S else (-999, None)
                break
            if watch:
                snap = _snapshot(out)
                if any(k not in seen or seen[k] != v for k, v in snap.items()):
                    writes.append(now)
                    if kill is not None and kill.after_write == len(writes):
                        kill_at = now + kill.delay_s
                seen = snap
            time.sleep(0.001 if kill_at is not None and kill_at - now < 0.01 else 0.002)
        wall = time.perf_counter() - t0
        err.seek(0)
        return Launch(rc, wall, err.read().decode(errors="replace"), writes, killed_at)


# ---------------------------------------------------------------------------------------------- checks
def _check_file(p: Path, graph, num_devices: int | None) -> str | None:
    """Why the file ``p`` is not a whole, valid output (None if it is)."""
    try:
        if p.suffix == ".pt":
            read_checkpoint(p)
            torch.load(p, map_location="cpu", weights_only=True)
        elif p.name == "config.json":
            if not isinstance(json.loads(p.read_text()), dict):
                return "not a JSON object"
        elif p.suffix == ".json":
            load_assignment(p, graph, num_devices)
        elif p.suffix == ".png":
            data = p.read_bytes()
            if not (data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(PNG_END)):
                return "a cut PNG"
        else:
            return "an unexpected file"
    except (CheckpointError, AssignmentError) as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - whatever a half-written file makes a reader raise
        return f"{type(e).__name__}: {e}"
    return None


def inspect(out: Path, graph=None, num_devices: int | None = None) -> tuple[list[str], int]:
    """The files under ``out`` that are not whole and valid, and the count of temp files."""
    problems, temps = [], 0
    if not out.exists():
        return problems, temps
    for p in sorted(out.rglob("*")):
        if not p.is_file() or "tensorboard" in p.relative_to(out).parts or LOCK.search(p.name):
            continue
        if TEMP.match(p.name):
            temps += 1
            continue
        why = _check_file(p, graph, num_devices)
        if why:
            problems.append(f"{p.relative_to(out)}: {why}")
    return problems, temps


def temp_files(out: Path) -> int:
    return sum(1 for p in out.rglob(".*.tmp") if p.is_file()) if out.exists() else 0


def _feed(h, obj: Any) -> None:
    if torch.is_tensor(obj):
        h.update(f"T{obj.dtype}{tuple(obj.shape)}".encode())
        h.update(obj.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(repr(obj).encode())


def digests(ck: dict[str, Any]) -> dict[str, str]:
    """A digest of each entry of a checkpoint, leaving out what measures time (histories' timings,
    pretraining's elapsed time and budget)."""
    out = {}
    for k, v in ck.items():
        if k == "history":
            v = [{a: b for a, b in row.items() if a not in TIMED} for row in json.loads(v)]
        elif k == "pretrain":
            v = {a: b for a, b in json.loads(v).items() if a not in ("elapsed_s", "budget_s")}
        elif k in ("numpy_rng", "config", "cluster"):
            v = json.loads(v)
        h = hashlib.sha256()
        _feed(h, v)
        out[k] = h.hexdigest()
    return out


def differences(want: dict[str, str], got: dict[str, str]) -> list[str]:
    return sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))


def _load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


# ---------------------------------------------------------------------------------------------- commands
class Case:
    """A command under test: how to start it, rerun it after a kill, check what a kill left, check its end."""

    name = ""
    note = ""

    def start(self, out: Path) -> list[str]:
        raise NotImplementedError

    def rerun(self, out: Path) -> list[str]:
        raise NotImplementedError

    def left(self, out: Path) -> tuple[list[str], int, str]:
        """Problems with the files a kill left, the count of temp files, and a note on what was there."""
        raise NotImplementedError

    def reference(self, out: Path) -> None:
        raise NotImplementedError

    def end(self, out: Path) -> list[str]:
        """How a completed run's output differs from the reference's (empty: identical)."""
        raise NotImplementedError


class Train(Case):
    name = "train"

    def __init__(self, work: Path, quick: bool, seed: int) -> None:
        self.graph = work / "train_graph.json"
        subprocess.run([*DOPPLER, "graph", "build", "random", "--set", "num_ops=30", "--set", "seed=0", "-o",
                        str(self.graph)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        self.args = ["-c", "unit:3", "--episodes", "64" if quick else "1200", "--il-episodes", "16",
                     "--batch", "8" if quick else "16", "--search-evals", "2000", "--seed", str(seed),
                     "--threads", "1", "--json"]  # fmt: skip
        self.note = (f"random graph of 30 ops on unit:3, {' '.join(self.args[2:-1])} (checkpoints after Stage I, "
                     "every 1000 Stage II episodes, at the end of Stage II and of distillation)")  # fmt: skip
        self.g = load_graph(self.graph)

    def start(self, out: Path) -> list[str]:
        return [*DOPPLER, "train", str(self.graph), *self.args, "-o", str(out)]

    def rerun(self, out: Path) -> list[str]:
        return [*self.start(out), "--resume"]

    def left(self, out: Path) -> tuple[list[str], int, str]:
        problems, temps = inspect(out, self.g, 3)
        ck = out / "checkpoint.pt"
        what = "no checkpoint"
        if ck.is_file() and not problems:
            c = _load(ck)
            what = f"checkpoint at IL {c['il_episode']}, RL {c['episode']}, distill {c['distill_step']}"
        return problems, temps, what

    def reference(self, out: Path) -> None:
        self.ref = digests(_load(out / "checkpoint.pt"))
        self.ref_files = {n: json.loads((out / n).read_text()) for n in ("config.json", "best_assignment.json")}

    def end(self, out: Path) -> list[str]:
        diff = differences(self.ref, digests(_load(out / "checkpoint.pt")))
        problems = [f"checkpoint.pt differs in {', '.join(diff)}"] if diff else []
        return problems + [f"{n} differs" for n, want in self.ref_files.items() if json.loads((out / n).read_text()) != want]


class Pretrain(Case):
    """``doppler pretrain`` (``api``: started through :class:`~doppler.train.pretrain.Pretrainer` with a checkpoint
    every 2 s, resumed by the command)."""

    def __init__(self, quick: bool, seed: int, api: bool, reference: "PretrainReference") -> None:
        self.budget_h = 0.0015 if quick else 0.003
        self.seed, self.api, self.refs = seed, api, reference
        self.name = "pretrain_api" if api else "pretrain"
        every = "a checkpoint every 2 s through the Pretrainer API, resumed by `doppler pretrain --resume`" if api \
            else "the command as it is (checkpoints every 180 s and at the end)"
        self.note = f"--budget-h {self.budget_h} ({self.budget_h * 3600:.1f} s of training), --seed {seed}, {every}"

    def start(self, out: Path) -> list[str]:
        if self.api:
            return [sys.executable, "-c", API_PRETRAIN, str(out), str(self.budget_h * 3600), str(self.seed), "2"]
        return [*DOPPLER, "pretrain", "-o", str(out), "--budget-h", str(self.budget_h), "--seed", str(self.seed),
                "--threads", "1", "--json"]  # fmt: skip

    def rerun(self, out: Path) -> list[str]:
        return [*DOPPLER, "pretrain", "-o", str(out), "--budget-h", str(self.budget_h), "--resume", "--json"]

    def left(self, out: Path) -> tuple[list[str], int, str]:
        problems, temps = inspect(out)
        ck = out / "checkpoint.pt"
        what = "no checkpoint"
        if ck.is_file() and not problems:
            what = f"checkpoint at update {json.loads(_load(ck)['pretrain'])['updates']}"
        return problems, temps, what

    def reference(self, out: Path) -> None:
        pass  # the reference is an in-process pretraining, update by update (PretrainReference)

    def end(self, out: Path) -> list[str]:
        ck = _load(out / "checkpoint.pt")
        meta = json.loads(ck["pretrain"])
        diff = differences(self.refs.at(int(meta["updates"])), digests(ck))
        problems = [f"checkpoint.pt at update {meta['updates']} differs from the uninterrupted run's in {', '.join(diff)}"] \
            if diff else []  # fmt: skip
        if meta["elapsed_s"] < meta["budget_s"]:
            problems.append(f"ended after {meta['elapsed_s']:.1f} s of its {meta['budget_s']:.1f} s budget")
        return problems


class PretrainReference:
    """Pretraining in this process (as ``doppler pretrain --seed S --threads 1`` configures it), one update
    at a time: the checkpoint's digests after each number of updates."""

    def __init__(self, seed: int) -> None:
        from doppler.train.pretrain import Pretrainer, pretrain_config

        self.pt = Pretrainer.create(pretrain_config(seed=seed, device="cpu", torch_threads=1), budget_s=1.0)
        self.by_update = {0: digests(_checkpoint(self.pt.state()))}

    def at(self, updates: int) -> dict[str, str]:
        while self.pt.updates < updates:
            self.pt.budget_s = self.pt.elapsed_s + 1e-9  # run() makes exactly one update, as the command's loop
            self.pt.run()
            self.by_update[self.pt.updates] = digests(_checkpoint(self.pt.state()))
        return self.by_update[updates]


def _checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as it reads back from a checkpoint file."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


class Compare(Case):
    name = "compare"
    METHODS = "single,round_robin,random,critical_path,heft,metis"

    def __init__(self, work: Path, quick: bool, seed: int) -> None:
        n = 20_000 if quick else 100_000
        self.graph = work / "compare_graph.json"
        subprocess.run([*DOPPLER, "graph", "build", "random", "--set", f"num_ops={n}", "--set", "seed=0", "-o",
                        str(self.graph)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        self.g = load_graph(self.graph)
        self.seed = seed
        self.note = f"random graph of {n:,} ops on unit:4, -m {self.METHODS} --seed {seed}"

    def start(self, out: Path) -> list[str]:
        return [*DOPPLER, "compare", str(self.graph), "-c", "unit:4", "-m", self.METHODS, "--seed", str(self.seed),
                "--save-dir", str(out), "--json"]  # fmt: skip

    def rerun(self, out: Path) -> list[str]:
        return self.start(out)

    @staticmethod
    def _files(out: Path) -> dict[str, Any]:
        def essential(obj):
            return {k: v for k, v in obj.items() if k != "assign_time_s"}

        return {p.name: essential(json.loads(p.read_text())) for p in sorted(out.glob("*.json"))}

    def left(self, out: Path) -> tuple[list[str], int, str]:
        problems, temps = inspect(out, self.g, 4)
        if not problems and out.exists():
            problems = [f"{n}: a whole file, but not the reference's" for n, v in self._files(out).items()
                        if self.ref.get(n) != v]  # fmt: skip
        n = len(list(out.glob("*.json"))) if out.exists() else 0
        return problems, temps, f"{n} of {len(self.METHODS.split(','))} files"

    def reference(self, out: Path) -> None:
        self.ref = self._files(out)

    def end(self, out: Path) -> list[str]:
        got = self._files(out)
        return [f"{n}: {'missing' if n not in got else 'differs'}" for n in self.ref if got.get(n) != self.ref[n]]


# ---------------------------------------------------------------------------------------------- trials
@dataclass
class Trial:
    kills: list[str]  # each kill: what it aimed at and when it struck
    outcome: str  # identical | refused | not killed | failure
    detail: str = ""
    caught_write: bool = False  # a kill left a temp file
    stray_temps: int = 0  # temp files still there at the end (kills leave them; no run removes them)


def one_line(stderr: str) -> str | None:
    """The one line of a clear refusal, else None."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if len(lines) != 1 or "Traceback" in stderr or "internal error" in stderr:
        return None
    return lines[0].strip()


def trial(case: Case, out: Path, kills: list[Kill], wall_s: float) -> tuple[Trial, float | None]:
    """Start ``case`` in ``out``, kill it as ``kills[0]`` says, rerun it (killing the reruns as the later ones
    say; ``wall_s``: an uninterrupted run's duration) until a run exits; check what each kill left and how the
    run ended. Also the duration of a run that went from start to end, if one did."""
    argv, done, caught, notes, whole_s = case.start(out), [], False, [], None
    for k in kills:
        k = k.timed(wall_s)
        r = launch(argv, out, k)
        if r.rc is not None:
            break
        done.append(f"{k} ({r.killed_at_s:.2f} s)" if k.after_write is not None else str(k))
        problems, temps, what = case.left(out)
        caught |= temps > 0
        notes.append(what)
        if problems:
            return Trial(done, "failure", f"after the kill at {r.killed_at_s:.2f} s: {'; '.join(problems)}", caught), None
        argv = case.rerun(out)
    else:
        r = launch(argv, out)
    if r.rc == -999:
        return Trial(done, "failure", f"ran over {RUN_TIMEOUT_S:.0f} s", caught), None
    outcome = "identical" if done else "not killed"
    whole_s = None if done else r.wall_s
    if r.rc == 2:
        line = one_line(r.stderr)
        if line is None:
            return Trial(done, "failure", f"exit 2 without one clear line: {r.stderr.strip()[-300:]!r}", caught), None
        notes.append(f"refused: {line}")
        outcome = "refused"
        r = launch(case.start(out), out)  # what the user does next: a new run in the same directory
        whole_s = r.wall_s
        if r.rc != 0:
            return Trial(done, "failure", f"refused ({line}), then a new run exited {r.rc}: {r.stderr.strip()[-300:]}",
                         caught), None  # fmt: skip
    elif r.rc != 0:
        return Trial(done, "failure", f"exit {r.rc}: {r.stderr.strip()[-300:]}", caught), None
    diff = case.end(out)
    stray = temp_files(out)
    if diff:
        return Trial(done, "failure", f"{'; '.join(notes)}: {'; '.join(diff)}", caught, stray), whole_s
    return Trial(done, outcome, "; ".join(notes), caught, stray), whole_s


def kill_plan(rng: np.random.Generator, points: int, writes: int, rekill: float) -> list[list[Kill]]:
    """Each point's kills: the first at a time uniform over an uninterrupted run (even points) or 0-20 ms after
    one of its ``writes`` file changes, drawn uniformly (odd points); then, with probability ``rekill`` each,
    kills of the reruns at times uniform over an uninterrupted run."""
    plan = []
    for i in range(points):
        if i % 2 and writes:
            kills = [Kill(after_write=int(rng.integers(1, writes + 1)), delay_s=float(rng.uniform(0.0, 0.02)))]
        else:
            kills = [Kill(at_frac=float(rng.uniform()))]
        while len(kills) < MAX_KILLS and rng.random() < rekill:
            kills.append(Kill(at_frac=float(rng.uniform())))
        plan.append(kills)
    return plan


def bench(case: Case, work: Path, points: int, seed: int, index: int, rekill: float, keep: bool) -> dict[str, Any]:
    t_start = time.perf_counter()
    print(f"\n## {case.name}: {case.note}", flush=True)
    warm, ref = work / f"{case.name}-warm", work / f"{case.name}-ref"
    first = launch(case.start(warm), warm)
    r = launch(case.start(ref), ref, watch=True)
    for run in (first, r):
        if run.rc != 0:
            raise SystemExit(f"{case.name}: an uninterrupted run failed (exit {run.rc}): {run.stderr[-500:]}")
    case.reference(ref)
    same = case.end(warm)
    bursts = [w for i, w in enumerate(r.writes_s) if i == 0 or w - r.writes_s[i - 1] > 0.1]
    print(f"uninterrupted: {first.wall_s:.1f} s and {r.wall_s:.1f} s (watched: {len(r.writes_s)} file changes, in bursts "
          f"from {', '.join(f'{w:.2f}' for w in bursts) or '(none seen)'} s); the two "
          f"{'end alike' if not same else 'DIFFER: ' + '; '.join(same)}", flush=True)  # fmt: skip
    # kill times are fractions of the latest uninterrupted durations (median of three): the machine's load changes
    durations = [first.wall_s, r.wall_s]
    rng = np.random.default_rng([seed, index])
    trials = []
    for i, kills in enumerate(kill_plan(rng, points, len(r.writes_s), rekill)):
        out = work / f"{case.name}-{i}"
        wall_s = float(np.median(durations[-3:]))
        t, whole_s = trial(case, out, kills, wall_s)
        if whole_s is not None:
            durations.append(whole_s)
        trials.append(t)
        what = ", then ".join(t.kills) or f"{kills[0].timed(wall_s)} (the run had ended)"
        temp = "  [caught a write]" if t.caught_write else ""
        print(f"  #{i:<2} kill {what} -> {t.outcome}{temp}: {t.detail}", flush=True)
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    count = {k: sum(t.outcome == k for t in trials) for k in ("identical", "refused", "not killed", "failure")}
    return {"command": case.name, "points": len(trials), **count,
            "caught": sum(t.caught_write for t in trials), "stray": sum(t.stray_temps for t in trials),
            "wall_s": time.perf_counter() - t_start, "uninterrupted_s": r.wall_s, "same": not same,
            "failures": [(i, t) for i, t in enumerate(trials) if t.outcome == "failure"]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 points per command, smaller runs")
    p.add_argument("--points", type=int, default=None, help="kill points per command (default: 20; --quick: 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the commands and of the kill times")
    p.add_argument("--rekill", type=float, default=0.25, help="probability that a rerun is killed again")
    p.add_argument("--commands", default="train,pretrain,pretrain_api,compare")
    p.add_argument("--keep", type=Path, default=None, help="work in this directory and keep every run's output")
    args = p.parse_args()
    points = args.points if args.points is not None else (5 if args.quick else 20)
    names = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = set(names) - {"train", "pretrain", "pretrain_api", "compare"}
    if unknown:
        p.error(f"unknown command(s): {', '.join(sorted(unknown))}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="doppler-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"{points} kill points per command, seed {args.seed}, rekill {args.rekill}, {os.cpu_count()} CPUs; work dir {work}")
    rows = []
    refs = None
    try:
        for index, name in enumerate(names):
            if name == "train":
                case: Case = Train(work, args.quick, args.seed)
            elif name == "compare":
                case = Compare(work, args.quick, args.seed)
            else:
                refs = refs or PretrainReference(args.seed)
                case = Pretrain(args.quick, args.seed, name == "pretrain_api", refs)
            rows.append(bench(case, work, points, args.seed, index, args.rekill, args.keep is not None))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| command | points | resumed identical | refused clearly | not killed | failures | kills that caught "
          "a write | temp files left | uninterrupted run | wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['command']} | {r['points']} | {r['identical']} | {r['refused']} | {r['not killed']} | "
              f"{r['failure']} | {r['caught']} | {r['stray']} | {r['uninterrupted_s']:.1f} s | {r['wall_s'] / 60:.1f} min |")
    for r in rows:
        if not r["same"]:
            print(f"{r['command']}: two uninterrupted runs ended differently")
        for i, t in r["failures"]:
            print(f"FAILURE {r['command']} #{i}: kill {', then '.join(t.kills)}: {t.detail}")
    print(f"\ntotal {(time.perf_counter() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
