"""Where an imported model comes from (doppler.importer.sources): a factory named by the caller or a ``.pt2``
file, exported or read; a bad source fails in one line that names it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from doppler.importer import GraphImportError, export_model, import_model, parse_input_shapes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import models  # noqa: E402


def test_import_cli_source_forms_and_pt2(tmp_path: Path) -> None:
    g = import_model(f"{EXAMPLES / 'models.py'}:mlp", blocks={256: 2})
    assert g.meta["params"]["blocks"] == {"256": 2}
    module, example = models.mlp()
    ep, _ = export_model(module, example)
    torch.export.save(ep, tmp_path / "mlp.pt2")
    g2 = import_model(str(tmp_path / "mlp.pt2"), blocks={256: 2})
    assert g2.num_ops == g.num_ops and g2.flops.sum() == pytest.approx(g.flops.sum())


def test_input_shape_redraws_the_example() -> None:
    g = import_model(f"{EXAMPLES / 'models.py'}:mlp", input_shapes={"x": [32, 256]})
    assert g.meta["inputs"]["x"] == [32, 256]


def test_input_shapes_are_parsed_and_checked() -> None:
    assert parse_input_shapes(["x=2x64x256", "y=3,4"]) == {"x": [2, 64, 256], "y": [3, 4]}
    with pytest.raises(GraphImportError, match="--input-shape"):
        parse_input_shapes(["x=2xq"])
    with pytest.raises(GraphImportError, match="the module's inputs are x"):
        import_model(f"{EXAMPLES / 'models.py'}:mlp", input_shapes={"nope": [2, 2]})
    with pytest.raises(GraphImportError, match="torch.export failed"):
        import_model(f"{EXAMPLES / 'models.py'}:mlp", input_shapes={"x": [32, 100]})


def _factory_file(tmp_path: Path, body: str) -> str:
    f = tmp_path / "fac.py"
    f.write_text("import torch\n" + body)
    return str(f)


@pytest.mark.parametrize(
    "source, body, match",
    [
        ("nosuchpkg_xyz:f", None, "cannot import nosuchpkg_xyz"),
        ("{f}:missing", "def f():\n    return 1\n", "has no function 'missing'"),
        ("{f}:f", "def f():\n    raise RuntimeError('boom')\n", "the factory raised RuntimeError: boom"),
        ("{f}:f", "def f():\n    return 3\n", r"must return \(module, example_inputs\).*got int"),
        ("{f}:f", "def f():\n    return torch.nn.Linear(4, 4), 5\n", "got a tuple of 2 whose second item has type int"),
        ("{f}:f", "def f():\n    raise SystemExit(3)\n", r"the factory called sys.exit\(3\)"),
        ("{f}:f", "import sys\nsys.exit('bye')\ndef f():\n    pass\n", r"called sys.exit\('bye'\)"),
        ("{f}:f", "def f():\n    return torch.nn.Linear(4, 4), (torch.randn(2, 5),)\n", "torch.export failed"),
        ("nocolon", None, "expected 'package.module:function'"),
        ("{d}/missing.pt2", None, "no such file"),
    ],
)
def test_bad_sources_fail_in_one_line(tmp_path: Path, source: str, body: str | None, match: str) -> None:
    f = _factory_file(tmp_path, body) if body else ""
    with pytest.raises(GraphImportError, match=match) as e:
        import_model(source.format(f=f, d=tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("body", ["import transformers\ndef f():\n    pass\n",
                                  "def f():\n    from transformers.models import llama\n"])
def test_a_model_that_needs_an_extra_names_it_in_one_line(tmp_path: Path, monkeypatch, body: str) -> None:
    """transformers missing (``pip install doppler`` without the hf extra), imported by the factory's module or by
    the factory itself: the error names the extra that installs it."""
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")] + ["transformers"]:
        monkeypatch.setitem(sys.modules, name, None)  # (importing it, or any of its modules, raises ModuleNotFoundError)
    with pytest.raises(GraphImportError, match=r"needs transformers, which is not installed: pip install 'doppler\[hf\]'$"):
        import_model(f"{_factory_file(tmp_path, body)}:f")


def test_a_corrupt_pt2_file_fails_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(GraphImportError, match="bad.pt2: not a zip archive"):
        import_model(str(bad))
