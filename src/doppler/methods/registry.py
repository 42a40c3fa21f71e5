"""The registry of placement methods, and the one interface they share.

A method is a function ``fn(graph, cluster[, options], *, ...)`` that returns an
:class:`~doppler.ir.assignment.Assignment` (or a bare device array), registered under a name with
:func:`register`. It asks only for what it uses:

* ``options``: an instance of its options class, a small frozen dataclass whose fields are its
  options, each with a default and one line of help (:func:`option`); a method without options
  takes none, and has no third argument;
* of the call's arguments (:data:`CALL_ARGUMENTS`), the keywords its signature names: ``seed``,
  ``budget_s`` (a method that takes it honours a time budget), ``on_progress``, and
  ``memory_budget_bytes`` (a memory-aware method, ``register(..., memory_aware=True)``).

:meth:`MethodSpec.options_from` builds the options from values by name, and refuses an unknown one by
name, listing the method's options, before the method runs. Running a method (validation, the memory
budget, comparing) is :mod:`doppler.methods.placement`'s.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union

import numpy as np

from doppler.ir.assignment import Assignment
from doppler.ir.graph import DataflowGraph


class MethodError(ValueError):
    """A method was asked for something it cannot do (unknown name, bad budget, too few devices, ...)."""


MethodFn = Callable[..., "Assignment | np.ndarray"]

#: the arguments of a call that a method takes by keyword where its signature names them
CALL_ARGUMENTS = ("seed", "budget_s", "on_progress", "memory_budget_bytes")


def option(default: Any, help: str, flag: str | None = None) -> Any:
    """A field of a method's options dataclass: its default, one line of help, and the command-line flag that
    sets it where it has one of its own (else ``doppler assign --set NAME=VALUE`` sets it)."""
    return field(default=default, metadata={"help": help, "flag": flag})


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its function, options class (None: it takes no options) and what it asks for."""

    name: str
    fn: MethodFn
    options: type | None = None
    description: str = ""
    min_devices: int = 1
    deterministic: bool = True  # same inputs -> same assignment, whatever the seed
    memory_aware: bool = False  # takes ``memory_budget_bytes`` and places within it
    memory_retries: bool = True  # ... and places again with lower caps where live activations overflow
    takes: frozenset[str] = frozenset()  # the CALL_ARGUMENTS fn names

    @property
    def uses_budget(self) -> bool:
        """Whether the method honours ``budget_s`` (the others are not given it)."""
        return "budget_s" in self.takes

    def option_names(self) -> list[str]:
        """The names of the method's options, in the order its options class declares them."""
        return [] if self.options is None else [f.name for f in dataclasses.fields(self.options)]

    def options_from(self, options: Any = None, values: Mapping[str, Any] | None = None) -> Any:
        """The method's options: ``options`` (an instance of its options class, or a mapping of values by name;
        None: the defaults) with ``values`` by name on top. MethodError naming an unknown option and listing
        the valid ones; None for a method without options."""
        if isinstance(options, Mapping):
            options, values = None, {**options, **(values or {})}
        names = self.option_names()
        unknown = [k for k in values or {} if k not in names]
        if unknown:
            valid = f"its options: {', '.join(names)}" if names else "it takes no options"
            raise MethodError(f"method {self.name!r} has no option {unknown[0]!r} ({valid})")
        if self.options is None:
            if options is not None:
                raise MethodError(f"method {self.name!r} takes no options, got {type(options).__name__}")
            return None
        if options is None:
            options = self.options()
        elif not isinstance(options, self.options):
            raise MethodError(f"method {self.name!r} takes {self.options.__name__}, got {type(options).__name__}")
        return dataclasses.replace(options, **values) if values else options

    def call(self, graph: DataflowGraph, cluster: Any, options: Any = None, *, seed: int = 0,
             budget_s: float | None = None, on_progress: Callable | None = None,
             memory_budget_bytes: np.ndarray | None = None) -> Assignment:  # fmt: skip
        """Run the method itself (no checks: :func:`doppler.methods.assign` runs it checked), given the call's
        arguments it asks for and its options (:meth:`options_from`)."""
        given = {"seed": seed, "budget_s": budget_s, "on_progress": on_progress, "memory_budget_bytes": memory_budget_bytes}
        kw = {k: v for k, v in given.items() if k in self.takes}
        args = (graph, cluster) if self.options is None else (graph, cluster, self.options_from(options))
        out = self.fn(*args, **kw)
        return out if isinstance(out, Assignment) else Assignment(devices=np.asarray(out))


#: ``rule`` of :class:`PythonRun`: always (True), or a predicate of the call's options and ``budget_s``
PythonRule = Union[bool, Callable[[Any, "float | None"], bool]]


@dataclass(frozen=True)
class PythonRun:
    """When one small call of a method may run its kernels as Python rather than start numba
    (:func:`doppler.methods.placement.runs_as_python`): ``rule`` holds, and the graph's ops x devices are
    at most ``max_work`` (None: no limit of its own)."""

    rule: PythonRule = True
    max_work: int | None = None


METHODS: dict[str, MethodSpec] = {}
#: the methods that may run a small call as Python, by name (a speed knob, apart from what they are)
PYTHON_RUNS: dict[str, PythonRun] = {}


def register(name: str, *, options: type | None = None, description: str = "", python: PythonRun | None = None,
             **spec: Any) -> Callable[[MethodFn], MethodFn]:  # fmt: skip
    """Decorator: register ``fn`` (the module docstring) under ``name`` with its ``options`` dataclass; ``python``:
    when a small call may run as Python; ``spec``: the other :class:`MethodSpec` fields (``min_devices``,
    ``deterministic``, ``memory_aware``, ``memory_retries``). What ``fn`` is given is read from its signature,
    once, here; a signature that does not fit is a TypeError."""

    def deco(fn: MethodFn) -> MethodFn:
        params = inspect.signature(fn).parameters
        takes = frozenset(a for a in CALL_ARGUMENTS if a in params)
        if spec.get("memory_aware") and "memory_budget_bytes" not in takes:
            raise TypeError(f"method {name!r} is memory-aware but takes no memory_budget_bytes")
        if not spec.get("memory_aware"):
            takes -= {"memory_budget_bytes"}
        if ("options" in params) != (options is not None):
            raise TypeError(f"method {name!r}: an options class and an ``options`` argument go together")
        if options is not None and not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
            raise TypeError(f"method {name!r}: options must be a frozen dataclass, got {options!r}")
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        METHODS[name] = MethodSpec(name, fn, options, doc, takes=takes, **spec)
        if python is not None:
            PYTHON_RUNS[name] = python
        else:
            PYTHON_RUNS.pop(name, None)
        return fn

    return deco


def list_methods() -> list[str]:
    """Names of every registered method (built-in first, in registration order)."""
    return list(METHODS)


def get_method(name: str) -> MethodSpec:
    """The registered method ``name``; MethodError listing the known ones otherwise."""
    spec = METHODS.get(name)
    if spec is None:
        raise MethodError(f"unknown method {name!r} (known: {', '.join(list_methods())})")
    return spec
