"""A placement's memory against the budget, in words for a report or an error (the model and the figures
are :mod:`doppler.memory`'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from doppler.memory import MemoryCheck, Shortfall
from doppler.report.text import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from doppler.ir.graph import DataflowGraph
    from doppler.hardware.cluster import Cluster


def memory_overruns(check: MemoryCheck) -> list[str]:
    """One phrase per device whose peak is over its budget (empty when all fit)."""
    return [f"{check.device_names[d]} holds {format_bytes(float(check.peak_memory_bytes[d]))} at peak "
            f"({format_bytes(float(check.resident_bytes[d]))} of it weights), over its budget of "
            f"{format_bytes(float(check.memory_budget_bytes[d]))}" for d in check.over()]  # fmt: skip


def shortfall_reason(graph: "DataflowGraph", cluster: "Cluster", sf: Shortfall, memory_fraction: float) -> str:
    """Why no placement of ``graph`` fits ``cluster``, in one line."""
    offer = f"{format_bytes(sf.offer_bytes)} (--memory-fraction {memory_fraction:g} of {cluster.name}'s memory)"
    if sf.op < 0:
        return (f"the weights alone need {format_bytes(sf.need_bytes)} and the cluster's {cluster.num_devices} "
                f"devices offer {offer}")  # fmt: skip
    return (f"op {graph.op_label(sf.op)} alone needs {format_bytes(sf.need_bytes)} (its weights, inputs and "
            f"output), more than any device's budget of {offer}")  # fmt: skip
