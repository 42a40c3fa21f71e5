"""Imports run one way, from the ground up (docs/design.md, Package layout): no module imports
one above its layer, not even lazily inside a function; inside each package of ``SUBLAYERS`` no
file imports a sibling of its own sublayer or above, so their files form no circle either."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "doppler"

#: the packages (and the few top-level modules), lowest first: each may import its own layer and the layers
#: below it; docs/design.md's "Package layout" table lists the same, in the same order
LAYERS = [
    {"util"},
    {"ir"},
    {"memory"},
    {"hardware"},
    {"workloads"},
    {"importer"},
    {"listsched"},
    {"sim"},
    {"report"},
    {"methods"},
    {"policy"},
    {"engine"},
    {"train"},
    {"cli", "__main__", "__init__"},
]
#: the most modules the package's top level may hold besides ``__init__`` and ``__main__``
MAX_TOP_LEVEL_MODULES = 5

#: the files of a package, lowest first: a file imports only siblings of lower sublayers (not of its own:
#: the files of one sublayer stand side by side), so the imports inside the package run one way; the
#: package's ``__init__`` is a file like the others
SUBLAYERS = {
    "methods": [
        {"registry", "_anneal_loops"},
        {"placement"},
        {"simple", "layered", "critical_path", "heft", "metis", "enumerative", "threads", "_rollout_loops"},
        {"lookahead", "tensor_parallel"},
        {"anneal"},
        {"__init__"},
    ],
    "policy": [
        {"__init__"},
        {"features"},
        {"checkpoint", "base", "message_passing"},
        {"decode", "networks"},
        {"rollout", "fixed_output"},
        {"single", "gdp", "placeto"},
        {"architectures"},
        {"infer"},
        {"method"},
    ],
    "importer": [
        {"files", "errors"},
        {"pt2", "layout"},
        {"sources", "fusion"},
        {"lowering"},
        {"__init__"},
    ],
    "train": [
        {"config"},
        {"tasks"},
        {"losses", "state"},
        {"trainer"},
        {"pretrain"},
        {"pretrain_parallel"},
        {"__init__"},
    ],
}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"doppler.{module} is in no layer: add it to LAYERS")


def _sublayer(package: str, name: str) -> int:
    for i, names in enumerate(SUBLAYERS[package]):
        if name in names:
            return i
    raise AssertionError(f"doppler/{package}/{name}.py is in no sublayer: add it to SUBLAYERS[{package!r}]")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module below ``doppler.``) of every import of a doppler module in ``path``; ``from
    doppler.pkg import mod`` names ``pkg.mod`` where ``mod`` is a module of ``pkg``, else ``pkg``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "doppler":
                out += [(node.lineno, a.name) for a in node.names if (SRC / a.name).exists() or (SRC / f"{a.name}.py").exists()]
            elif node.module.startswith("doppler."):
                module = node.module.removeprefix("doppler.")
                folder = SRC.joinpath(*module.split("."))
                subs = [a.name for a in node.names if (folder / a.name).is_dir() or (folder / f"{a.name}.py").exists()]
                out += [(node.lineno, f"{module}.{name}") for name in subs]
                if len(subs) < len(node.names) or not folder.is_dir():  # a name the module itself defines
                    out.append((node.lineno, module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.removeprefix("doppler.")) for a in node.names if a.name.startswith("doppler.")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("doppler."):
            name = node.value.removeprefix("doppler.")
            top = SRC / name.split(".")[0]
            if name.replace(".", "").isidentifier() and (top.with_suffix(".py").exists() or top.is_dir()):
                out.append((node.lineno, name))  # importlib.import_module("doppler.x") by name
    return out


FILES = sorted(p for p in SRC.rglob("*.py") if "pretrained" not in p.parts)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(SRC)) for p in FILES])
def test_no_module_imports_one_above_its_layer(path: Path) -> None:
    rel = path.relative_to(SRC).with_suffix("")
    me = "__init__" if rel.parts == ("__init__",) else ".".join(rel.parts)
    mine = _layer(me)
    upward = [f"line {line}: doppler.{mod}" for line, mod in _imports(path) if _layer(mod) > mine]
    assert not upward, f"doppler.{me} (layer {mine}) imports upward: {', '.join(upward)}"


PACKAGE_FILES = [p for p in FILES if p.parent.parent == SRC and p.parent.name in SUBLAYERS]


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=[str(p.relative_to(SRC)) for p in PACKAGE_FILES])
def test_no_file_imports_a_sibling_of_its_own_sublayer_or_above(path: Path) -> None:
    package, me = path.parent.name, path.stem
    mine = _sublayer(package, me)
    siblings = [(line, mod.split(".")[1] if "." in mod else "__init__") for line, mod in _imports(path)
                if mod.split(".")[0] == package]  # fmt: skip
    level = [f"line {line}: doppler/{package}/{name}.py (sublayer {_sublayer(package, name)})"
             for line, name in siblings if name != me and _sublayer(package, name) >= mine]  # fmt: skip
    assert not level, f"doppler/{package}/{me}.py (sublayer {mine}) imports siblings not below it: {', '.join(level)}"


def test_a_file_in_no_sublayer_is_named_and_every_sublayer_name_is_a_file() -> None:
    with pytest.raises(AssertionError, match=r"doppler/policy/newcomer\.py is in no sublayer: add it to SUBLAYERS\['policy'\]"):
        _sublayer("policy", "newcomer")
    stale = [f"doppler/{package}/{name}.py" for package, layers in SUBLAYERS.items() for names in layers for name in names
             if not (SRC / package / f"{name}.py").is_file()]  # fmt: skip
    assert not stale, f"SUBLAYERS names files that do not exist: {', '.join(stale)}"


def test_the_learned_method_registers_on_import_doppler() -> None:
    import doppler

    assert "doppler" in doppler.list_methods()


def test_no_package_binds_a_name_of_one_of_its_modules_to_something_else() -> None:
    """``doppler.simulate`` is a function: a module ``doppler/simulate.py`` would be hidden behind it,
    reachable only with importlib. So a package's ``__init__`` imports nothing from elsewhere under
    the name of one of its own modules."""
    clashes = []
    for init in sorted(SRC.rglob("__init__.py")):
        package = ".".join(("doppler", *init.parent.relative_to(SRC).parts))
        for node in ast.walk(ast.parse(init.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module == package:
                continue
            for alias in node.names:
                name = alias.asname or alias.name
                if (init.parent / f"{name}.py").exists() or (init.parent / name / "__init__.py").exists():
                    clashes.append(f"{package}.{name} (line {node.lineno}: from {node.module} import {alias.name})")
    assert not clashes, f"names of modules bound to something else: {', '.join(clashes)}"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(SRC)) for p in FILES])
def test_no_module_docstring_is_over_60_lines(path: Path) -> None:
    """A module's docstring states its contract; measurements and histories live in docs/research/."""
    body = ast.parse(path.read_text()).body
    first = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else None
    lines = first.end_lineno - first.lineno + 1 if first is not None and isinstance(first.value.value, str) else 0
    assert lines <= 60, f"{path.name}: a {lines}-line module docstring"


