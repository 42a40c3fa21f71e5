"""The local engine's torch device path: on the CPU always (a torch device set), on CUDA where a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest

from doppler import workloads
from doppler.workloads import references
from doppler.engine import EngineError, RunOptions, build_program, run
from doppler.engine.local import HostDevices, run_local
from doppler.hardware.presets import cluster
from tests.engine.test_local import WORKLOADS, _assignments, check_trace, tiny_float64_case

torch = pytest.importorskip("torch")
HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device here")


class TorchCpuDevices(HostDevices):
    """The CUDA device set's data path (torch tensors, torch kernels, tensor copies) on the CPU,
    with its link workers: copies run on one thread per link, as on CUDA devices."""

    device_type = "torch-cpu"
    copies_inbound = False

    def bind_thread(self, key) -> None:
        if isinstance(key, int):  # link threads stay unpinned
            super().bind_thread(key)

    def __init__(self, num_devices: int) -> None:
        from doppler.ir.kernels import TorchOps

        super().__init__(num_devices)
        self.ops = TorchOps("cpu")

    def place(self, array, d):
        return torch.from_numpy(np.array(array, copy=True))

    def empty(self, shape, dtype, d):
        return torch.zeros(shape, dtype=self.ops.dtype(np.dtype(dtype)))

    def kernel(self, prog, v, d, arrays):
        start = self.now()
        out = prog.kernel(v, d, arrays, self.ops)
        end = self.now()
        return out, start, end, end

    def copy(self, dst, src, a, b, k):
        start = self.now()
        dst.copy_(src)
        end = self.now()
        return start, end, end

    def to_host(self, value):
        return value.numpy()


@pytest.mark.parametrize("name", WORKLOADS)
def test_torch_data_path_gives_the_untiled_outputs(name: str) -> None:
    from doppler.workloads.references import assemble_outputs

    g, ref, prog = tiny_float64_case(name)
    for label, dev in _assignments(g, 3).items():
        hw = TorchCpuDevices(3)
        res = run_local(prog.place(dev, 3, hw), timeout_s=60, devices=hw)
        out = assemble_outputs(g, res.values)
        for k in ref:
            np.testing.assert_allclose(out[k], ref[k], rtol=1e-10, atol=1e-12, err_msg=f"{name}/{label}/{k}")
        check_trace(g, res.trace, 3)


def test_ready_time_is_the_last_arrival() -> None:
    g = workloads.build("ffnn", size="tiny")
    dev = np.arange(g.num_ops) % 2
    tr = run(g, dev, num_devices=2).trace
    arrival = tr.arrival_s(g)
    for v in range(g.num_ops):
        preds = [int(u) for u in g.predecessors(v)]
        want = max((arrival[(u, int(dev[v]))] for u in preds), default=0.0)
        assert tr.op_ready[v] == pytest.approx(want, abs=1e-12)


def test_device_type_errors_are_clear() -> None:
    g = workloads.build("ffnn", size="tiny")
    with pytest.raises(EngineError, match="unknown device type 'tpu'"):
        run(g, [0] * g.num_ops, options=RunOptions(device_type="tpu"))
    with pytest.raises(EngineError, match="dask engine runs CPU devices only"):
        run(g, [0] * g.num_ops, options=RunOptions(engine="dask", device_type="cuda"))


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_one_clear_error() -> None:
    g = workloads.build("ffnn", size="tiny")
    with pytest.raises(EngineError, match="no CUDA device is visible"):
        run(g, [0] * g.num_ops, options=RunOptions(device_type="cuda"))


# ---------------------------------------------------------------------------------------- on a GPU
@needs_cuda
@pytest.mark.parametrize("name", WORKLOADS)
def test_cuda_outputs_equal_untiled_numpy(name: str) -> None:
    """Two logical devices (one GPU split, or two GPUs): float64 tiny and float32 small, four assignments."""
    for size, dtype, rtol in (("tiny", np.float64, 1e-10), ("small", np.float32, 1e-3)):
        g = workloads.build(name, size=size)
        x = references.make_inputs(g, seed=0, dtype=np.float64)
        ref = workloads.reference(g, x)
        prog = build_program(g, inputs=x, dtype=dtype)
        for label, dev in _assignments(g, 2).items():
            res = run(g, dev, num_devices=2, program=prog, options=RunOptions(device_type="cuda"))
            assert res.info["device_type"] == "cuda" and len(res.info["devices"]) == 2
            assert res.trace.mode == "engine:local:cuda"
            for k in ref:
                scale = float(np.abs(ref[k]).max())
                np.testing.assert_allclose(res.outputs[k], ref[k], rtol=rtol, atol=rtol * 0.1 * scale,
                                           err_msg=f"{name}/{size}/{label}/{k}")  # fmt: skip
            check_trace(g, res.trace, 2)


@needs_cuda
def test_cuda_synthetic_kernels_last_their_time() -> None:
    g = workloads.build("random", num_ops=12, width=4, seed=3)
    cl = cluster("unit:2")
    comp = cl.compute_time_s(g)[:, 0]
    scale = 0.004 / comp.max()  # the longest op lasts 4 ms
    res = run(g, np.arange(g.num_ops) % 2, cluster=cl, time_scale=scale, options=RunOptions(device_type="cuda"))
    check_trace(g, res.trace, 2)
    dur = res.trace.op_end - res.trace.op_start
    longest = int(np.argmax(comp))
    assert 0.5 * comp[longest] * scale <= dur[longest] <= 2.0 * comp[longest] * scale  # the SM clock varies


@needs_cuda
def test_cuda_repeated_runs_do_not_leak_gpu_memory() -> None:
    g = workloads.build("ffnn", size="small")
    prog = build_program(g)
    dev = np.arange(g.num_ops) % 2
    for _ in range(5):
        run(g, dev, num_devices=2, program=prog, keep_outputs=False, options=RunOptions(device_type="cuda"))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(50):
        run(g, dev, num_devices=2, program=prog, keep_outputs=False, options=RunOptions(device_type="cuda"))
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 1e6


@needs_cuda
def test_cuda_calibration_fits_gpu_devices() -> None:
    from doppler.engine.calibrate import calibrate

    res = calibrate(2, sizes=(64, 128, 256), runs=2, options=RunOptions(device_type="cuda"))
    cl = res.cluster
    assert cl.num_devices == 2 and all(d.kind == "gpu" for d in cl.devices)
    assert cl.meta["device_type"] == "cuda"
    assert np.isfinite(cl.bandwidth_Bps[0, 1]) and cl.bandwidth_Bps[0, 1] > 0
