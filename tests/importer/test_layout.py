"""The tiling of an imported model (doppler.importer.layout): ``--blocks`` parsed and checked, and one
picked for a number of devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from doppler.importer import GraphImportError, import_model, parse_blocks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_blocks_are_parsed_and_checked() -> None:
    assert parse_blocks(["4096=4", " 11008 = 2 "]) == {4096: 4, 11008: 2}
    for bad in (["4096"], ["4096=0"], ["a=2"]):
        with pytest.raises(GraphImportError, match="--blocks"):
            parse_blocks(bad)
    with pytest.raises(GraphImportError, match="do not divide"):
        parse_blocks(["100=3"])


def test_devices_picks_a_tiling() -> None:
    g = import_model(f"{EXAMPLES / 'models.py'}:llama_block", devices=4)
    assert g.meta["params"]["blocks"] == {"256": 4, "688": 4} and g.meta["devices"] == 4
