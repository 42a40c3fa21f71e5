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

from doppler.policy.checkpoint import weight_fault
from doppler.train.config import MAX_RUN_COUNT, RULE_TEACHER, TrainConfig, TrainError
from doppler.train.tasks import Task


def finite(value: Any, name: str, *, positive: bool = False) -> float:
    """``value`` as a float: ValueError naming ``name`` unless it is a finite number (and > 0 with ``positive``)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or (positive and not value > 0)):  # fmt: skip
        raise ValueError(f"{name} is {value!r}, not a finite number{' > 0' if positive else ''}")
    return float(value)


def count(value: Any, name: str, most: int = MAX_RUN_COUNT) -> int:
    """``value`` as an int: ValueError naming ``name`` unless it is an integer from 0 to ``most``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= most:
        raise ValueError(f"{name} is {shown(value)}, not an integer from 0 to {most:,}")
    return int(value)


def shown(value: Any) -> str:
    """A loaded value in a message: a tensor's kind, or the value itself cut to 40 characters."""
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def check_counters(ck: dict[str, Any], cfg: TrainConfig, num_tasks: int) -> None:
    """A ``doppler train`` checkpoint's episode and update counters against the configuration it was saved with
    (``cfg``): each at most the stage's total plus one update's episodes short of another (an update counts
    all its episodes, so a stage ends at most that far past its total). ValueError naming the first that is not."""
    per_il_update = (cfg.il_batch if cfg.teacher == RULE_TEACHER else 1) * num_tasks
    for key, total, step in (("il_episode", cfg.il_episodes, per_il_update), ("episode", cfg.episodes, cfg.batch * num_tasks),
                             ("real_episode", cfg.real_episodes, cfg.batch * num_tasks),
                             ("distill_step", cfg.distill_updates, 1)):  # fmt: skip
        count(ck.get(key, 0), key, total + step - 1)


