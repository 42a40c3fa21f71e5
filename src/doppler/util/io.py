"""Small file helpers shared by every writer: atomic writes (temp file + rename), JSON-safe values."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shlex
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as hex (which checkpoint a derived file or run came from)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def to_jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars/arrays turned into plain Python numbers/lists and dict keys into strings."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    return obj


#: the largest seed: numpy's legacy seeding, which training uses too, takes 32-bit seeds
MAX_SEED = 2**32 - 1


def check_seed(seed: Any, error: type[Exception] = ValueError, name: str = "the seed") -> int:
    """A seed is an integer from 0 to :data:`MAX_SEED` (numpy's generators take no negative seeds, its legacy
    seeding none past 32 bits); else ``error`` naming it."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise error(f"{name} must be an integer >= 0, got {seed!r}")
    if seed > MAX_SEED:
        raise error(f"{name} must be an integer from 0 to {MAX_SEED} (2**32 - 1), got {seed!r}")
    return int(seed)


def read_text(path: str | Path, what: str, error: type[Exception]) -> str:
    """The text of an input file, or ``error`` naming the path and why not (missing, a directory,
    unreadable, not text, not a regular file: a FIFO or a device would block or never end).
    ``what`` names the kind of file in the message ("graph file", ...)."""
    p = Path(path)
    a_what = f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"
    if p.exists() and not p.is_dir() and not p.is_file():
        raise error(f"{p}: not a regular file (a pipe, socket or device), not {a_what}")
    try:
        return p.read_text()
    except FileNotFoundError:
        raise error(f"{p}: no such {what}" + (" (a broken link)" if p.is_symlink() else "")) from None
    except IsADirectoryError:
        raise error(f"{p}: is a directory, not {a_what}") from None
    except PermissionError:
        raise error(f"{p}: cannot read (permission denied)") from None
    except UnicodeDecodeError as e:
        raise error(f"{p}: not a text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise error(f"{p}: cannot read ({e.strerror or e})") from None


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice (:func:`loads_json`); ``key`` is that key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r:.80} appears twice in one object")
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return obj


def loads_json(text: str | bytes | bytearray) -> Any:
    """``json.loads`` of a document doppler reads, except that an object naming a key twice is a
    :class:`DuplicateKeyError` (a ValueError) instead of its last value silently winning."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys)


def parse_json(text: str, source: str, error: type[Exception]) -> Any:
    """``text`` as JSON, or ``error`` naming ``source`` (and the line): invalid JSON, an object that names a
    key twice (:func:`loads_json`), an integer literal past Python's 4,300 digits, or nesting too deep for
    the parser."""
    try:
        return loads_json(text)
    except DuplicateKeyError as e:
        raise error(f"{source}: not valid JSON ({e})") from None
    except json.JSONDecodeError as e:
        raise error(f"{source}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    except ValueError as e:  # an integer literal too long to convert
        raise error(f"{source}: unreadable JSON ({str(e).split(';')[0]})") from None
    except RecursionError:
        raise error(f"{source}: unreadable JSON (nested too deeply)") from None


def read_json(path: str | Path, what: str, error: type[Exception]) -> Any:
    """A JSON input file (:func:`read_text`); invalid JSON is ``error`` naming the file and line."""
    return parse_json(read_text(path, what, error), str(path), error)


def _new_file_mode(path: Path) -> int:
    """The mode a plain ``open(path, "w")`` would give: the old file's, else 0o666 minus the umask (a link's
    target's mode is not taken)."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class OutputPathError(ValueError):
    """An output path cannot be written; the message names the path the user gave and why."""


def refuse_link(path: str | Path, name: str | Path | None = None) -> None:
    """An :class:`OutputPathError` if ``path`` is a symbolic link, naming it (or ``name``): doppler never
    writes through one."""
    if Path(path).is_symlink():
        raise OutputPathError(f"{name or path}: is a symbolic link; doppler does not write through links (remove "
                              "the link or give the path it points to)")  # fmt: skip


def refuse_links(directory: str | Path, members: Iterable[str]) -> None:
    """:func:`refuse_link` for each of ``members`` (names inside ``directory``): a run directory is refused
    before any work if a file or directory that doppler writes in it is a link, which would send the write
    elsewhere."""
    for name in members:
        refuse_link(Path(directory) / name)


def _file_in_the_way(paths) -> Path | None:
    """The first of ``paths`` that exists and is not a directory (a file where a directory must go)."""
    return next((a for a in paths if a.exists() and not a.is_dir()), None)


