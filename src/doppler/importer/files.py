"""The one way doppler unpickles a file a user hands it: torch's weights-only loader.

``torch.load(..., weights_only=True)`` resolves no global outside torch's allowlist of tensor and
container types, so a pickle that names any other callable (``os.system``, ``builtins.eval``) is
refused before anything is called. Every checkpoint and every pickled member of a ``.pt2`` archive
goes through :func:`load_plain`; a refusal is one short phrase (:func:`load_failure`), never torch's
advice to retry with ``weights_only=False``, which doppler never does.

Both kinds of torch file that doppler reads from users are zip archives (a ``torch.save`` checkpoint, a
``torch.export`` ``.pt2`` program), and a zip archive may declare sizes far past its own (a decompression
bomb) or lie about them. :func:`open_zip` is the one gate for both: before any member is read it bounds
the central directory, the member count, each member's declared uncompressed size, their sum and each
member's compression ratio (the ``MAX_ZIP_*`` constants), and :func:`read_member` reads a member in
chunks, never past its declared size. :func:`load_plain` passes every zip through :func:`open_zip`
before ``torch.load`` sees it, and refuses what it loads if a tensor in it holds more elements than its bytes
(a view whose strides repeat elements, as ``expand`` makes: ten billion elements over four bytes) or is not a
dense tensor (sparse, quantized): what a reader does with every element of such a tensor (``isfinite``, a cast)
would allocate far past the archive's bounds.
"""

from __future__ import annotations

import io
import logging
import re
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any

__all__ = [
    "MAX_PICKLE_BYTES", "MAX_ZIP_DIRECTORY_BYTES", "MAX_ZIP_MEMBERS", "MAX_ZIP_MEMBER_BYTES", "MAX_ZIP_RATIO",
    "MAX_ZIP_TOTAL_BYTES", "ZIP_RATIO_MIN_BYTES", "ArchiveError", "check_zip", "load_failure", "load_plain",
    "open_zip", "read_member",
]  # fmt: skip

#: the most members a zip archive may hold (a checkpoint holds one per tensor storage, about 100; a ``.pt2``
#: program one per weight and constant, a few hundred for a 0.1B-parameter model)
MAX_ZIP_MEMBERS = 10_000
#: the largest central directory (the archive's table of members) parsed: 10,000 members with names of 700
#: characters; it is bounded before it is read, so that a table of millions of members is never parsed
MAX_ZIP_DIRECTORY_BYTES = 8 << 20
#: the largest declared uncompressed size of one member (a ``.pt2`` weight: a 0.1B-parameter model's largest,
#: its embedding, is about 150 MB in float32)
MAX_ZIP_MEMBER_BYTES = 512 << 20
#: the largest sum of the members' declared uncompressed sizes (a 0.1B-parameter model in float32 holds about
#: 400 MB of weights; the largest checkpoint, a policy of the widest layers with its optimizer's moments, about
#: 400 MB): what a reader may hold of one archive, so that reading it peaks under 2 GB
MAX_ZIP_TOTAL_BYTES = 1 << 30
#: the largest compression ratio (declared uncompressed / compressed size) of a member over
#: :data:`ZIP_RATIO_MIN_BYTES`: ``torch.save`` and ``torch.export.save`` store members uncompressed (ratio 1),
#: real weights deflate by less than 2, and zeros by about 1,000
MAX_ZIP_RATIO = 100
#: members of at most this many declared bytes are not held to :data:`MAX_ZIP_RATIO` (a small member, however
#: well it compresses, makes no bomb)
ZIP_RATIO_MIN_BYTES = 1 << 20
#: the largest pickle stream unpickled (a checkpoint's ``data.pkl``: ours hold tens of kB; a raw pickle in a
#: ``.pt2`` archive): the objects a pickle builds may take some 30 times its bytes
MAX_PICKLE_BYTES = 16 << 20
#: the bytes :func:`read_member` decompresses at a time
_CHUNK_BYTES = 1 << 20


class ArchiveError(ValueError):
    """A zip archive or member past one of the ``MAX_ZIP_*`` bounds, or too damaged to check; the message is
    one line naming the member where there is one (the caller names the file)."""


def _check_directory(f: IO[bytes]) -> None:
    """Bound the archive's table of members before :class:`zipfile.ZipFile` parses it: the end-of-directory
    record's member count and directory size (zipfile's own reader of that record, so that both read the same)."""
    try:
        end = zipfile._EndRecData(f)  # noqa: SLF001 - the record ZipFile itself reads next
    except OSError:
        end = None
    finally:
        f.seek(0)
    if end is None:
        return  # (not a zip archive: ZipFile says so)
    members, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]  # noqa: SLF001
    if members > MAX_ZIP_MEMBERS:
        raise ArchiveError(f"a zip archive of {members:,} members, more than the {MAX_ZIP_MEMBERS:,} doppler reads")
    if size > MAX_ZIP_DIRECTORY_BYTES:
        raise ArchiveError(f"a zip archive whose table of members takes {_bytes(size)}, more than the "
                            f"{_bytes(MAX_ZIP_DIRECTORY_BYTES)} doppler reads")  # fmt: skip


