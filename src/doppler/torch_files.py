"""The one way doppler unpickles a file a user hands it: torch's weights-only loader.

``torch.load(..., weights_only=True)`` resolves no global outside torch's allowlist of tensor and
container types, so a pickle that names any other callable (``os.system``, ``builtins.eval``) is
refused before anything is called. Every checkpoint and every pickled member of a ``.pt2`` archive
goes through :func:`load_plain`; a refusal is one short phrase (:func:`load_failure`), never torch's
advice to retry with ``weights_only=False``, which doppler never does.
"""

from __future__ import annotations

import io
import logging
import re
import warnings
from pathlib import Path
from typing import Any

__all__ = ["load_failure", "load_plain"]


def load_plain(source: str | Path | bytes) -> Any:
    """``torch.load`` of a file or bytes with ``weights_only=True`` onto the CPU; torch's own warnings
    and log lines are silenced (the caller reports one line). Raises what torch raises."""
    import torch

    f = io.BytesIO(source) if isinstance(source, bytes) else source
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        finally:
            logging.disable(logging.NOTSET)


def load_failure(e: BaseException) -> str:
    """:func:`load_plain`'s failure in one short phrase. A weights-only refusal gives the unpickler's
    reason (a file that is not a torch file at all, or one that pickles code)."""

    def first_sentence(text: str) -> str:
        text = re.sub(r"^\s*\[enforce fail at [^\]]*\]", "", text)  # torch's C++ source location
        return " ".join(text.split()).lstrip(" .:").split(". ", 1)[0].rstrip(".")[:120]

    text = str(e)
    if "Weights only load failed" in text:
        paragraphs = re.split(r"\n\s*\n", text.split("WeightsUnpickler error:", 1)[-1])
        reason = next((first_sentence(p) for p in paragraphs
                       if p.strip() and not p.strip().startswith(("Weights only load failed", "Check the documentation"))),
                      "")  # fmt: skip
        return "not a file of plain tensors: " + (reason or "refused by the weights-only loader")
    if isinstance(e, EOFError):
        return "the file ends early: empty or cut short"
    if isinstance(e, OSError) or "PytorchStreamReader" in text:
        return f"a damaged or cut-short zip archive: {first_sentence(text) or type(e).__name__}"
    return f"{type(e).__name__}: {first_sentence(text) or 'no message'}"
