"""One progress protocol for long work: a callback that receives one :class:`ProgressEvent`.

Searches (``anneal``), training (each stage), pretraining, calibration, validation, ``compare``
and the demo all report this way, so the CLI draws every live bar with one helper
(``doppler.cli._common.live_progress``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ProgressEvent", "ProgressFn"]


@dataclass
class ProgressEvent:
    """What is running (``task``: ``"anneal"``, ``"il"``, ``"sim"``, ``"pretrain"``, ``"validate"``,
    ...), how far along it is (``done`` of ``total`` ``unit``; ``total`` None when open-ended), and
    the numbers behind it (``stats``: the training step's losses, the best makespan so far, ...)."""

    task: str
    done: float
    total: float | None
    unit: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[ProgressEvent], None]
