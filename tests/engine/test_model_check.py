"""`execute --check --reference`: the reference module loads the checkpoint strictly, and the comparison
fails where the logits or the top-1 tokens differ."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from doppler.engine.model_check import TOLERANCE, coarser, compare_logits, load_weights  # noqa: E402
from doppler.engine.weights import WeightsError, open_checkpoint  # noqa: E402


class _Tied(torch.nn.Module):
    """An embedding and a head tied to it, and a buffer the checkpoint does not hold."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(1), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids) * self.scale)


def _saved(tmp_path, tensors: dict) -> object:
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    return open_checkpoint(path)


def test_load_weights_ties_again_and_is_strict(tmp_path) -> None:
    torch.manual_seed(0)
    w = torch.randn(10, 4)
    with torch.device("meta"):
        m = _Tied()
    m.scale = torch.ones(1)  # the buffer real, the parameters on the meta device
    load_weights(m, _saved(tmp_path, {"embed.weight": w}), "f.py:m")
    assert m.head.weight is m.embed.weight and torch.equal(m.embed.weight, w) and not m.embed.weight.is_meta
    with pytest.raises(WeightsError, match="tensor 'extra' is not in the reference f.py:m's state_dict"):
        load_weights(_Tied(), _saved(tmp_path, {"embed.weight": w, "extra": w.clone()}), "f.py:m")
    with pytest.raises(WeightsError, match=r"'embed.weight' has shape \[10, 5\], the reference f.py:m's has \[10, 4\]"):
        load_weights(_Tied(), _saved(tmp_path, {"embed.weight": torch.zeros(10, 5)}), "f.py:m")
    with pytest.raises(WeightsError, match="no tensor 'embed.weight', which the reference f.py:m's state_dict has"):
        load_weights(_Tied(), _saved(tmp_path, {"other": w}), "f.py:m")
    with torch.device("meta"):
        m = _Tied()
    with pytest.raises(WeightsError, match="scale is still on the meta device"):
        load_weights(m, _saved(tmp_path, {"embed.weight": w}), "f.py:m")


def test_compare_logits_fails_on_error_or_a_different_top_token() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 6, 50))
    same = compare_logits({"logits": ref + 1e-7}, ref, source="f", dtype="float32")
    assert same.match and same.top1_agree == same.positions == 6 and same.max_abs_error == pytest.approx(1e-7)
    off = compare_logits({"logits": ref * 1.01}, ref, source="f", dtype="float32")
    assert not off.match and off.max_rel_error == pytest.approx(0.01) and off.top1_agree == 6
    i, j = np.argsort(ref[0, 4])[::-1][:2]  # the two largest logits at position 4
    tie, other = ref.copy(), ref.copy()
    tie[0, 4, j] = ref[0, 4, i] - 1e-6
    other[0, 4, j] = ref[0, 4, i] + 1e-6  # a near tie broken the other way: within tolerance, another top-1 token
    moved = compare_logits({"logits": other}, tie, source="f", dtype="float32")
    assert moved.max_rel_error < TOLERANCE["float32"] and not moved.match and moved.top1_disagree_at == [4]
    assert moved.to_json()["top1_agreement"] == pytest.approx(5 / 6)
    with pytest.raises(WeightsError, match=r"its forward returns shape \[1, 6, 50\], the graph's 'logits' has"):
        compare_logits({"logits": ref[:, :5]}, ref, source="f", dtype="float32")
    assert coarser("float32", "float16") == "float16" and coarser("float64", "float32") == "float32"


class _Outputs(torch.nn.Module):
    """A forward without use_cache that returns its logits in an output object (as OpenAI GPT's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor):
        from transformers.modeling_outputs import CausalLMOutput

        return CausalLMOutput(logits=self.embed(ids))


def outputs_factory():
    return _Outputs(), (torch.zeros(1, 3, dtype=torch.long),)


def test_the_reference_reads_the_logits_of_an_output_object(tmp_path) -> None:
    pytest.importorskip("transformers")
    from pathlib import Path

    from types import SimpleNamespace

    from doppler.engine.model_check import reference_outputs

    torch.manual_seed(0)
    module = _Outputs()
    ckpt = _saved(tmp_path, {"embed.weight": module.embed.weight.detach()})
    graph = SimpleNamespace(meta={"user_inputs": ["ids"], "input_init": {"ids": {"init": "index"}}})  # what it reads
    ids = np.array([[1, 2, 3]])
    got = reference_outputs(f"{Path(__file__).resolve()}:outputs_factory", ckpt, graph, {"ids": ids})
    np.testing.assert_array_equal(got, module.embed.weight.detach().double().numpy()[ids])
