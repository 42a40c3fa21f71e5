"""Fuzzing `execute --weights` and `--input-ids`: a safetensors checkpoint, its sharded index and a token-id
file, bytes mutated or documents corrupted, and a pickle under a safetensors name. Every run keeps the
property of docs/fuzzing.md (exit 0 or 2, one error line, no file made, no code run)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.common import SENTINEL, corrupted, fuzz, mutated_bytes, sandbox

torch = pytest.importorskip("torch")


class _Embed(torch.nn.Module):
    """A token embedding and a head: a causal-LM-shaped model of 3 ops."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def embed_model():
    from doppler.importer import parameters_on_meta

    with parameters_on_meta():
        model = _Embed()
    return model, (torch.empty((1, 4), dtype=torch.long, device="meta"),)


class _Payload:
    def __reduce__(self):  # noqa: ANN204 - what a malicious pickle does
        import os

        return (os.system, (f"touch {SENTINEL}",))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, bytes | str]:
    """The graph, an assignment, a checkpoint (bytes) and a sharded index of the 3-op model."""
    from safetensors.torch import save

    from doppler.ir.formats import graph_to_json
    from doppler.importer import import_model

    g = import_model(f"{Path(__file__).resolve()}:embed_model")
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in _Embed().state_dict().items()}
    index = {"metadata": {}, "weight_map": {"embed.weight": "a.safetensors", "head.weight": "b.safetensors",
                                            "head.bias": "b.safetensors"}}  # fmt: skip
    return {"graph": json.dumps(graph_to_json(g)), "assignment": json.dumps([0] * g.num_ops),
            "ckpt": save(state), "a": save({"embed.weight": state["embed.weight"]}),
            "b": save({k: state[k] for k in ("head.weight", "head.bias")}), "index": index}  # fmt: skip


def _execute(box, files, weights: Path, *extra: object):
    g, a = box.write("g.json", files["graph"]), box.write("a.json", files["assignment"])
    return box.run("execute", g, "-a", a, "--weights", weights, "--repeats", 1, "--warmup", 0, *extra)


@fuzz(ci=40)
@given(data=st.data())
def test_mutated_checkpoints(fuzz_base, model_files, data) -> None:
    ckpt = data.draw(mutated_bytes(model_files["ckpt"]))
    with sandbox(fuzz_base) as box:
        res = _execute(box, model_files, box.write("w.safetensors", ckpt))
        if res.exit_code == 2:
            assert "w.safetensors" in res.error_line or "weights" in res.error_line, res.error_line


@fuzz(ci=40)
@given(data=st.data())
def test_corrupted_shard_indexes(fuzz_base, model_files, data) -> None:
    index = data.draw(corrupted(model_files["index"]))
    with sandbox(fuzz_base) as box:
        box.write("ck/a.safetensors", model_files["a"])
        box.write("ck/b.safetensors", model_files["b"])
        box.write("ck/model.safetensors.index.json", index)
        _execute(box, model_files, box.root / "ck")


@fuzz(ci=30)
@given(ids=st.one_of(st.lists(st.integers(-5, 40), max_size=6).map(json.dumps),
                     st.text(alphabet="0123456789 ,[]-x.\n", max_size=20)))  # fmt: skip
def test_odd_token_id_files(fuzz_base, model_files, ids) -> None:
    with sandbox(fuzz_base) as box:
        res = _execute(box, model_files, box.write("w.safetensors", model_files["ckpt"]), "--input-ids",
                       box.write("ids.txt", ids))  # fmt: skip
        if res.exit_code == 2:
            assert "--input-ids" in res.error_line, res.error_line


def test_a_pickle_under_a_safetensors_name_is_refused_unread(fuzz_base, model_files) -> None:
    with sandbox(fuzz_base) as box:
        for name in ("w.safetensors", "ck/model.safetensors"):
            res = _execute(box, model_files, box.write(name, pickle.dumps(_Payload())))
            assert res.exit_code == 2 and "pickle checkpoint" in res.error_line, res.error_line
        res = _execute(box, model_files, box.root / "ck")
        assert res.exit_code == 2 and "pickle checkpoint" in res.error_line, res.error_line


@fuzz(ci=12)
@given(where=st.sampled_from(["weights", "index", "shard", "input-ids"]),
       special=st.sampled_from(["fifo", "/dev/zero", "/dev/null", "link to fifo"]))  # fmt: skip
def test_a_pipe_or_a_device_at_any_input_path_is_refused_unread(fuzz_base, model_files, where, special) -> None:
    """A pipe given as the weights, their index or the token ids once blocked the command forever (a shard
    named by an index was refused already), and /dev/zero as token ids read until memory ran out."""
    import os

    with sandbox(fuzz_base) as box:
        target = box.root / "special"
        if special in ("fifo", "link to fifo"):
            os.mkfifo(target)
        else:
            target = Path(special)

        def plant(name: str) -> Path:
            p = box.root / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if special == "fifo":
                os.replace(target, p)
            else:
                p.symlink_to(target)
            return p

        weights = box.write("w.safetensors", model_files["ckpt"])
        extra: tuple = ()
        if where == "weights":
            weights = plant("x.safetensors")
        elif where in ("index", "shard"):
            box.write("ck/a.safetensors", model_files["a"])
            box.write("ck/b.safetensors", model_files["b"])
            if where == "index":
                plant("ck/model.safetensors.index.json")
            else:
                box.write("ck/model.safetensors.index.json", json.dumps(model_files["index"]))
                (box.root / "ck/b.safetensors").unlink()
                plant("ck/b.safetensors")
            weights = box.root / "ck" / ("model.safetensors.index.json" if where == "index" else "")
        else:
            extra = ("--input-ids", plant("ids.txt"))
        res = _execute(box, model_files, weights, *extra)
        assert res.exit_code == 2, (where, special, res.stderr)
