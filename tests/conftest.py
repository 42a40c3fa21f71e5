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

numba: a whole-suite run with pytest-xdist compiles the loops once, split over the cores, before
the workers' first test (tests/numba_warmup.py); ``DOPPLER_TEST_WARMUP=0`` turns that off, ``=1`` on
for any run with workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.register_profile("fuzz", parent=settings.get_profile("dev"), print_blob=True,
                          max_examples=int(os.environ.get("DOPPLER_FUZZ_EXAMPLES") or 100))
if os.environ.get("DOPPLER_FUZZ_EXAMPLES"):
    settings.load_profile("fuzz")
else:
    settings.load_profile("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev")


#: the environment variable that hands the warm-up's folder from pytest-xdist's controller to its workers
WARMUP_ENV = "DOPPLER_TEST_WARMUP_DIR"
#: the longest a worker waits for the warm-up (then it compiles what it needs itself)
WARMUP_WAIT_S = 600.0
TESTS = Path(__file__).resolve().parent


def _whole_suite_on_workers(config) -> bool:
    """Whether this is pytest-xdist's controller, with workers, running the whole suite (no paths
    below tests/ named): a run of a few tests does not pay for compiling every loop."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return False
    if os.environ.get("DOPPLER_TEST_WARMUP") == "0" or os.environ.get("NUMBA_DISABLE_JIT", "0") != "0":
        return False
    if os.environ.get("DOPPLER_TEST_WARMUP") == "1":
        return True
    named = [Path(a.split("::")[0]).resolve() for a in config.args]
    return all(p in (TESTS, TESTS.parent) for p in named)


def pytest_configure(config) -> None:
    if not _whole_suite_on_workers(config):
        return
    from tests.numba_warmup import GROUPS

    folder = Path(tempfile.mkdtemp(prefix="doppler-numba-warmup-"))
    os.environ[WARMUP_ENV] = str(folder)  # the workers inherit it as they start
    config._numba_warmup = (folder, [
        subprocess.Popen([sys.executable, "-m", "tests.numba_warmup", group, str(folder / f"{group}.done")],
                         cwd=TESTS.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for group in GROUPS])  # fmt: skip


def pytest_unconfigure(config) -> None:
    """The controller stops a warm-up still running (a run ended early) and removes its folder."""
    folder, procs = getattr(config, "_numba_warmup", (None, []))
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session) -> None:
    """On a worker, before the first test: wait for every warm-up group to finish (or fail)."""
    folder = os.environ.get(WARMUP_ENV)
    if not folder or not hasattr(session.config, "workerinput"):
        return
    from tests.numba_warmup import GROUPS

    deadline = time.monotonic() + WARMUP_WAIT_S
    while time.monotonic() < deadline and not all((Path(folder) / f"{g}.done").exists() for g in GROUPS):
        time.sleep(0.2)
