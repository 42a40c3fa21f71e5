"""doppler: learned device assignment for dataflow graphs on work-conserving multi-device engines."""

from __future__ import annotations

from doppler.ir.assignment import Assignment, load_assignment, save_assignment
from doppler.methods import MethodError, assign, list_methods
from doppler.hardware.files import load_cluster, save_cluster
from doppler.ir.formats import load_graph, save_graph
from doppler.ir.graph import DataflowGraph, GraphError, OpKind
from doppler.hardware.cluster import Cluster
from doppler.hardware.presets import cluster
from doppler.sim import SimResult, lower_bound, simulate, simulate_many
from doppler import workloads  # noqa: E402  (doppler.workloads.build(...))
from doppler.policy import method as _learned_method  # noqa: E402, F401 - registers the learned method "doppler"

__version__ = "0.1.0"

__all__ = [
    "workloads",
    "Assignment",
    "MethodError",
    "assign",
    "list_methods",
    "Cluster",
    "SimResult",
    "DataflowGraph",
    "GraphError",
    "OpKind",
    "cluster",
    "lower_bound",
    "load_assignment",
    "load_cluster",
    "load_graph",
    "save_assignment",
    "save_cluster",
    "save_graph",
    "simulate",
    "simulate_many",
]
