"""The one error of ``doppler graph import``: :class:`GraphImportError`, a model that cannot be imported,
with a message that says what and where (the command exits 2 with it), and :func:`one_line`, which
condenses a third-party exception to one line of it."""

from __future__ import annotations


class GraphImportError(ValueError):
    """A model that cannot be imported; the message says what and where (exit code 2)."""


def one_line(e: BaseException) -> str:
    """``e`` as ``"Type: first line of its message"``, at most 300 characters."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