def check_weights(weights: Any, policy: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """``weights``, a saved copy of ``policy``'s own (distillation's best so far), as the policy holds them: each
    of its weights, a tensor of its shape and of real numbers, every one finite. ValueError naming the first
    that is not (a NaN weight loaded at the end of distillation would be saved as the run's policy)."""
    own = policy.state_dict()
    if not isinstance(weights, dict) or set(weights) != set(own):
        raise ValueError(f"{name} does not hold the policy's weights")
    fault = weight_fault(weights)
    if fault is not None:
        raise ValueError(f"{name} {fault}")
    bad = next((k for k, mine in own.items() if not torch.is_tensor(weights[k]) or weights[k].shape != mine.shape), None)
    if bad is not None:
        raise ValueError(f"{name} weight {bad!r} is {shown(weights[bad])}, not of shape {list(own[bad].shape)}")
    return {k: weights[k].to(mine.dtype) for k, mine in own.items()}


def check_torch_rng(value: Any) -> torch.Tensor:
    """A saved state of torch's CPU generator: a uint8 tensor of the length of this torch's own (torch itself checks
    the Mersenne Twister state it holds). ValueError if not."""
    own = torch.get_rng_state()
    if not (torch.is_tensor(value) and value.dtype == own.dtype and value.shape == own.shape):
        raise ValueError(f"torch_rng is {shown(value)}, not torch's CPU generator state (a {own.dtype} tensor of "
                         f"shape {list(own.shape)})")  # fmt: skip
    return value


#: the state of numpy's PCG64 generator (``Generator.bit_generator.state``): the bounds of each integer in it
_PCG64_STATE = {"state": 2**128, "inc": 2**128}


def check_numpy_rng(value: Any, name: str) -> dict[str, Any]:
    """A saved ``bit_generator.state`` of numpy's default generator (PCG64), as numpy would take it only in part:
    it accepts a float, a wider integer or ``has_uint32`` 5 and truncates them. ValueError naming ``name`` if
    not exactly such a state."""
    def whole(v: Any, below: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < below

    ok = (isinstance(value, dict) and set(value) == {"bit_generator", "state", "has_uint32", "uinteger"}
          and value["bit_generator"] == "PCG64" and isinstance(value["state"], dict)
          and set(value["state"]) == set(_PCG64_STATE)
          and all(whole(value["state"][k], b) for k, b in _PCG64_STATE.items()) and value["state"]["inc"] % 2 == 1
          and whole(value["has_uint32"], 2) and whole(value["uinteger"], 2**32))  # fmt: skip
    if not ok:
        raise ValueError(f"{name} is not the state of numpy's PCG64 generator (its state and an odd increment below "
                         "2**128, has_uint32 0 or 1, uinteger below 2**32)")  # fmt: skip
    return value


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


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _same(value: Any, own: Any) -> bool:
    """Whether a loaded optimizer setting is the optimizer's own (a tuple and a list alike)."""
    if isinstance(own, (tuple, list)):
        return isinstance(value, (tuple, list)) and len(value) == len(own) and all(map(_same, value, own))
    return type(value) is type(own) and value == own


#: the Adam setting a checkpoint may hold a value of its own for (set again before every update), with its range;
#: every other one (betas, eps, weight decay, the flags) is torch's default, which doppler never changes, and must
#: be the optimizer's own (an eps of 1e-300 made the first step inf)
_ADAM_NUMBERS = {"lr": ("a learning rate in [0, 1]", lambda v: _number(v) and 0 <= v <= 1)}


def load_optimizer_state(optimizer: torch.optim.Adam, state: dict[str, Any]) -> None:
    """A checkpoint's Adam state into ``optimizer``, checked as its next step will use it: each group's learning rate
    in range and its other settings the optimizer's own (:data:`_ADAM_NUMBERS`); each parameter's state the step count
    (a whole number from 0 to :data:`MAX_RUN_COUNT`) and the moments (real, finite, of its shape; the second
    moments >= 0). torch checks only that the groups hold as many parameters and casts what it loads to the
    parameters' type (a complex moment to its real part, 1e300 to inf), so anything else was an error or a NaN
    weight in the next step. ValueError naming the first setting or tensor that does not hold."""
    own = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    saved = state.get("state") if isinstance(state, dict) else None
    for st in saved.values() if isinstance(saved, dict) else ():  # before torch casts them: real numbers only
        for name, value in st.items() if isinstance(st, dict) else ():
            if torch.is_tensor(value) and not value.is_floating_point():
                raise ValueError(f"the optimizer's {name} is {shown(value)}, not a tensor of real numbers")
    optimizer.load_state_dict(state)
    for group, settings in zip(optimizer.param_groups, own):
        for key, mine in settings.items():
            value = group.get(key)
            what, ok = _ADAM_NUMBERS.get(key, (f"{mine!r}, the optimizer's own", lambda v: _same(v, mine)))
            if not ok(value):
                raise ValueError(f"the optimizer's {key} is {shown(value)}, not {what}")
        moments = {"exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if group["amsgrad"] else set())
        for i, param in enumerate(group["params"]):
            st = optimizer.state.get(param)
            if not st:  # (a parameter that has not stepped yet)
                continue
            if set(st) != moments | {"step"}:
                raise ValueError(f"the optimizer's state of a parameter holds {sorted(st)}, not "
                                 f"{sorted(moments | {'step'})}")  # fmt: skip
            for name, value in st.items():
                _check_adam_tensor(name, value, param, f"the optimizer's {name} of parameter {i}")


def _check_adam_tensor(name: str, value: Any, param: torch.Tensor, where: str) -> None:
    shape = torch.Size([]) if name == "step" else param.shape
    if not (torch.is_tensor(value) and value.is_floating_point() and value.shape == shape):
        raise ValueError(f"{where} is {shown(value)}, not a tensor of real numbers of shape {list(shape)}")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{where} holds values that are not finite numbers (NaN or inf)")
    if name == "step" and not (float(value) == int(value) and 0 <= int(value) <= MAX_RUN_COUNT):
        raise ValueError(f"{where} is {float(value)!r}, not a step count from 0 to {MAX_RUN_COUNT:,}")
    if name != "step" and name != "exp_avg" and bool((value < 0).any()):
        raise ValueError(f"{where} holds negative values (a mean of squares is >= 0)")


@contextlib.contextmanager
def loading_state(path: str | Path) -> Iterator[None]:
    """A checkpoint's training state (optimizer, generators, counters, per-graph records) going into a trainer:
    what does not fit, being damaged, is a TrainError naming the file, not torch's or numpy's own error."""
    try:
        yield
    except (AttributeError, IndexError, KeyError, OverflowError, RuntimeError, TypeError, ValueError) as e:
        text = str(e).splitlines()[0][:200] if str(e) else "no message"
        raise TrainError(f"{path}: a damaged checkpoint: its training state does not load ({type(e).__name__}: "
                         f"{text})") from None  # fmt: skip
