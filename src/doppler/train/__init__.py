"""Training DOPPLER's policies: the configuration (:mod:`.config`), the tasks a run learns on
(:mod:`.tasks`), the losses (:mod:`.losses`), the trainer and its stages (:mod:`.trainer`), and a
checkpoint's training state checked as it loads (:mod:`.state`).

The names of :mod:`.tasks` and :mod:`.trainer` load with torch when first used, so that the command line
reads the configuration (its options) without importing torch."""

from typing import Any

from doppler.train.config import INIT_SEARCH_EVALS, STAGES, TrainConfig, TrainError, TrainingDiverged

__all__ = ["INIT_SEARCH_EVALS", "STAGES", "CostOracle", "SimulatorOracle", "Task", "TrainConfig", "TrainError",
           "Trainer", "TrainingDiverged", "make_task", "train_and_assign"]


def __getattr__(name: str) -> Any:
    if name in ("CostOracle", "SimulatorOracle", "Task", "make_task"):
        from doppler.train import tasks as module
    elif name in ("Trainer", "train_and_assign"):
        from doppler.train import trainer as module
    else:
        raise AttributeError(f"module 'doppler.train' has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value
