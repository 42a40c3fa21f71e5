"""The one gate for zip archives from users (doppler.importer.files): every ``MAX_ZIP_*`` bound refuses an
archive in one line naming the member before any member is read, a member is never read past its declared
size, and a raw pickle past ``MAX_PICKLE_BYTES`` is never unpickled."""

from __future__ import annotations

import io
import tracemalloc
import zipfile

import pytest
import torch

from doppler.importer import files
from doppler.importer.files import (MAX_PICKLE_BYTES, MAX_ZIP_MEMBER_BYTES, MAX_ZIP_MEMBERS, MAX_ZIP_RATIO,
                                    MAX_ZIP_TOTAL_BYTES, ZIP_RATIO_MIN_BYTES, ArchiveError, load_failure, load_plain,
                                    open_zip, read_member)  # fmt: skip

from tests.fuzz.zips import declare_sizes, zip_bytes


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _refusal(data: bytes) -> str:
    with pytest.raises(ArchiveError) as e:
        open_zip(io.BytesIO(data)).close()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_torch_save_file_passes_and_loads() -> None:
    data = _saved({"w": torch.arange(6.0).reshape(2, 3)})
    open_zip(io.BytesIO(data)).close()
    assert torch.equal(load_plain(data)["w"], torch.arange(6.0).reshape(2, 3))


def test_load_plain_on_the_meta_device_reads_no_tensor_bytes() -> None:
    data = _saved({"w": torch.zeros(1000, 1000)})
    w = load_plain(data, meta=True)["w"]
    assert w.device.type == "meta" and w.shape == (1000, 1000)


def test_a_member_declaring_more_than_the_member_limit_is_refused_unread() -> None:
    data = declare_sizes(zip_bytes([("a/small", b"x" * 10), ("a/big", b"y" * 10)]), "a/big",
                         file_size=MAX_ZIP_MEMBER_BYTES + 1, compress_size=MAX_ZIP_MEMBER_BYTES + 1)  # fmt: skip
    msg = _refusal(data)
    assert msg.startswith("member a/big declares 536,870,913 bytes") and "one member" in msg, msg


def test_members_declaring_more_than_the_total_limit_together_are_refused() -> None:
    each = MAX_ZIP_TOTAL_BYTES // 3 + 1  # (under the member limit, over the total by three)
    data = zip_bytes([(f"a/{i}", b"z") for i in range(3)])
    for i in range(3):
        data = declare_sizes(data, f"a/{i}", file_size=each, compress_size=each)  # (ratio 1)
    assert each <= MAX_ZIP_MEMBER_BYTES
    msg = _refusal(data)
    assert msg.startswith("the members up to a/2 declare") and "one archive" in msg, msg


def test_a_member_compressed_past_the_ratio_limit_is_refused() -> None:
    bomb = zip_bytes([("a/zeros", 2 * ZIP_RATIO_MIN_BYTES)])  # (zeros deflate about 1,000 to 1)
    msg = _refusal(bomb)
    assert msg.startswith("member a/zeros declares 2,097,152 bytes") and f"ratio over {MAX_ZIP_RATIO}" in msg, msg
    open_zip(io.BytesIO(zip_bytes([("a/zeros", ZIP_RATIO_MIN_BYTES)]))).close()  # a small member may compress well


def test_an_archive_of_more_members_than_the_limit_is_refused_before_its_table_is_parsed(monkeypatch) -> None:
    data = zip_bytes([(f"m/{i}", b"") for i in range(MAX_ZIP_MEMBERS + 1)])
    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", lambda self: pytest.fail("the table was parsed"))
    assert _refusal(data).startswith(f"a zip archive of {MAX_ZIP_MEMBERS + 1:,} members")


def test_an_archive_whose_table_of_members_is_too_large_is_refused_before_it_is_parsed(monkeypatch) -> None:
    long = "n" * 60_000
    data = zip_bytes([(f"{i}/{long}", b"") for i in range(150)])  # (a table of about 9 MB)
    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", lambda self: pytest.fail("the table was parsed"))
    assert "table of members takes" in _refusal(data)


def test_a_name_that_appears_twice_is_refused() -> None:
    assert _refusal(zip_bytes([("a/x", b"1"), ("a/x", b"2")])) == "member a/x appears twice in the archive"


def test_a_data_pkl_larger_than_the_pickle_limit_is_refused_unread() -> None:
    data = declare_sizes(zip_bytes([("a/data.pkl", b"\x80\x02N.")]), "a/data.pkl",
                         file_size=MAX_PICKLE_BYTES + 1, compress_size=MAX_PICKLE_BYTES + 1)  # fmt: skip
    assert "declares a pickle of 16,777,217 bytes" in _refusal(data)


def test_a_raw_pickle_larger_than_the_pickle_limit_is_not_unpickled() -> None:
    with pytest.raises(ArchiveError, match="a pickle of 16,777,217 bytes"):
        load_plain(b"\x80\x02" + bytes(MAX_PICKLE_BYTES - 1))