def test_every_top_level_name_is_in_a_layer_and_few_modules_stay_at_the_top() -> None:
    entries = sorted(p.stem for p in SRC.glob("*.py")) + sorted(p.parent.name for p in SRC.glob("*/__init__.py"))
    unlayered = [name for name in entries if not any(name in layer for layer in LAYERS)]
    assert not unlayered, f"in no layer: {', '.join(unlayered)} (add each to LAYERS and to docs/design.md's table)"
    stale = [name for layer in LAYERS for name in layer if name not in entries]
    assert not stale, f"LAYERS names what src/doppler does not hold: {', '.join(stale)}"
    modules = [p.stem for p in SRC.glob("*.py") if p.stem not in ("__init__", "__main__")]
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, f"{len(modules)} top-level modules: {', '.join(sorted(modules))}"


def _sibling_imports(package: Path) -> dict[str, set[str]]:
    """{file or subpackage of ``package``: the siblings it imports} (a subpackage counts as one node)."""
    rel = ".".join(package.relative_to(SRC).parts)
    nodes = {p.stem for p in package.glob("*.py")} | {p.parent.name for p in package.glob("*/__init__.py")}
    edges: dict[str, set[str]] = {n: set() for n in nodes}
    for path in package.rglob("*.py"):
        if "pretrained" in path.parts:
            continue
        inner = path.relative_to(package).parts
        me = inner[0].removesuffix(".py") if len(inner) > 1 or inner[0] != "__init__.py" else "__init__"
        for _, mod in _imports(path):
            if mod.startswith(rel + "."):
                sib = mod[len(rel) + 1 :].split(".")[0]
                if sib in nodes and sib != me:
                    edges[me].add(sib)
            elif mod == rel and me != "__init__":
                edges[me].add("__init__")
    return edges


PACKAGES = sorted(p.parent for p in SRC.rglob("__init__.py") if p.parent != SRC and "pretrained" not in p.parts)


@pytest.mark.parametrize("package", PACKAGES, ids=[str(p.relative_to(SRC)) for p in PACKAGES])
def test_the_files_of_every_package_form_no_circle(package: Path) -> None:
    edges = _sibling_imports(package)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (circle := visit(m)):
                return circle
        state[n] = 2
        path.pop()
        return None

    for n in sorted(edges):
        if n not in state and (circle := visit(n)):
            raise AssertionError(f"doppler/{package.relative_to(SRC)}: its files import in a circle: {' -> '.join(circle)}")


def test_the_design_docs_layer_table_is_the_layers() -> None:
    text = (SRC.parents[1] / "docs" / "design.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+?) \|$", text.split("## Package layout", 1)[1], flags=re.M)
    table = [set(re.findall(r"`([\w.]+)`", names)) for _, names in rows]
    layers = [{n.removesuffix(".py") for n in names} for names in table]
    assert layers == LAYERS, f"docs/design.md's table: {layers}; tests/test_layers.py: {LAYERS}"
