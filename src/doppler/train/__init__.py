"""Training DOPPLER's policies: the configuration (:mod:`.config`), the tasks a run learns on
(:mod:`.tasks`), the losses (:mod:`.losses`), the trainer and its stages (:mod:`.trainer`), and a
checkpoint's training state checked as it loads (:mod:`.state`)."""

from doppler.train.config import INIT_SEARCH_EVALS, STAGES, TrainConfig, TrainError, TrainingDiverged
from doppler.train.tasks import CostOracle, SimulatorOracle, Task, make_task
from doppler.train.trainer import Trainer, train_and_assign

__all__ = ["INIT_SEARCH_EVALS", "STAGES", "CostOracle", "SimulatorOracle", "Task", "TrainConfig", "TrainError",
           "Trainer", "TrainingDiverged", "make_task", "train_and_assign"]
