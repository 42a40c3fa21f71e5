"""A method's options read from command-line text by the types its options dataclass declares."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler.cli._common import UserError
from doppler.cli.method_options import options_of, parse_settings, to_text
from doppler.methods import get_method, list_methods

#: (method, option) of every option of every registered method that text sets
TEXT_OPTIONS = [(m, o) for m in list_methods() for o in options_of(get_method(m)) if o.type is not None]
_PATH_TEXT = st.text("abcXYZ019._-/", min_size=1, max_size=12).filter(lambda t: t.lower() != "none")
_VALUES = {bool: st.booleans(), int: st.integers(-(2**62), 2**62), str: st.text(min_size=1),
           float: st.floats(allow_nan=False, allow_infinity=False), Path: _PATH_TEXT.map(Path)}  # fmt: skip


def test_every_method_option_has_help_and_most_are_set_from_text():
    assert TEXT_OPTIONS, "no method has an option text sets"
    for m in list_methods():
        for o in options_of(get_method(m)):
            assert o.help, f"{m}.{o.name} has no help"
    assert {(m, o.name) for m in list_methods() for o in options_of(get_method(m)) if o.type is None} == {
        ("anneal", "start"), ("anneal", "extra_starts")}


@pytest.mark.parametrize(("method", "opt"), TEXT_OPTIONS, ids=[f"{m}.{o.name}" for m, o in TEXT_OPTIONS])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_registered_methods_options_round_trip_from_cli_text(method, opt, data):
    """An option's default, and any value of its type (None where it may be None), written as text and read back
    by ``--set`` is the same value; the options built from it are the method's own class."""
    spec = get_method(method)
    values = _VALUES[opt.type] | st.none() if opt.optional else _VALUES[opt.type]
    for value in (opt.default, data.draw(values)):
        text = to_text(value)
        if opt.type is str and value is not None and (text != text.strip() or "\n" in text):
            continue  # (--set strips the blanks around a value)
        back = parse_settings(spec, [f"{opt.name}={text}"])
        assert back == {opt.name: value}, (text, back)
        assert getattr(spec.options_from(None, back), opt.name) == value


def test_text_that_is_not_of_the_options_type_is_refused_in_one_line():
    spec = get_method("anneal")
    for item, message in (("pool=2.5", "'2.5' is not a valid integer"), ("prune=maybe", "'maybe' is not a valid "
                          "boolean"), ("t_start=hot", "'hot' is not a valid float"), ("pool", "expected OPTION=VALUE"),
                          ("=3", "expected OPTION=VALUE")):  # fmt: skip
        with pytest.raises(UserError, match=message):
            parse_settings(spec, [item])
    with pytest.raises(UserError, match="pool is set twice"):
        parse_settings(spec, ["pool=2", "pool=3"])
    with pytest.raises(UserError, match="none"):
        parse_settings(spec, ["pool=none"])  # pool may not be None