def test_a_checkpoint_with_a_deflated_huge_tensor_is_refused_by_load_plain(tmp_path) -> None:
    entries = []
    with zipfile.ZipFile(io.BytesIO(_saved({"w": torch.zeros(4)}))) as z:
        entries = [(i.filename, z.read(i)) for i in z.infolist()]
    storage = next(n for n, _ in entries if n.endswith("/data/0"))
    path = tmp_path / "bomb.pt"
    path.write_bytes(zip_bytes([(n, c) for n, c in entries if n != storage] + [(storage, 64 << 20)]))
    with pytest.raises(ArchiveError) as e:
        load_plain(path)
    assert load_failure(e.value) == str(e.value) and storage in str(e.value) and "ratio" in str(e.value)


def test_a_zip_that_zipfile_cannot_read_is_not_handed_to_torch() -> None:
    with pytest.raises(ArchiveError, match="a damaged or cut-short zip archive"):
        load_plain(b"PK\x03\x04" + bytes(40))


# ---------------------------------------------------------------------------- reading a member
def _one_member(data: bytes):
    z = zipfile.ZipFile(io.BytesIO(data))
    return z, z.infolist()[0]


def _peak_bytes_of_a_refused_read(z: zipfile.ZipFile, info: zipfile.ZipInfo, refusal: str) -> int:
    """The most bytes Python held while :func:`read_member` refused ``info`` with a message matching ``refusal``."""
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError, match=refusal):
            read_member(z, info)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_member_reads_as_its_bytes() -> None:
    z, info = _one_member(zip_bytes([("a/x", b"hello" * 1000)], compression=zipfile.ZIP_DEFLATED))
    assert read_member(z, info) == b"hello" * 1000


def test_a_member_whose_stream_inflates_past_its_declared_size_is_never_held_past_it() -> None:
    raw = zip_bytes([("a/x", 64 << 20)])  # 64 MiB of zeros, declared as 100 bytes below
    z, info = _one_member(declare_sizes(raw, "a/x", file_size=100))
    peak = _peak_bytes_of_a_refused_read(z, info, "member a/x is damaged .*CRC")
    assert peak < 8 << 20, peak  # (zlib's working buffers; never the 64 MiB)


def test_a_member_declaring_more_than_it_holds_is_refused_holding_only_what_it_holds() -> None:
    raw = zip_bytes([("a/x", b"abc" * 100)])
    z, info = _one_member(declare_sizes(raw, "a/x", file_size=300 << 20, compress_size=300 << 20))
    peak = _peak_bytes_of_a_refused_read(z, info, "member a/x (holds 300 bytes, fewer than|ends before)")
    assert peak < 8 << 20, peak


def test_a_member_past_the_callers_limit_is_refused_unread() -> None:
    z, info = _one_member(zip_bytes([("a/x", b"x" * 1000)]))
    with pytest.raises(ArchiveError, match="declares 1,000 bytes uncompressed, more than the 999 bytes"):
        read_member(z, info, limit=999)


def test_the_limits_sit_between_our_largest_files_and_two_gigabytes() -> None:
    # the widest policy's checkpoint (weights, two optimizer moments, a best copy) fits the total, with room
    from doppler.policy.architectures import MAX_WIDTH, build_policy

    with torch.device("meta"):
        policy = build_policy("gdp", num_devices=1024, hidden=MAX_WIDTH, steps=3, mlp_hidden=MAX_WIDTH)
    weight_bytes = sum(p.numel() * 4 for p in policy.parameters())
    assert 4 * weight_bytes < MAX_ZIP_TOTAL_BYTES
    assert max(p.numel() * 4 for p in policy.parameters()) < MAX_ZIP_MEMBER_BYTES
    assert 400e6 < MAX_ZIP_TOTAL_BYTES and MAX_ZIP_TOTAL_BYTES + MAX_ZIP_MEMBER_BYTES < 2e9
    assert files.MAX_ZIP_DIRECTORY_BYTES < MAX_ZIP_TOTAL_BYTES


@pytest.mark.parametrize(("make", "refusal"), [
    (lambda: torch.zeros(1).expand(100_000, 100_000), r"tensor w/1 of shape \[100000, 100000\] holds 10,000,000,000 "
                                                      r"elements over 4 bytes of storage"),
    (lambda: torch.zeros(4, dtype=torch.float64).as_strided((3, 1_000_000), (1, 0)), r"tensor w/1 of shape "
                                                                                      r"\[3, 1000000\] holds 3,000,000"),
    (lambda: torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([1.0]), (100_000, 100_000)),
     r"tensor w/1 is a torch.sparse_coo tensor; doppler reads dense tensors only"),
])  # fmt: skip
def test_a_tensor_larger_than_its_bytes_or_not_dense_is_refused_as_it_loads(make, refusal) -> None:
    """A view whose strides repeat its elements holds ten billion elements over four bytes: a reader's isfinite
    or cast of it once allocated 40 GB. It and a sparse tensor are refused, naming where in the file they are."""
    data = _saved({"w": [torch.ones(2), make()]})
    with pytest.raises(ArchiveError, match=refusal):
        load_plain(data)
    assert load_plain(data, meta=True)["w"][1].device.type == "meta"  # (the meta device allocates nothing)


def test_views_within_their_bytes_load() -> None:
    base = torch.arange(12.0)
    got = load_plain(_saved({"t": base.reshape(3, 4).t(), "s": base[2:5], "b": base[::3]}))
    assert torch.equal(got["t"], base.reshape(3, 4).t()) and torch.equal(got["s"], base[2:5])
    assert torch.equal(got["b"], base[::3])
