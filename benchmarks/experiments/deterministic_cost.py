"""What torch's deterministic CPU kernels cost training, side by side in one run.

    python benchmarks/experiments/deterministic_cost.py [--reps 4] [--episodes 320]

Every training update runs with ``torch.use_deterministic_algorithms(True)`` on the CPU, so that
same-seed runs with two torch threads are identical (``doppler.train.trainer._reproducible``). This runs
the same short training (llama_layer / p100x4, 64 imitation and ``--episodes`` Stage II episodes,
two torch threads, no searches) with the flag and with it made a no-op, interleaved per
repetition (the first repetition is warm-up and not counted), and prints the median episodes per
second of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from doppler import cluster, workloads
from doppler.train import TrainConfig, Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=320)
    args = ap.parse_args()
    real = torch.use_deterministic_algorithms
    g, cl = workloads.build("llama_layer"), cluster("p100x4")
    rates: dict[str, list[float]] = {"deterministic": [], "off": []}
    try:
        for rep in range(args.reps):
            for mode in ("off", "deterministic"):
                torch.use_deterministic_algorithms = real if mode == "deterministic" else (lambda *a, **k: None)
                tr = Trainer.create([g], cl, TrainConfig(il_episodes=64, episodes=args.episodes, seed=rep, search_every=0,
                                                         distill_updates=0, torch_threads=2))  # fmt: skip
                t0 = time.perf_counter()
                tr.run(None)
                rate = (64 + args.episodes) / (time.perf_counter() - t0)
                if rep:
                    rates[mode].append(rate)
                print(f"rep {rep} {mode}: {rate:.1f} episodes/s{' (warm-up)' if rep == 0 else ''}", flush=True)
    finally:
        torch.use_deterministic_algorithms = real
    det, off = statistics.median(rates["deterministic"]), statistics.median(rates["off"])
    print(f"median episodes/s: deterministic {det:.1f}, off {off:.1f}; ratio {det / off:.3f}")


if __name__ == "__main__":
    main()