def check_zip(zf: zipfile.ZipFile) -> None:
    """:class:`ArchiveError` unless the archive ``zf`` keeps every ``MAX_ZIP_*`` bound by its declared sizes:
    the member count, each member's uncompressed size, their sum, each member's compression ratio, and a
    ``data.pkl``'s size (:data:`MAX_PICKLE_BYTES`); a name that appears twice is refused too (two readers
    could take different members for it)."""
    infos = zf.infolist()
    if len(infos) > MAX_ZIP_MEMBERS:
        raise ArchiveError(f"a zip archive of {len(infos):,} members, more than the {MAX_ZIP_MEMBERS:,} doppler reads")
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = _shown(info.filename)
        if info.filename in seen:
            raise ArchiveError(f"member {name} appears twice in the archive")
        seen.add(info.filename)
        size = info.file_size
        if size > MAX_ZIP_MEMBER_BYTES:
            raise ArchiveError(f"member {name} declares {_bytes(size)} uncompressed, more than the "
                                f"{_bytes(MAX_ZIP_MEMBER_BYTES)} doppler reads of one member")  # fmt: skip
        if size > ZIP_RATIO_MIN_BYTES and size > MAX_ZIP_RATIO * info.compress_size:
            raise ArchiveError(f"member {name} declares {_bytes(size)} uncompressed from {_bytes(info.compress_size)}, "
                                f"a compression ratio over {MAX_ZIP_RATIO} (a decompression bomb)")  # fmt: skip
        if info.filename.rsplit("/", 1)[-1] == "data.pkl" and size > MAX_PICKLE_BYTES:
            raise ArchiveError(f"member {name} declares a pickle of {_bytes(size)}, more than the "
                                f"{_bytes(MAX_PICKLE_BYTES)} doppler unpickles")  # fmt: skip
        total += size
        if total > MAX_ZIP_TOTAL_BYTES:
            raise ArchiveError(f"the members up to {name} declare {_bytes(total)} uncompressed, more than the "
                                f"{_bytes(MAX_ZIP_TOTAL_BYTES)} doppler reads of one archive")  # fmt: skip


def open_zip(f: IO[bytes]) -> zipfile.ZipFile:
    """The zip archive in the seekable binary file ``f``, opened after its table of members is bounded and
    then checked by :func:`check_zip`. Raises :class:`ArchiveError` past a bound, and what
    :class:`zipfile.ZipFile` raises for a file that is not a zip archive (:class:`zipfile.BadZipFile`)."""
    _check_directory(f)
    zf = zipfile.ZipFile(f)
    try:
        check_zip(zf)
    except BaseException:
        zf.close()
        raise
    return zf


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int = MAX_ZIP_MEMBER_BYTES) -> bytearray:
    """The bytes of member ``info``, decompressed a chunk at a time: never more than its declared size (nor
    than ``limit``) is held, whatever the compressed stream holds. A
    :class:`ArchiveError` naming the member if it declares more than ``limit``, or if its bytes are not the
    declared ones (fewer, more, or a wrong checksum)."""
    name = _shown(info.filename)
    size = info.file_size
    if size > limit:
        raise ArchiveError(f"member {name} declares {_bytes(size)} uncompressed, more than the {_bytes(limit)} "
                            "doppler reads of it")  # fmt: skip
    buf = bytearray()  # (grown as bytes arrive: a member that declares more than it holds takes only what it holds)
    try:
        with zf.open(info) as member:
            while len(buf) < size:
                chunk = member.read(min(_CHUNK_BYTES, size - len(buf)))
                if not chunk:
                    raise ArchiveError(f"member {name} holds {_bytes(len(buf))}, fewer than the {_bytes(size)} it declares")
                buf += chunk
            if member.read(1):
                raise ArchiveError(f"member {name} holds more than the {_bytes(size)} it declares")
    except ArchiveError:
        raise
    except EOFError:
        raise ArchiveError(f"member {name} ends before the {_bytes(size)} it declares") from None
    except (zipfile.BadZipFile, OSError, zlib.error, NotImplementedError, RuntimeError, ValueError) as e:
        raise ArchiveError(f"member {name} is damaged ({_first_line(e)})") from None
    return buf


