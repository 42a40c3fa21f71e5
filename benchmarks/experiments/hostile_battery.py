"""A hostile battery against SECURITY.md: every probe a real ``doppler`` process on a hostile input.

    python benchmarks/experiments/hostile_battery.py [--only SUBSTRING] [--keep DIR] [--as-bytes N]

It builds real inputs once (a graph, a tiny training run and a pretraining run, a ``.pt2`` program, a model
imported with its safetensors weights), then for each probe a fresh directory holding what the probe needs:
zip bombs in ``.pt2`` programs and checkpoints (nested archives, zip64 sizes, data descriptors, local and
central headers that disagree, names given twice, many small members), links at every path a command
writes (outputs, run-directory members, lock files), poisoned ``--resume`` states, counts past their bounds,
huge declared shapes in every format, two writers in one run directory, and keys named twice in every JSON
document doppler reads. Each probe runs as::

    prlimit --as=N -- timeout 60 /usr/bin/time -v doppler ...

in its own directory, with a sentinel file elsewhere that links point at. The bar (issue #59): exit 2 with
one line, or exit 0 with correct output; no file changed outside the named outputs (the probe's directory
and the sentinel's are hashed before and after); peak resident size under 2 GB; under 30 s. It prints one
row per probe and the failures; its exit status is 1 if any probe fails the bar.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"  #: the doppler under test (--src: another checkout's, to compare)
#: the bars of issue #59
PEAK_BAR_BYTES = 2_000_000_000
TIME_BAR_S = 30.0
KILL_S = 60
TINY_POLICY = ("--set", "hidden=8", "--set", "mlp_hidden=8", "--set", "mp_steps=1", "--set", "distill_updates=0")
TINY_TRAIN = ("--il-episodes", "8", "--batch", "4", "--search-evals", "0", "--search-every", "0", "--warm-start",
              "none", "--threads", "1")  # fmt: skip


def doppler_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("doppler")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "doppler"]


# ------------------------------------------------------------------------------------------------ zip writing
@dataclass
class Member:
    """One member of a hand-written zip archive. ``data`` is what is stored (already compressed for
    ``method`` 8); the declared sizes and checksum default to the truth and may lie, in the local header, the
    central table and a data descriptor separately."""

    name: str
    data: bytes
    method: int = 0  # 0 stored, 8 deflated
    usize: int | None = None  # true uncompressed size (default: len(data) when stored)
    crc: int | None = None
    central_usize: int | None = None  # lies, where given
    central_csize: int | None = None
    local_usize: int | None = None
    local_csize: int | None = None
    descriptor: bool = False  # flag bit 3: sizes 0 in the local header, a data descriptor after the data
    zip64: bool = False  # sizes in a zip64 extra field (0xFFFFFFFF in the 32-bit fields)


def deflate(raw: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(raw) + c.flush()


def deflated_zeros(n: int) -> tuple[bytes, int]:
    """``n`` zero bytes deflated a chunk at a time (3 GB take about 3 MB) and their CRC."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(min(n, 1 << 24))
    out, crc, left = [], 0, n
    while left > 0:
        part = chunk[: min(left, len(chunk))]
        out.append(c.compress(part))
        crc = zlib.crc32(part, crc)
        left -= len(part)
    out.append(c.flush())
    return b"".join(out), crc


def zeros_member(name: str, n: int, **kw) -> Member:
    data, crc = deflated_zeros(n)
    return Member(name, data, method=8, usize=n, crc=crc, **kw)


def stored(name: str, raw: bytes, **kw) -> Member:
    return Member(name, raw, method=0, usize=len(raw), crc=zlib.crc32(raw), **kw)


def write_raw_zip(members: list[Member], *, ecd_entries: int | None = None) -> bytes:
    """A zip archive of ``members`` written by hand, so that every size can lie; ``ecd_entries`` makes the
    end record's member count lie."""
    out = bytearray()
    central = bytearray()
    for m in members:
        usize = m.usize if m.usize is not None else len(m.data)
        crc = m.crc if m.crc is not None else zlib.crc32(m.data)
        csize = len(m.data)
        flags = 0x08 if m.descriptor else 0
        offset = len(out)
        name = m.name.encode()
        lu = m.local_usize if m.local_usize is not None else usize
        lc = m.local_csize if m.local_csize is not None else csize
        if m.descriptor:
            lu = lc = 0
            lcrc = 0
        else:
            lcrc = crc
        extra = b""
        if m.zip64:
            extra = struct.pack("<HHQQ", 1, 16, lu, lc)
            lu32 = lc32 = 0xFFFFFFFF
        else:
            lu32, lc32 = lu & 0xFFFFFFFF, lc & 0xFFFFFFFF
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if m.zip64 else 20, flags, m.method, 0, 0x21, lcrc, lc32,
                           lu32, len(name), len(extra)) + name + extra  # fmt: skip
        out += m.data
        if m.descriptor:
            if m.zip64:
                out += struct.pack("<IIQQ", 0x08074B50, crc, csize, usize)
            else:
                out += struct.pack("<IIII", 0x08074B50, crc, csize & 0xFFFFFFFF, usize & 0xFFFFFFFF)
        cu = m.central_usize if m.central_usize is not None else usize
        cc = m.central_csize if m.central_csize is not None else csize
        cextra = b""
        if m.zip64:
            cextra = struct.pack("<HHQQ", 1, 16, cu, cc)
            cu32 = cc32 = 0xFFFFFFFF
        else:
            cu32, cc32 = cu & 0xFFFFFFFF, cc & 0xFFFFFFFF
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45 if m.zip64 else 20, 45 if m.zip64 else 20, flags,
                               m.method, 0, 0x21, crc, cc32, cu32, len(name), len(cextra), 0, 0, 0, 0,
                               offset) + name + cextra  # fmt: skip
    cd_offset = len(out)
    out += central
    n = len(members) if ecd_entries is None else ecd_entries
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), len(central), cd_offset, 0)
    return bytes(out)


def zip_members(path: Path) -> list[Member]:
    """The members of a real archive as stored members (their bytes as they are)."""
    with zipfile.ZipFile(path) as z:
        return [stored(i.filename, z.read(i)) for i in z.infolist()]


def replace(members: list[Member], name_end: str, new: Member | None) -> list[Member]:
    """``members`` with the first whose name ends with ``name_end`` replaced by ``new`` (renamed to it), or
    removed (``new`` None)."""
    out, done = [], False
    for m in members:
        if not done and m.name.endswith(name_end):
            done = True
            if new is not None:
                new.name = m.name
                out.append(new)
        else:
            out.append(m)
    assert done, name_end
    return out


# ------------------------------------------------------------------------------------------------ probes
@dataclass
class Spec:
    """What a probe runs: ``argv`` after ``doppler``, in its directory; ``outputs`` (paths relative to it)
    may change; ``check(dir)`` says what is wrong with a success (None: right); ``names``: words of which
    the one error line must hold one (the file, key, option or member at fault); ``holder``: a doppler
    command started first and held running while the probe runs (two writers), with the lock file it
    holds once started."""

    argv: list[str]
    outputs: list[str] = field(default_factory=list)
    check: Callable[[Path], str | None] | None = None
    names: list[str] = field(default_factory=list)
    holder: list[str] | None = None
    holder_lock: str | None = None


@dataclass
class Probe:
    name: str
    cls: str
    expect: str  # "refuse" (exit 2), "ok" (exit 0 and correct), "either"
    make: Callable[["Ctx"], Spec]


PROBES: list[Probe] = []


def probe(cls: str, expect: str = "refuse") -> Callable:
    def deco(f: Callable[["Ctx"], Spec]) -> Callable:
        PROBES.append(Probe(f.__name__, cls, expect, f))
        return f

    return deco


@dataclass
class Ctx:
    dir: Path  # the probe's directory (its working directory)
    base: Path  # the real inputs
    sentinel: Path  # a file elsewhere that links point at

    def copy(self, name: str, as_name: str | None = None) -> str:
        src, dst = self.base / name, self.dir / (as_name or name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst)
        return as_name or name

    def write(self, name: str, data: bytes | str) -> str:
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return name

    def link(self, name: str, target: Path | str) -> str:
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        os.symlink(target, p)
        return name


def is_json(kind: str) -> Callable[[Path], str | None]:
    """A check that the named output is JSON holding ``kind`` ("graph", "assignment", "cluster")."""

    def check_file(path: Path) -> str | None:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            return f"{path.name}: {e}"
        ok = {"graph": lambda d: "ops" in d, "assignment": lambda d: isinstance(d.get("assignment"), list),
              "cluster": lambda d: isinstance(d.get("devices"), list)}[kind]  # fmt: skip
        return None if isinstance(doc, dict) and ok(doc) else f"{path.name}: not a {kind} file"

    return check_file


