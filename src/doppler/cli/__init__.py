"""The ``doppler`` command. Each command group lives in its own module and registers
itself on the shared typer app when imported here."""

from __future__ import annotations

from doppler.cli import (  # noqa: F401  (registers the commands)
    assign_cmds,
    demo_cmd,
    engine_cmds,
    graph_cmds,
    info_cmds,
    pretrain_cmd,
    simulate_cmd,
    train_cmd,
)
from doppler.cli._common import app


def main() -> None:
    """Console-script entry point."""
    app()
