"""Where an imported model comes from: a factory the caller names, or a ``.pt2`` file read without running it.

* **Factories.** ``package.module:function`` or ``path/to/file.py:function`` returns ``(module,
  example_inputs)`` (:func:`load_factory`); only the module named is imported. ``--input-shape`` redraws
  the named inputs at new shapes (:func:`parse_input_shapes`).
* **Export.** :func:`export_model` runs :func:`torch.export.export` (non-strict, eval mode). A Hugging Face
  forward (one that takes ``use_cache``) is exported without its cache, returning its logits only
  (:func:`without_cache`; the wrapper sits under :data:`WRAPPED`, a name the graph never shows).
* **The meta device.** A model built under :func:`parameters_on_meta` has its parameters on the meta device
  (no weight allocated) and its buffers real, so what it computes from them at import is recorded.
* **Saved programs.** :func:`load_pt2` reads a ``.pt2`` file with :mod:`doppler.importer.pt2` (JSON and raw
  tensor bytes; no unpickling, no ``torch.export.load``).
* **What the program says of itself**: the element type most of its parameters have
  (:func:`parameter_dtype`), and the keys a Hugging Face checkpoint saves its parameters under where they
  differ from the ``state_dict``'s (:func:`checkpoint_keys`).

Every failure is one :class:`~doppler.importer.errors.GraphImportError` line naming the source.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from doppler.importer.errors import GraphImportError, one_line
from doppler.importer.pt2 import Pt2Error, read_pt2

__all__ = ["WRAPPED", "checkpoint_keys", "export_model", "load_factory", "load_pt2", "parameter_dtype",
           "parameters_on_meta", "parse_input_shapes", "without_cache"]

#: the optional dependencies a model may need, and the extra of ``pip install 'doppler[EXTRA]'`` that installs each
OPTIONAL_EXTRAS = {"transformers": "hf"}


def _missing_extra(source: str, e: BaseException) -> GraphImportError | None:
    """The one-line error of a factory that needs an optional dependency not installed (``e``), naming the
    extra that installs it; None for any other error."""
    top = (getattr(e, "name", None) or "").split(".")[0] if isinstance(e, ModuleNotFoundError) else ""
    if top not in OPTIONAL_EXTRAS:
        return None
    return GraphImportError(f"{source}: the model needs {top}, which is not installed: pip install "
                            f"'doppler[{OPTIONAL_EXTRAS[top]}]'")  # fmt: skip


def load_factory(source: str) -> tuple[Any, tuple]:
    """Call the factory ``package.module:function`` or ``path/to/file.py:function``.

    Returns ``(module, example_inputs)``. Only the module named here is imported."""
    mod_name, sep, fn_name = source.rpartition(":")
    if not sep or not mod_name or not fn_name.isidentifier():
        raise GraphImportError(f"{source}: expected 'package.module:function', 'file.py:function' or a .pt2 file")
    if mod_name.endswith(".py") and not Path(mod_name).is_file():
        raise GraphImportError(f"{source}: no such file {Path(mod_name)}")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            spec = importlib.util.spec_from_file_location(f"_doppler_factory_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[spec.name] = module  # type: ignore[union-attr]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(mod_name)
    except SystemExit as e:  # the module calls sys.exit (a script's main, say) when imported
        raise GraphImportError(f"{source}: importing {mod_name} called sys.exit({e.code!r})") from None
    except Exception as e:  # the factory's module itself is broken, or needs an optional dependency
        raise _missing_extra(source, e) or GraphImportError(f"{source}: cannot import {mod_name} ({one_line(e)})") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise GraphImportError(f"{source}: {mod_name} has no function {fn_name!r}")
    try:
        out = fn()
    except SystemExit as e:
        raise GraphImportError(f"{source}: the factory called sys.exit({e.code!r})") from None
    except Exception as e:
        raise _missing_extra(source, e) or GraphImportError(f"{source}: the factory raised {one_line(e)}") from None
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (tuple, list))):
        got = type(out).__name__ if not isinstance(out, tuple) else f"a tuple of {len(out)}" + (
            f" whose second item has type {type(out[1]).__name__}" if len(out) == 2 else "")  # fmt: skip
        raise GraphImportError(f"{source}: the factory must return (module, example_inputs), a tuple of a module and "
                               f"a tuple of inputs; got {got}")  # fmt: skip
    return out[0], tuple(out[1])


def _reshaped_inputs(module: Any, example: tuple, shapes: Mapping[str, Sequence[int]]) -> tuple:
    """``example`` with the inputs named in ``shapes`` (forward's argument names) redrawn at new shapes, on
    the device of the input they replace (an input on the meta device stays there: it has no values)."""
    import torch

    if not shapes:
        return example
    names = [p for p in inspect.signature(module.forward).parameters][: len(example)]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise GraphImportError(f"--input-shape {unknown[0]}: the module's inputs are {', '.join(names)}")
    out = list(example)
    for i, name in enumerate(names):
        if name in shapes:
            old, shape = example[i], tuple(shapes[name])
            if old.is_meta:
                out[i] = torch.empty(shape, dtype=old.dtype, device="meta")
            elif old.dtype.is_floating_point:
                out[i] = torch.randn(*shape, dtype=old.dtype)
            else:
                out[i] = torch.randint(0, int(old.max()) + 1, shape, dtype=old.dtype)
    return tuple(out)


#: the attribute under which :func:`export_model` wraps a forward that returns a cache; stripped from the
#: parameter names and module paths of the graph, which are those of the user's module
WRAPPED = "_doppler_wrapped"


def without_cache(module: Any) -> Any:
    """``module`` itself, or, when its forward takes ``use_cache`` (a Hugging Face model), a wrapper whose
    forward has the same signature, calls it with ``use_cache=False`` and returns only its logits (or, for a
    model without logits, its first output): the key/value cache is not part of the computation to place."""
    import torch

    sig = inspect.signature(module.forward)
    if "use_cache" not in sig.parameters:
        return module

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            setattr(self, WRAPPED, inner)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = getattr(self, WRAPPED)(*args, **{**kwargs, "use_cache": False})
            logits = getattr(out, "logits", None)
            if logits is not None:
                return logits
            return out[0] if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple") else out

    LogitsOnly.forward.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *sig.parameters.values()])
    return LogitsOnly(module)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build modules inside this block with every parameter on the meta device and every buffer where it
    would be without it (accelerate's ``init_empty_weights(include_buffers=False)``).

    No weight is allocated or initialised, while what a model computes from its buffers at import (a rotary
    embedding's tables) keeps its values. A graph imported from such a model is cost-only (no weights)
    but records those constants, so ``doppler execute --weights`` can run it with a checkpoint's weights."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, param: Any) -> None:
        register(module, name, param)
        p = module._parameters.get(name)
        if p is not None and not p.is_meta:
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def export_model(module: Any, example: tuple, input_shapes: Mapping[str, Sequence[int]] | None = None):
    """``torch.export`` of ``module`` at ``example`` (non-strict; dropout and friends in eval mode).

    A forward that takes ``use_cache`` (a Hugging Face model) is exported with ``use_cache=False`` and
    returning only its logits (:func:`without_cache`). Returns ``(exported program, example)``."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise GraphImportError(f"the factory returned a {type(module).__name__}, not a torch.nn.Module")
    module.eval()
    example = _reshaped_inputs(module, example, input_shapes or {})
    wrapped = without_cache(module)
    logging.disable(logging.CRITICAL)  # torch logs a failed trace's whole traceback; we report one line
    try:
        with torch.no_grad(), _parameters_off_meta(wrapped, example) as (inputs, meta):
            ep = torch.export.export(wrapped, inputs, strict=False)
    except Exception as e:
        raise GraphImportError(f"torch.export failed: {one_line(e)}") from None
    finally:
        logging.disable(logging.NOTSET)
    for spec in ep.graph_signature.input_specs:  # the parameters back on the meta device: the graph has no weights
        if spec.kind.name == "PARAMETER" and spec.target in meta:
            ep.state_dict[spec.target] = meta[spec.target]
    return ep, example


@contextlib.contextmanager
def _parameters_off_meta(module: Any, example: tuple) -> Iterator[tuple[tuple, dict[str, Any]]]:
    """Within this block, a module built by :func:`parameters_on_meta` (its parameters on the meta device,
    its buffers real) computes on the CPU, as it would with its weights: each parameter is a view of one
    zero with zero strides (no memory), and the example inputs on the meta device are zeros of their shape.
    The export then reads the buffers and the constants the forward makes (Falcon picks its key and value
    heads with the list ``[-2]``) with their values, and no op sees two devices (GPT-J gathers its sinusoid
    buffer at the position ids). The block gets the inputs to export with and the meta parameters by name.
    A module with no meta parameter, or with a buffer on the meta device (one built wholly there), is left
    as it is."""
    import torch

    params = dict(module.named_parameters(remove_duplicate=False))
    if not any(p.is_meta for p in params.values()) or any(b.is_meta for b in module.buffers()):
        yield example, {}
        return
    moved: list[tuple[Any, str, Any]] = []
    stand_in: dict[int, Any] = {}  # id(meta parameter) -> its zeros: parameters tied together stay one
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None and p.is_meta:
                moved.append((sub, name, p))
                if id(p) not in stand_in:
                    zero = torch.zeros((), dtype=p.dtype).expand(p.shape)
                    stand_in[id(p)] = torch.nn.Parameter(zero, requires_grad=p.requires_grad)
                sub._parameters[name] = stand_in[id(p)]
    inputs = tuple(torch.zeros(x.shape, dtype=x.dtype) if isinstance(x, torch.Tensor) and x.is_meta else x
                   for x in example)  # fmt: skip
    try:
        yield inputs, {k: p for k, p in params.items() if p.is_meta}
    finally:
        for sub, name, p in moved:
            sub._parameters[name] = p


def load_pt2(path: Path):
    """The program of a ``.pt2`` file, read by :func:`doppler.importer.pt2.read_pt2`: its JSON program and raw
    tensor bytes only; ``torch.export.load`` (which unpickles and evaluates what the file says) is never called."""
    if not path.is_file():
        raise GraphImportError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        return read_pt2(path)
    except Pt2Error as e:
        raise GraphImportError(f"{path}: {e}") from None
    except OSError as e:
        raise GraphImportError(f"{path}: cannot read ({e.strerror or e})") from None


def parse_input_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """``["x=2x64x256"]`` -> ``{"x": [2, 64, 256]}``."""
    out: dict[str, list[int]] = {}
    for item in items:
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+(?:\s*[x,]\s*\d+)*)\s*", item)
        if not m:
            raise GraphImportError(f"--input-shape {item!r}: expected NAME=DIMS, e.g. x=2x64x256")
        dims = [int(d) for d in re.split(r"\s*[x,]\s*", m[2])]
        if min(dims) < 1:
            raise GraphImportError(f"--input-shape {item!r}: dimensions must be >= 1")
        out[m[1]] = dims
    return out


