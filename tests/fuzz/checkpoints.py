"""Mutations of a real checkpoint (a torch zip archive): at the zip level (bytes flipped, the file cut
short, members deleted, repeated or damaged), in its contents (keys deleted, values replaced, the JSON
it carries corrupted, then saved again), and pickles that would run code (``os.system``, ``open``, ...)
when loaded by anything but a weights-only loader."""

from __future__ import annotations

import builtins
import io
import json
import os
import pathlib
import pickle
import subprocess
import warnings
import zipfile
from typing import Any

import torch
from hypothesis import strategies as st

from tests.fuzz.common import ABSOLUTE_SENTINEL, ODD_VALUES, SENTINEL, Mutant, corrupted_doc, mutated_bytes

#: the fields a checkpoint holds as JSON text
JSON_FIELDS = ("config", "cluster", "history", "numpy_rng", "pretrain")


def members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(info.filename, z.read(info)) for info in z.infolist()]


def rezip(entries: list[tuple[str, bytes]]) -> bytes:
    """A zip archive of ``entries`` in this order (a name may repeat)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            for name, content in entries:
                z.writestr(name, content)
    return buf.getvalue()


class _Call:
    """Pickles as a call of ``fn(*args)``: what an unsafe loader would run."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return self.fn, self.args


def code_pickles(sentinel: str) -> list[bytes]:
    """Pickles that create ``sentinel`` when unpickled unsafely, each alone and inside a checkpoint-like dict."""
    calls = [
        _Call(os.system, f"touch {sentinel}"),
        _Call(builtins.open, sentinel, "w"),
        _Call(builtins.exec, f"open({sentinel!r}, 'w').close()"),
        _Call(builtins.eval, f"__import__('pathlib').Path({sentinel!r}).touch()"),
        _Call(subprocess.call, ["touch", sentinel]),
        _Call(pathlib.Path.touch, pathlib.Path(sentinel)),
        _Call(torch.load, sentinel),  # (a call outside the allowlist, however harmless it looks)
    ]
    out = []
    for call in calls:
        for obj in (call, {"format": "doppler-checkpoint-1", "state_dict": {"w": call}}, [torch.zeros(2), call]):
            for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
                out.append(pickle.dumps(obj, protocol=protocol))
    out.append(b"cposix\nsystem\n(S'touch " + sentinel.encode() + b"'\ntR.")  # hand-written protocol 0
    out.append(b"\x80\x02cbuiltins\nopen\nq\x00X" + len(sentinel).to_bytes(4, "little") + sentinel.encode()
               + b"X\x01\x00\x00\x00w\x86R.")  # fmt: skip
    return out


@st.composite
def code_checkpoint(draw: Any, base: bytes) -> bytes:
    """``base`` with its ``data.pkl`` replaced by a pickle that would create the sentinel; or that pickle
    as a bare file, or as the only member of a zip."""
    payload = draw(st.sampled_from(code_pickles(draw(st.sampled_from([SENTINEL, str(ABSOLUTE_SENTINEL)])))))
    entries = members(base)
    where = draw(st.sampled_from(["data.pkl", "data.pkl", "alone", "bare", "extra"]))
    how = f"pickle {payload[:120]!r} as {where}"
    if where == "data.pkl":
        return Mutant(rezip([(n, payload if n.endswith("/data.pkl") else c) for n, c in entries]), how)
    if where == "alone":
        return Mutant(rezip([("archive/data.pkl", payload)]), how)
    if where == "extra":  # a second data.pkl after the real one
        return Mutant(rezip(entries + [(next(n for n, _ in entries if n.endswith("/data.pkl")), payload)]), how)
    return Mutant(payload, how)


@st.composite
def zip_mutated(draw: Any, base: bytes) -> bytes:
    """``base`` damaged at the zip level: its bytes mutated anywhere, or one member deleted, repeated,
    emptied or mutated, or the members reordered."""
    how = draw(st.sampled_from(["bytes", "bytes", "delete", "repeat", "member", "member", "empty", "order"]))
    if how == "bytes":
        mutant = draw(mutated_bytes(base))
        return Mutant(mutant, f"bytes: {mutant.how}")
    entries = members(base)
    k = draw(st.integers(0, len(entries) - 1))
    if draw(st.booleans()):  # the members torch reads first are the likeliest to matter
        k = draw(st.sampled_from([i for i, (n, _) in enumerate(entries)
                                  if n.endswith(("data.pkl", "version", "byteorder", "format_version"))]))  # fmt: skip
    name, content = entries[k]
    if how == "delete":
        del entries[k]
    elif how == "repeat":
        entries.insert(draw(st.integers(0, len(entries))), (name, draw(st.sampled_from([content, b"", b"\x00" * 8]))))
    elif how == "member":
        entries[k] = (name, draw(mutated_bytes(content)))
        how = f"member ({entries[k][1].how})"
    elif how == "empty":
        entries[k] = (name, b"")
    else:
        entries = draw(st.permutations(entries))
        name = "all"
    return Mutant(rezip(entries), f"{how} {name}")


