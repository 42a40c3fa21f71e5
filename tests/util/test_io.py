"""Atomic writes: all-or-nothing, and the same permissions a plain write would give."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from doppler.util.io import (DuplicateKeyError, atomic_write_bytes, atomic_write_text, check_seed, loads_json, parse_json, write_json)


def test_new_file_gets_umask_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def test_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    p = tmp_path / "a.txt"
    p.write_text("old")
    p.chmod(0o640)
    atomic_write_text(p, "new")
    assert p.read_text() == "new" and stat.S_IMODE(p.stat().st_mode) == 0o640


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "a.txt"
    p.write_text("last good state")

    with pytest.raises(TypeError):
        atomic_write_bytes(p, "not bytes")  # type: ignore[arg-type]
    assert p.read_text() == "last good state"
    assert [f.name for f in tmp_path.iterdir()] == ["a.txt"]


def test_creates_parent_directories(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "x" / "y" / "a.txt", "hi")
    assert (tmp_path / "x" / "y" / "a.txt").read_text() == "hi"


def test_writing_to_a_directory_or_an_unwritable_place_names_the_given_path(tmp_path) -> None:
    import pytest

    from doppler.util.io import OutputPathError, atomic_write_text

    with pytest.raises(OutputPathError, match=rf"^{tmp_path}: is a directory"):
        atomic_write_text(tmp_path, "x")
    with pytest.raises(OutputPathError, match=r"^/proc/doppler-x\.json: cannot write"):
        atomic_write_text("/proc/doppler-x.json", "x")
    assert not list(tmp_path.iterdir())  # no temporary file left behind


def test_a_run_directory_is_created_or_refused_with_its_path(tmp_path) -> None:
    from doppler.util.io import OutputPathError, make_run_dir

    assert make_run_dir(tmp_path / "a" / "b").is_dir()
    assert make_run_dir(tmp_path / "a" / "b").is_dir()  # an existing directory is fine
    (tmp_path / "f").write_text("x")
    for given in (tmp_path / "f", tmp_path / "f" / "run"):
        with pytest.raises(OutputPathError, match=rf"^{given}: cannot be an output directory \({tmp_path / 'f'} is a file"):
            make_run_dir(given)
    with pytest.raises(OutputPathError, match=r"^/proc/doppler-run: cannot create"):
        make_run_dir("/proc/doppler-run")


def test_write_json_writes_numpy_values_atomically(tmp_path):
    p = tmp_path / "sub" / "x.json"
    write_json(p, {"a": np.arange(3), 4: np.float32(0.5), "b": (np.int64(2),)}, indent=1)
    assert json.loads(p.read_text()) == {"a": [0, 1, 2], "4": 0.5, "b": [2]}
    assert p.read_text().endswith("\n") and "\n " in p.read_text()
    write_json(p, [1, 2], compact=True)
    assert p.read_text() == "[1,2]\n"
    assert [q.name for q in p.parent.iterdir()] == ["x.json"]  # no temporary file left behind


def test_a_key_named_twice_in_any_object_is_an_error_naming_the_file_and_the_key() -> None:
    assert loads_json('{"a": {"b": 1, "c": [{"d": 2}]}}') == {"a": {"b": 1, "c": [{"d": 2}]}}
    for text, key in [('{"a": 1, "a": 1}', "a"), ('{"x": [{"k": 1, "j": 2, "k": 3}]}', "k"), ('[{"": 0, "": 0}]', "")]:
        with pytest.raises(DuplicateKeyError) as e:
            loads_json(text)
        assert e.value.key == key
        with pytest.raises(ValueError) as e:
            parse_json(text, "f.json", ValueError)
        assert str(e.value) == f"f.json: not valid JSON (key {key!r} appears twice in one object)"


def test_what_we_write_reads_back_under_the_duplicate_check(tmp_path: Path) -> None:
    doc = {"a": {"1": 1, 1: 2}, "b": [np.int64(3)]}  # (keys 1 and "1" become one: written once)
    write_json(tmp_path / "d.json", doc)
    assert loads_json((tmp_path / "d.json").read_text()) == {"a": {"1": 2}, "b": [3]}


def test_one_seed_check_for_every_layer():
    assert check_seed(np.int64(3)) == 3 and isinstance(check_seed(np.int64(3)), int)
    for bad in (-1, 1.5, True, np.bool_(True), "3", None):
        with pytest.raises(KeyError, match="--seed must be an integer >= 0"):
            check_seed(bad, KeyError, "--seed")


def test_every_kind_of_bad_input_path_is_one_clear_error(tmp_path):
    from doppler.util.io import read_json, read_text

    class Bad(ValueError):
        pass

    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "gone.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "bad.json").write_text('{\n  "a": [1,\n}')
    os.mkfifo(tmp_path / "fifo.json")  # opening it would block until a writer comes: never
    (tmp_path / "zero.json").symlink_to("/dev/zero")  # reading it would never end
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    cases = [(tmp_path / "missing.json", "no such graph file$"), (tmp_path / "dir", "is a directory, not a graph file"),
             (tmp_path / "link", r"no such graph file \(a broken link\)"), (tmp_path / "bin.json", "not a text file"),
             (tmp_path / "fifo.json", "fifo.json: not a regular file"), (tmp_path / "zero.json", "zero.json: not a regular file"),
             (tmp_path / "loop.json", "loop.json: cannot read")]
    for path, msg in cases:
        with pytest.raises(Bad, match=msg):
            read_text(path, "graph file", Bad)
    with pytest.raises(Bad, match=r"bad.json:3: not valid JSON"):
        read_json(tmp_path / "bad.json", "cluster file", Bad)
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.json"
        locked.write_text("{}")
        locked.chmod(0)
        with pytest.raises(Bad, match="permission denied"):
            read_text(locked, "graph file", Bad)


def test_outputs_apart_refuses_an_input_or_a_second_output_and_leaves_no_probe(tmp_path: Path) -> None:
    from doppler.util.io import OutputPathError, check_output_file, check_outputs_apart

    g = tmp_path / "g.json"
    g.write_text("{}")
    check_outputs_apart({"G": g, "--cluster": "p100x4", "--checkpoint": None}, {"-o": tmp_path / "new" / "a.json",
                                                                              "--csv": None})  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]  # no probe file, no directory made
    with pytest.raises(OutputPathError, match="-o .*g.json is the same file as G"):
        check_outputs_apart({"G": g}, {"-o": tmp_path / "." / "g.json"})
    with pytest.raises(OutputPathError, match="--b .* is the same file as --a"):
        check_outputs_apart({}, {"--a": tmp_path / "x", "--b": tmp_path / "x"})
    check_outputs_apart({"--cluster": "p100x4"}, {"-o": tmp_path / "p100x4"})  # a preset's name is no file
    with pytest.raises(OutputPathError, match="is a directory"):
        check_output_file(tmp_path)
    with pytest.raises(OutputPathError, match="g.json is a file, not a directory"):
        check_output_file(g / "a.json", "--trace")


def test_a_link_is_refused_untouched_and_a_pipe_is_refused(tmp_path: Path) -> None:
    """No write through a link: an output that is a symbolic link (to a file, or dangling) is refused in one
    line naming it, by every writer and check, and its target keeps its bytes (or is not created)."""
    from doppler.util.io import OutputLock, OutputPathError, check_output_file, make_run_dir

    target = tmp_path / "outside" / "target.json"
    target.parent.mkdir()
    target.write_text("old")
    dangling = tmp_path / "outside" / "new"
    for link, points_to in ((tmp_path / "link.json", target), (tmp_path / "dangling.json", dangling)):
        link.symlink_to(points_to)
        for call in (lambda: write_json(link, {"a": 1}), lambda: check_output_file(link, "--trace"),
                     lambda: OutputLock(link, label="--trace").acquire(), lambda: make_run_dir(link),
                     lambda: OutputLock(link, directory=True).acquire()):  # fmt: skip
            with pytest.raises(OutputPathError, match=rf"^(--trace )?{link}: is a symbolic link; doppler does not "
                                                      "write through links"):  # fmt: skip
                call()
        assert link.is_symlink()
    assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["target.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "link.json", "outside"]  # no lock left
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for call in (lambda: atomic_write_text(fifo, "x"), lambda: check_output_file(fifo, "--trace")):
        with pytest.raises(OutputPathError, match="fifo: not a regular file"):
            call()
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still a pipe


def test_a_linked_directory_above_the_output_is_the_users_choice(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real", target_is_directory=True)
    write_json(tmp_path / "via" / "a.json", [1])
    from doppler.util.io import OutputLock

    with OutputLock(tmp_path / "via" / "run", directory=True), OutputLock(tmp_path / "via" / "b.json"):
        write_json(tmp_path / "via" / "run" / "c.json", [2])
    assert json.loads((tmp_path / "real" / "a.json").read_text()) == [1]
    assert json.loads((tmp_path / "real" / "run" / "c.json").read_text()) == [2]


def test_a_link_planted_after_the_check_is_replaced_not_followed(tmp_path: Path, monkeypatch) -> None:
    """The window between the link check and the write: the bytes go to a new temporary file that the rename
    puts in the link's place; the link's target is never opened."""
    from doppler.util import io as io_util

    target = tmp_path / "target"
    target.write_bytes(b"theirs")
    out = tmp_path / "out.json"
    real_mkstemp = io_util.tempfile.mkstemp

    def mkstemp_then_plant(**kw):
        made = real_mkstemp(**kw)
        out.symlink_to(target)
        return made

    monkeypatch.setattr(io_util.tempfile, "mkstemp", mkstemp_then_plant)
    write_json(out, {"a": 1})
    assert target.read_bytes() == b"theirs" and not out.is_symlink() and json.loads(out.read_text()) == {"a": 1}


def test_a_lock_file_that_is_a_link_or_a_hard_link_is_refused_untouched(tmp_path: Path) -> None:
    from doppler.util.io import LOCK_NAME, OutputLock, OutputPathError

    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    run = tmp_path / "RUN"
    run.mkdir()
    cases = [(run, True, run / LOCK_NAME), (tmp_path / "a.json", False, tmp_path / ".a.json.doppler.lock")]
    for out, directory, lock_file in cases:
        for how, what in (("symlink", "a symbolic link"), ("hardlink", "a hard link to another file")):
            lock_file.symlink_to(victim) if how == "symlink" else os.link(victim, lock_file)
            with pytest.raises(OutputPathError, match=rf"^{out}: its lock file {lock_file} is {what}; doppler does "
                                                      "not write through links"):  # fmt: skip
                OutputLock(out, directory=directory).acquire()
            assert victim.read_bytes() == b"precious"
            lock_file.unlink()
    assert not (tmp_path / "a.json").exists()


def test_a_link_among_a_run_directorys_members_refuses_it_before_any_write(tmp_path: Path) -> None:
    from doppler.util.io import OutputLock, OutputPathError, refuse_links

    run = tmp_path / "RUN"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"ck")
    outside = tmp_path / "outside"
    outside.mkdir()
    (run / "tensorboard").symlink_to(outside, target_is_directory=True)
    members = ("checkpoint.pt", "config.json", "tensorboard")
    with pytest.raises(OutputPathError, match=rf"^{run}/tensorboard: is a symbolic link; doppler does not write"):
        OutputLock(run, directory=True, members=members).acquire()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "tensorboard"]  # the lock let go
    with OutputLock(run, directory=True, members=members[:2]):  # the names it writes, not every name in it
        pass
    refuse_links(run, ("nothing-there", "checkpoint.pt"))


def test_seeds_are_32_bit() -> None:
    assert check_seed(2**32 - 1) == 2**32 - 1
    with pytest.raises(ValueError, match="from 0 to 4294967295"):
        check_seed(2**32)


_HOLDER = """
import sys, time
from doppler.util.io import OutputLock
lock = OutputLock(sys.argv[1], directory=sys.argv[2] == "dir").acquire()
print("locked", flush=True)
time.sleep(30)
"""


def _holder(path: Path, kind: str):
    """A child process that locks ``path`` (``kind``: dir or file) and holds it for 30 s; returned once it holds it."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), kind], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "locked\n"
    return child


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path: Path, kind: str) -> None:
    import time

    from doppler.util.io import OutputLock, OutputPathError

    out = tmp_path / ("run" if kind == "dir" else "a.json")
    child = _holder(out, kind)
    try:
        t0 = time.monotonic()
        with pytest.raises(OutputPathError, match=rf"^--output {out}: another doppler process \(pid {child.pid}: .*\) "
                                                  r"is writing it; wait for it to finish or give another output$"):
            OutputLock(out, directory=kind == "dir", label="--output").acquire()
        assert time.monotonic() - t0 < 5  # it does not wait for the holder's 30 s
    finally:
        child.kill()
        child.wait()


