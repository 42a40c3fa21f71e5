"""engine/oracle.py directly: the Stage III cost oracle measures real runs."""

from __future__ import annotations

import time

import numpy as np
import pytest

from doppler import workloads
from doppler.engine import EngineError
from doppler.engine.oracle import EngineOracle
from doppler.engine.program import synthetic_kernel
from doppler.ir.graph import from_edges
from doppler.hardware.cluster import homogeneous
from doppler.hardware.presets import cluster


def test_engine_oracle_measures_a_batch() -> None:
    g = workloads.build("ffnn", size="tiny")
    oracle = EngineOracle(g, cluster("cpu4:2"), repeats=2)
    mk = oracle.evaluate(np.stack([np.zeros(g.num_ops, np.int64), np.arange(g.num_ops) % 2]))
    assert mk.shape == (2,) and (mk > 0).all()
    assert oracle.calls == 1 and oracle.runs == 4  # two rows, two measured runs each
    with pytest.raises(EngineError, match="shape"):
        oracle.evaluate(np.zeros((1, 3), np.int64))


def _spun_s(seconds: float) -> float:
    """How long the synthetic kernel of ``seconds`` takes now, on this core."""
    t0 = time.perf_counter()
    synthetic_kernel(seconds, 0)
    return time.perf_counter() - t0


def test_a_serial_chain_measures_at_least_its_spun_compute() -> None:
    # three synthetic ops of 20 ms each, one after another: no assignment runs them faster than the
    # three spins take. The spin's rate is measured once per process, so on a machine whose load
    # drops the spins run short of 60 ms: the floor is also what they take next to the runs
    g = from_edges([0.02, 0.02, 0.02], [(0, 1), (1, 2)], output_bytes=[8, 8, 0])
    oracle = EngineOracle(g, homogeneous("h", 2, flops_per_s=1.0, bandwidth_Bps=1e9))
    before = _spun_s(0.06)
    mk = oracle.evaluate(np.array([[0, 0, 0], [0, 1, 0]]))
    floor_s = min(0.06, before, _spun_s(0.06))
    assert (mk >= 0.95 * floor_s).all() and (mk < 10.0).all()


@pytest.mark.parametrize(("kw", "match"), [({"repeats": 0}, "repeats"), ({"engine": "mpi"}, "engine"),
                                           ({"timeout_s": 0.0}, "timeout")])  # fmt: skip
def test_bad_options_fail_before_any_run(kw, match) -> None:
    with pytest.raises(EngineError, match=match):
        EngineOracle(workloads.build("ffnn", size="tiny"), cluster("cpu4:2"), **kw)
