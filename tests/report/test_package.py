"""The package: importing it does not load matplotlib (the drawing functions do, when called)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_report_does_not_load_matplotlib() -> None:
    code = "import sys, doppler.report; assert 'matplotlib' not in sys.modules, 'matplotlib loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
