"""``doppler execute --check --reference FACTORY``: a placed run's logits against the model's own forward.

The factory (``path/file.py:function`` or ``package.module:function``, named on the command line, so it is the
user's code and runs) returns the module. Its ``state_dict`` is loaded from the same checkpoint the engine read
(:func:`load_weights`: every key, of the module's shape, strictly; a key the checkpoint stores once for
parameters tied together is tied again), the module runs its forward in torch on the same inputs, and
:func:`compare_logits` reports the largest error and whether the top-1 token agrees at every position. The
reference holds the whole model in this process: it runs after the engine has finished and released its
devices.

Tolerance, relative to the largest absolute reference logit, by the coarser of the graph's and the
weights' element types (:data:`TOLERANCE`): 1e-6 in float64, 1e-4 in float32, 1e-2 in float16, 3e-2 in
bfloat16. The engine sums matrix products tile by tile, in another order than torch, so the two differ by
rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from doppler.engine.weights import Checkpoint, WeightsError
from doppler.ir.graph import DataflowGraph

__all__ = ["TOLERANCE", "LogitsCheck", "compare_logits", "load_weights", "reference_outputs"]

#: largest |engine - reference| / max |reference| accepted, per element type
TOLERANCE = {"float64": 1e-6, "float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
#: positions where the top-1 tokens differ that a report lists
MAX_LISTED = 10


@dataclass
class LogitsCheck:
    """One output compared with the reference: errors, top-1 agreement, and the verdict."""

    reference: str  # the factory
    output: str  # the graph output compared
    tolerance: float  # on max_rel_error
    max_abs_error: float
    max_rel_error: float  # max |engine - reference| / max |reference|
    positions: int  # positions checked (every position of every sequence)
    top1_agree: int  # positions whose largest logit is the same token in both
    top1_disagree_at: list[int] = field(default_factory=list)  # the first positions (flat index) where it is not

    @property
    def match(self) -> bool:
        return self.max_rel_error <= self.tolerance and self.top1_agree == self.positions

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "checked_output": self.output, "tolerance": self.tolerance,
                "max_abs_error": self.max_abs_error, "max_rel_error": {self.output: self.max_rel_error},
                "positions_checked": self.positions, "top1_agree": self.top1_agree,
                "top1_agreement": self.top1_agree / max(self.positions, 1),
                "top1_disagree_at": list(self.top1_disagree_at), "outputs_match": self.match}  # fmt: skip


def load_weights(module: Any, ckpt: Checkpoint, source: str) -> None:
    """Load ``module``'s ``state_dict`` from ``ckpt`` in place, strictly (``load_state_dict(assign=True)``, so a
    module built with its parameters on the meta device gets real ones). A key the checkpoint lacks is a fault
    unless its parameter is tied to one it has (one tensor under several names); that name then shares the
    loaded parameter again. A key the module lacks, a shape that differs, or a parameter or buffer still on
    the meta device afterwards is a :class:`WeightsError` naming it."""
    import torch

    from doppler.importer import checkpoint_keys

    state = module.state_dict()
    groups: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    tied = {name: names for names in groups.values() for name in names if len(names) > 1}
    saved = {k: checkpoint_keys(module).get(k, k) for k in state}  # the key on disk of each state_dict key
    have = set(ckpt.shard_of)
    for key in state:
        if saved[key] not in have and not any(saved.get(k, k) in have for k in tied.get(key, ())):
            raise WeightsError(f"{ckpt.path}: no tensor {saved[key]!r}, which the reference {source}'s state_dict has")
    extra = sorted(have - set(saved.values()))
    if extra:
        raise WeightsError(f"{ckpt.path}: tensor {extra[0]!r} is not in the reference {source}'s state_dict")
    found = [k for k in state if saved[k] in have]
    loaded = ckpt.tensors(sorted({saved[k] for k in found}))
    tensors = {k: loaded[saved[k]] for k in found}
    for key, t in tensors.items():
        if tuple(t.shape) != tuple(state[key].shape):
            raise WeightsError(f"{ckpt.shard_of[saved[key]]}: tensor {saved[key]!r} has shape {list(t.shape)}, the "
                               f"reference {source}'s has {list(state[key].shape)}")  # fmt: skip
    del state
    try:
        module.load_state_dict(tensors, strict=False, assign=True)
    except (RuntimeError, ValueError) as e:
        raise WeightsError(f"{source}: load_state_dict failed ({str(e).strip().splitlines()[0][:200]})") from None
    for names in groups.values():  # ``assign`` replaced the loaded name's parameter: tie the others to it again
        loaded = next((n for n in names if n in tensors), None)
        for name in names:
            if loaded is not None and name != loaded:
                owner, _, attr = name.rpartition(".")
                setattr(module.get_submodule(owner), attr, module.get_parameter(loaded))
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if isinstance(t, torch.Tensor) and t.is_meta:
            raise WeightsError(f"{source}: {name} is still on the meta device after loading the checkpoint (a buffer "
                               "the checkpoint does not hold: build the module's buffers on the CPU)")  # fmt: skip


def reference_outputs(source: str, ckpt: Checkpoint, graph: DataflowGraph, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The factory's module, with the checkpoint's weights, run forward on the graph's forward arguments
    (``inputs``, by graph input name, in ``meta["user_inputs"]`` order): its logits (a Hugging Face forward is
    called without its cache, as imported), in float64."""
    import torch

    from doppler.importer import GraphImportError, load_factory, without_cache

    try:
        module, _ = load_factory(source)
    except GraphImportError as e:
        raise WeightsError(f"--reference {e}") from None
    if not isinstance(module, torch.nn.Module):
        raise WeightsError(f"--reference {source}: the factory returned a {type(module).__name__}, not a torch.nn.Module")
    load_weights(module, ckpt, source)
    module.eval()
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    args = []
    for name in graph.meta.get("user_inputs") or ():
        x = np.asarray(inputs[name])
        kind = (graph.meta.get("input_init", {}).get(name) or {}).get("init")
        args.append(torch.as_tensor(x.astype(np.int64)) if kind == "index" else torch.as_tensor(x).to(dtype))
    try:
        with torch.no_grad():
            out = without_cache(module)(*args)
    except Exception as e:  # the user's forward failed on the graph's inputs
        text = str(e).strip().splitlines()
        raise WeightsError(f"--reference {source}: the forward raised {type(e).__name__}: {text[0][:200] if text else ''}") from None
    if getattr(out, "logits", None) is not None:  # a Hugging Face output whose forward takes no use_cache
        out = out.logits
    elif isinstance(out, (tuple, list)) or hasattr(out, "to_tuple"):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise WeightsError(f"--reference {source}: the forward returned a {type(out).__name__}, not logits")
    return out.detach().double().numpy()


