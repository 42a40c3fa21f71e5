"""Zip archives with any declared and actual member sizes, for the bounds of
:func:`doppler.importer.files.open_zip`: members of zeros deflated a chunk at a time (a file of a few MB that
inflates to GB), sizes in the member tables rewritten to lie (smaller or larger than the bytes), and
archives of very many members."""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Iterable

#: the bytes of zeros written at a time
_CHUNK = 1 << 24


def write_zip(path: Path | io.BytesIO, members: Iterable[tuple[str, bytes | int]], *,
              compression: int = zipfile.ZIP_STORED) -> None:  # fmt: skip
    """A zip archive of ``members`` in order: bytes as they are, an int ``n`` as ``n`` zero bytes written a
    chunk at a time (deflated: ``n`` of 3 GB takes about 3 MB); a name may repeat."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a repeated name)
        with zipfile.ZipFile(path, "w", compression) as z:
            for name, content in members:
                if isinstance(content, int):
                    info = zipfile.ZipInfo(name)
                    info.compress_type = zipfile.ZIP_DEFLATED
                    with z.open(info, "w", force_zip64=content >= 1 << 31) as f:
                        left = content
                        zeros = bytes(min(_CHUNK, content))
                        while left > 0:
                            f.write(zeros[: min(left, _CHUNK)])
                            left -= _CHUNK
                else:
                    z.writestr(name, content)


def zip_bytes(members: Iterable[tuple[str, bytes | int]], *, compression: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    write_zip(buf, members, compression=compression)
    return buf.getvalue()


def declare_sizes(data: bytes, name: str, *, file_size: int | None = None, compress_size: int | None = None,
                  crc: int | None = None) -> bytes:  # fmt: skip
    """``data`` (a zip archive without zip64 sizes) with member ``name``'s uncompressed and compressed sizes
    (each below 2**32) and checksum rewritten in its local header and in the table of members; its bytes
    unchanged."""
    out = bytearray(data)
    encoded = name.encode()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        offsets = [i.header_offset for i in z.infolist() if i.filename == name]
    for off in offsets:  # local headers: checksum at +14, compressed size at +18, uncompressed at +22
        _put(out, off + 14, crc)
        _put(out, off + 18, compress_size)
        _put(out, off + 22, file_size)
    pos = 0
    while (pos := out.find(b"PK\x01\x02", pos)) >= 0:  # table entries: +16 checksum, +20 compressed, +24 uncompressed
        (n,) = struct.unpack_from("<H", out, pos + 28)
        if bytes(out[pos + 46: pos + 46 + n]) == encoded:
            _put(out, pos + 16, crc)
            _put(out, pos + 20, compress_size)
            _put(out, pos + 24, file_size)
        pos += 4
    return bytes(out)


def _put(out: bytearray, at: int, value: int | None) -> None:
    if value is not None:
        struct.pack_into("<I", out, at, value)
