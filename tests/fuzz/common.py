"""What every fuzz test shares (docs/fuzzing.md): how many examples it runs, the sandbox an example runs
its commands in, the property every command must keep, and the mutations of files and documents.

The property, for every command on every input: exit 0 or 2; with 2, exactly one ``error:`` line on stderr
(the last; warnings before it are one line each); never a traceback or an ``internal error``; it ends within
:data:`COMMAND_BOUND_S`; no file appears in the sandbox except the outputs the command was given; and
the sentinel file that a malicious pickle would create never exists.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from doppler.cli import app

#: the environment variable of ``make fuzz``: examples per fuzz test (read by the ``fuzz`` profile, tests/conftest.py)
FUZZ_EXAMPLES_ENV = "DOPPLER_FUZZ_EXAMPLES"
#: the most seconds one command may take on any input (a hang fails the test; the slowest command here, a
#: tiny training from a checkpoint, takes about 1 s)
COMMAND_BOUND_S = 60.0
#: the file a malicious pickle in a fuzzed checkpoint tries to create (a relative path: in the sandbox, the
#: working directory while a command runs), and the absolute path some pickles name instead (one per process)
SENTINEL = "SENTINEL"
ABSOLUTE_SENTINEL = Path(tempfile.gettempdir()) / f"doppler-fuzz-sentinel-{os.getpid()}"

runner = CliRunner()


def fuzz(ci: int, share: float = 1.0) -> settings:
    """Hypothesis settings of one fuzz test: ``ci`` examples in ``make test``; under ``make fuzz`` the
    ``fuzz`` profile's count (``DOPPLER_FUZZ_EXAMPLES``) times ``share`` (a costly test takes a share of it)."""
    n = ci if not os.environ.get(FUZZ_EXAMPLES_ENV) else max(ci, int(settings.default.max_examples * share))
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck))


class CommandHang(BaseException):
    """A command ran past :data:`COMMAND_BOUND_S` (a BaseException: no command's handler may report it)."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`CommandHang` in the main thread after ``seconds`` (pytest and its xdist workers run tests
    there; elsewhere the elapsed time is still checked afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):  # noqa: ANN001
        raise CommandHang(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def error_line(self) -> str | None:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1] if self.exit_code == 2 and lines else None


class Sandbox:
    """A fresh directory that is also the working directory while an example runs: a command that wrote a
    file by a relative path, or a pickle that ran ``touch SENTINEL``, leaves it here to be found."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sentinel = root / SENTINEL

    def write(self, name: str, data: bytes | str) -> Path:
        p = self.root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        p.write_bytes(data)
        return p

    def paths(self) -> set[str]:
        """Every file, directory and link under the sandbox, relative to it."""
        out = set()
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root)
            out.update(str(rel / n) for n in dirnames + filenames)
        return out

    def run(self, *args: Any, outputs: Sequence[Any] = (), input: str | None = None) -> Outcome:
        """Run ``doppler ARGS`` in-process and assert the property (module docstring); ``outputs``: the paths
        the command is told to write (a file, or a run directory with everything under it)."""
        argv = [str(a) for a in args]
        allowed = [os.path.relpath(Path(o).absolute(), self.root) for o in outputs]
        before = self.paths()
        t0 = time.perf_counter()
        try:
            with _deadline(COMMAND_BOUND_S):
                res = runner.invoke(app, argv, input=input)
        except CommandHang as e:
            raise AssertionError(f"doppler {' '.join(argv)}: {e}") from None
        elapsed = time.perf_counter() - t0
        out = Outcome(res.exit_code, res.stdout, res.stderr, elapsed)
        where = f"doppler {' '.join(argv)}"
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            tb = "".join(traceback.format_exception(*res.exc_info))
            raise AssertionError(f"{where}: uncaught {type(res.exception).__name__}\n{tb}")
        assert out.exit_code in (0, 2), f"{where}: exit {out.exit_code}\n{res.output[-2000:]}"
        assert "Traceback" not in res.output, f"{where}:\n{res.output[-2000:]}"
        assert "internal error" not in res.output, f"{where}:\n{res.output[-2000:]}"
        if out.exit_code == 2 and "Usage:" not in out.stderr:  # (click's usage errors: one line from main(),
            # as test_entry_point checks)
            lines = [ln for ln in out.stderr.splitlines() if ln.strip()]  # (splitlines: at every line break there is)
            ok = lines and lines[-1].startswith("error: ") and all(ln.startswith("warning: ") for ln in lines[:-1])
            assert ok, f"{where}: stderr is not warnings then one error line:\n{out.stderr}"
        assert not self.sentinel.exists() and not ABSOLUTE_SENTINEL.exists(), f"{where}: the sentinel file was created"
        new = sorted(p for p in self.paths() - before
                     if not any(p == a or p.startswith(a + os.sep) for a in allowed))  # fmt: skip
        assert not new, f"{where}: created {new} (outputs given: {allowed})"
        assert elapsed < COMMAND_BOUND_S, f"{where}: took {elapsed:.1f} s"
        return out