def test_a_file_inside_a_held_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    """One writer per run directory, whoever writes: a file or directory output anywhere under a directory a
    live process holds is refused at once, and leaves nothing; outputs beside it are not."""
    from doppler.util.io import LOCK_NAME, OutputLock, OutputPathError

    run = tmp_path / "RUN"
    child = _holder(run, "dir")
    try:
        for out, directory in ((run / "best_assignment.json", False), (run / "sub" / "deep" / "x.json", False),
                               (run / "inner", True)):  # fmt: skip
            held_by = rf"another doppler process \(pid {child.pid}: .*\) is writing {run}, which holds this output"
            with pytest.raises(OutputPathError, match=rf"^--output {out}: {held_by}; wait"):
                OutputLock(out, directory=directory, label="--output").acquire()
        assert [p.name for p in run.iterdir()] == [LOCK_NAME]  # nothing made, no lock left
        with OutputLock(tmp_path / "beside.json"), OutputLock(tmp_path / "RUN2", directory=True):
            pass
    finally:
        child.kill()
        child.wait()
    with OutputLock(run / "x.json"):  # its holder gone, its lock file left: no one holds RUN
        pass


def test_a_directory_with_a_live_writer_inside_is_refused_naming_it(tmp_path: Path) -> None:
    """The other order: a train that starts while another command writes inside its directory is refused."""
    from doppler.util.io import OutputLock, OutputPathError

    run = tmp_path / "RUN"
    child = _holder(run / "sub" / "x.json", "file")
    try:
        for out in (run, tmp_path):
            writes_inside = rf"another doppler process \(pid {child.pid}: .*\) is writing {run}/sub/x.json, inside"
            with pytest.raises(OutputPathError, match=rf"^{out}: {writes_inside} this output; wait"):
                OutputLock(out, directory=True).acquire()
        assert [p.name for p in run.iterdir()] == ["sub"]  # no lock file left, no directory made
        assert [p.name for p in (run / "sub").iterdir()] == [".x.json.doppler.lock"]
    finally:
        child.kill()
        child.wait()
    with OutputLock(run / "sub" / "x.json") as mine:  # one process: another command's lock counts, its own do not
        with pytest.raises(OutputPathError, match=rf"pid {os.getpid()}: .*\) is writing {run}/sub/x.json, inside"):
            OutputLock(run, directory=True).acquire()
        with OutputLock(run, directory=True, alongside=[mine]):
            pass