def compare_logits(outputs: Mapping[str, np.ndarray], ref: np.ndarray, *, source: str, dtype: str) -> LogitsCheck:
    """The engine's one graph output against the reference logits ``ref`` (same shape; the last axis is the
    vocabulary), within :data:`TOLERANCE` of ``dtype``."""
    if len(outputs) != 1:
        raise WeightsError(f"--reference: the graph has {len(outputs)} outputs; it is compared with one logits tensor")
    (name, out), = outputs.items()
    out = np.asarray(out, dtype=np.float64)
    if out.shape != ref.shape:
        raise WeightsError(f"--reference {source}: its forward returns shape {list(ref.shape)}, the graph's {name!r} "
                           f"has {list(out.shape)}")  # fmt: skip
    err = np.abs(out - ref)
    max_abs = float(err.max()) if err.size else 0.0
    rel = max_abs / max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-30)
    flat_out, flat_ref = out.reshape(-1, out.shape[-1]), ref.reshape(-1, ref.shape[-1])
    differ = np.flatnonzero(flat_out.argmax(axis=-1) != flat_ref.argmax(axis=-1))
    return LogitsCheck(reference=source, output=name, tolerance=TOLERANCE.get(dtype, TOLERANCE["float32"]),
                       max_abs_error=max_abs, max_rel_error=rel, positions=int(flat_ref.shape[0]),
                       top1_agree=int(flat_ref.shape[0] - differ.size),
                       top1_disagree_at=[int(i) for i in differ[:MAX_LISTED]])  # fmt: skip


def coarser(*dtypes: str) -> str:
    """The element type of ``dtypes`` with the largest tolerance."""
    return max(dtypes, key=lambda d: TOLERANCE.get(d, TOLERANCE["float32"]))
