"""The ``doppler`` command. Each command group lives in its own module and registers
itself on the shared typer app when imported here. The command modules do without
``from __future__ import annotations``: typer would then compile and evaluate every
parameter's annotation from its text at each start (20 ms of every command)."""

from __future__ import annotations

import gc

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
    gc.freeze()  # what the imports made lives as long as the process: keep it out of every collection
    app()