def parameter_dtype(ep: Any) -> str:
    """The element type most of an exported program's parameter elements have (``"float16"`` for a model
    cast with ``.half()``), if it is one a graph counts bytes in; else ``"float32"``."""
    count: Counter = Counter()
    for spec in ep.graph_signature.input_specs:
        value = ep.state_dict.get(spec.target) if spec.kind.name == "PARAMETER" else None
        if value is not None:
            count[str(value.dtype).removeprefix("torch.")] += value.numel()
    dtype = count.most_common(1)[0][0] if count else "float32"
    return dtype if dtype in ("float16", "bfloat16", "float32", "float64") else "float32"


def checkpoint_keys(module: Any) -> dict[str, str]:
    """``state_dict`` key -> the key a Hugging Face ``save_pretrained`` checkpoint stores it under, where the two
    differ: transformers renames some parameters on saving (GPT-NeoX's ``lm_head.weight`` is
    ``embed_out.weight`` on disk). Only renames are listed: a parameter that saving splits or merges with others
    has no key of its own there. Empty for a module that is not a ``transformers`` model."""
    if not hasattr(module, "save_pretrained") or "transformers" not in sys.modules:
        return {}
    try:
        from transformers.core_model_loading import revert_weight_conversion

        state = dict(module.state_dict())
        saved = revert_weight_conversion(module, dict(state))
    except Exception:  # an older transformers, or a conversion that needs real values: no renames known
        return {}
    key_of = {id(t): k for k, t in saved.items()}
    return {k: key_of[id(t)] for k, t in state.items() if key_of.get(id(t), k) != k}
