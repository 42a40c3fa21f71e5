"""Every command that writes files refuses, before any work, an output that would destroy one of its inputs
or another of its outputs: exit 2, one line naming both, every file as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from doppler.cli import app
from doppler.ir.formats import save_graph

runner = CliRunner()


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    from doppler import workloads

    g = tmp_path / "g.json"
    save_graph(workloads.build("ffnn", size="tiny"), g)
    a = tmp_path / "a.json"
    res = runner.invoke(app, ["assign", str(g), "-c", "p100x4", "-m", "round_robin", "-o", str(a)])
    assert res.exit_code == 0, res.output
    model = tmp_path / "model.py"
    model.write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 4), (torch.zeros(2, 4),)\n")
    return {"g": g, "a": a, "model": model}


def _refused(args: list[str], files: dict[str, Path], *names: str) -> str:
    before = {k: p.read_bytes() for k, p in files.items()}
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and "same file" in line and all(n in line for n in names), line
    assert {k: p.read_bytes() for k, p in files.items()} == before  # nothing was overwritten
    return line


def test_assign_refuses_to_write_over_its_graph(files) -> None:
    g = str(files["g"])
    _refused(["assign", g, "-c", "p100x4", "-m", "heft", "-o", g], files, "--output", "G")


def test_assign_may_refine_its_init_assignment_in_place(files) -> None:
    g, a = str(files["g"]), str(files["a"])
    res = runner.invoke(app, ["assign", g, "-c", "p100x4", "-m", "anneal", "--budget-s", "0.2", "--init", a, "-o", a])
    assert res.exit_code == 0, res.output


def test_simulate_refuses_an_input_or_two_outputs_on_one_file(files, tmp_path: Path) -> None:
    g, a = str(files["g"]), str(files["a"])
    base = ["simulate", g, "-c", "p100x4", "-a", a]
    _refused([*base, "--trace", g], files, "--trace", "G")
    _refused([*base, "--ops-csv", a], files, "--ops-csv", "--assignment")
    _refused([*base, "--chrome-trace", str(tmp_path / "x.json"), "--trace", str(tmp_path / "x.json")], files,
             "--trace", "--chrome-trace")  # fmt: skip
    assert not (tmp_path / "x.json").exists()


def test_a_symlink_to_an_input_is_the_same_file(files, tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(files["g"])
    _refused(["assign", str(files["g"]), "-c", "p100x4", "-m", "heft", "-o", str(link)], files, "--output")


def test_compare_checks_every_output_before_any_method_runs(files, tmp_path: Path) -> None:
    g = str(files["g"])
    _refused(["compare", g, "-c", "p100x4", "-m", "heft", "--csv", g], files, "--csv", "G")
    save = tmp_path / "saved"
    (save / "heft.json").mkdir(parents=True)  # a directory where one method's file must go
    res = runner.invoke(app, ["compare", g, "-c", "p100x4", "-m", "critical_path,heft", "--save-dir", str(save)])
    assert res.exit_code == 2 and "heft.json" in res.output and "is a directory" in res.output, res.output
    assert not (save / "critical_path.json").exists()  # no partial set of files


def test_validate_and_graph_import_refuse_their_input_as_output(files) -> None:
    g = str(files["g"])
    _refused(["validate", g, "-c", "p100x4", "--n", "2", "-o", g], files, "--output", "G")
    _refused(["graph", "import", f"{files['model']}:make", "-o", str(files["model"])], files, "--output", "SOURCE")
    _refused(["graph", "convert", g, g], files, "OUT", "IN")


def test_execute_refuses_before_running(files) -> None:
    g, a = str(files["g"]), str(files["a"])
    _refused(["execute", g, "-a", a, "-c", "p100x4", "--trace", a], files, "--trace", "--assignment")