def test_two_writers_starting_together_are_not_both_let_through(tmp_path: Path, monkeypatch) -> None:
    """The worst interleaving: both take their own locks before either looks at the other's; each look then
    sees the other, so at most one goes on (here both are refused, each naming the other)."""
    from doppler.util.io import OutputLock, OutputPathError

    run = tmp_path / "RUN"
    train, writer = OutputLock(run, directory=True), OutputLock(run / "x.json")
    look = OutputLock._refuse_other_writers
    monkeypatch.setattr(OutputLock, "_refuse_other_writers", lambda self: None)
    train.acquire(), writer.acquire()  # (own locks only)
    monkeypatch.setattr(OutputLock, "_refuse_other_writers", look)
    try:
        with pytest.raises(OutputPathError, match=rf"is writing {run}, which holds this output"):
            writer._refuse_other_writers()
        with pytest.raises(OutputPathError, match=rf"is writing {run}/x.json, inside this output"):
            train._refuse_other_writers()
    finally:
        writer.release(), train.release()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    from doppler.util.io import LOCK_NAME, OutputLock

    child = _holder(tmp_path / "run", "dir")
    child.kill()  # SIGKILL: no clean-up, the lock file stays, its flock is gone with the process
    child.wait()
    lock_file = tmp_path / "run" / LOCK_NAME
    assert lock_file.read_text().split("\n")[0] == str(child.pid)
    with OutputLock(tmp_path / "run", directory=True):
        assert lock_file.read_text().split("\n")[0] == str(os.getpid())
    assert not lock_file.exists()


