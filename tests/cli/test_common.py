"""cli/_common.py: the live progress display's plain lines where stderr is not a terminal."""

from __future__ import annotations

from doppler.cli import _common
from doppler.util.progress import ProgressEvent


def _events(on_progress) -> None:
    for done in (1, 2):
        on_progress(ProgressEvent(task="sim", done=done, total=4, stats={"x": done}))


def test_a_log_gets_a_plain_progress_line_now_and_then_and_json_gets_none(monkeypatch, capsys) -> None:
    monkeypatch.setattr(_common, "PLAIN_PROGRESS_EVERY_S", 0.0)  # (a minute by default)
    with _common.live_progress(lambda ev: f"[bold]x={ev.stats['x']}[/]", labels={"sim": "Stage II"},
                               counts=True) as on_progress:  # fmt: skip
        _events(on_progress)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["[0 min] Stage II 1/4 x=1", "[0 min] Stage II 2/4 x=2"]  # markup made plain
    with _common.live_progress(labels={"sim": "Stage II"}, quiet=True) as on_progress:
        _events(on_progress)
    monkeypatch.setattr(_common, "PLAIN_PROGRESS_EVERY_S", 3600.0)
    with _common.live_progress(labels={"sim": "Stage II"}) as on_progress:
        _events(on_progress)
    assert capsys.readouterr().err == ""


def test_usage_errors_from_the_command_line_are_one_line_exit_2() -> None:
    import subprocess
    import sys

    for args, words in [(["assign", "g.json", "--budget-s", "abc"], "Invalid value for '--budget-s'"),
                        (["assgn"], "No such command 'assgn'"), (["simulate", "--bogus"], "No such option: --bogus")]:  # fmt: skip
        res = subprocess.run([sys.executable, "-m", "doppler", *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and res.stdout == "", (args, res)
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ") and words in res.stderr, res.stderr
    res = subprocess.run([sys.executable, "-m", "doppler", "--version"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("doppler ")


def test_an_error_is_one_line_whatever_line_breaks_its_text_holds(tmp_path) -> None:
    """Python's splitlines (and a terminal or a log reader) ends a line at more than "\\n": "\\x1e", "\\x85" and
    "\\u2028" in a file's name or text once split an error line in two (found by tests/fuzz)."""
    from typer.testing import CliRunner

    from doppler.cli import app

    for name in ("a\x1eb.json", "a\u2028b.json", "a\x85b.json", "a\nb.json"):
        res = CliRunner().invoke(app, ["graph", "info", str(tmp_path / name)])
        assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, repr(res.stderr)
        assert res.stderr.startswith("error: ") and "no such graph file" in res.stderr


def test_an_internal_error_is_one_line_too(capsys) -> None:
    """A bug's report is exit 1 and its first line: torch's errors append a table of a hundred lines (a sparse
    tensor in a checkpoint once printed one)."""
    import pytest
    import typer

    with pytest.raises(typer.Exit) as e:
        with _common.handle_errors():
            raise NotImplementedError("Could not run 'aten::ne.Scalar'\n\nUndefined: registered at x\nCPU: y\n")
    err = capsys.readouterr().err
    assert e.value.exit_code == 1 and err == "internal error: NotImplementedError: Could not run 'aten::ne.Scalar'\n"
