"""A model's own weights, bound to an imported graph by name (``doppler execute --weights``).

``doppler graph import`` records, for every parameter input of the graph, its ``state_dict`` key, shape and
element type (``meta["weights"]``); each op's operand reference says which slice of it a tile reads, in the
parameter's own layout (a Linear weight is (out, in); the transpose the model applies is an ``xform`` step
after the slice). :func:`open_checkpoint` opens a checkpoint written by ``safetensors`` or
``save_pretrained``; :func:`bind` checks it against the graph before anything runs, and the program reads
each tile's slice (:class:`WeightTile`) when it places the tile on the device that reads it: the file is
memory-mapped, only the slice is copied out, and no whole tensor is gathered unless a tile is the whole
tensor.

A checkpoint is one of:

* a ``.safetensors`` file;
* a directory with ``model.safetensors.index.json`` (a sharded checkpoint; every shard must be a
  ``.safetensors`` file in that directory) or ``model.safetensors`` (``save_pretrained``'s two layouts).

A pickle checkpoint (``pytorch_model.bin``, ``.pt``, ``.pth``, ``.ckpt``, or a file that starts like one) is
refused: unpickling runs whatever code the file names. Every fault is a :class:`WeightsError` whose one line
names the file and the key.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from doppler.engine.program import WeightTile, build_program
from doppler.ir.graph import DataflowGraph
from doppler.ir.graph import NO_WEIGHTS
from doppler.util.io import DuplicateKeyError, loads_json

__all__ = ["BoundProgram", "Checkpoint", "WeightTile", "WeightsError", "bind", "bound_program", "check_executable",
           "open_checkpoint", "read_input_ids", "token_input", "weight_inputs"]  # fmt: skip

#: ``save_pretrained``'s file names
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
#: suffixes of checkpoints written by ``torch.save`` (pickles)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
#: the largest index file read (the index of a 400B-parameter model is a few MB)
MAX_INDEX_BYTES = 64 << 20
#: the largest safetensors header read (the JSON table of a file's tensors: a shard of a 400B-parameter model
#: lists a few hundred tensors in tens of kB; safetensors itself reads up to 100 MB, which takes seconds and
#: over a GB to list)
MAX_HEADER_BYTES = 16 << 20
#: safetensors' element types -> numpy's names (``bfloat16`` has no numpy type: it is refused where read)
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}  # fmt: skip
#: element types a tile can be read into (those of the engine's numpy kernels)
READABLE = ("float16", "float32", "float64")


class WeightsError(ValueError):
    """A checkpoint that cannot be bound to the graph; the message names the file and the key (exit code 2)."""


def _pickle_refusal(path: Path) -> WeightsError:
    return WeightsError(f"{path}: a pickle checkpoint (torch.save): loading it would run the code it names; save "
                        "the weights as safetensors (save_pretrained does by default, or safetensors.torch.save_file)")


@dataclass
class Checkpoint:
    """A safetensors checkpoint: its files, and for each key the file that holds it. Tensors are read by slice
    from memory-mapped files; ``reads`` logs every read as (key, bounds, bytes)."""

    path: Path
    shard_of: dict[str, Path]  # key -> its file
    reads: list[tuple[str, tuple[tuple[int, int], ...], int]] = field(default_factory=list)
    _handles: dict[Path, Any] = field(default_factory=dict, repr=False)

    def _open(self, shard: Path) -> Any:
        from safetensors import safe_open

        if shard not in self._handles:
            try:
                self._handles[shard] = safe_open(str(shard), framework="pt")
            except Exception as e:  # the header is not safetensors: a truncated, corrupt or foreign file
                raise WeightsError(f"{shard}: not a readable safetensors file ({_one_line(e)})") from None
        return self._handles[shard]

    def info(self, key: str) -> tuple[str, tuple[int, ...]]:
        """(element type as numpy names it, shape) of tensor ``key``, from its file's header."""
        sl = self._open(self.shard_of[key]).get_slice(key)
        dtype = SAFETENSORS_DTYPES.get(sl.get_dtype(), sl.get_dtype())
        return dtype, tuple(int(s) for s in sl.get_shape())

    def read(self, key: str, bounds: Sequence[tuple[int, int]] | None, dtype: Any) -> np.ndarray:
        """A fresh, contiguous copy of ``tensor[key][bounds]`` in ``dtype`` (``None``: the whole tensor); only the
        slice is copied out of the memory-mapped file."""
        import torch

        handle = self._open(self.shard_of[key])
        sl = handle.get_slice(key)
        index = tuple(slice(lo, hi) for lo, hi in bounds) if bounds is not None else None
        want = getattr(torch, np.dtype(dtype).name)
        try:
            if not sl.get_shape():  # a 0-d tensor is a graph input of shape (1,)
                t = handle.get_tensor(key).reshape(1)
                t = t if index is None else t[index]
            else:
                t = sl[:] if index is None else sl[index]
            out = t.to(dtype=want, copy=True, memory_format=torch.contiguous_format).numpy()
        except Exception as e:
            raise WeightsError(f"{self.shard_of[key]}: tensor {key!r}: cannot read {_fmt(bounds)} ({_one_line(e)})") from None
        self.reads.append((key, tuple(bounds) if bounds is not None else (), int(out.nbytes)))
        return out

    def tensors(self, keys: Sequence[str]) -> dict[str, Any]:
        """Whole tensors ``keys`` as torch tensors in their stored type (a reference model's ``load_state_dict``)."""
        out = {}
        for key in keys:
            try:
                out[key] = self._open(self.shard_of[key]).get_tensor(key).clone()
            except WeightsError:
                raise
            except Exception as e:
                raise WeightsError(f"{self.shard_of[key]}: tensor {key!r}: cannot read ({_one_line(e)})") from None
        return out

    def close(self) -> None:
        """Drop the memory maps (reads reopen them)."""
        self._handles.clear()


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _fmt(bounds: Any) -> str:
    return "the whole tensor" if not bounds else "[" + ", ".join(f"{lo}:{hi}" for lo, hi in bounds) + "]"


