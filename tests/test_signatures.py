"""No function of the package takes more than 10 parameters (``self``/``cls`` not counted, ``*args`` and ``**kw``
one each), except the numba loops (``@jit`` and ``@numba.njit`` functions, their ``python=`` twins and the functions
of the module that the twins call), whose arguments are the arrays they loop over, and the typer commands, whose
parameters are their options: anything else groups related arguments in a dataclass."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "doppler"
MAX_PARAMETERS = 10
#: functions still over the bar, for another change to bring under it (an entry no longer over fails below)


def _name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    own = 1 if in_class and names[:1] in (["self"], ["cls"]) else 0
    return len(names) - own + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def _over() -> dict[str, int]:
    over = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        twins = {kw.value.id for node in ast.walk(tree) if isinstance(node, ast.Call) and _name(node) == "jit"
                 for kw in node.keywords if kw.arg == "python" and isinstance(kw.value, ast.Name)}  # fmt: skip
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        while True:  # the twins, and what they call of their module
            called = {_name(c) for f in functions if f.name in twins for c in ast.walk(f) if isinstance(c, ast.Call)}
            new = (called & {f.name for f in functions}) - twins
            if not new:
                break
            twins |= new
        in_class = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
        for fn in functions:
            if fn.name in twins or any(_name(d) in ("jit", "njit", "command", "callback") for d in fn.decorator_list):
                continue
            n = _count(fn, id(fn) in in_class)
            if n > MAX_PARAMETERS:
                module = path.relative_to(SRC.parent).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
                over[f"{module}.{fn.name}"] = n
    return over


def test_no_function_takes_more_than_ten_parameters():
    over = _over()
    assert not over, over


def test_the_count_reads_every_kind_of_parameter():
    fn = ast.parse("def f(a, /, b, *c, d, **e): pass").body[0]
    method = ast.parse("class C:\n    def g(self, a, *, b): pass").body[0].body[0]
    assert _count(fn, False) == 5 and _count(method, True) == 2
