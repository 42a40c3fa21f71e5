"""The plumbing every figure shares: the image format from a path's extension, atomic saving, and
one colour per op kind (the Gantt chart's and the graph picture's).

matplotlib is imported inside the functions (a command that draws nothing never loads it) and runs
on the Agg backend; a figure is rendered to memory, then written with ``io_util.atomic_write_bytes``,
so an interrupted run never leaves half a PNG.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from doppler.ir.graph import OpKind
from doppler.util.io import atomic_write_bytes


class FigureFormatError(ValueError):
    """A figure path whose extension matplotlib cannot write; the message names the path and the formats."""


def figure_format(path: str | Path) -> str:
    """The image format of ``path`` from its extension (none: png); FigureFormatError if unsupported."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise FigureFormatError(f"{path}: cannot draw a .{fmt} image (use one of: {', '.join(sorted(supported))})")
    return fmt


def pyplot() -> Any:
    """``matplotlib.pyplot``, on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int | None = None) -> None:
    """Render ``fig`` in the format of ``path``'s extension, write it atomically, close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format=figure_format(path), dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


# one stable colour per op kind (colour-blind-friendly Okabe-Ito first, then tab20)
_KIND_COLOURS: dict[int, str] = {
    OpKind.MATMUL: "#0072B2",
    OpKind.ADD: "#E69F00",
    OpKind.ELEMENTWISE: "#009E73",
    OpKind.SOFTMAX: "#CC79A7",
    OpKind.NORM: "#56B4E9",
    OpKind.ROTARY: "#D55E00",
    OpKind.MASK_FILL: "#F0E442",
    OpKind.SELECT: "#8c564b",
    OpKind.REDUCE: "#7f7f7f",
    OpKind.INPUT: "#c7c7c7",
    OpKind.FORMATION: "#9edae5",
    OpKind.COMPLEXER: "#c5b0d5",
    OpKind.SQUEEZER: "#dbdb8d",
    OpKind.FILL: "#ffbb78",
    OpKind.EINSUMMABLE: "#1f77b4",
    OpKind.UNKNOWN: "#aec7e8",
}


def kind_colour(kind: int) -> str:
    return _KIND_COLOURS.get(int(kind), "#999999")
