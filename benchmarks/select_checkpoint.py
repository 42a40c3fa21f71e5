"""Choose among pretraining checkpoints on the validation split (never the held-out one).

    python benchmarks/select_checkpoint.py [--split validation|shifted] CKPT [CKPT ...]

For each checkpoint: the geometric mean over :func:`doppler.corpus.validation_split` (pairs of
the training distribution from a stream no training run draws) of zero-shot greedy / best cheap
method and greedy / critical_path. The shipped policy is the one with the lowest first column.
``--split shifted`` judges on :func:`doppler.corpus.shifted_validation_split` instead: training
graphs on clusters outside both training and the held-out split, for choices that should transfer.
"""

from __future__ import annotations

import argparse

from doppler.corpus import shifted_validation_split, validation_split
from feature_ablation import judge, references  # same folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("validation", "shifted"), default="validation")
    ap.add_argument("checkpoints", nargs="+")
    args = ap.parse_args()
    refs = references(validation_split() if args.split == "validation" else shifted_validation_split())
    print("| checkpoint | greedy / best cheap | greedy / critical_path |")
    print("|---|---|---|")
    for ck in args.checkpoints:
        a, b = judge(ck, refs)
        print(f"| {ck} | {a:.3f} | {b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