def output_is(name: str, kind: str) -> Callable[[Path], str | None]:
    """A check that output ``name`` is JSON holding ``kind``; a graph must also read back (``graph info``)."""

    def check(d: Path) -> str | None:
        wrong = is_json(kind)(d / name)
        if wrong is None and kind == "graph":
            r = run_doppler(["graph", "info", name], d)
            wrong = f"{name} does not read back: {r.stderr.strip()[:200]}" if r.returncode else None
        return wrong

    return check


def resumed_finite(run: str) -> Callable[[Path], str | None]:
    """A check that ``run``'s checkpoint loads with finite weights (the resume bar)."""

    def check(d: Path) -> str | None:
        import torch

        ck = torch.load(d / run / "checkpoint.pt", weights_only=True)
        bad = [k for k, v in ck["state_dict"].items() if not torch.isfinite(v).all()]
        return f"non-finite weights {bad[:3]}" if bad else None

    return check


G, A, CL = "g.json", "a.json", "cl.json"  # a tiled chainmm graph, an assignment of it, a cluster file
G8 = "g8.json"  # the training graph (random, 8 ops)
ASSIGN_CK = ["assign", G8, "-c", "unit:2", "-m", "doppler", "-o", "out.json", "--checkpoint"]
RESUME = ["train", G8, "-c", "unit:2", "--resume", "--episodes", "12", "-o", "RUN"]


def ckpt(ctx: Ctx, members: list[Member], name: str = "bad.pt") -> str:
    ctx.copy(G8)
    return ctx.write(name, write_raw_zip(members))


def torch_edit(ctx: Ctx, src: str, edit: Callable[[dict], None], dst: str | None = None) -> str:
    """Load a base checkpoint, ``edit`` it, save it with ``torch.save`` under ``dst``."""
    import torch

    ck = torch.load(ctx.base / src, weights_only=True)
    edit(ck)
    out = ctx.dir / (dst or src)
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(ck, buf)
    out.write_bytes(buf.getvalue())
    return str(out.relative_to(ctx.dir))


def pt2_with(ctx: Ctx, edit: Callable[[list[Member]], list[Member]], **kw) -> str:
    return ctx.write("m.pt2", write_raw_zip(edit(zip_members(ctx.base / "m.pt2")), **kw))


IMPORT = ["graph", "import", "m.pt2", "-o", "out.json"]


# ---- decompression bombs: .pt2 programs (graph import)
@probe("bomb/pt2", "refuse")
def pt2_extra_member_deflated_400mib(ctx: Ctx) -> Spec:
    pt2_with(ctx, lambda ms: ms + [zeros_member("m/extra/blob.bin", 400 << 20)])
    return Spec(IMPORT, ["out.json"], output_is("out.json", "graph"), ["m.pt2"])


@probe("bomb/pt2", "either")
def pt2_nested_zip_holding_a_3gib_bomb(ctx: Ctx) -> Spec:
    inner = write_raw_zip([zeros_member("bomb.bin", 3 << 30, zip64=True)])
    pt2_with(ctx, lambda ms: ms + [stored("m/extra/inner.zip", inner)])
    return Spec(IMPORT, ["out.json"], output_is("out.json", "graph"), ["m.pt2"])


@probe("bomb/pt2", "refuse")
def pt2_zip64_member_declaring_1tib(ctx: Ctx) -> Spec:
    pt2_with(ctx, lambda ms: ms + [stored("m/extra/big.bin", b"x" * 16, zip64=True, central_usize=1 << 40,
                                          local_usize=1 << 40)])  # fmt: skip
    return Spec(IMPORT, ["out.json"], names=["m.pt2"])


@probe("bomb/pt2", "either")
def pt2_data_descriptor_member_inflating_past_its_declared_size(ctx: Ctx) -> Spec:
    m = zeros_member("m/extra/dd.bin", 200 << 20, descriptor=True)
    m.usize = 1000  # the table and the descriptor both say 1000 bytes; the stream holds 200 MiB
    pt2_with(ctx, lambda ms: ms + [m])
    return Spec(IMPORT, ["out.json"], output_is("out.json", "graph"), ["m.pt2"])


@probe("bomb/pt2", "either")
def pt2_program_json_inflating_past_its_declared_size(ctx: Ctx) -> Spec:
    def edit(ms: list[Member]) -> list[Member]:
        orig = next(m for m in ms if m.name.endswith("models/model.json"))
        raw = orig.data + b" " * (300 << 20)
        new = Member(orig.name, deflate(raw), method=8, usize=len(orig.data), crc=zlib.crc32(orig.data),
                     descriptor=True)  # fmt: skip
        return replace(ms, "models/model.json", new)

    pt2_with(ctx, edit)
    return Spec(IMPORT, ["out.json"], output_is("out.json", "graph"), ["m.pt2"])


@probe("bomb/pt2", "either")
def pt2_local_header_declaring_3gib_central_the_truth(ctx: Ctx) -> Spec:
    pt2_with(ctx, lambda ms: [Member(m.name, m.data, m.method, m.usize, m.crc, zip64=True,
                                     local_usize=3 << 30, local_csize=3 << 30) for m in ms])  # fmt: skip
    return Spec(IMPORT, ["out.json"], output_is("out.json", "graph"), ["m.pt2"])


@probe("bomb/pt2", "refuse")
def pt2_program_json_named_twice(ctx: Ctx) -> Spec:
    def edit(ms: list[Member]) -> list[Member]:
        orig = next(m for m in ms if m.name.endswith("models/model.json"))
        return ms + [stored(orig.name, b'{"graph_module": {}}')]

    pt2_with(ctx, edit)
    return Spec(IMPORT, ["out.json"], names=["m.pt2"])


@probe("bomb/pt2", "refuse")
def pt2_9000_small_members_summing_past_1gib(ctx: Ctx) -> Spec:
    one = zeros_member("x", 120 << 10)
    pt2_with(ctx, lambda ms: ms + [Member(f"m/extra/{i}.bin", one.data, 8, one.usize, one.crc) for i in range(9000)])
    return Spec(IMPORT, ["out.json"], names=["m.pt2"])


@probe("bomb/pt2", "either")
def pt2_8000_small_members_summing_just_under_1gib(ctx: Ctx) -> Spec:
    one = zeros_member("x", 127 << 10)
    pt2_with(ctx, lambda ms: ms + [Member(f"m/extra/{i}.bin", one.data, 8, one.usize, one.crc) for i in range(8000)])
    return Spec(IMPORT, ["out.json"], output_is("out.json", "graph"), ["m.pt2"])


@probe("bomb/pt2", "refuse")
def pt2_stored_member_declaring_600mib(ctx: Ctx) -> Spec:
    pt2_with(ctx, lambda ms: ms + [stored("m/extra/s.bin", b"abc", central_usize=600 << 20, central_csize=600 << 20)])
    return Spec(IMPORT, ["out.json"], names=["m.pt2"])


@probe("bomb/pt2", "refuse")
def pt2_table_of_12000_members_under_an_end_record_saying_5(ctx: Ctx) -> Spec:
    pt2_with(ctx, lambda ms: ms + [stored(f"m/extra/{i}", b"") for i in range(12000)], ecd_entries=5)
    return Spec(IMPORT, ["out.json"], names=["m.pt2"])


@probe("bomb/pt2", "refuse")
def pt2_program_json_nested_5_million_deep(ctx: Ctx) -> Spec:
    pt2_with(ctx, lambda ms: replace(ms, "models/model.json", stored("", b"[" * 5_000_000)))
    return Spec(IMPORT, ["out.json"], names=["m.pt2"])


@probe("bomb/pt2", "refuse")
def pt2_program_json_million_digit_integer(ctx: Ctx) -> Spec:
    pt2_with(ctx, lambda ms: replace(ms, "models/model.json", stored("", b'{"a": ' + b"9" * 1_000_000 + b"}")))
    return Spec(IMPORT, ["out.json"], names=["m.pt2"])


# ---- decompression bombs: checkpoints
@probe("bomb/checkpoint", "refuse")
def ckpt_tensor_deflated_to_500mib(ctx: Ctx) -> Spec:
    ckpt(ctx, replace(zip_members(ctx.base / "RUN/checkpoint.pt"), "data/0", zeros_member("", 500 << 20)))
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], names=["bad.pt"])


@probe("bomb/checkpoint", "refuse")
def ckpt_9000_small_members_summing_past_1gib(ctx: Ctx) -> Spec:
    one = zeros_member("x", 120 << 10)
    ms = zip_members(ctx.base / "RUN/checkpoint.pt")
    ckpt(ctx, ms + [Member(f"archive/extra/{i}", one.data, 8, one.usize, one.crc) for i in range(9000)])
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], names=["bad.pt"])


