"""Stage III where the simulator is wrong about the real system, in two scenarios.

    python benchmarks/stage3_real.py --scenario shared-cores|free-links|split-gpu [--episodes 1000]
                                             [--real-episodes 256] [--real-lr 3e-4] [--repeats 7]

* ``shared-cores`` (ffnn, size small): the simulator is given 4 *independent* CPU
  devices, each as fast as one calibrated device of this machine (``doppler
  calibrate --devices 2``), so it believes spreading over 4 devices halves the
  makespan; the engine really runs 4 device threads on 2 cores.
* ``free-links`` (ffnn, size tiny: ops of microseconds): the simulator's cluster has
  the calibrated devices but free links (no latency, unbounded bandwidth), so it
  believes spreading ops over both devices pays; on the engine every cross-device
  hand-off costs tens of microseconds, more than most ops.
* ``split-gpu`` (ffnn at its paper size, needs CUDA): one GPU split into 2 logical
  devices (``--device-type cuda``), calibrated with ``doppler calibrate``; the
  simulator treats them as independent devices, but their kernels share the GPU's
  multiprocessors, so running ops side by side gains far less than it predicts.

DOPPLER is trained with Stage I + II on the simulator; then Stage III fine-tunes on
measured makespans. Both greedy decodes, and the best assignment Stage III measured,
are then measured side by side (``--repeats`` interleaved runs each, median) and
simulated.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from doppler import workloads
from doppler.engine import RunOptions, build_program, run
from doppler.engine.calibrate import calibrate
from doppler.hardware.cluster import Cluster
from doppler.sim import simulate
from doppler.train import Trainer, TrainConfig


def assumed_independent(cal: Cluster, num_devices: int) -> Cluster:
    """``num_devices`` copies of the calibrated device 0, every link the calibrated links' mean."""
    off = ~np.eye(cal.num_devices, dtype=bool)
    bw = np.full((num_devices, num_devices), float(np.mean(cal.bandwidth_Bps[off])))
    lat = np.full((num_devices, num_devices), float(np.mean(cal.latency_s[off])))
    from dataclasses import replace

    devices = [replace(cal.devices[0], name=f"cpu{d}") for d in range(num_devices)]
    return Cluster(f"cpu{num_devices}-assumed-independent", devices, bw, lat, meta={"from": cal.name})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=("shared-cores", "free-links", "split-gpu"), default="shared-cores")
    ap.add_argument("--workload", default="ffnn")
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--il-episodes", type=int, default=256)
    ap.add_argument("--real-episodes", type=int, default=256)
    ap.add_argument("--real-lr", type=float, default=TrainConfig.real_lr)
    ap.add_argument("--real-eps", type=float, default=TrainConfig.real_eps)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device_type = "cuda" if args.scenario == "split-gpu" else "cpu"
    sizes = (1024, 2048, 4096, 8192) if device_type == "cuda" else (128, 256, 512, 1024)
    cal = calibrate(2, runs=3, sizes=sizes, options=RunOptions(device_type=device_type)).cluster
    if args.scenario == "shared-cores":
        cl, size = assumed_independent(cal, 4), "small"
    elif args.scenario == "split-gpu":
        cl, size = cal, "paper"
    else:
        free = np.where(np.eye(2, dtype=bool), np.inf, 1e15)
        cl, size = Cluster("calibrated-free-links", cal.devices, free, np.zeros((2, 2))), "tiny"
    D = cl.num_devices
    g = workloads.build(args.workload, size=size)
    cfg = TrainConfig(stages=("il", "sim"), episodes=args.episodes, il_episodes=args.il_episodes,
                      real_episodes=args.real_episodes, real_lr=args.real_lr, real_eps=args.real_eps, seed=args.seed,
                      engine_device_type=device_type)  # fmt: skip
    trainer = Trainer.create([g], cl, cfg)
    t0 = time.perf_counter()
    trainer.run()
    sim_s = time.perf_counter() - t0
    task = trainer.tasks[0]
    before, _ = trainer.greedy(task)
    trainer.cfg.stages = ("real",)
    t0 = time.perf_counter()
    trainer.run()
    real_s = time.perf_counter() - t0
    after, _ = trainer.greedy(task)
    cases = {"all on device 0": np.zeros(g.num_ops, np.int64), "greedy after Stage II (simulator)": before, "greedy after Stage III (engine)": after,
             "best measured during Stage III": task.best_assignment}  # fmt: skip
    prog = build_program(g)
    measured: dict[str, list[float]] = {k: [] for k in cases}
    kw = {"num_devices": D, "program": prog, "keep_outputs": False, "options": RunOptions(device_type=device_type)}
    run(g, before, **kw)  # warm-up
    for _ in range(args.repeats):
        for k, a in cases.items():
            measured[k].append(run(g, a, **kw).makespan_s)
    where = "one GPU split in two" if device_type == "cuda" else "this machine's cores"
    print(f"{args.workload} ({size}, {g.num_ops} ops): simulator cluster {cl.name}, engine: {D} {device_type} devices on "
          f"{where}; Stage I+II {sim_s:.0f} s, Stage III {args.real_episodes} episodes "
          f"(lr {args.real_lr:g}, eps {args.real_eps:g}) in {real_s:.0f} s")
    print(f"{'assignment':<36} {'devices used':>12} {'transfers':>9} {'simulated':>10} {'measured (median)':>18}")
    for k, a in cases.items():
        tr = simulate(g, cl, a, trace=True, link_contention=True).trace
        used = len(np.unique(a))
        print(f"{k:<36} {used:>12} {tr.num_transfers:>9} {tr.makespan_s * 1e3:>8.2f}ms "
              f"{np.median(measured[k]) * 1e3:>16.2f}ms")


if __name__ == "__main__":
    main()