def test_a_released_lock_leaves_no_file_and_outputs_apart_do_not_block(tmp_path: Path) -> None:
    from doppler.util.io import OutputLock, OutputPathError

    with OutputLock(tmp_path, directory=True) as d, OutputLock(tmp_path / "a.json", alongside=[d]), \
            OutputLock(tmp_path / "b.json", alongside=[d]):  # (one command's outputs: see alongside)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".a.json.doppler.lock", ".b.json.doppler.lock",
                                                              ".doppler.lock"]  # fmt: skip
        with pytest.raises(OutputPathError, match=rf"^{tmp_path}/a.json: another doppler process \(pid {os.getpid()}"):
            OutputLock(tmp_path / "a.json").acquire()  # (a second open file in one process is refused too)
    assert not list(tmp_path.iterdir())
    # the directories a lock needed are removed again if nothing was written in them...
    with OutputLock(tmp_path / "x" / "y" / "a.json"), OutputLock(tmp_path / "r" / "s", directory=True):
        assert (tmp_path / "x" / "y").is_dir() and (tmp_path / "r" / "s").is_dir()
    assert not list(tmp_path.iterdir())
    # ...and kept with what was
    with OutputLock(tmp_path / "r" / "s", directory=True):
        (tmp_path / "r" / "s" / "checkpoint.pt").write_text("x")
    assert [p.name for p in (tmp_path / "r" / "s").iterdir()] == ["checkpoint.pt"]
    with pytest.raises(OutputPathError, match="is a file, not a directory"):  # make_run_dir's checks
        OutputLock(tmp_path / "r" / "s" / "checkpoint.pt" / "run", directory=True).acquire()


