"""Shared test settings.

Hypothesis: no per-example deadline anywhere (the first simulation in a process
compiles or loads numba loops, which can take seconds on a cold machine), and
under CI (``CI=true``) a derandomised, fixed set of examples so a landing never
depends on a random draw; locally, examples stay random to keep finding bugs.
``make fuzz`` sets ``DOPPLER_FUZZ_EXAMPLES``: the ``fuzz`` profile then runs that many random examples
per fuzz test (tests/fuzz, docs/fuzzing.md), even under CI.

OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``, unless set already): torch and numba
both use OpenMP, whose threads otherwise spin after each parallel region and take the cores that the
other pytest-xdist worker's threads need. Measured on 2 cores with ``-n 2``: the whole suite 873 s ->
341 s, two training tests side by side 72 s -> 9 s each. It must be set before torch is imported,
hence here. (A single process trains about a third slower with it, so doppler itself does not set it.)

typer's ``CliRunner.invoke`` builds the whole click command tree from the app on every call (every
command's parameters from its signature and type hints: 17 ms, most of a fuzz example's time).
Here it is built once per app and kept while the app's commands stay the same: the commands that
run are the same objects ``doppler`` builds once per process.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer.testing  # noqa: E402

_build_command = typer.testing._get_command
_built: dict = {}


def _command_of(app):
    """``app``'s click command, built again only when commands or groups were added to it."""
    shape = (len(app.registered_commands), len(app.registered_groups), app.registered_callback)
    if app not in _built or _built[app][0] != shape:
        _built[app] = (shape, _build_command(app))
    return _built[app][1]


typer.testing._get_command = _command_of

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.register_profile("fuzz", parent=settings.get_profile("dev"), print_blob=True,
                          max_examples=int(os.environ.get("DOPPLER_FUZZ_EXAMPLES") or 100))
if os.environ.get("DOPPLER_FUZZ_EXAMPLES"):
    settings.load_profile("fuzz")
else:
    settings.load_profile("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev")