@probe("bomb/checkpoint", "refuse")
def ckpt_zip64_data_pkl_declaring_1tib(ctx: Ctx) -> Spec:
    ms = zip_members(ctx.base / "RUN/checkpoint.pt")
    pkl = next(m for m in ms if m.name.endswith("data.pkl"))
    ms = replace(ms, "data.pkl", Member("", pkl.data, 0, pkl.usize, pkl.crc, zip64=True, central_usize=1 << 40))
    ckpt(ctx, ms)
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], names=["bad.pt"])


@probe("bomb/checkpoint", "refuse")
def ckpt_data_pkl_named_twice(ctx: Ctx) -> Spec:
    ms = zip_members(ctx.base / "RUN/checkpoint.pt")
    ckpt(ctx, ms + [stored(ms[0].name, b"\x80\x02}q\x00.")])
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], names=["bad.pt"])


@probe("bomb/checkpoint", "either")
def ckpt_storage_replaced_by_a_nested_zip_bomb(ctx: Ctx) -> Spec:
    inner = write_raw_zip([zeros_member("bomb.bin", 3 << 30, zip64=True)])
    ckpt(ctx, replace(zip_members(ctx.base / "RUN/checkpoint.pt"), "data/0", stored("", inner)))
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], output_is("out.json", "assignment"), ["bad.pt"])


@probe("bomb/checkpoint", "either")
def ckpt_storage_with_descriptor_inflating_to_300mib_past_its_table(ctx: Ctx) -> Spec:
    ms = zip_members(ctx.base / "RUN/checkpoint.pt")
    orig = next(m for m in ms if m.name.endswith("data/0"))
    raw = orig.data + bytes(300 << 20)
    new = Member("", deflate(raw), 8, usize=len(orig.data), crc=zlib.crc32(orig.data), descriptor=True)
    ckpt(ctx, replace(ms, "data/0", new))
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], output_is("out.json", "assignment"), ["bad.pt"])


@probe("bomb/checkpoint", "either")
def ckpt_local_headers_declaring_3gib(ctx: Ctx) -> Spec:
    ms = zip_members(ctx.base / "RUN/checkpoint.pt")
    ckpt(ctx, [Member(m.name, m.data, 0, m.usize, m.crc, zip64=True, local_usize=3 << 30, local_csize=3 << 30)
               for m in ms])  # fmt: skip
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], output_is("out.json", "assignment"), ["bad.pt"])


@probe("bomb/checkpoint", "refuse")
def ckpt_zero_stride_weight_of_1e10_elements(ctx: Ctx) -> Spec:
    import torch

    def edit(ck: dict) -> None:
        ck["state_dict"]["encoder.embed.weight"] = torch.zeros(1).expand(100_000, 100_000)

    ctx.copy(G8)
    torch_edit(ctx, "RUN/checkpoint.pt", edit, "bad.pt")
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], names=["bad.pt"])


@probe("bomb/checkpoint", "refuse")
def ckpt_sparse_weight_of_1e10_elements(ctx: Ctx) -> Spec:
    import torch

    def edit(ck: dict) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch's note that it skips checking sparse tensors)
            ck["state_dict"]["encoder.embed.weight"] = torch.sparse_coo_tensor(
                torch.tensor([[0], [0]]), torch.tensor([1.0]), (100_000, 100_000))

    ctx.copy(G8)
    torch_edit(ctx, "RUN/checkpoint.pt", edit, "bad.pt")
    return Spec([*ASSIGN_CK, "bad.pt"], ["out.json"], names=["bad.pt"])


@probe("bomb/pt2", "refuse")
def pt2_weight_zero_stride_view_of_2_40_elements(ctx: Ctx) -> Spec:
    def edit(ms: list[Member]) -> list[Member]:
        orig = next(m for m in ms if m.name.endswith("model_weights_config.json"))
        doc = json.loads(orig.data)
        meta = doc["config"]["head.weight"]["tensor_meta"]
        meta["sizes"], meta["strides"] = [{"as_int": 1 << 20}] * 2, [{"as_int": 0}] * 2
        return replace(ms, "model_weights_config.json", stored("", json.dumps(doc).encode()))

    pt2_with(ctx, edit)
    return Spec(IMPORT, ["out.json"], names=["head.weight"])