def test_a_lock_file_replaced_between_open_and_flock_is_not_kept(tmp_path: Path, monkeypatch) -> None:
    """A holder that releases (unlinks its file) and a third writer that makes a new one, both between this
    writer's open and its flock: the flock on the old, unlinked file must not count."""
    import fcntl

    from doppler.util import io as io_util
    from doppler.util.io import LOCK_NAME, OutputLock, OutputPathError

    real_flock = fcntl.flock
    lock_file = tmp_path / LOCK_NAME
    replaced = []

    def flock_after_a_swap(fd: int, op: int) -> None:
        if not replaced:
            lock_file.unlink()
            lock_file.write_text("")
            replaced.append(True)
        real_flock(fd, op)

    monkeypatch.setattr(io_util.fcntl, "flock", flock_after_a_swap)
    with OutputLock(tmp_path, directory=True):
        monkeypatch.setattr(io_util.fcntl, "flock", real_flock)
        assert replaced and lock_file.read_text().startswith(f"{os.getpid()}\n")
        with pytest.raises(OutputPathError, match="another doppler process"):  # held: the file the path names
            OutputLock(tmp_path, directory=True).acquire()


def test_a_directory_lock_removes_temp_files_a_killed_writer_left(tmp_path) -> None:
    from doppler.util.io import OutputLock

    run = tmp_path / "RUN"
    run.mkdir()
    (run / ".checkpoint.pt.abc123.tmp").write_bytes(b"half")
    (run / "checkpoint.pt").write_bytes(b"whole")
    with OutputLock(run, directory=True):
        assert sorted(p.name for p in run.iterdir()) == [".doppler.lock", "checkpoint.pt"]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt"]