def _bytes(n: int) -> str:
    """``n`` bytes in words: ``"536,870,912 bytes (512 MiB)"``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n:,} bytes ({n / (1 << shift):.3g} {unit})"
    return f"{n:,} bytes"


def _shown(name: str) -> str:
    """A member name as an error line shows it: printable, on one line, at most 120 characters."""
    text = name if name.isprintable() else repr(name)
    return text if len(text) <= 120 else text[:117] + "..."


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]


def load_plain(source: str | Path | bytes | bytearray, *, meta: bool = False) -> Any:
    """``torch.load`` of a file or bytes with ``weights_only=True`` onto the CPU (``meta``: onto torch's meta
    device, so that no tensor's bytes are read or allocated: what a check of the pickle alone needs); torch's
    own warnings and log lines are silenced (the caller reports one line). A zip archive (what ``torch.save``
    writes) is first bounded by :func:`open_zip` (a :class:`ArchiveError` past a bound); a raw pickle of
    more than :data:`MAX_PICKLE_BYTES` is a :class:`ArchiveError` too, and so is (off the meta device) a
    tensor it gives that is not dense or holds more elements than its bytes (:func:`_check_tensors`).
    Otherwise raises what torch raises."""
    import torch

    if isinstance(source, (bytes, bytearray)):
        f: Any = io.BytesIO(source)
        _check_torch_file(f, len(source))
        obj = _torch_load(torch, f, meta)
    else:
        with open(source, "rb") as f:
            _check_torch_file(f, None)
            obj = _torch_load(torch, f, meta)
    if not meta:
        _check_tensors(torch, obj)
    return obj


def _check_tensors(torch: Any, obj: Any) -> None:
    """:class:`ArchiveError` naming the first tensor in the containers of ``obj`` that is not a dense (strided,
    unquantized) tensor, or that holds more elements than the bytes of its storage: every tensor a loaded
    file gives is then no larger than the archive's bounded members."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, dict):
            stack.extend((f"{where}/{_shown(str(k))}", v) for k, v in x.items())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend((f"{where}/{i}", v) for i, v in enumerate(x))
        elif torch.is_tensor(x):
            name = where.lstrip("/") or "the file's tensor"
            if x.layout != torch.strided or x.is_quantized:
                raise ArchiveError(f"tensor {name} is a {x.layout} tensor{' (quantized)' if x.is_quantized else ''}; "
                                   "doppler reads dense tensors only")  # fmt: skip
            nbytes = x.untyped_storage().nbytes()
            if x.numel() * x.element_size() > nbytes:
                raise ArchiveError(f"tensor {name} of shape {list(x.shape)} holds {x.numel():,} elements over "
                                   f"{_bytes(nbytes)} of storage (a view that repeats its elements)")  # fmt: skip


def _check_torch_file(f: IO[bytes], size: int | None) -> None:
    """Bound a torch file before ``torch.load`` reads it: a zip archive by :func:`open_zip`, a raw pickle (torch's
    legacy format) by its size."""
    head = f.read(4)
    f.seek(0)
    if head == b"PK\x03\x04":
        try:  # (an archive that zipfile cannot read is not handed to torch's reader: its bounds are unknown)
            open_zip(f).close()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, OSError) as e:
            raise ArchiveError(f"a damaged or cut-short zip archive: {_first_line(e)}") from None
        finally:
            f.seek(0)
        return
    if size is None:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
    if size > MAX_PICKLE_BYTES:
        raise ArchiveError(f"a pickle of {_bytes(size)}, more than the {_bytes(MAX_PICKLE_BYTES)} doppler unpickles")


def _torch_load(torch: Any, f: IO[bytes], meta: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            return torch.load(f, map_location="meta" if meta else "cpu", weights_only=True)
        finally:
            logging.disable(logging.NOTSET)


def load_failure(e: BaseException) -> str:
    """:func:`load_plain`'s failure in one short phrase. A weights-only refusal gives the unpickler's
    reason (a file that is not a torch file at all, or one that pickles code)."""

    def first_sentence(text: str) -> str:
        text = re.sub(r"^\s*\[enforce fail at [^\]]*\]", "", text)  # torch's C++ source location
        return " ".join(text.split()).lstrip(" .:").split(". ", 1)[0].rstrip(".")[:120]

    text = str(e)
    if isinstance(e, ArchiveError):
        return text
    if "Weights only load failed" in text:
        paragraphs = re.split(r"\n\s*\n", text.split("WeightsUnpickler error:", 1)[-1])
        reason = next((first_sentence(p) for p in paragraphs
                       if p.strip() and not p.strip().startswith(("Weights only load failed", "Check the documentation"))),
                      "")  # fmt: skip
        return "not a file of plain tensors: " + (reason or "refused by the weights-only loader")
    if isinstance(e, EOFError):
        return "the file ends early: empty or cut short"
    if isinstance(e, OSError) or "PytorchStreamReader" in text:
        return f"a damaged or cut-short zip archive: {first_sentence(text) or type(e).__name__}"
    return f"{type(e).__name__}: {first_sentence(text) or 'no message'}"