def make_run_dir(path: str | Path) -> Path:
    """Create a run directory (and its parents) before a run starts, or raise an
    :class:`OutputPathError` that names it: a symbolic link in its place (the directories above it may be
    links: the user chose that path), a file in its place, or a directory that cannot be created or written."""
    p = Path(path)
    refuse_link(p)
    blocking = _file_in_the_way((p, *p.parents))
    if blocking is not None:
        raise OutputPathError(f"{path}: cannot be an output directory ({blocking} is a file, not a directory)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"{path}: cannot create the directory ({e.strerror or e})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: the directory is not writable")
    return p


def _output_target(path: str | Path, name: str) -> Path:
    """The file an output path names, or an :class:`OutputPathError` naming ``name`` if it cannot be a file
    doppler writes: a symbolic link (never written through; the directories above it may be links: the user
    chose that path), a directory, a file where one of its directories must go, or a device, pipe or socket,
    which an atomic write (a new file renamed over the old) would replace with a regular file."""
    p = Path(path)
    refuse_link(p, name)
    if p.is_dir():
        raise OutputPathError(f"{name}: is a directory (give a file name)")
    if p.exists() and not p.is_file():
        raise OutputPathError(f"{name}: not a regular file (a device, pipe or socket): doppler writes whole files, "
                              "atomically; give a file path")  # fmt: skip
    blocking = _file_in_the_way(p.parents)
    if blocking is not None:
        raise OutputPathError(f"{name}: cannot write here ({blocking} is a file, not a directory)")
    return p


def check_output_file(path: str | Path, label: str = "") -> None:
    """Fail now, before any work, if ``path`` cannot be written as a file: a symbolic link or a directory in
    its place, a file where a directory must go, or a nearest existing directory that refuses a new file (a
    probe file is created there and removed; nothing else is created)."""
    name = f"{label} {path}" if label else str(path)
    p = _output_target(path, name)
    where = next(d for d in (p.parent, *p.parent.parents) if d.exists())
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".doppler-probe-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputPathError(f"{name}: cannot write here ({where}: {e.strerror or e})") from None


def check_outputs_apart(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Refuse, before any work, an output that names one of the command's input files (writing it would
    destroy the input) or the same file as another output; ``None`` entries are skipped, and inputs that
    are not existing files (a cluster preset's name) cannot clash. Each output is then
    :func:`check_output_file`'d."""
    taken: dict[str, str] = {}
    for label, path in inputs.items():
        if path is not None and os.path.isfile(path):
            taken.setdefault(os.path.realpath(path), f"{label} {path}")
    for label, path in outputs.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in taken:
            raise OutputPathError(f"{label} {path} is the same file as {taken[key]}: writing it would destroy "
                                  "that file; give another path")  # fmt: skip
        taken[key] = f"{label} {path}"
        check_output_file(path, label)


#: the lock file of a directory output, inside it; a file output's is a hidden sibling ``.NAME.doppler.lock``
LOCK_NAME = ".doppler.lock"
#: how every lock file's name ends, a directory's and a file's
LOCK_SUFFIX = ".doppler.lock"
#: tries, 5 ms apart, before a lock that another open file holds counts as held: another writer's look at a
#: lock (:func:`_live_holder`) or a refused writer's lock lets go within microseconds
_BUSY_TRIES = 20


class OutputLock:
    """One writer per output, whoever writes: an exclusive ``flock`` on a lock file, held from before a
    command's work until its end, so that a second doppler process writing the same output, or writing into
    a directory output, is refused at once instead of the two interleaving their files.

    A directory output (``directory=True``) is locked by ``DIR/.doppler.lock``, a file output by the hidden
    sibling ``.NAME.doppler.lock`` beside it. The directories this needs are created (:func:`make_run_dir`'s
    checks for a directory output). Contract:

    * :meth:`acquire` does not wait for a holder. An :class:`OutputPathError` names the holder's pid and
      command line (which a holder writes into its lock file) if a live process holds the output; if one
      holds a directory above it (``assign -o RUN/x.json`` while ``train -o RUN`` runs: the ``.doppler.lock``
      of every directory above is looked at); and, for a directory output, if one holds a file or directory
      inside it (every lock file below is looked at). Each writer takes its own lock before it looks at the
      others', so of two that start together at least one sees the other. The locks of the same command
      (``alongside``, already held) do not count.
    * Nothing is written through a symbolic link. The output itself may not be one (:func:`_output_target`,
      :func:`make_run_dir`; the directories above it may: the user chose that path), nor may the ``members``
      of a directory output (the names the command writes in it, :func:`refuse_links`). A lock file is opened
      with ``O_NOFOLLOW`` and refused, untouched, if it is a link, not a regular file, or a hard link.
    * The kernel drops a ``flock`` when its process dies, so a lock file left by a killed process is free
      and simply taken over.
    * :meth:`release` unlinks the lock file while still holding it, then closes it; the directories that
      :meth:`acquire` created are removed again if they are empty (a command that wrote nothing leaves
      nothing). Since a lock file can vanish between another process's ``open`` and its ``flock``,
      :meth:`acquire` keeps a lock only on the file that its path still names (same inode), else retries.
    """

    def __init__(self, path: str | Path, *, directory: bool = False, label: str = "", members: Iterable[str] = (),
                 alongside: Iterable["OutputLock"] = ()) -> None:  # fmt: skip
        self.path = Path(path)
        self.directory = directory
        self.name = f"{label} {path}" if label else str(path)
        self.members = tuple(members)
        self.alongside = tuple(alongside)
        self.lock_path: Path | None = None  #: the lock file, while held
        self._fd: int | None = None
        self._made: list[Path] = []  # directories acquire() created, deepest first

    def _lock_path(self) -> Path:
        """Create the directory that holds the lock file (and its parents); the lock file's path."""
        target = None if self.directory else _output_target(self.path, self.name)
        where = self.path if target is None else target.parent
        made = [d for d in (where, *where.parents) if not d.exists()]
        if self.directory:
            make_run_dir(self.path)
        else:
            try:
                where.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise OutputPathError(f"{self.name}: cannot create its directory ({e.strerror or e})") from None
        self._made += [d for d in made if d not in self._made]
        if target is None:
            return where / LOCK_NAME
        return Path(os.path.realpath(where)) / f".{target.name}{LOCK_SUFFIX}"

    def acquire(self) -> "OutputLock":
        """Take the lock now or raise :class:`OutputPathError` (held by a live process, a directory above or
        a file below held by one, a link among its members, or no lock file can be made there); then write
        this process's pid and command line into the lock file."""
        try:
            for _ in range(100):  # each retry: a holder removed the lock file (or its directory) under us
                lock_path = self._lock_path()
                fd = self._try_lock(lock_path)
                if fd is not None:
                    self._fd, self.lock_path = fd, lock_path
                    break
            else:
                raise OutputPathError(f"{self.name}: cannot lock it (its lock file keeps being replaced)")
            self._refuse_other_writers()
            if self.directory:
                refuse_links(self.path, self.members)
                _remove_stale_temp_files(self.path)
            return self
        except BaseException:
            self.release()
            self._remove_made()
            raise

    def _try_lock(self, lock_path: Path) -> int | None:
        """The locked fd of ``lock_path`` with this process's pid and command line written in it; None if the
        file was removed or replaced meanwhile (try again); :class:`OutputPathError` if a live process holds it
        or the path is a link or not a plain file of its own (nothing is written then)."""
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OutputPathError(f"{self.name}: its lock file {lock_path} is a symbolic link; doppler does not "
                                      "write through links (remove the link)") from None  # fmt: skip
            raise OutputPathError(f"{self.name}: cannot lock it ({lock_path}: {e.strerror or e})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                what = "not a regular file" if not stat.S_ISREG(st.st_mode) else "a hard link to another file"
                raise OutputPathError(f"{self.name}: its lock file {lock_path} is {what}; doppler does not write "
                                      "through links (remove it)")  # fmt: skip
            if not _flock_soon(fd, fcntl.LOCK_EX):
                raise OutputPathError(f"{self.name}: another doppler process ({_lock_holder(fd)}) is writing it; wait "
                                      "for it to finish or give another output")  # fmt: skip
            if not _same_file(fd, lock_path):
                os.close(fd)
                return None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{_command_line()}\n".encode(), 0)
            return fd
        except OSError as e:
            os.close(fd)
            raise OutputPathError(f"{self.name}: cannot lock it ({lock_path}: {e.strerror or e})") from None
        except BaseException:
            os.close(fd)
            raise

    def _file_id(self) -> tuple[int, int] | None:
        if self._fd is None:
            return None
        st = os.fstat(self._fd)
        return st.st_dev, st.st_ino

    def _refuse_other_writers(self) -> None:
        """An :class:`OutputPathError` naming the holder if a live process other than this command holds a
        directory above this output, or (a directory output) a file or directory inside it."""
        ours = {lock._file_id() for lock in (self, *self.alongside)} - {None}
        assert self.lock_path is not None
        where = Path(os.path.realpath(self.lock_path.parent))
        for d in where.parents if self.directory else (where, *where.parents):
            holder = _live_holder(d / LOCK_NAME, ours)
            if holder is not None:
                raise OutputPathError(f"{self.name}: another doppler process ({holder}) is writing {d}, which holds "
                                      "this output; wait for it to finish or give another output")  # fmt: skip
        if not self.directory:
            return
        for dirpath, _, filenames in os.walk(self.path):  # (links to directories are not followed)
            for n in filenames:
                holder = _live_holder(Path(dirpath) / n, ours) if n.endswith(LOCK_SUFFIX) else None
                if holder is not None:
                    what = Path(dirpath) / n[1 : -len(LOCK_SUFFIX)] if n != LOCK_NAME else Path(dirpath)
                    raise OutputPathError(f"{self.name}: another doppler process ({holder}) is writing {what}, inside "
                                          "this output; wait for it to finish or give another output")  # fmt: skip

    def release(self) -> None:
        """Unlink the lock file and let it go; remove the directories :meth:`acquire` made if they are empty.
        Does nothing if the lock is not held."""
        if self._fd is None or self.lock_path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.lock_path)
        os.close(self._fd)
        self._fd = self.lock_path = None
        self._remove_made()

    def _remove_made(self) -> None:
        for d in self._made:
            try:
                d.rmdir()
            except OSError:  # not empty (or gone): the output, or another writer's
                break
        self._made = []

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _flock_soon(fd: int, op: int) -> bool:
    """Take the ``flock`` ``op`` (``LOCK_EX`` or ``LOCK_SH``) on ``fd``; False if another open file keeps
    holding it for :data:`_BUSY_TRIES` tries (a live writer, not a passing look)."""
    for i in range(_BUSY_TRIES):
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if i + 1 < _BUSY_TRIES:
                time.sleep(0.005)
    return False


def _live_holder(lock_path: Path, ours: set[tuple[int, int]]) -> str | None:
    """The holder (``pid N: COMMAND``) of the lock file ``lock_path`` if a live process holds it, else None:
    no such file, a link or not a regular file (never a doppler lock), one of ``ours`` (file ids), or a lock
    file its holder left when killed. Opened without ``O_CREAT`` and without following a link; a shared
    lock, taken to see whether it can be, is let go at once."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in ours or _flock_soon(fd, fcntl.LOCK_SH):
            return None
        return _lock_holder(fd)
    finally:
        os.close(fd)


def _remove_stale_temp_files(directory: Path) -> None:
    """Delete what :func:`atomic_write_bytes` leaves when its process is killed mid-write (``.NAME.*.tmp``):
    the directory's lock is held, so no live writer owns one."""
    for tmp in directory.glob(".*.tmp"):
        if tmp.is_file() and not tmp.is_symlink():
            with contextlib.suppress(OSError):
                tmp.unlink()


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` itself (not a link's target) still names the file open as ``fd``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _command_line() -> str:
    """This process's command line as a shell would take it (``doppler train g.json -o DIR``)."""
    return shlex.join([Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]])


def _lock_holder(fd: int) -> str:
    """The holder named by a held lock file, as ``pid N: COMMAND`` (a holder writes it just after locking:
    read again briefly if it is still empty)."""
    for _ in range(20):
        pid, _, cmd = os.pread(fd, 4096, 0).decode(errors="replace").partition("\n")
        if pid.strip():
            return f"pid {pid.strip()}: {cmd.strip()}" if cmd.strip() else f"pid {pid.strip()}"
        time.sleep(0.005)
    return "pid unknown"


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a killed process leaves either the old file or the new one.

    A path that is a directory, or whose directory cannot be created or written, is an
    :class:`OutputPathError` naming ``path`` (not the temporary file) and the reason. A symbolic link, a
    device, a pipe or a socket in its place is refused: nothing is written through a link. The new bytes go to
    a new temporary file (``O_EXCL``) renamed over ``path``, so a link planted after that check is replaced
    by the rename, its target untouched."""
    p = _output_target(path, str(path))
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputPathError(f"{path}: cannot write here ({e.strerror or e})") from None
    try:
        _write_and_replace(fd, tmp, p, data)
    except OSError as e:
        raise OutputPathError(f"{path}: cannot write ({e.strerror or e})") from None


def _write_and_replace(fd: int, tmp: str, p: Path, data: bytes) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), _new_file_mode(p))  # mkstemp creates 0600 files
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, *, indent: int | None = None, compact: bool = False) -> None:
    """Write ``obj`` (numpy values allowed) as one JSON document to ``path``, atomically.

    ``indent`` pretty-prints; ``compact`` drops the spaces after separators (large graphs)."""
    seps = (",", ":") if compact else None
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=indent, separators=seps) + "\n")
