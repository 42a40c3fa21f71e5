"""doppler: learned device assignment for dataflow graphs on work-conserving multi-device engines."""

from __future__ import annotations

from doppler.assignment import Assignment, load_assignment
from doppler.formats import load_graph, save_graph
from doppler.graph import DataflowGraph, GraphError, OpKind

__version__ = "0.1.0"

__all__ = [
    "Assignment",
    "DataflowGraph",
    "GraphError",
    "OpKind",
    "load_assignment",
    "load_graph",
    "save_graph",
]
