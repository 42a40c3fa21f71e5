"""Choose among pretraining checkpoints, or decodes, on a validation split (never the held-out one).

    python benchmarks/experiments/select_checkpoint.py [--split validation|shifted|held_out] [--k 12]
        [--plc default|ties|free|both] CKPT|shipped [CKPT ...]

For each checkpoint: the geometric mean over :func:`doppler.workloads.corpus.validation_split` (``--k``
pairs of the training distribution from a stream no training run draws) of zero-shot greedy /
best cheap method and greedy / critical_path, and the pairs where greedy is not worse than
critical_path. The shipped policy is the one with the lowest first column.
``--split shifted`` judges on :func:`doppler.workloads.corpus.shifted_validation_split` instead: training
graphs on clusters outside both training and the held-out split, for choices that should
transfer. ``--plc``: the device head breaks only its rule's ties (``ties``), chooses freely
(``free``), each in turn (``both``), or as ``doppler assign`` does zero-shot (``default``).
``--split held_out`` reports on the held-out split: for reporting a choice, never for making it.
"""

from __future__ import annotations

import argparse

from doppler.workloads.corpus import held_out_split, shifted_validation_split, validation_split
from feature_ablation import judge, references  # same folder

PLC_CHOICES = {"default": (None,), "ties": (True,), "free": (False,), "both": (False, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("validation", "shifted", "held_out"), default="validation")
    ap.add_argument("--k", type=int, default=12, help="pairs of the validation split")
    ap.add_argument("--plc", choices=tuple(PLC_CHOICES), default="default")
    ap.add_argument("checkpoints", nargs="+", help="checkpoint files, or 'shipped'")
    args = ap.parse_args()
    cases = {"validation": lambda: validation_split(k=args.k), "shifted": shifted_validation_split,
             "held_out": held_out_split}[args.split]()  # fmt: skip
    refs = references(cases)
    print(f"| checkpoint | device head | greedy / best cheap | greedy / critical_path | not worse than critical_path (of {len(refs)}) |")
    print("|---|---|---|---|---|")
    for ck in args.checkpoints:
        for ties in PLC_CHOICES[args.plc]:
            a, b, ok = judge(None if ck == "shipped" else ck, refs, ties)
            head = {None: "default", True: "ties only", False: "free"}[ties]
            print(f"| {ck} | {head} | {a:.3f} | {b:.3f} | {ok} |", flush=True)


if __name__ == "__main__":
    main()
