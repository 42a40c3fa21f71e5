"""The ``doppler`` command. Each command group lives in its own module and registers
itself on the shared typer app when imported here."""

from __future__ import annotations

import contextlib
import importlib

from doppler.cli._common import app

for _module in ("graph_cmds", "simulate_cmd", "assign_cmds"):
    with contextlib.suppress(ModuleNotFoundError):
        importlib.import_module(f"doppler.cli.{_module}")


def main() -> None:
    """Console-script entry point."""
    app()
