"""``pip install doppler`` without extras: every registered method assigns a graph from the command line
with the optional packages missing, and a model that needs one says in one line which extra installs it.

The packages are made missing in a fresh interpreter (a ``sys.meta_path`` finder that refuses them), which
then runs every command through the CLI in one process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from doppler import workloads
from doppler.ir.formats import save_graph
from doppler.methods import get_method, list_methods
from doppler.policy import LEARNED_METHODS
from doppler.hardware.presets import cluster

ROOT = Path(__file__).resolve().parents[2]
#: methods that place a model's decoder layers, which ffnn has not: they assign a LLaMA model instead
NEEDS_LAYERS = ("tensor_parallel", "tp_pipeline")
#: what only the extras install (pyproject.toml's ``hf`` and ``dev``), by top-level module
EXTRAS_ONLY = ("torch_geometric", "transformers", "simpy", "pytest", "_pytest", "hypothesis", "xdist")
#: the interpreter's bootstrap: refuse the extras' modules, then run each command through the CLI and print
#: ``[[exit code, output], ...]`` as JSON
BOOTSTRAP = """
import importlib.abc, json, sys
BLOCKED = set(sys.argv[1].split(","))
class NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoExtras())
from typer.testing import CliRunner
from doppler.cli import app
results = []
for argv in json.loads(sys.argv[2]):
    res = CliRunner().invoke(app, argv)
    results.append([res.exit_code, res.output])
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"results": results, "leaked": leaked}))
"""


def _untrained_checkpoint(method: str, graph, cl, run_dir: Path) -> Path:
    from doppler.train import Trainer, TrainConfig

    cfg = TrainConfig(method=method, hidden=8, mlp_hidden=8, mp_steps=1, episodes=8, il_episodes=8, batch=2,
                      torch_threads=1)  # fmt: skip
    Trainer.create([graph], cl, cfg).save(run_dir)
    return run_dir / "checkpoint.pt"


def _one_line_naming_an_extra(output: str) -> bool:
    lines = [line for line in output.splitlines() if line.strip()]
    return len(lines) == 1 and "pip install 'doppler[" in lines[0]


def test_every_method_assigns_without_the_extras(tmp_path: Path) -> None:
    g, cl = workloads.build("ffnn", size="tiny"), cluster("unit:2")
    graphs = {"ffnn": g, "llama_model": workloads.build("llama_model", size="tiny")}
    for name, graph in graphs.items():
        save_graph(graph, tmp_path / f"{name}.json")
    commands = []
    for method in list_methods():
        graph_file = tmp_path / ("llama_model.json" if method in NEEDS_LAYERS else "ffnn.json")
        argv = ["assign", str(graph_file), "-c", "unit:2", "-m", method, "-o", str(tmp_path / f"{method}.json")]
        if method in LEARNED_METHODS and method != "doppler":  # (doppler: the shipped policy)
            argv += ["--checkpoint", str(_untrained_checkpoint(method, g, cl, tmp_path / method))]
        elif get_method(method).uses_budget and method not in LEARNED_METHODS:
            argv += ["--budget-s", "0.2"]
        commands.append(argv)
    commands.append(["graph", "import", f"{ROOT / 'examples' / 'hf_models.py'}:llama", "-o", str(tmp_path / "l.json")])
    proc = subprocess.run([sys.executable, "-c", BOOTSTRAP, ",".join(EXTRAS_ONLY), json.dumps(commands)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["leaked"] == []
    *assigned, (hf_code, hf_output) = out["results"]
    for method, (code, output) in zip(list_methods(), assigned):
        assert code == 0 or (code == 2 and _one_line_naming_an_extra(output)), f"{method}: exit {code}: {output[-800:]}"
        if code == 0:
            placed = graphs["llama_model" if method in NEEDS_LAYERS else "ffnn"]
            assert len(json.loads((tmp_path / f"{method}.json").read_text())["assignment"]) == placed.num_ops
    # a Hugging Face model needs transformers: one line naming the hf extra, exit 2
    assert hf_code == 2 and _one_line_naming_an_extra(hf_output) and "doppler[hf]" in hf_output, hf_output


@pytest.mark.parametrize("module", ["torch_geometric", "transformers"])
def test_the_extras_are_declared_as_optional(module: str) -> None:
    """What the extras install is no dependency of the package itself (pyproject.toml)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert module.lower() not in _names(project["dependencies"])
    assert module.lower() in _names(project["optional-dependencies"]["dev"])


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=\[ ]", r, maxsplit=1)[0].lower() for r in requirements}
