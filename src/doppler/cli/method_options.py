"""A method's options on the command line: read from text (``doppler assign --set NAME=VALUE``) by the type
its options dataclass declares, and shown (``doppler methods NAME``). Text is read by click's own types
(whole numbers, numbers, true/false, paths); ``none`` is None where the option may be None. An option of
another type (an array, a mapping) is set from Python only, or by a flag of its own (``--init``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import click

from doppler.cli._common import UserError

#: the Python types an option read from text may have, and the click type that reads it
_TEXT_TYPES: dict[type, click.ParamType] = {bool: click.BOOL, int: click.INT, float: click.FLOAT, str: click.STRING,
                                            Path: click.Path(path_type=Path)}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class OptionInfo:
    """One option of a method: its name, the type text is read as (None: not from text), whether it may be None,
    its default, help and flag."""

    name: str
    type: type | None
    optional: bool
    default: Any
    help: str
    flag: str | None

    @property
    def type_name(self) -> str:
        """The option's type as ``doppler methods NAME`` shows it (``int | none``; ``python`` where no text sets it)."""
        if self.type is None:
            return "python"
        name = {bool: "true|false", Path: "path"}.get(self.type, self.type.__name__)
        return f"{name} | none" if self.optional else name


def flag_help(methods: str, method: str, name: str) -> str:
    """The help of a flag that sets option ``name``: the ``methods`` that have it, then the option's help as
    ``method``'s options dataclass declares it (the help is written once)."""
    from doppler.methods import get_method

    f = next(f for f in dataclasses.fields(get_method(method).options) if f.name == name)
    return f"{methods}: {f.metadata['help']}."


def options_of(spec: Any) -> list[OptionInfo]:
    """The options of a registered method (:class:`~doppler.methods.MethodSpec`), in declaration order."""
    if spec.options is None:
        return []
    hints = typing.get_type_hints(spec.options)
    out = []
    for f in dataclasses.fields(spec.options):
        tp, optional = _text_type(hints[f.name])
        out.append(OptionInfo(f.name, tp, optional, f.default, f.metadata.get("help", ""), f.metadata.get("flag")))
    return out


def _text_type(hint: Any) -> tuple[type | None, bool]:
    """The first member of ``hint`` that text can be read as (None: none), and whether None is allowed."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    optional = type(None) in args
    return next((a for a in args if a in _TEXT_TYPES), None), optional


def to_text(value: Any) -> str:
    """An option's value as ``--set`` reads it back (``none``, ``true``/``false``, numbers in full)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def parse_settings(spec: Any, items: Sequence[str]) -> dict[str, Any]:
    """``--set NAME=VALUE`` items as the method's option values by name, each read by its declared type. A
    UserError in one line naming the item: not NAME=VALUE, an option the method does not have (listing the ones
    it has), one set twice, one not read from text, or a value not of its type."""
    known = {o.name: o for o in options_of(spec)}
    out: dict[str, Any] = {}
    for item in items:
        name, text = _split(item)
        opt = _settable(spec, known, item, name)
        if name in out:
            raise UserError(f"--set {item!r}: {name} is set twice")
        out[name] = _read(item, opt, text)
    return out


def _split(item: str) -> tuple[str, str]:
    """``NAME=VALUE`` as its name and value text, the blanks around each dropped."""
    name, sep, text = item.partition("=")
    if not sep or not name.strip():
        raise UserError(f"--set {item!r}: expected OPTION=VALUE")
    return name.strip(), text.strip()


def _settable(spec: Any, known: dict[str, OptionInfo], item: str, name: str) -> OptionInfo:
    """The option ``name`` of the method, where text sets it."""
    opt = known.get(name)
    if opt is None:
        valid = f"its options: {', '.join(known)}" if known else "it takes no options"
        raise UserError(f"--set {item!r}: method {spec.name!r} has no option {name!r} ({valid})")
    if opt.type is None:
        by = f"; {opt.flag} sets it" if opt.flag else ""
        raise UserError(f"--set {item!r}: {spec.name}'s option {name} is not read from text{by}")
    return opt


def _read(item: str, opt: OptionInfo, text: str) -> Any:
    if opt.optional and text.lower() == "none":
        return None
    try:
        return _TEXT_TYPES[opt.type].convert(text, None, None)
    except click.BadParameter as e:
        raise UserError(f"--set {item!r}: {e.message}") from None
