"""Choose among pretraining checkpoints on the validation split (never the held-out one).

    python benchmarks/select_checkpoint.py CKPT [CKPT ...]

For each checkpoint: the geometric mean over :func:`doppler.corpus.validation_split` (pairs of
the training distribution from a stream no training run draws) of zero-shot greedy / best cheap
method and greedy / critical_path. The shipped policy is the one with the lowest first column.
"""

from __future__ import annotations

import sys

from doppler.corpus import validation_split
from feature_ablation import judge, references  # same folder


def main() -> None:
    refs = references(validation_split())
    print("| checkpoint | greedy / best cheap | greedy / critical_path |")
    print("|---|---|---|")
    for ck in sys.argv[1:]:
        a, b = judge(ck, refs)
        print(f"| {ck} | {a:.3f} | {b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