def _looks_pickled(path: Path) -> bool:
    """Does the file start like a pickle (protocol 2+) or a ``torch.save`` zip archive, and not like safetensors
    (8 bytes of header length, then the header's ``{``)?"""
    try:
        with path.open("rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return head[8:9] != b"{" and (head[:1] == b"\x80" or head[:4] == b"PK\x03\x04")


def _regular_file(path: Path, what: str) -> None:
    """WeightsError unless ``path`` (a link is followed) is a regular file: a pipe would block the read forever,
    a device (``/dev/zero``) never end it."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise WeightsError(f"{what}: not a regular file (a pipe, socket or device)")


def _check_header(shard: Path) -> None:
    """WeightsError naming ``shard`` if its safetensors header takes more than :data:`MAX_HEADER_BYTES` or names a
    key twice (safetensors would keep the last silently); a header that is not JSON is left to safetensors to
    refuse."""
    _regular_file(shard, str(shard))
    try:
        with shard.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise WeightsError(f"{shard}: its safetensors header takes {n:,} bytes, more than the {MAX_HEADER_BYTES:,} "
                                   "doppler reads (a checkpoint's header lists its tensors in kilobytes)")  # fmt: skip
            text = f.read(n)
    except OSError as e:
        raise WeightsError(f"{shard}: cannot read ({_one_line(e)})") from None
    try:
        loads_json(text)
    except DuplicateKeyError as e:
        raise WeightsError(f"{shard}: its safetensors header names {e.key!r:.80} twice") from None
    except (ValueError, RecursionError):
        pass


def _keys_of(shard: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(shard), framework="pt") as f:
            return list(f.keys())
    except Exception as e:
        raise WeightsError(f"{shard}: not a readable safetensors file ({_one_line(e)})") from None


def _from_index(index: Path) -> dict[str, Path]:
    """key -> shard, from a ``model.safetensors.index.json``: each shard a ``.safetensors`` file beside it."""
    _regular_file(index, str(index))
    try:
        size = index.stat().st_size
        if size > MAX_INDEX_BYTES:
            raise WeightsError(f"{index}: {size} bytes, more than an index holds ({MAX_INDEX_BYTES})")
        doc = loads_json(index.read_text(encoding="utf-8"))  # (a tensor named twice: refused)
    except WeightsError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise WeightsError(f"{index}: not a readable JSON index ({_one_line(e)})") from None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise WeightsError(f"{index}: no \"weight_map\" object naming each tensor's file")
    out: dict[str, Path] = {}
    checked: set[Path] = set()
    for key, name in wmap.items():
        if not isinstance(name, str) or Path(name).name != name or name in (".", ".."):
            raise WeightsError(f"{index}: tensor {key!r}: its file {name!r} is not a file name in this directory")
        if name.endswith(PICKLE_SUFFIXES):
            raise _pickle_refusal(index.parent / name)
        if not name.endswith(".safetensors"):
            raise WeightsError(f"{index}: tensor {key!r}: its file {name!r} is not a .safetensors file")
        shard = index.parent / name
        if not shard.is_file():
            raise WeightsError(f"{index}: tensor {key!r}: its file {shard} does not exist")
        if shard not in checked:
            if _looks_pickled(shard):
                raise _pickle_refusal(shard)
            _check_header(shard)
        checked.add(shard)
        out[key] = shard
    return out


def open_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint at ``path`` (see the module docstring); its headers are read, no tensor is."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / INDEX_NAME).is_file():
            return Checkpoint(path, _from_index(path / INDEX_NAME))
        if (path / SINGLE_NAME).is_file():
            return _single(path / SINGLE_NAME)
        pickles = sorted(p.name for p in path.iterdir() if p.name.endswith(PICKLE_SUFFIXES) or p.name.endswith(".bin.index.json"))
        if pickles:
            raise _pickle_refusal(path / pickles[0])
        raise WeightsError(f"{path}: no {INDEX_NAME} or {SINGLE_NAME} in this directory")
    if path.name.endswith(PICKLE_SUFFIXES) or path.name.endswith(".bin.index.json"):
        raise _pickle_refusal(path)
    if path.name.endswith(".index.json"):
        return Checkpoint(path.parent, _from_index(path))
    return _single(path)


def _single(path: Path) -> Checkpoint:
    _regular_file(path, str(path))
    if _looks_pickled(path):
        raise _pickle_refusal(path)
    _check_header(path)
    return Checkpoint(path, {key: path for key in _keys_of(path)})


# ------------------------------------------------------------------ binding
def weight_inputs(graph: DataflowGraph, source: str) -> dict[str, dict[str, Any]]:
    """The graph's ``meta["weights"]`` (input -> key, shape, dtype, tied keys, the key a checkpoint saves it
    under), checked: the graph file is data.
    A graph that records none (not made by ``doppler graph import``) is a :class:`WeightsError`."""
    weights = graph.meta.get("weights")
    if not isinstance(weights, dict) or not weights:
        raise WeightsError(f"{source}: the graph records no state_dict keys for its inputs (import the model with "
                           "doppler graph import to bind its weights by name)")  # fmt: skip
    inputs = graph.meta.get("inputs") or {}
    for name, how in weights.items():
        ok = (isinstance(how, dict) and isinstance(how.get("key"), str) and isinstance(how.get("dtype"), str)
              and isinstance(how.get("shape"), list) and all(isinstance(s, int) and s >= 0 for s in how["shape"])
              and all(isinstance(how.get(f, []), list) and all(isinstance(k, str) for k in how.get(f, []))
                      for f in ("tied", "saved_as")))  # fmt: skip
        if not ok or name not in inputs:
            raise WeightsError(f"{source}: weights entry {name!r} is malformed (key, shape, dtype and tied keys of a "
                               "graph input)")  # fmt: skip
    return weights


def check_executable(graph: DataflowGraph, source: str) -> None:
    """With a checkpoint for its weights, can ``graph`` run? Every input other than a weight and a forward
    argument needs a recorded value: a constant computed on the meta device has none."""
    weights = weight_inputs(graph, source)
    users = set(graph.meta.get("user_inputs") or ())
    init = graph.meta.get("input_init") or {}
    for name in graph.meta.get("inputs") or {}:
        if name not in weights and name not in users and (init.get(name) or {}).get("init") == "meta":
            raise WeightsError(f"{source}: input {name!r} has no value: it was computed from a buffer on the meta "
                               "device; build the model with doppler.importer.parameters_on_meta() (weights on "
                               "the meta device, buffers real) and import it again")  # fmt: skip
    if graph.meta.get("cost_only") and graph.meta["cost_only"] != NO_WEIGHTS:
        raise WeightsError(f"{source}: {graph.meta['cost_only']}: a constant of the model has no value, so it "
                           "cannot run even with its weights")  # fmt: skip


def bind(graph: DataflowGraph, ckpt: Checkpoint, source: str) -> dict[str, str]:
    """Graph weight input -> the checkpoint key that holds it (its own key, else the key it is saved under or a
    key it is tied to), after checking every one before anything runs: present, of the recorded shape and
    element type, and readable by the engine. The first fault is a :class:`WeightsError` naming the key."""
    out: dict[str, str] = {}
    for name, how in weight_inputs(graph, source).items():
        key = next((k for k in (how["key"], *how.get("saved_as", []), *how.get("tied", [])) if k in ckpt.shard_of), None)
        if key is None:
            others = [*how.get("saved_as", []), *how.get("tied", [])]
            verb = "hold" if len(others) > 1 else "holds"
            also = f" (nor {', '.join(repr(k) for k in others)}, which {verb} it too)" if others else ""
            raise WeightsError(f"{ckpt.path}: no tensor {how['key']!r}{also}")
        dtype, shape = ckpt.info(key)
        if list(shape) != list(how["shape"]):
            raise WeightsError(f"{ckpt.shard_of[key]}: tensor {key!r} has shape {list(shape)}, the graph's "
                               f"{how['key']!r} has {how['shape']}")  # fmt: skip
        if dtype != how["dtype"]:
            raise WeightsError(f"{ckpt.shard_of[key]}: tensor {key!r} is {dtype}, the graph's {how['key']!r} is "
                               f"{how['dtype']} (save the checkpoint in the type the model was imported in)")  # fmt: skip
        if dtype not in READABLE:
            raise WeightsError(f"{ckpt.shard_of[key]}: tensor {key!r} is {dtype}: the engine computes in "
                               f"{', '.join(READABLE)}")  # fmt: skip
        out[name] = key
    return out


# ------------------------------------------------------------------ token ids
def token_input(graph: DataflowGraph, source: str) -> tuple[str, tuple[int, ...], int]:
    """(name, shape, vocabulary size) of the graph's one token-id input (a forward argument read by an
    embedding lookup)."""
    init = graph.meta.get("input_init") or {}
    ids = [n for n in graph.meta.get("user_inputs") or () if (init.get(n) or {}).get("init") == "index"]
    if len(ids) != 1:
        raise WeightsError(f"--input-ids: {source} has {len(ids) or 'no'} token-id inputs (a causal LM has one)")
    name = ids[0]
    return name, tuple(int(s) for s in graph.meta["inputs"][name]), int(init[name].get("high", 0))


def read_input_ids(spec: str, graph: DataflowGraph, source: str, seed: int) -> tuple[str, np.ndarray]:
    """The token ids ``--input-ids`` gives: ``(input name, int64 array of its shape)``.

    ``spec`` is a count (digits only: that many ids drawn uniformly from the vocabulary with ``seed``; it must be
    the input's size), or a file: JSON (a list of integers, or of lists for a batch) or text (integers
    separated by white space or commas). Every id must lie in ``[0, vocabulary)``."""
    name, shape, vocab = token_input(graph, source)
    size = math.prod(shape)
    if spec.strip().isdigit():
        count = int(spec)
        if count != size:
            raise WeightsError(f"--input-ids {count}: the graph's {name!r} holds {size} ids (shape {list(shape)})")
        return name, np.random.default_rng(seed).integers(0, vocab, size=shape, dtype=np.int64)
    path = Path(spec)
    _regular_file(path, f"--input-ids {path}")
    try:
        if path.stat().st_size > 64 * size + 4096:
            raise WeightsError(f"--input-ids {path}: too large for {size} token ids")
        text = path.read_text(encoding="utf-8")
    except WeightsError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise WeightsError(f"--input-ids {path}: cannot read ({_one_line(e)})") from None
    ids = _parse_ids(text, path)
    if ids.size != size:
        raise WeightsError(f"--input-ids {path}: {ids.size} token ids, the graph's {name!r} holds {size} (shape "
                           f"{list(shape)})")  # fmt: skip
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if bad.size:
        raise WeightsError(f"--input-ids {path}: id {int(ids[bad[0]])} at position {int(bad[0])} is outside the "
                           f"vocabulary [0, {vocab})")  # fmt: skip
    return name, ids.reshape(shape)


def _parse_ids(text: str, path: Path) -> np.ndarray:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            doc = loads_json(stripped)
        except ValueError as e:
            raise WeightsError(f"--input-ids {path}: not valid JSON ({_one_line(e)})") from None
        flat: list[Any] = []
        stack = [doc]
        while stack:
            x = stack.pop()
            if isinstance(x, list):
                stack.extend(reversed(x))
            else:
                flat.append(x)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in flat):
            raise WeightsError(f"--input-ids {path}: a JSON token-id file holds integers (in lists) only")
        return np.asarray(flat, dtype=np.int64)
    words = [w for w in stripped.replace(",", " ").split() if w]
    if not all(w.isdigit() for w in words):
        bad = next(w for w in words if not w.isdigit())
        raise WeightsError(f"--input-ids {path}: {bad[:20]!r} is not a token id (non-negative integers, separated by "
                           "white space or commas)")  # fmt: skip
    return np.asarray([int(w) for w in words], dtype=np.int64)



# ------------------------------------------------------------------ the program
@dataclass
class BoundProgram:
    """A program whose inputs are chosen (``execute --weights``/``--input-ids``, ``train --weights``): weights
    read from ``checkpoint`` per tile when placed (``None``: drawn), and the forward arguments it runs on."""

    program: Any
    checkpoint: Checkpoint | None
    user_inputs: dict[str, np.ndarray]


def bound_program(graph: DataflowGraph, source: str, weights: str | Path | None, input_ids: str | None = None,
                  seed: int = 0) -> BoundProgram:  # fmt: skip
    """The program of ``graph`` (file ``source``) on the checkpoint ``weights`` (checked and bound first:
    :func:`check_executable`, :func:`bind`) and the token ids ``input_ids`` (:func:`read_input_ids`); every
    other input is drawn with ``seed`` as the engine draws it."""
    from doppler.workloads.references import make_inputs

    ckpt, binding = None, {}
    if weights is not None:
        check_executable(graph, source)
        ckpt = open_checkpoint(weights)
        binding = bind(graph, ckpt, source)
    rest = [n for n in graph.meta.get("inputs", {}) if n not in binding]
    inputs = make_inputs(graph, seed=seed, dtype=np.float64, names=rest)
    if input_ids is not None:
        name, ids = read_input_ids(input_ids, graph, source, seed)
        inputs[name] = ids
    program = build_program(graph, inputs=inputs, seed=seed, checkpoint=ckpt, weights=binding)
    return BoundProgram(program, ckpt, {n: inputs[n] for n in graph.meta.get("user_inputs") or () if n in inputs})