ODD_TENSORS = st.sampled_from([torch.zeros(0), torch.zeros(3), torch.full((2, 2), float("nan")), torch.tensor(float("inf")),
                               torch.zeros(2, 2, dtype=torch.int64), torch.zeros(1, 1, 1), torch.tensor([True]),
                               torch.zeros(5056, dtype=torch.uint8), torch.zeros(3, dtype=torch.uint8)])  # fmt: skip
ODD_CONTENTS = st.one_of(ODD_VALUES, ODD_TENSORS, st.sampled_from(["{", "[]", "{}", "null", '{"a": 1}', "1e999"]))


@st.composite
def content_mutated(draw: Any, ck: dict) -> bytes:
    """The checkpoint ``ck`` (loaded) with one to three of its contents changed, saved again by torch."""
    ck = dict(ck)
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(ck) + ["state_dict", "policy_config", "graphs"] + list(JSON_FIELDS)))
        how = draw(st.sampled_from(["delete", "replace", "inner", "inner", "inner"]))
        steps.append(f"{how} {key}")
        if how == "delete":
            ck.pop(key, None)
        elif how == "replace" or key not in ck:
            ck[key] = draw(ODD_CONTENTS)
        elif key in JSON_FIELDS and isinstance(ck[key], str):  # the JSON it carries, corrupted
            try:
                doc = json.loads(ck[key])
            except ValueError:
                continue
            ck[key] = json.dumps(draw(corrupted_doc(doc, values=ODD_VALUES)), allow_nan=True) if doc else "{"
        elif key == "state_dict" and isinstance(ck[key], dict) and ck[key]:
            sd = dict(ck[key])
            name = draw(st.sampled_from(sorted(sd)))
            change = draw(st.sampled_from(["delete", "tensor", "value", "shape", "extra"]))
            if change == "delete":
                del sd[name]
            elif change == "tensor":
                sd[name] = draw(ODD_TENSORS)
            elif change == "shape" and torch.is_tensor(sd[name]):
                sd[name] = sd[name].reshape(-1)[: max(0, sd[name].numel() - 1)]
            elif change == "extra":
                sd[name + "_extra"] = torch.zeros(2)
            else:
                sd[name] = draw(ODD_VALUES)
            ck[key] = sd
            steps[-1] += f": {change} {name}"
        elif isinstance(ck[key], (dict, list)) and ck[key]:
            ck[key] = draw(corrupted_doc(_plain(ck[key]), values=ODD_CONTENTS))
        else:
            ck[key] = draw(ODD_CONTENTS)
        if key in ck and not steps[-1].startswith(("delete", "inner state_dict")):
            steps[-1] += f" -> {_short(ck[key])}"
    return Mutant(torch_bytes(ck), "; ".join(steps))


def torch_bytes(obj: Any) -> bytes:
    """``obj`` as ``torch.save`` writes it."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rewrite_checkpoint(path: pathlib.Path, change: Any) -> None:
    """The checkpoint file ``path`` loaded (weights only), changed in place by ``change(ck)``, and saved again."""
    from doppler.importer.files import load_plain

    ck = load_plain(path)
    change(ck)
    path.write_bytes(torch_bytes(ck))


def _short(v: Any, limit: int = 300) -> str:
    text = repr(v) if not torch.is_tensor(v) else f"tensor{tuple(v.shape)} {v.dtype}"
    return text if len(text) <= limit else text[:limit] + "..."


def _plain(obj: Any) -> Any:
    """``obj`` with tensors kept and containers as plain dicts and lists (for :func:`corrupted_doc`)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def mutated_checkpoint(base: bytes, loaded: dict) -> st.SearchStrategy[bytes]:
    """Every kind of damage to the checkpoint ``base`` (its bytes) / ``loaded`` (its contents)."""
    return st.one_of(zip_mutated(base), content_mutated(loaded), code_checkpoint(base))
