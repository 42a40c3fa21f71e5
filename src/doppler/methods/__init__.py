"""Device-assignment methods behind one interface (:mod:`doppler.methods.registry`), run by
:mod:`doppler.methods.placement` (``assign``, ``compare``, ``score``).

Built in (docs/design.md, Baselines): ``single``, ``round_robin``, ``round_robin_block``, ``sequential_fill``, ``pipeline``,
``tensor_parallel``, ``tp_pipeline``, ``random``, ``critical_path``, ``heft``, ``metis``, ``enumerative``, ``lookahead``, ``heft_lookahead``,
``anneal``; importing this
package registers them. The learned methods (``doppler``, its ablations ``doppler_sel`` and
``doppler_plc``, and the learned baselines ``single_policy``, ``gdp`` and ``placeto``) register
themselves the same way from :mod:`doppler.policy.method`, which ``import doppler`` imports: a
broken learned method fails that import loudly instead of turning into an unknown method name.

Methods use only public APIs (graph, cluster, simulator); they never reach into simulator
internals.
"""

from __future__ import annotations

# importing them registers them, in this order (the order `doppler methods` and tables list them)
from doppler.methods import simple, layered, tensor_parallel, critical_path, heft, metis, enumerative, lookahead, anneal  # noqa: F401, I001
from doppler.methods.critical_path import CriticalPathTrace, critical_path_trace
from doppler.methods.heft import HeftSchedule, heft_schedule
from doppler.methods.placement import CompareRow, assign, check_budget, check_seed, compare, score
from doppler.methods.registry import (
    METHODS, MethodError, MethodSpec, PythonRun, get_method, list_methods, option, register,
)  # fmt: skip

__all__ = [
    "METHODS",
    "CompareRow",
    "CriticalPathTrace",
    "HeftSchedule",
    "MethodError",
    "MethodSpec",
    "PythonRun",
    "assign",
    "check_budget",
    "check_seed",
    "compare",
    "score",
    "critical_path_trace",
    "get_method",
    "heft_schedule",
    "list_methods",
    "option",
    "register",
]