@probe("bomb/pt2", "either")
def pt2_weights_of_1gib_deflated_into_11mb_within_the_ratio(ctx: Ctx) -> Spec:
    """Two weights of 512 MiB (zeros), each deflated and padded with bytes the inflater never reads so that its
    ratio is 99, under MAX_ZIP_RATIO: an archive just under MAX_ZIP_TOTAL_BYTES, the most a reader may hold of
    one archive, from a file of 11 MB."""
    import torch

    n = 11584  # (two n x n float32 weights and the program: just under 1 GiB)

    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(n, n, bias=False)
            self.b = torch.nn.Linear(n, n, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    with torch.device("meta"):
        model = Wide()
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    big = ctx.sentinel.parent / "big.pt2"  # (written whole once, outside the probe's directory, then removed)
    torch.export.save(torch.export.export(model, (torch.zeros(2, n),)), big)
    del model
    members = []
    with zipfile.ZipFile(big) as z:
        for info in z.infolist():
            raw = z.read(info)
            if len(raw) > 1 << 20:
                packed = deflate(raw)
                packed += os.urandom(len(raw) // 99 - len(packed))  # (after the stream's end: never inflated)
                members.append(Member(info.filename, packed, 8, usize=len(raw), crc=zlib.crc32(raw)))
            else:
                members.append(stored(info.filename, raw))
            del raw
    big.unlink()
    ctx.write("m.pt2", write_raw_zip(members))
    return Spec(IMPORT, ["out.json"], output_is("out.json", "graph"), ["m.pt2"])


@probe("bomb/checkpoint", "refuse")
def train_init_from_a_storage_deflated_to_500mib(ctx: Ctx) -> Spec:
    ckpt(ctx, replace(zip_members(ctx.base / "RUN/checkpoint.pt"), "data/1", zeros_member("", 500 << 20)))
    ctx.copy(G8)
    return Spec(["train", G8, "-c", "unit:2", "--init", "bad.pt", "-o", "NEW", "--episodes", "4", *TINY_TRAIN],
                ["NEW"], names=["bad.pt"])  # fmt: skip


@probe("bomb/checkpoint", "refuse")
def pretrain_init_from_8001_members(ctx: Ctx) -> Spec:
    ms = zip_members(ctx.base / "PRE/checkpoint.pt")
    ckpt(ctx, ms + [stored(f"archive/pad/{i}", b"") for i in range(10_001 - len(ms) + 1)])
    return Spec(["pretrain", "--init", "bad.pt", "-o", "NEW", "--budget-h", "0.0001"], ["NEW"], names=["bad.pt"])


@probe("bomb/checkpoint", "refuse")
def resume_zero_stride_adam_moment(ctx: Ctx) -> Spec:
    import torch

    ctx.copy("RUN"), ctx.copy(G8)

    def edit(ck: dict) -> None:
        ck["optimizer"]["state"][0]["exp_avg"] = torch.zeros(1).expand(100_000, 100_000)

    torch_edit(ctx, "RUN/checkpoint.pt", edit)
    return Spec(RESUME, [], names=["RUN", "checkpoint.pt"])


@probe("bomb/checkpoint", "refuse")
def resume_float64_view_adam_moment_cast_on_load(ctx: Ctx) -> Spec:
    import torch

    ctx.copy("RUN"), ctx.copy(G8)

    def edit(ck: dict) -> None:
        ck["optimizer"]["state"][5]["exp_avg_sq"] = torch.zeros(1, dtype=torch.float64).expand(60_000, 60_000)

    torch_edit(ctx, "RUN/checkpoint.pt", edit)
    return Spec(RESUME, [], names=["checkpoint.pt"])


# ---- poisoned resumes
def poisoned(ctx: Ctx, edit: Callable[[dict], None], run: str = "RUN") -> None:
    ctx.copy(run), ctx.copy(G8)
    torch_edit(ctx, f"{run}/checkpoint.pt", edit)


@probe("resume", "refuse")
def resume_every_weight_nan(ctx: Ctx) -> Spec:
    poisoned(ctx, lambda ck: [v.fill_(float("nan")) for v in ck["state_dict"].values()])
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def resume_every_second_moment_negative(ctx: Ctx) -> Spec:
    poisoned(ctx, lambda ck: [s["exp_avg_sq"].fill_(-1.0) for s in ck["optimizer"]["state"].values()])
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def resume_every_step_nan(ctx: Ctx) -> Spec:
    poisoned(ctx, lambda ck: [s["step"].fill_(float("nan")) for s in ck["optimizer"]["state"].values()])
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def resume_first_moment_transposed(ctx: Ctx) -> Spec:
    def edit(ck: dict) -> None:
        s = ck["optimizer"]["state"][0]
        s["exp_avg"] = s["exp_avg"].t().contiguous()

    poisoned(ctx, edit)
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "either")
def resume_moments_as_float16_and_int64(ctx: Ctx) -> Spec:
    def edit(ck: dict) -> None:
        import torch

        for s in ck["optimizer"]["state"].values():
            s["exp_avg"] = s["exp_avg"].half()
            s["exp_avg_sq"] = s["exp_avg_sq"].to(torch.int64)

    poisoned(ctx, edit)
    return Spec(RESUME, ["RUN"], resumed_finite("RUN"), names=["checkpoint.pt"])


@probe("resume", "either")
def resume_torch_generator_state_all_zeros(ctx: Ctx) -> Spec:
    poisoned(ctx, lambda ck: ck["torch_rng"].zero_())
    return Spec(RESUME, ["RUN"], resumed_finite("RUN"), names=["checkpoint.pt"])


@probe("resume", "refuse")
def resume_torch_generator_state_cut_short(ctx: Ctx) -> Spec:
    def edit(ck: dict) -> None:
        ck["torch_rng"] = ck["torch_rng"][:100].clone()

    poisoned(ctx, edit)
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def resume_numpy_generator_even_increment(ctx: Ctx) -> Spec:
    def edit(ck: dict) -> None:
        st = json.loads(ck["numpy_rng"])
        st["state"]["inc"] = st["state"]["inc"] - 1
        ck["numpy_rng"] = json.dumps(st)

    poisoned(ctx, edit)
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def resume_learning_rate_inf(ctx: Ctx) -> Spec:
    poisoned(ctx, lambda ck: ck["optimizer"]["param_groups"][0].update(lr=float("inf")))
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def resume_checkpoint_config_episodes_1e15(ctx: Ctx) -> Spec:
    def edit(ck: dict) -> None:
        cfg = json.loads(ck["config"])
        cfg["episodes"] = 10**15
        ck["config"] = json.dumps(cfg)

    poisoned(ctx, edit)
    cfg = json.loads((ctx.dir / "RUN/config.json").read_text())
    cfg["episodes"] = 10**15
    ctx.write("RUN/config.json", json.dumps(cfg))
    return Spec(["train", G8, "-c", "unit:2", "--resume", "-o", "RUN"], [], names=["episodes"])


@probe("resume", "refuse")
def resume_config_json_key_named_twice(ctx: Ctx) -> Spec:
    ctx.copy("RUN"), ctx.copy(G8)
    text = (ctx.dir / "RUN/config.json").read_text()
    ctx.write("RUN/config.json", text.replace('"episodes": 8,', '"episodes": 8, "episodes": 400000,'))
    return Spec(RESUME, [], names=["config.json"])


@probe("resume", "refuse")
def resume_best_makespan_nan_and_counter_1e18(ctx: Ctx) -> Spec:
    def edit(ck: dict) -> None:
        ck["graphs"][0]["best_makespan_s"] = float("nan")
        ck["episode"] = 10**18

    poisoned(ctx, edit)
    return Spec(RESUME, [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def pretrain_resume_every_weight_inf(ctx: Ctx) -> Spec:
    ctx.copy("PRE")
    torch_edit(ctx, "PRE/checkpoint.pt", lambda ck: [v.fill_(float("inf")) for v in ck["state_dict"].values()
                                                      if v.is_floating_point()])  # fmt: skip
    return Spec(["pretrain", "--resume", "-o", "PRE", "--threads", "1"], [], names=["checkpoint.pt"])


@probe("resume", "refuse")
def pretrain_resume_budget_of_1e30_seconds_in_its_checkpoint(ctx: Ctx) -> Spec:
    ctx.copy("PRE")

    def edit(ck: dict) -> None:
        state = json.loads(ck["pretrain"])
        state["budget_s"] = 1e30
        ck["pretrain"] = json.dumps(state)

    torch_edit(ctx, "PRE/checkpoint.pt", edit)
    return Spec(["pretrain", "--resume", "-o", "PRE", "--threads", "1"], [], names=["checkpoint.pt"])


@probe("count", "refuse")
def checkpoint_policy_config_of_a_billion_wide_and_deep(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    torch_edit(ctx, "RUN/checkpoint.pt", lambda ck: ck["policy_config"].update(hidden=10**9, steps=10**9), "bad.pt")
    return Spec([*ASSIGN_CK, "bad.pt"], [], names=["bad.pt"])


@probe("resume", "either")
def resume_checkpoint_hard_linked_to_a_file_elsewhere(ctx: Ctx) -> Spec:
    ctx.copy("RUN"), ctx.copy(G8)
    shutil.copy2(ctx.dir / "RUN/checkpoint.pt", ctx.sentinel)
    os.unlink(ctx.dir / "RUN/checkpoint.pt")
    os.link(ctx.sentinel, ctx.dir / "RUN/checkpoint.pt")
    return Spec(RESUME, ["RUN"], resumed_finite("RUN"), names=["checkpoint.pt"])


# ---- links at written paths
@probe("link", "refuse")
def graph_build_output_links_to_a_file_elsewhere(ctx: Ctx) -> Spec:
    ctx.link("out.json", ctx.sentinel)
    return Spec(["graph", "build", "chainmm", "--set", "size=tiny", "-o", "out.json"], [], names=["out.json"])


@probe("link", "refuse")
def graph_import_output_dangling_link(ctx: Ctx) -> Spec:
    ctx.copy("m.pt2")
    ctx.link("out.json", ctx.sentinel.parent / "nowhere" / "x.json")
    return Spec(IMPORT, [], names=["out.json"])


@probe("link", "refuse")
def graph_convert_output_links_to_a_directory(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link("out.txt", ctx.sentinel.parent)
    return Spec(["graph", "convert", G, "out.txt", "--round"], [], names=["out.txt"])


@probe("link", "refuse")
def graph_draw_output_link(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link("g.png", ctx.sentinel)
    return Spec(["graph", "draw", G, "-o", "g.png"], [], names=["g.png"])


@probe("link", "refuse")
def assign_lock_file_symlinked_to_a_file_elsewhere(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link(".out.json.doppler.lock", ctx.sentinel)
    return Spec(["assign", G, "-c", "unit:2", "-m", "critical_path", "-o", "out.json"], [], names=["lock"])


@probe("link", "refuse")
def assign_lock_file_hard_linked_to_a_file_elsewhere(ctx: Ctx) -> Spec:
    ctx.copy(G)
    os.link(ctx.sentinel, ctx.dir / ".out.json.doppler.lock")
    return Spec(["assign", G, "-c", "unit:2", "-m", "critical_path", "-o", "out.json"], [], names=["lock"])


@probe("link", "ok")
def assign_output_hard_linked_to_a_file_elsewhere(ctx: Ctx) -> Spec:
    ctx.copy(G)
    os.link(ctx.sentinel, ctx.dir / "out.json")  # replaced by rename: the sentinel keeps its bytes
    return Spec(["assign", G, "-c", "unit:2", "-m", "critical_path", "-o", "out.json"], ["out.json"],
                output_is("out.json", "assignment"))  # fmt: skip


@probe("link", "refuse")
def assign_output_is_the_input_through_a_linked_directory(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link("here", ".")
    return Spec(["assign", G, "-c", "unit:2", "-m", "critical_path", "-o", f"here/{G}"], [], names=[G])


@probe("link", "refuse")
def compare_csv_link(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link("t.csv", ctx.sentinel)
    return Spec(["compare", G, "-c", "unit:2", "-m", "critical_path,heft", "--csv", "t.csv"], [], names=["t.csv"])


@probe("link", "refuse")
def compare_save_dir_member_link(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link("D/heft.json", ctx.sentinel)
    return Spec(["compare", G, "-c", "unit:2", "-m", "critical_path,heft", "--save-dir", "D"], [], names=["heft.json"])


@probe("link", "refuse")
def compare_save_dir_lock_link(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link("D/.doppler.lock", ctx.sentinel)
    return Spec(["compare", G, "-c", "unit:2", "-m", "critical_path", "--save-dir", "D"], [], names=["lock"])


@probe("link", "refuse")
def simulate_gantt_link_beside_a_good_trace(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(A)
    ctx.link("gantt.png", ctx.sentinel)
    return Spec(["simulate", G, "-c", "unit:2", "-a", A, "--trace", "t.json", "--gantt", "gantt.png",
                 "--chrome-trace", "c.json"], [], names=["gantt.png"])  # fmt: skip


@probe("link", "refuse")
def simulate_ops_csv_lock_link(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(A)
    ctx.link(".ops.csv.doppler.lock", ctx.sentinel)
    return Spec(["simulate", G, "-c", "unit:2", "-a", A, "--ops-csv", "ops.csv"], [], names=["lock"])


@probe("link", "refuse")
def train_new_run_config_json_link(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    ctx.link("NEW/config.json", ctx.sentinel)
    return Spec(["train", G8, "-c", "unit:2", "-o", "NEW", "--episodes", "4", *TINY_TRAIN, *TINY_POLICY], [],
                names=["config.json"])  # fmt: skip


def resume_with_link(ctx: Ctx, member: str, target: Path, named: str) -> Spec:
    """``train --resume`` of the run with ``RUN/member`` a link to ``target``; the refusal names ``named``."""
    ctx.copy("RUN"), ctx.copy(G8)
    ctx.link(f"RUN/{member}", target)
    return Spec(RESUME, [], names=[named])


@probe("link", "refuse")
def train_resume_best_assignment_link(ctx: Ctx) -> Spec:
    return resume_with_link(ctx, "best_assignment.json", ctx.sentinel, "best_assignment.json")


@probe("link", "refuse")
def train_resume_training_curve_link(ctx: Ctx) -> Spec:
    return resume_with_link(ctx, "training_curve.png", ctx.sentinel, "training_curve.png")


@probe("link", "refuse")
def train_resume_tensorboard_link_to_a_directory(ctx: Ctx) -> Spec:
    return resume_with_link(ctx, "tensorboard", ctx.sentinel.parent, "tensorboard")


@probe("link", "refuse")
def train_resume_lock_link(ctx: Ctx) -> Spec:
    return resume_with_link(ctx, ".doppler.lock", ctx.sentinel, "lock")


@probe("link", "refuse")
def train_run_directory_itself_a_link(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    shutil.copytree(ctx.base / "RUN", ctx.sentinel.parent / "RUNX")
    ctx.link("RUN", ctx.sentinel.parent / "RUNX")
    return Spec(RESUME, [], names=["RUN"])


@probe("link", "either")
def train_resume_planted_temp_file_link(ctx: Ctx) -> Spec:
    ctx.copy("RUN"), ctx.copy(G8)
    ctx.link("RUN/.checkpoint.pt.abcdefgh.tmp", ctx.sentinel)
    return Spec(RESUME, ["RUN"], resumed_finite("RUN"), names=["RUN"])


@probe("link", "refuse")
def pretrain_new_run_checkpoint_link(ctx: Ctx) -> Spec:
    ctx.link("NEW/checkpoint.pt", ctx.sentinel)
    return Spec(["pretrain", "-o", "NEW", "--budget-h", "0.0001"], [], names=["checkpoint.pt"])


@probe("link", "refuse")
def execute_trace_link(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(A)
    ctx.link("t.json", ctx.sentinel)
    return Spec(["execute", G, "-a", A, "--repeats", "1", "--warmup", "0", "--trace", "t.json", "--json"], [],
                names=["t.json"])  # fmt: skip


@probe("link", "refuse")
def calibrate_output_link(ctx: Ctx) -> Spec:
    ctx.link("cal.json", ctx.sentinel)
    return Spec(["calibrate", "-o", "cal.json", "--runs", "1", "--sizes", "64"], [], names=["cal.json"])


@probe("link", "refuse")
def validate_plot_link(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(CL)
    ctx.link("p.png", ctx.sentinel)
    return Spec(["validate", G, "-c", CL, "--n", "2", "--repeats", "1", "--plot", "p.png", "-o", "v.json"], [],
                names=["p.png"])  # fmt: skip


@probe("link", "refuse")
def demo_output_member_link(ctx: Ctx) -> Spec:
    ctx.link("D/chainmm_graph.png", ctx.sentinel)
    return Spec(["demo", "-o", "D", "--train-episodes", "0", "--no-engine", "--budget-s", "0.1"], [],
                names=["chainmm_graph.png"])  # fmt: skip


@probe("link", "refuse")
def graph_build_output_is_a_fifo(ctx: Ctx) -> Spec:
    os.mkfifo(ctx.dir / "out.json")
    return Spec(["graph", "build", "chainmm", "--set", "size=tiny", "-o", "out.json"], [], names=["out.json"])


# ---- counts past their bounds
def tiny_train(*extra: str) -> list[str]:
    return ["train", G8, "-c", "unit:2", "-o", "NEW", *TINY_TRAIN, *TINY_POLICY, *extra]


@probe("count", "refuse")
def train_episodes_past_int64(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    return Spec(tiny_train("--episodes", "99999999999999999999999"), [], names=["--episodes", "episodes"])


@probe("count", "refuse")
def train_search_evals_and_every_huge(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    return Spec(["train", G8, "-c", "unit:2", "-o", "NEW", "--episodes", "8", "--search-evals", "100000000000",
                 "--search-every", "1", "--threads", "1"], [], names=["search"])  # fmt: skip


@probe("count", "refuse")
def train_set_checkpoint_every_and_il_batch_huge(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    return Spec(tiny_train("--episodes", "4", "--set", "il_batch=100000000"), [], names=["il_batch"])


@probe("count", "refuse")
def pretrain_budget_of_a_million_hours(ctx: Ctx) -> Spec:
    return Spec(["pretrain", "-o", "NEW", "--budget-h", "1e6"], [], names=["--budget-h", "budget"])


@probe("count", "refuse")
def pretrain_100000_workers(ctx: Ctx) -> Spec:
    return Spec(["pretrain", "-o", "NEW", "--budget-h", "0.0001", "--workers", "100000"], [], names=["--workers", "workers"])


@probe("count", "refuse")
def assign_samples_past_bound(ctx: Ctx) -> Spec:
    ctx.copy(G8), ctx.copy("RUN")
    return Spec([*ASSIGN_CK, "RUN/checkpoint.pt", "--samples", "1000000000"], [], names=["--samples", "samples"])


@probe("count", "refuse")
def assign_budget_of_a_century(ctx: Ctx) -> Spec:
    ctx.copy(G)
    return Spec(["assign", G, "-c", "unit:2", "-m", "anneal", "-o", "out.json", "--budget-s", "3.2e9"], [],
                names=["--budget-s", "budget"])  # fmt: skip


@probe("count", "refuse")
def compare_budget_inf(ctx: Ctx) -> Spec:
    ctx.copy(G)
    return Spec(["compare", G, "-c", "unit:2", "-m", "anneal", "--budget-s", "inf"], [], names=["--budget-s", "budget"])


@probe("count", "refuse")
def execute_repeats_and_warmup_past_bound(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(A)
    return Spec(["execute", G, "-a", A, "--warmup", "100000000", "--repeats", "1"], [], names=["--warmup", "warmup"])


@probe("count", "either")
def execute_100000_engine_devices(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(A)
    return Spec(["execute", G, "-a", A, "--devices", "100000", "--repeats", "1", "--warmup", "0"], [],
                names=["--devices", "devices"])  # fmt: skip


@probe("count", "refuse")
def calibrate_100000_devices(ctx: Ctx) -> Spec:
    return Spec(["calibrate", "-o", "cal.json", "--devices", "100000", "--runs", "1", "--sizes", "64"], [],
                names=["--devices", "devices"])  # fmt: skip


@probe("count", "refuse")
def calibrate_size_past_bound(ctx: Ctx) -> Spec:
    return Spec(["calibrate", "-o", "cal.json", "--runs", "1", "--sizes", "64,1000000"], [], names=["--sizes", "size"])


@probe("count", "refuse")
def validate_n_and_repeats_past_bound(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(CL)
    return Spec(["validate", G, "-c", CL, "--n", "1000000", "--repeats", "1"], [], names=["--n"])


@probe("count", "refuse")
def graph_build_random_num_ops_past_bound(ctx: Ctx) -> Spec:
    return Spec(["graph", "build", "random", "--set", "num_ops=2000001", "-o", "out.json"], [], names=["num_ops"])


@probe("count", "refuse")
def graph_build_llama_model_1001_layers(ctx: Ctx) -> Spec:
    return Spec(["graph", "build", "llama_model", "--set", "size=tiny", "--set", "layers=1001", "-o", "out.json"], [],
                names=["layers"])  # fmt: skip


@probe("count", "refuse")
def graph_build_decode_context_past_bound(ctx: Ctx) -> Spec:
    return Spec(["graph", "build", "llama_model", "--set", "size=tiny", "--set", "phase=decode", "--set",
                 "context=1000001", "-o", "out.json"], [], names=["context"])  # fmt: skip


@probe("count", "either")
def graph_build_ffnn_batch_1e13(ctx: Ctx) -> Spec:
    return Spec(["graph", "build", "ffnn", "--set", "size=tiny", "--set", "batch=10000000000000", "-o", "out.json"],
                ["out.json"], output_is("out.json", "graph"), names=["ffnn: input 'X'"])  # fmt: skip


@probe("count", "either")
def graph_build_llama_block_batch_seq_1e6(ctx: Ctx) -> Spec:
    return Spec(["graph", "build", "llama_block", "--set", "size=tiny", "--set", "batch=1000000", "--set",
                 "seq_len=1000000", "-o", "out.json"], ["out.json"], output_is("out.json", "graph"),
                names=["llama_block: input 'x'"])  # fmt: skip


@probe("count", "refuse")
def cluster_preset_of_a_million_devices(ctx: Ctx) -> Spec:
    ctx.copy(G)
    return Spec(["graph", "info", G, "-c", "unit:1000000"], [], names=["unit:1000000", "devices"])


@probe("count", "refuse")
def demo_episodes_past_bound(ctx: Ctx) -> Spec:
    return Spec(["demo", "-o", "D", "--train-episodes", "1000000000", "--no-engine"], [], names=["--train-episodes", "episodes"])


# ---- huge declared shapes
def graph_doc(ctx: Ctx) -> dict:
    return json.loads((ctx.base / G).read_text())


@probe("shape", "refuse")
def execute_input_declared_1e7_by_1e7(ctx: Ctx) -> Spec:
    doc = graph_doc(ctx)
    name = next(iter(doc["meta"]["inputs"]))
    doc["meta"]["inputs"][name] = [10_000_000, 10_000_000]
    ctx.write(G, json.dumps(doc)), ctx.copy(A)
    return Spec(["execute", G, "-a", A, "--repeats", "1", "--warmup", "0"], [], names=[G, name])


@probe("shape", "either")
def execute_input_declared_15000_by_15000(ctx: Ctx) -> Spec:
    doc = graph_doc(ctx)
    name = next(iter(doc["meta"]["inputs"]))
    doc["meta"]["inputs"][name] = [15000, 15000]
    ctx.write(G, json.dumps(doc)), ctx.copy(A)
    return Spec(["execute", G, "-a", A, "--repeats", "1", "--warmup", "0", "--json"], [], names=[G, name])


@probe("shape", "refuse")
def graph_spec_shape_past_2_40(ctx: Ctx) -> Spec:
    doc = graph_doc(ctx)
    doc["ops"]["spec"][3]["shape"] = [1 << 21, 1 << 21]
    ctx.write(G, json.dumps(doc))
    return Spec(["graph", "info", G], [], names=[G])


@probe("shape", "refuse")
def text_format_declaring_a_billion_ops(ctx: Ctx) -> Spec:
    ctx.write("g.txt", "1000000000\n\n0\n999999999999999999\n1,1\n")
    return Spec(["graph", "info", "g.txt"], [], names=["g.txt"])


@probe("shape", "either")
def cluster_of_1024_devices_and_every_link(ctx: Ctx) -> Spec:
    ctx.copy(G)
    n = 1024
    devices = [{"name": f"d{i}", "flops_per_s": 1e12} for i in range(n)]
    links = [{"src": i, "dst": j, "bandwidth_Bps": 1e9, "latency_s": 1e-6} for i in range(n) for j in range(n) if i != j]
    ctx.write("big.json", json.dumps({"name": "big", "devices": devices, "links": links}, separators=(",", ":")))
    return Spec(["graph", "info", G, "-c", "big.json", "--json"], [], names=["big.json"])


@probe("shape", "refuse")
def cluster_of_two_million_empty_devices(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(A)
    ctx.write("big.json", '{"name":"x","devices":[' + ",".join(["{}"] * 2_000_000) + "]}")
    return Spec(["simulate", G, "-c", "big.json", "-a", A], [], names=["big.json"])


@probe("shape", "refuse")
def assignment_of_five_million_entries(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.write(A, json.dumps({"assignment": [0] * 5_000_000}))
    return Spec(["simulate", G, "-c", "unit:2", "-a", A], [], names=[A])


@probe("shape", "refuse")
def assignment_device_index_1e30(ctx: Ctx) -> Spec:
    ctx.copy(G)
    n = len(graph_doc(ctx)["ops"]["kind"])
    ctx.write(A, json.dumps({"assignment": [10**30] + [0] * (n - 1)}))
    return Spec(["simulate", G, "-c", "unit:2", "-a", A], [], names=[A])


def weights_spec(ctx: Ctx, weights: str, *extra: str) -> Spec:
    ctx.copy("wg.json"), ctx.copy("wa.json")
    return Spec(["execute", "wg.json", "-a", "wa.json", "--weights", weights, "--repeats", "1", "--warmup", "0",
                 *extra], [], names=[weights])  # fmt: skip


def ids_spec(ctx: Ctx, ids: str) -> Spec:
    """``execute --weights`` of the imported model with ``--input-ids ids``; its refusal names ``ids``."""
    ctx.copy("w.safetensors")
    spec = weights_spec(ctx, "w.safetensors", "--input-ids", ids)
    spec.names = [ids]
    return spec


def safetensors_bytes(header: dict | str, data: bytes) -> bytes:
    h = (header if isinstance(header, str) else json.dumps(header)).encode()
    return struct.pack("<Q", len(h)) + h + data


@probe("shape", "refuse")
def safetensors_header_declaring_2_31_squared(ctx: Ctx) -> Spec:
    header = {"embed.weight": {"dtype": "F32", "shape": [1 << 31, 1 << 31], "data_offsets": [0, 16]}}
    ctx.write("w.safetensors", safetensors_bytes(header, bytes(16)))
    return weights_spec(ctx, "w.safetensors")


@probe("shape", "refuse")
def safetensors_index_pointing_outside_the_directory(ctx: Ctx) -> Spec:
    ctx.copy("ck")
    idx = json.loads((ctx.dir / "ck/model.safetensors.index.json").read_text())
    idx["weight_map"] = {k: "../../../../etc/passwd" for k in idx["weight_map"]}
    ctx.write("ck/model.safetensors.index.json", json.dumps(idx))
    return weights_spec(ctx, "ck")


@probe("shape", "refuse")
def safetensors_index_shard_linked_to_etc_passwd(ctx: Ctx) -> Spec:
    ctx.copy("ck")
    ctx.link("ck/a.safetensors", "/etc/passwd")
    return weights_spec(ctx, "ck")


@probe("shape", "refuse")
def safetensors_index_shard_linked_to_a_fifo(ctx: Ctx) -> Spec:
    ctx.copy("ck")
    os.mkfifo(ctx.sentinel.parent / "fifo")
    ctx.link("ck/a.safetensors", ctx.sentinel.parent / "fifo")
    return weights_spec(ctx, "ck")


@probe("shape", "refuse")
def safetensors_header_of_90mb(ctx: Ctx) -> Spec:
    pad = " " * (90 << 20)
    ctx.write("w.safetensors", safetensors_bytes('{"__metadata__": {"x": "' + pad + '"}}', b""))
    return weights_spec(ctx, "w.safetensors")


@probe("shape", "refuse")
def token_ids_file_of_ten_million(ctx: Ctx) -> Spec:
    ctx.write("ids.txt", " ".join(["1"] * 10_000_000))
    return ids_spec(ctx, "ids.txt")


@probe("shape", "refuse")
def token_id_count_of_a_billion(ctx: Ctx) -> Spec:
    return ids_spec(ctx, "1000000000")


@probe("shape", "refuse")
def safetensors_header_of_1_6_million_empty_tensors(ctx: Ctx) -> Spec:
    entries, size, i = [], 0, 0
    while size < 98_000_000:
        e = f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
        entries.append(e)
        size, i = size + len(e) + 1, i + 1
    ctx.write("w.safetensors", safetensors_bytes("{" + ",".join(entries) + "}", b""))
    return weights_spec(ctx, "w.safetensors")


@probe("special", "refuse")
def weights_file_is_a_fifo(ctx: Ctx) -> Spec:
    os.mkfifo(ctx.dir / "w.safetensors")
    return weights_spec(ctx, "w.safetensors")


@probe("special", "refuse")
def weights_index_is_a_fifo(ctx: Ctx) -> Spec:
    ctx.copy("ck")
    os.unlink(ctx.dir / "ck/model.safetensors.index.json")
    os.mkfifo(ctx.dir / "ck/model.safetensors.index.json")
    return weights_spec(ctx, "ck/model.safetensors.index.json")


@probe("special", "refuse")
def token_ids_file_is_a_fifo(ctx: Ctx) -> Spec:
    os.mkfifo(ctx.dir / "ids.txt")
    return ids_spec(ctx, "ids.txt")


@probe("special", "refuse")
def token_ids_file_is_dev_zero(ctx: Ctx) -> Spec:
    return ids_spec(ctx, "/dev/zero")


@probe("special", "refuse")
def checkpoint_is_a_fifo(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    os.mkfifo(ctx.dir / "bad.pt")
    return Spec([*ASSIGN_CK, "bad.pt"], [], names=["bad.pt"])


@probe("special", "refuse")
def cluster_file_is_dev_zero_through_a_link(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.link("cl.json", "/dev/zero")
    return Spec(["graph", "info", G, "-c", "cl.json"], [], names=["cl.json"])


# ---- keys named twice
@probe("dupkey", "refuse")
def graph_json_ops_named_twice(ctx: Ctx) -> Spec:
    text = (ctx.base / G).read_text().rstrip()
    ctx.write(G, text[:-1] + ', "ops": {"kind": []}}')
    return Spec(["graph", "info", G], [], names=[G, "ops"])


@probe("dupkey", "refuse")
def graph_json_input_shape_named_twice_in_meta(ctx: Ctx) -> Spec:
    doc = graph_doc(ctx)
    name = next(iter(doc["meta"]["inputs"]))
    text = json.dumps(doc).replace(f'"{name}": ', f'"{name}": [1, 1], "{name}": ', 1)
    ctx.write(G, text), ctx.copy(A)
    return Spec(["simulate", G, "-c", "unit:2", "-a", A], [], names=[G, name])


@probe("dupkey", "refuse")
def cluster_device_flops_named_twice(ctx: Ctx) -> Spec:
    ctx.copy(G), ctx.copy(A)
    text = (ctx.base / CL).read_text().replace('"flops_per_s": ', '"flops_per_s": 1e30, "flops_per_s": ', 1)
    ctx.write(CL, text)
    return Spec(["simulate", G, "-c", CL, "-a", A], [], names=[CL, "flops_per_s"])


@probe("dupkey", "refuse")
def assignment_named_twice(ctx: Ctx) -> Spec:
    ctx.copy(G)
    text = (ctx.base / A).read_text().replace('"assignment": ', '"assignment": [0], "assignment": ', 1)
    ctx.write(A, text)
    return Spec(["simulate", G, "-c", "unit:2", "-a", A], [], names=[A, "assignment"])


@probe("dupkey", "refuse")
def safetensors_index_weight_named_twice(ctx: Ctx) -> Spec:
    ctx.copy("ck")
    text = (ctx.dir / "ck/model.safetensors.index.json").read_text()
    ctx.write("ck/model.safetensors.index.json",
              text.replace('"weight_map": {', '"weight_map": {"head.bias": "a.safetensors", ', 1))
    return weights_spec(ctx, "ck")


@probe("dupkey", "refuse")
def safetensors_header_tensor_named_twice(ctx: Ctx) -> Spec:
    raw = (ctx.base / "w.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    key = "head.bias"
    info = header[key]
    twin = dict(info, dtype="I32")  # the same bytes, read as integers if the second one wins
    text = json.dumps(header)[:-1] + f', "{key}": ' + json.dumps(twin) + "}"
    ctx.write("w.safetensors", safetensors_bytes(text, raw[8 + n :]))
    spec = weights_spec(ctx, "w.safetensors")
    spec.names = ["twice"]
    return spec


@probe("dupkey", "refuse")
def token_ids_json_object_with_a_key_twice(ctx: Ctx) -> Spec:
    ctx.write("ids.json", '{"ids": [1, 2], "ids": [3]}')
    return ids_spec(ctx, "ids.json")


@probe("dupkey", "refuse")
def checkpoint_policy_config_key_named_twice(ctx: Ctx) -> Spec:
    ctx.copy(G8)

    def edit(ck: dict) -> None:
        ck["cluster"] = ck["cluster"].replace('"name": ', '"name": "x", "name": ', 1)

    torch_edit(ctx, "RUN/checkpoint.pt", edit, "bad.pt")
    return Spec([*ASSIGN_CK, "bad.pt"], [], names=["bad.pt", "name"])


@probe("dupkey", "refuse")
def pt2_program_json_key_named_twice(ctx: Ctx) -> Spec:
    def edit(ms: list[Member]) -> list[Member]:
        orig = next(m for m in ms if m.name.endswith("models/model.json"))
        text = orig.data.replace(b'"graph_module": ', b'"graph_module": {}, "graph_module": ', 1)
        return replace(ms, "models/model.json", stored("", text))

    pt2_with(ctx, edit)
    return Spec(IMPORT, [], names=["m.pt2", "graph_module"])


# ---- two writers in one run directory
LONG_TRAIN = ["train", G8, "-c", "unit:2", "-o", "RUN", "--episodes", "1000000", *TINY_TRAIN, *TINY_POLICY]


@probe("writers", "refuse")
def assign_into_a_run_directory_train_holds(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    return Spec(["assign", G8, "-c", "unit:2", "-m", "critical_path", "-o", "RUN/best_assignment.json"], ["RUN"],
                names=["RUN"], holder=LONG_TRAIN, holder_lock="RUN/.doppler.lock")  # fmt: skip


@probe("writers", "refuse")
def compare_save_dir_inside_a_run_directory_train_holds(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    return Spec(["compare", G8, "-c", "unit:2", "-m", "critical_path", "--save-dir", "RUN/cmp"], ["RUN"],
                names=["RUN"], holder=LONG_TRAIN, holder_lock="RUN/.doppler.lock")  # fmt: skip


@probe("writers", "refuse")
def simulate_trace_deep_inside_a_run_directory_through_a_link(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    ctx.link("L", "RUN")
    ctx.write("a8.json", json.dumps({"assignment": [0] * 8}))
    return Spec(["simulate", G8, "-c", "unit:2", "-a", "a8.json", "--trace", "L/sub/t.json"], ["RUN"],
                names=["RUN"], holder=LONG_TRAIN, holder_lock="RUN/.doppler.lock")  # fmt: skip


@probe("writers", "refuse")
def train_resume_while_train_holds(ctx: Ctx) -> Spec:
    ctx.copy(G8)
    return Spec(["train", G8, "-c", "unit:2", "--resume", "-o", "RUN"], ["RUN"], names=["RUN"], holder=LONG_TRAIN,
                holder_lock="RUN/.doppler.lock")  # fmt: skip


@probe("writers", "refuse")
def train_into_a_directory_assign_writes_inside(ctx: Ctx) -> Spec:
    ctx.copy(G)
    ctx.copy(G8)
    return Spec(["train", G8, "-c", "unit:2", "-o", "RUN", "--episodes", "4", *TINY_TRAIN, *TINY_POLICY], ["RUN"],
                names=["RUN"],
                holder=["assign", G, "-c", "unit:2", "-m", "anneal", "--budget-s", "40", "-o", "RUN/x.json"],
                holder_lock="RUN/.x.json.doppler.lock")  # fmt: skip


@probe("writers", "refuse")
def graph_build_into_a_directory_pretrain_holds(ctx: Ctx) -> Spec:
    return Spec(["graph", "build", "chainmm", "--set", "size=tiny", "-o", "PRE/g.json"], ["PRE"], names=["PRE"],
                holder=["pretrain", "-o", "PRE", "--budget-h", "0.02", "--threads", "1"],
                holder_lock="PRE/.doppler.lock")  # fmt: skip


# ------------------------------------------------------------------------------------------------ the runner
FACTORY = '''
import torch


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, ids):
        return self.head(self.embed(ids))


def embed_model():
    from doppler.importer import parameters_on_meta

    with parameters_on_meta():
        model = Embed()
    return model, (torch.empty((1, 4), dtype=torch.long, device="meta"),)
'''


def run_doppler(argv: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run([*doppler_cmd(), *argv], cwd=cwd, env=env, capture_output=True, text=True, **kw)


def build_base(base: Path) -> None:
    """The real inputs every probe starts from."""
    import torch

    base.mkdir(parents=True, exist_ok=True)

    def ok(argv: list[str]) -> None:
        r = run_doppler(argv, base)
        if r.returncode:
            raise SystemExit(f"building the base inputs failed: doppler {' '.join(argv)}\n{r.stderr}")

    ok(["graph", "build", "chainmm", "--set", "size=tiny", "-o", G])
    ok(["assign", G, "-c", "unit:2", "-m", "critical_path", "-o", A])
    ok(["graph", "build", "random", "--set", "size=tiny", "--set", "num_ops=8", "-o", G8])
    sys.path.insert(0, str(SRC))
    from doppler.hardware.presets import cluster

    (base / CL).write_text(json.dumps(cluster("unit:2").to_json(), indent=1))
    ok(["train", G8, "-c", "unit:2", "-o", "RUN", "--episodes", "8", *TINY_TRAIN, *TINY_POLICY])
    ok(["pretrain", "-o", "PRE", "--budget-h", "0.0001", "--threads", "1"])
    ns: dict = {}
    exec(compile(FACTORY, "embed_model.py", "exec"), ns)  # noqa: S102 - our own factory, written below
    torch.manual_seed(0)
    model = ns["Embed"]()
    torch.export.save(torch.export.export(model, (torch.zeros(1, 4, dtype=torch.long),)), base / "m.pt2")
    ok(["graph", "import", "m.pt2", "-o", "pt2_graph.json"])
    (base / "embed_model.py").write_text(textwrap.dedent(FACTORY))
    ok(["graph", "import", "embed_model.py:embed_model", "-o", "wg.json"])
    n = len(json.loads((base / "wg.json").read_text())["ops"]["kind"])
    (base / "wa.json").write_text(json.dumps({"assignment": [0] * n}))
    from safetensors.torch import save

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    (base / "w.safetensors").write_bytes(save(state))
    (base / "ck").mkdir()
    (base / "ck/a.safetensors").write_bytes(save({"embed.weight": state["embed.weight"]}))
    (base / "ck/b.safetensors").write_bytes(save({k: state[k] for k in ("head.weight", "head.bias")}))
    (base / "ck/model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"embed.weight": "a.safetensors", "head.weight": "b.safetensors",
                                        "head.bias": "b.safetensors"}}, indent=1))  # fmt: skip
    ok(["execute", "wg.json", "-a", "wa.json", "--weights", "w.safetensors", "--repeats", "1", "--warmup", "0"])
    ok(["execute", "wg.json", "-a", "wa.json", "--weights", "ck", "--repeats", "1", "--warmup", "0"])


def snapshot(*roots: Path) -> dict[str, str]:
    """Every entry under ``roots``: a file's hash, a link's target, a directory, a FIFO (links not followed)."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames + filenames:
                p = Path(dirpath) / n
                st = p.lstat()
                if p.is_symlink():
                    out[str(p)] = "link:" + os.readlink(p)
                elif p.is_dir():
                    out[str(p)] = "dir"
                elif p.is_file():
                    out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() + f":{st.st_mode:o}"
                else:
                    out[str(p)] = f"special:{st.st_mode:o}"
    return out


@dataclass
class Result:
    probe: Probe
    rc: int
    lines: int
    error: str
    named: bool
    rss_bytes: int
    wall_s: float
    outside: list[str]
    wrote: list[str]
    wrong: str | None
    verdict: str = ""


def run_probe(p: Probe, base: Path, work: Path, as_bytes: int) -> Result:
    pdir, sdir = work / p.name, work / f"{p.name}.sentinel"
    pdir.mkdir(parents=True)
    sdir.mkdir()
    sentinel = sdir / "target.txt"
    sentinel.write_text("sentinel: must keep these bytes\n")
    ctx = Ctx(pdir, base, sentinel)
    spec = p.make(ctx)
    holder = None
    if spec.holder:
        env = dict(os.environ, PYTHONPATH=str(SRC))
        holder = subprocess.Popen([*doppler_cmd(), *spec.holder], cwd=pdir, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        lock = pdir / spec.holder_lock
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and not (lock.exists() and lock.read_text().strip()):
            if holder.poll() is not None:
                raise SystemExit(f"{p.name}: the holder ended first: {holder.stderr.read()[-500:]}")
            time.sleep(0.1)
    before = snapshot(pdir, sdir)
    timing = work / f"{p.name}.time"
    cmd = ["prlimit", f"--as={as_bytes}", "--", "timeout", str(KILL_S), "/usr/bin/time", "-o", str(timing), "-v",
           "env", f"PYTHONPATH={SRC}", *doppler_cmd(), *spec.argv]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=pdir, capture_output=True, text=True, timeout=KILL_S + 30)
    wall = time.monotonic() - t0
    if holder is not None:
        os.killpg(holder.pid, signal.SIGTERM)
        holder.wait(30)
    after = snapshot(pdir, sdir)
    rss = 0
    for line in timing.read_text(errors="replace").splitlines() if timing.exists() else []:
        if "Maximum resident set size" in line:
            rss = int(line.split(":")[-1]) * 1024
    allowed = [str(pdir / o) for o in spec.outputs]
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))

    def inside(k: str) -> bool:
        return any(k == a or k.startswith(a + "/") for a in allowed)

    outside = [str(Path(k).relative_to(work)) for k in changed if not inside(k)]
    wrote = [str(Path(k).relative_to(work)) for k in changed if inside(k)]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    err = lines[-1] if lines else ""
    named = any(n in err for n in spec.names) if spec.names else True
    wrong = spec.check(pdir) if r.returncode == 0 and spec.check else None
    return Result(p, r.returncode, len(lines), err, named, rss, wall, outside, wrote, wrong)


def judge(res: Result) -> str:
    """PASS, or what fails the bar."""
    faults = []
    refused = res.rc == 2 and res.lines == 1 and res.error.startswith("error:")
    succeeded = res.rc == 0 and res.wrong is None
    if res.probe.expect == "refuse" and not refused:
        faults.append(f"expected exit 2 in one line, got exit {res.rc} with {res.lines} lines")
    elif res.probe.expect == "ok" and not succeeded:
        faults.append(f"expected success, got exit {res.rc}" + (f" ({res.wrong})" if res.wrong else ""))
    elif res.probe.expect == "either" and not (refused or succeeded):
        faults.append(f"exit {res.rc} with {res.lines} lines" + (f" ({res.wrong})" if res.wrong else ""))
    if refused and not res.named:
        faults.append("the line names none of the file, key or option")
    if res.outside:
        faults.append("changed outside its outputs: " + ", ".join(res.outside[:4]))
    if res.rc == 2 and res.wrote and not res.probe.make.__name__.startswith(("assign_into", "compare_save_dir_inside",
                                                                            "simulate_trace_deep", "train_resume_while",
                                                                            "train_into", "graph_build_into")):  # fmt: skip
        faults.append("refused but wrote: " + ", ".join(res.wrote[:4]))
    if res.rss_bytes >= PEAK_BAR_BYTES:
        faults.append(f"peak {res.rss_bytes / 1e9:.2f} GB")
    if res.wall_s >= TIME_BAR_S:
        faults.append(f"{res.wall_s:.0f} s")
    return "PASS" if not faults else "FAIL: " + "; ".join(faults)


def main() -> int:
    global SRC
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the probes whose name or class holds this text")
    ap.add_argument("--keep", type=Path, default=None, help="work here (kept) instead of a temporary directory")
    ap.add_argument("--as-bytes", type=int, default=6_000_000_000, help="the address-space limit of each probe")
    ap.add_argument("--list", action="store_true", help="list the probes and exit")
    ap.add_argument("--errors", action="store_true", help="print each probe's last stderr line under its row")
    ap.add_argument("--src", type=Path, default=SRC, help="the doppler source tree to test (default: this checkout's)")
    args = ap.parse_args()
    SRC = args.src.resolve()
    chosen = [p for p in PROBES if args.only in p.name or args.only in p.cls]
    if args.list:
        for p in chosen:
            print(f"{p.cls:16} {p.expect:7} {p.name}")
        return 0
    root = args.keep or Path(tempfile.mkdtemp(prefix="hostile_battery."))
    base, work = root / "base", root / "work"
    if not (base / "wg.json").exists():
        shutil.rmtree(base, ignore_errors=True)
        t0 = time.monotonic()
        build_base(base)
        print(f"base inputs built in {time.monotonic() - t0:.0f} s in {base}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results = []
    t_all = time.monotonic()
    print(f"{'probe':72} {'class':16} {'exit':>4} {'lines':>5} {'peak_MB':>8} {'wall_s':>6}  verdict", flush=True)
    for p in chosen:
        res = run_probe(p, base, work, args.as_bytes)
        res.verdict = judge(res)
        results.append(res)
        print(f"{p.name:72} {p.cls:16} {res.rc:>4} {res.lines:>5} {res.rss_bytes / 1e6:>8.0f} {res.wall_s:>6.1f}  "
              f"{res.verdict}", flush=True)  # fmt: skip
        if args.errors and res.error:
            print(f"    {res.error[:200]}", flush=True)
    failed = [r for r in results if r.verdict != "PASS"]
    print(f"\n{len(results) - len(failed)} of {len(results)} probes pass ({time.monotonic() - t_all:.0f} s)")
    for r in failed:
        print(f"\n{r.probe.name}: {r.verdict}\n  last stderr line: {r.error[:300]}")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
