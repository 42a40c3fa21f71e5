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
from doppler.cli._common import app, err_console


def main() -> None:
    """Console-script entry point. A usage error (an unknown option, a value of the wrong type, a missing
    argument) is one line and exit 2, as every other bad input is, not click's boxed usage message."""
    import sys

    from rich.markup import escape

    gc.freeze()  # what the imports made lives as long as the process: keep it out of every collection
    try:
        code = app(standalone_mode=False)  # (click's exceptions come to us instead of printing themselves)
    except Exception as e:  # click's own: typer vendors click, so they are recognised by their interface
        if type(e).__name__ == "Abort":  # Ctrl-C or end of input outside a command's own handling
            err_console.print("[bold red]interrupted[/]", markup=True)
            sys.exit(130)
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
            raise
        if not e.format_message():  # a group run without a command: its help is on screen already
            sys.exit(e.exit_code)
        ctx = getattr(e, "ctx", None)
        see = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        err_console.print(f"[bold red]error:[/] {escape(e.format_message())}{escape(see)}", markup=True,
                          highlight=False, soft_wrap=True)  # fmt: skip
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
