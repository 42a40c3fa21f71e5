"""What a trace's peak memory says against the devices' memory, as phrases for a report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from doppler.report.text import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from doppler.hardware import Cluster


def memory_overruns(peak_bytes: np.ndarray, cluster: "Cluster") -> list[str]:
    """One phrase per device whose peak live bytes exceed its ``memory_bytes`` (empty when all fit)."""
    cap = cluster.memory_bytes
    return [f"{cluster.devices[d].name} holds {format_bytes(float(peak_bytes[d]))} at peak, more than its "
            f"{format_bytes(float(cap[d]))}" for d in np.flatnonzero(peak_bytes > cap)]  # fmt: skip