@contextlib.contextmanager
def sandbox(base: Path) -> Iterator[Sandbox]:
    """A fresh :class:`Sandbox` under ``base``, the working directory while it is open, removed afterwards."""
    root = Path(tempfile.mkdtemp(dir=base)).resolve()
    old = os.getcwd()
    os.chdir(root)
    try:
        yield Sandbox(root)
    finally:
        os.chdir(old)
        shutil.rmtree(root, ignore_errors=True)


class Mutant(bytes):
    """A damaged file's bytes with a short account of the damage (its ``repr``: what Hypothesis prints of a
    failing example instead of megabytes)."""

    how: str = ""

    def __new__(cls, data: bytes, how: str) -> "Mutant":
        obj = super().__new__(cls, data)
        obj.how = how
        return obj

    def __repr__(self) -> str:
        how = self.how if len(self.how) <= 400 else self.how[:400] + "..."
        return f"<{len(self)} bytes: {how}>"


# ------------------------------------------------------------------ documents
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5), st.lists(st.integers(-3, 5), max_size=6), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([10**400, -(10**400), 1e308, -0.0, "1e999", "NaN", [[]], [None], {"": {}}]),
)  # fmt: skip


def _paths(doc: Any) -> list[tuple]:
    """Every (nested) key path of a JSON document."""
    out: list[tuple] = []

    def walk(node: Any, path: tuple) -> None:
        out.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (i,))

    walk(doc, ())
    return out


@st.composite
def corrupted_doc(draw: Any, base: Any, values: st.SearchStrategy = ODD_VALUES) -> Any:
    """``base`` (a JSON-like document) with one to three of its values replaced by odd ones (``values``),
    keys deleted or added, or list entries dropped or repeated."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            how = draw(st.sampled_from(["replace", "replace", "delete", "add", "repeat"]))
            if how == "delete" and isinstance(parent, dict):
                del parent[path[-1]]
            elif how == "delete" and isinstance(parent, list):
                parent.pop(path[-1])
            elif how == "add" and isinstance(parent, dict):
                parent[draw(st.text(max_size=4))] = copy.deepcopy(draw(values))  # (a later step may edit it)
            elif how == "repeat" and isinstance(parent, list):
                parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
            else:
                parent[path[-1]] = copy.deepcopy(draw(values))
        except (KeyError, IndexError, TypeError):
            continue
    return doc


@st.composite
def corrupted(draw: Any, base: Any) -> str:
    """:func:`corrupted_doc` as JSON text, sometimes cut short."""
    text = json.dumps(draw(corrupted_doc(base)), allow_nan=True)
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text


# ------------------------------------------------------------------ bytes
ODD_TOKENS = [b"", b"-1", b"0", b"-0", b"nan", b"NaN", b"inf", b"-inf", b"1e999", b"1.5", b"9" * 19, b"9" * 400,
              b"\x00", b"\xff\xfe", "\u00e9".encode(), "\u0663".encode(), b"[", b"]", b"{", b"}", b'"', b",", b"\n",
              b"\r\n", b" ", b"\t", b"null", b"true", b"0x10", b"1_000", b"[[[[[[[[", b"\\u0000"]  # fmt: skip


@st.composite
def mutated_bytes(draw: Any, base: bytes, max_steps: int = 4) -> bytes:
    """``base`` after one to ``max_steps`` random edits: bytes flipped, odd tokens inserted, ranges deleted
    or repeated, the end cut off."""
    data = bytearray(base)
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        i = draw(st.integers(0, len(data)))
        j = draw(st.integers(i, min(len(data), i + 64)))
        how = draw(st.sampled_from(["flip", "flip", "token", "delete", "repeat", "truncate", "random"]))
        if how == "flip" and i < len(data):
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "token":
            token = draw(st.sampled_from(ODD_TOKENS))
            data[i:i] = token
            how = f"insert {token[:20]!r} at"
        elif how == "delete":
            del data[i:j]
        elif how == "repeat":
            data[j:j] = data[i:j] * draw(st.integers(1, 3))
        elif how == "truncate":
            del data[i:]
        else:
            data[i:j] = draw(st.binary(min_size=j - i, max_size=j - i))
        steps.append(f"{how} {i}" if how.startswith("insert") else f"{how} {i}:{j}")
    return Mutant(bytes(data), ", ".join(steps))
