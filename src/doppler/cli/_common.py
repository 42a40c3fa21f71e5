"""Shared pieces of the ``doppler`` command: the typer app, output and error handling.

Conventions (docs/design.md, Command-line and file contracts): a human summary by default, exactly one JSON value on
stdout with ``--json``; exit 0 on success, 2 on bad input (one line naming the
file/line/op), 1 on internal failure.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import re
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape

from doppler.util.io import OutputLock, OutputPathError, check_outputs_apart, to_jsonable
from doppler.memory import DEFAULT_MEMORY_FRACTION, MEMORY_FRACTION_HELP

#: the `--json` option every command takes
JSON_OPT = typer.Option(False, "--json", help="Print exactly one JSON value on stdout.")

app = typer.Typer(
    name="doppler",
    help="Learn where each op of a dataflow graph should run on a work-conserving multi-device engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
graph_app = typer.Typer(help="Build, inspect, convert and draw dataflow graphs.", no_args_is_help=True)
app.add_typer(graph_app, name="graph")

# piped (not a terminal): no wrapping at 80 columns inside file names, no truncated table cells
# Markup only where a line asks for it (``markup=True``, each name, path or message in it through
# ``escape``): paths and names may hold square brackets, which rich would read as markup and drop.
# No emoji codes either: rich would print the file "a:fire:b.json" as "a🔥b.json".
_PLAIN = {"markup": False, "emoji": False}
console = Console(**_PLAIN) if sys.stdout.isatty() else Console(width=1000, **_PLAIN)
err_console = Console(stderr=True, **_PLAIN) if sys.stderr.isatty() else Console(stderr=True, width=1000, **_PLAIN)


class UserError(Exception):
    """A mistake in what the user asked for; reported in one line with exit code 2."""


@contextlib.contextmanager
def as_user_error(*types: type[BaseException]) -> Iterator[None]:
    """An exception of ``types`` raised inside is bad input: a :class:`UserError` with its message."""
    try:
        yield
    except types as e:
        raise UserError(str(e)) from None


def user_error_types() -> tuple[type[BaseException], ...]:
    """Every exception type that means bad input rather than a bug."""
    from doppler.ir.assignment import AssignmentError
    from doppler.ir.graph import GraphError
    from doppler.hardware.cluster import ClusterError

    types: list[type[BaseException]] = [UserError, GraphError, AssignmentError, ClusterError, FileNotFoundError,
                                        IsADirectoryError, NotADirectoryError, PermissionError, OutputPathError]  # fmt: skip
    with contextlib.suppress(ImportError):
        from doppler.workloads import WorkloadError

        types.append(WorkloadError)
    with contextlib.suppress(ImportError):
        from doppler.sim import SimulationError

        types.append(SimulationError)
    with contextlib.suppress(ImportError):
        from doppler.methods import MethodError

        types.append(MethodError)
    with contextlib.suppress(ImportError):
        from doppler.engine import EngineError

        types.append(EngineError)
    with contextlib.suppress(ImportError):
        from doppler.report import FigureFormatError

        types.append(FigureFormatError)
    return tuple(types)


#: a line break and the blanks around it: every character at which ``str.splitlines`` (and a terminal or a log
#: reader) may end a line, not only "\n" (a key "\x1e" in a cluster file once split an error line in two)
LINE_BREAK = re.compile(r"\s*[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]\s*")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """Warnings as one clean line on stderr (no source file, no code line)."""
    text = re.sub(LINE_BREAK, " ", str(message).strip())
    err_console.print(f"[yellow]warning:[/] {escape(text)}", markup=True, highlight=False, soft_wrap=True)


#: the graph argument of the commands that read one (typer reads a shared default as it builds each command)
GRAPH_ARG = typer.Argument(..., metavar="G", help="Graph file (.json or .txt).")
#: the cluster option of the commands that need one
CLUSTER_OPT = typer.Option(..., "--cluster", "-c", help="Cluster preset (p100x4, h100x8, unit:8, ...: `doppler clusters`) "
                           "or cluster JSON file.")

@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Turn user mistakes into exit 2 with one line, anything else into exit 1; warnings print as one line."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            yield
    except typer.Exit:
        raise
    except user_error_types() as e:
        if isinstance(e, FileNotFoundError):
            msg = f"{e.filename or e}: no such file"
        elif isinstance(e, OSError):  # a directory or an unreadable file given as an input
            msg = f"{e.filename}: {e.strerror}" if e.filename else str(e)
        else:
            msg = str(e)
        msg = re.sub(LINE_BREAK, " ", msg.strip())  # one line, whatever a file's quoted text holds
        err_console.print(f"[bold red]error:[/] {escape(msg)}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]", markup=True)
        raise typer.Exit(130) from None
    except Exception as e:  # noqa: BLE001 - last-resort report of a bug
        first = re.split(LINE_BREAK, str(e).strip())[0]  # (one line: torch's errors append a table of 100 lines)
        err_console.print(f"[bold red]internal error:[/] {type(e).__name__}: {escape(first)}", markup=True,
                          highlight=False, soft_wrap=True)  # fmt: skip
        raise typer.Exit(1) from None


def hold_outputs(ctx: typer.Context, dirs: dict[str, Any] | None = None, files: dict[str, Any] | None = None,
                 inputs: dict[str, Any] | None = None, members: Iterable[str] = ()) -> None:  # fmt: skip
    """One writer per output: lock each output directory of ``dirs`` and file of ``files`` ({label: path};
    ``None`` paths skipped; a label names the option in a refusal, "" none) with an
    :class:`~doppler.util.io.OutputLock`, now, before the command's work, and hold them until the command
    ends (its context ``ctx`` closes: at its end, on an error, on Ctrl-C). An output another live doppler
    process holds, or one inside a directory it holds, or a directory it writes inside, is an
    :class:`~doppler.util.io.OutputPathError` (exit 2) at once; so is a symbolic link at an output, at a lock
    file or at ``members`` (the names the command writes in each of ``dirs``). The command's own outputs do
    not block each other. With ``inputs`` (the command's input files, {label: path}), the ``files`` are first
    checked apart from them and from each other, and writable (:func:`~doppler.util.io.check_outputs_apart`)."""
    if inputs is not None:
        check_outputs_apart(inputs, files or {})
    held: list[OutputLock] = []
    for directory, outputs in ((True, dirs or {}), (False, files or {})):
        for label, path in outputs.items():
            if path is not None:
                lock = OutputLock(path, directory=directory, label=label, members=members if directory else (),
                                  alongside=held)  # fmt: skip
                held.append(ctx.with_resource(lock))


#: seconds between the plain progress lines of :func:`live_progress` when stderr is not a terminal
PLAIN_PROGRESS_EVERY_S = 60.0

MEMORY_FRACTION_OPT = typer.Option(DEFAULT_MEMORY_FRACTION, "--memory-fraction", show_default=False,
                                   help=MEMORY_FRACTION_HELP.format(default=DEFAULT_MEMORY_FRACTION))
IGNORE_MEMORY_OPT = typer.Option(False, "--ignore-memory", help="Place and run without the memory budget: a placement that does not fit is only a warning.")


def config_options(options: Sequence[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A typer command whose parameter ``options`` stands for one option per item of ``options`` (the
    :class:`~doppler.train.config.CommandOption` of each configuration field the command sets): its names and
    help come from the field, and it defaults to None. The command receives ``options`` as a dict of the
    fields given on the command line (field -> value, read by the field's type), the others left out."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(command).parameters.values())
        at = next(i for i, p in enumerate(params) if p.name == "options")
        generated = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[o.value_type],
                                       default=typer.Option(None, *o.decls, help=o.help, show_default=False))
                     for o in options]  # fmt: skip

        @functools.wraps(command)
        def with_options(**kw: Any) -> Any:
            given = {o.name: o.read(kw[o.name]) for o in options if kw[o.name] is not None}
            return command(**{k: v for k, v in kw.items() if k not in {o.name for o in options}}, options=given)

        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
        with_options.__signature__ = inspect.Signature(own[:at] + generated + own[at + 1:])  # type: ignore[attr-defined]
        return with_options

    return decorate


def memory_check(graph: Any, cl: Any, result: Any, memory_fraction: float, ignore: bool, what: str) -> Any:
    """A traced run's memory against the budget (:class:`doppler.memory.MemoryCheck`). Over budget: exit 2
    naming the device, or, with ``ignore`` (``--ignore-memory``), a one-line warning."""
    from doppler.memory import MemoryBudgetError, check
    from doppler.report import memory_overruns

    with as_user_error(MemoryBudgetError):
        chk = check(graph, cl, result.resident_bytes, result.peak_memory_bytes, memory_fraction)
    if not chk.feasible:
        msg = f"{what} does not fit: {'; '.join(memory_overruns(chk))}"
        if not ignore:
            raise UserError(msg + " (--ignore-memory runs it anyway)")
        warnings.warn(msg, stacklevel=2)
    return chk


def load_graph_and_cluster(graph_path: Any, cluster_name: str) -> tuple[Any, Any]:
    """The graph file and the cluster (a preset or a JSON file) a command works on, read in that order."""
    from doppler.ir.formats import load_graph
    from doppler.hardware.presets import cluster

    return load_graph(graph_path), cluster(cluster_name)


def emit_json(obj: Any) -> None:
    """Print exactly one JSON value on stdout."""
    sys.stdout.write(json.dumps(to_jsonable(obj)) + "\n")
    sys.stdout.flush()


def write_trace_files(trace, graph, device_names: list[str], out: dict[str, Any], *, trace_path=None,
                      chrome_path=None, csv_path=None) -> list[tuple[str, Any]]:  # fmt: skip
    """Write the requested trace exports (JSON with op names, Chrome trace, per-op CSV); record them in ``out``."""
    written = []
    for path, key, label, save in (
        (trace_path, "trace", "trace", lambda p: trace.save(p, graph, len(device_names))),
        (chrome_path, "chrome_trace", "chrome trace (Perfetto, chrome://tracing)",
         lambda p: trace.save_chrome_trace(p, graph, device_names)),
        (csv_path, "ops_csv", "per-op table", lambda p: trace.save_ops_csv(p, graph)),
    ):  # fmt: skip
        if path is not None:
            save(path)
            out[key] = str(path)
            written.append((label, path))
    return written


@contextlib.contextmanager
def live_progress(describe: Any = None, *, labels: dict[str, str] | None = None, counts: bool = False,
                  quiet: bool = False, keep: bool = False) -> Iterator[Any]:  # fmt: skip
    """The one live display of long work: a rich Progress on stderr with one bar per task of the
    :class:`~doppler.util.progress.ProgressEvent` stream; yields the callback that drives it.

    ``describe(event) -> str`` writes the bar's status text; ``labels`` names the tasks;
    ``counts`` shows "done/total"; ``quiet`` draws nothing (``--json``); ``keep`` leaves the bars
    on screen when done (training), else they vanish. When stderr is not a terminal (a log file, CI),
    the bars are not drawn; instead one plain line says where the work stands every
    :data:`PLAIN_PROGRESS_EVERY_S` seconds, so that a long run's log shows it is alive."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn)  # fmt: skip

    columns = [SpinnerColumn(), TextColumn("[bold]{task.description}[/]"), BarColumn()]
    columns += [MofNCompleteColumn()] if counts else []
    columns += [TextColumn("{task.fields[status]}"), TimeElapsedColumn()]
    plain = not quiet and not err_console.is_terminal
    started = last_line = time.monotonic()
    with Progress(*columns, console=err_console, transient=not keep,
                  disable=quiet or not err_console.is_terminal) as progress:  # fmt: skip
        bars: dict[str, Any] = {}

        def on_progress(ev: Any) -> None:
            nonlocal last_line
            label = (labels or {}).get(ev.task, ev.task)
            if ev.task not in bars:
                bars[ev.task] = progress.add_task(label, total=ev.total, status="")
            done = ev.done if ev.total is None else min(ev.done, ev.total)
            status = describe(ev) if describe else ""
            progress.update(bars[ev.task], completed=done, total=ev.total, status=status)
            now = time.monotonic()
            if plain and now - last_line >= PLAIN_PROGRESS_EVERY_S:
                last_line = now
                from rich.text import Text

                count = f" {done:g}/{ev.total:g}" if counts and ev.total is not None else ""
                line = f"[{(now - started) / 60:.0f} min] {label}{count} {Text.from_markup(status).plain}"
                err_console.print(line.rstrip(), markup=False, highlight=False, soft_wrap=True)

        yield on_progress
