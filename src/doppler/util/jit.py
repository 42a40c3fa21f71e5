"""numba loops that import numba only when first called, and that can run as plain Python.

Importing numba and its one-time start-up (loading compiled code from its on-disk cache) take
longer than one greedy decode of a 1,000-op graph takes as Python with numpy. So the package
declares its loops with :func:`jit` instead of ``numba.njit``:

* ``import doppler`` imports no numba: a loop is a :class:`Loop` that holds the plain function;
* the first call of any loop outside :func:`as_python` starts numba (:func:`start`): every loop
  gets its ``numba.njit`` dispatcher, which its calls run from then on; numba types a loop as its
  dispatcher, so a compiled loop that calls another (a module global, resolved when it compiles)
  calls the compiled one. No module's globals are rewritten: a loop stays the same object;
* inside :func:`as_python` (before numba has started) a loop runs as Python, or as its numpy twin
  where ``jit(python=...)`` names one: the scalar loops that numba makes fast and Python makes slow
  (``tests/util/test_jit.py`` checks each twin against its loop).

A command that does one small job (``doppler assign --method doppler``, zero-shot greedy) runs it
inside :func:`as_python` and never starts numba; everything else compiles.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

_LOOPS: list["Loop"] = []
_LOCK = threading.Lock()
_STARTED = False
_LOCAL = threading.local()  # .python: as_python's depth in this thread
_PYTHON_CALLS = 0  # as_python's depth over all threads (a cheap first test in Loop.__call__)


class Loop:
    """A loop: calls run its Python function (or twin) inside :func:`as_python` (before numba has
    started), else its dispatcher (starting numba on the first such call)."""

    def __init__(self, py_func: Callable, options: dict[str, Any], python: Callable | None) -> None:
        functools.update_wrapper(self, py_func)
        self.py_func = py_func
        self.options = options
        self.python = python or py_func
        self.dispatcher: Any = None

    def __call__(self, *args: Any) -> Any:
        if _PYTHON_CALLS and getattr(_LOCAL, "python", 0):
            return self.python(*args)
        if self.dispatcher is None:
            start()
        return self.dispatcher(*args)

    def __repr__(self) -> str:
        return f"<doppler loop {self.__module__}.{self.__qualname__}>"


def jit(*, python: Callable | None = None, **options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(**options)``, started on first use (module docstring). ``python``: a numpy twin
    that :func:`as_python` runs instead of the function itself (same arguments, same results)."""

    def wrap(py_func: Callable) -> Any:
        with _LOCK:
            if not _STARTED:
                loop = Loop(py_func, options, python)
                _LOOPS.append(loop)
                return loop
        import numba

        return numba.njit(**options)(py_func)

    return wrap


def start() -> None:
    """Import numba and give every :class:`Loop` its dispatcher (compiled, or loaded from numba's
    cache, on its first call); numba types a loop as its dispatcher from then on."""
    global _STARTED
    with _LOCK:
        if _STARTED:
            return
        import numba
        from numba.extending import typeof_impl

        for loop in _LOOPS:
            loop.dispatcher = numba.njit(**loop.options)(loop.py_func)
        typeof_impl.register(Loop)(lambda loop, c: typeof_impl(loop.dispatcher, c))
        _STARTED = True


def started() -> bool:
    """Whether numba has started in this process (its loops are compiled dispatchers)."""
    return _STARTED


@contextlib.contextmanager
def as_python(enabled: bool = True) -> Iterator[bool]:
    """Inside, this thread's loop calls run as Python (twins where given), unless numba has
    already started, whose compiled loops are faster. Yields whether they run as Python."""
    global _PYTHON_CALLS
    on = bool(enabled) and not _STARTED
    with _LOCK:
        _PYTHON_CALLS += on
    _LOCAL.python = getattr(_LOCAL, "python", 0) + on
    try:
        yield on
    finally:
        _LOCAL.python -= on
        with _LOCK:
            _PYTHON_CALLS -= on
