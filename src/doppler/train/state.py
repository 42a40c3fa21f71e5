"""A checkpoint's training state going back into a trainer, checked as it is loaded.

A checkpoint is read with torch's weights-only loader (:mod:`doppler.policy.checkpoint`); what it
holds may still be damaged. Each function here checks one part (the history, the incumbent, the
optimizer state) as the next update will use it, so that a damaged file is a :class:`TrainError`
naming it, never torch's or numpy's own error a few updates later.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from doppler.train.config import TrainError
from doppler.train.tasks import Task


def finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} is {value!r}, not a finite number")
    return float(value)


#: what a row of :attr:`Trainer.history` holds besides its stage flags, by stage (the training curve draws them)
HISTORY_ROW_KEYS = {"il": ("episode", "agree_sel", "agree_plc"), "sim": ("episode", "mean_ratio", "best_ratio"),
                    "distill": ("greedy_ratio",), "real": ("episode", "mean_ratio")}  # fmt: skip


def history_from_json(text: str, *, stages: bool = False) -> list[dict[str, float]]:
    """A checkpoint's ``history``: rows of named numbers; with ``stages`` (a training run's, which the training
    curve draws), each holding the numbers of its stage (:data:`HISTORY_ROW_KEYS`). ValueError if not."""
    rows = json.loads(text)
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r.values())
        for r in rows
    ):
        raise ValueError("history is not a list of rows of numbers")
    for i, row in enumerate(rows if stages else ()):
        stage = next((s for s in ("il", "distill", "real") if row.get(f"stage_{s}")), "sim")
        missing = [k for k in HISTORY_ROW_KEYS[stage] if k not in row]
        if missing:
            raise ValueError(f"history row {i} (stage {stage}) has no {', '.join(missing)}")
    return rows


def replayable_best(best: Any, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A checkpoint's best ``[op order, device per step, device per op]`` of ``task``, checked as the rollout
    replays it (each op once, after the ops it reads; devices of the cluster; the two device lists agreeing):
    ValueError naming what is wrong."""
    order, step_device, assignment = (np.asarray(x, dtype=np.int64) for x in best)
    n = task.graph.num_ops
    if any(a.shape != (n,) for a in (order, step_device, assignment)):
        raise ValueError(f"best holds lists of {[a.shape for a in (order, step_device, assignment)]} entries, not {n}")
    if not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError("the best op order does not hold each op once")
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    if np.any(position[task.graph.src] >= position[task.graph.dst]):
        raise ValueError("the best op order puts an op before an op it reads")
    if assignment.min() < 0 or assignment.max() >= task.cluster.num_devices:
        raise ValueError(f"the best assignment names a device outside 0..{task.cluster.num_devices - 1}")
    if not np.array_equal(step_device, assignment[order]):
        raise ValueError("the best devices per step are not the best assignment's")
    return order, step_device, assignment


def _like(value: Any, own: Any) -> bool:
    """Whether a loaded optimizer setting is of the kind of the optimizer's own (a finite number, a flag, ...)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if number(own):
        return number(value) and math.isfinite(value)
    if isinstance(own, (tuple, list)):
        return isinstance(value, (tuple, list)) and len(value) == len(own) and all(map(_like, value, own))
    return type(value) is type(own)


def load_optimizer_state(optimizer: torch.optim.Adam, state: dict[str, Any]) -> None:
    """A checkpoint's Adam state into ``optimizer``, checked as its next step will use it: each group's settings
    of the kind of the optimizer's own, each parameter's state the step count and the moments of its shape.
    torch checks only that the groups hold as many parameters, so any of those was an error in the next step."""
    own = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, settings in zip(optimizer.param_groups, own):
        bad = next((k for k, v in settings.items() if not _like(group.get(k), v)), None)
        if bad is not None:
            raise ValueError(f"the optimizer's {bad} is {group.get(bad)!r}, not like {settings[bad]!r}")
        moments = {"exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if group["amsgrad"] else set())
        for param in group["params"]:
            st = optimizer.state.get(param)
            if not st:  # (a parameter that has not stepped yet)
                continue
            if set(st) != moments | {"step"}:
                raise ValueError(f"the optimizer's state of a parameter holds {sorted(st)}, not "
                                 f"{sorted(moments | {'step'})}")  # fmt: skip
            for name, value in st.items():
                shape = torch.Size([]) if name == "step" else param.shape
                if not (torch.is_tensor(value) and value.is_floating_point() and value.shape == shape):
                    raise ValueError(f"the optimizer's {name} is {_tensor_kind(value)} for a parameter of shape "
                                     f"{list(param.shape)}")  # fmt: skip


def _tensor_kind(value: Any) -> str:
    return f"a {value.dtype} tensor of shape {list(value.shape)}" if torch.is_tensor(value) else repr(value)[:40]


@contextlib.contextmanager
def loading_state(path: str | Path) -> Iterator[None]:
    """A checkpoint's training state (optimizer, generators, counters, per-graph records) going into a trainer:
    what does not fit, being damaged, is a TrainError naming the file, not torch's or numpy's own error."""
    try:
        yield
    except (AttributeError, IndexError, KeyError, OverflowError, RuntimeError, TypeError, ValueError) as e:
        text = str(e).splitlines()[0][:120] if str(e) else "no message"
        raise TrainError(f"{path}: a damaged checkpoint: its training state does not load ({type(e).__name__}: "
                         f"{text})") from None  # fmt: skip
