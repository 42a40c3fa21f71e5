"""A model's own weights bound by name: checkpoints read per tile, the placed run equal to the module's
forward, and every worker holding its placement's weights plus its live activations, nothing more."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from doppler import memory  # noqa: E402
from doppler.engine import EngineError, RunOptions, build_program, run  # noqa: E402
from doppler.engine.model_check import compare_logits, reference_outputs  # noqa: E402
from doppler.engine.weights import (WeightTile, WeightsError, bind, check_executable, open_checkpoint,  # noqa: E402
                                    read_input_ids)  # fmt: skip
from doppler.importer import import_model  # noqa: E402
from doppler.workloads.references import make_inputs  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FACTORY = f"{EXAMPLES / 'hf_models.py'}:tiny_llama"
sys.path.insert(0, str(EXAMPLES))
import hf_models  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """tiny_llama imported on the meta device for 2 devices, and its random weights saved by save_pretrained
    in shards (so the index is read), as a single file, and as the module's state_dict."""
    d = tmp_path_factory.mktemp("tiny")
    hf_models.save("tiny_llama", str(d / "sharded"), max_shard_size="100KB")
    model, _ = hf_models.runnable("tiny_llama", weights=True)
    model.save_pretrained(str(d / "single"))
    graph = import_model(FACTORY, devices=2)
    return {"graph": graph, "dir": d, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def _program(graph, ckpt, ids: np.ndarray | None = None):
    binding = bind(graph, ckpt, "g.json")
    rest = [n for n in graph.meta["inputs"] if n not in binding]
    inputs = make_inputs(graph, seed=0, dtype=np.float64, names=rest)
    if ids is not None:
        inputs["input_ids"] = ids
    return build_program(graph, inputs=inputs, checkpoint=ckpt, weights=binding), inputs


def test_the_import_records_each_weight_by_its_state_dict_key_and_tiles_read_slices_of_it(tiny) -> None:
    """Every parameter input is its state_dict key, with its shape and type; the head tied to the embedding
    names it; each tile a projection reads is a slice of the stored (out, in) tensor, which its einsum
    contracts on its second axis (no copy, no transpose)."""
    g, state = tiny["graph"], tiny["state"]
    weights = g.meta["weights"]
    assert set(weights) == {k for k in state if not k.endswith("inv_freq")}
    for name, how in weights.items():
        assert how["key"] == name and how["shape"] == list(state[name].shape) and how["dtype"] == "float32"
    assert weights["lm_head.weight"]["tied"] == ["model.embed_tokens.weight"]
    assert weights["model.embed_tokens.weight"]["tied"] == ["lm_head.weight"]
    q = [(spec["eq"], ref) for spec in g.specs for ref in spec["inputs"]
         if ref.get("input") == "model.layers.0.self_attn.q_proj.weight"]  # fmt: skip
    assert len(q) == 4 and all(eq.split(",")[1].startswith("yz") and "xform" not in ref for eq, ref in q)
    q = [ref for _, ref in q]
    assert sorted(tuple(map(tuple, ref["slice"])) for ref in q) == [((0, 32), (0, 32)), ((0, 32), (32, 64)),
                                                                   ((32, 64), (0, 32)), ((32, 64), (32, 64))]  # fmt: skip
    assert "execute --weights" in g.meta["cost_only"]  # no weights, but the rotary tables are recorded
    consts = [n for n in g.meta["inputs"] if n.startswith("const.")]
    assert consts and all(g.meta["input_init"][n]["init"] == "value" for n in consts)


@pytest.mark.parametrize("layout", ["sharded", "sharded_index", "single", "single_file"])
def test_checkpoint_layouts_open(tiny, layout: str) -> None:
    d = tiny["dir"]
    path = {"sharded": d / "sharded", "sharded_index": d / "sharded" / "model.safetensors.index.json",
            "single": d / "single", "single_file": d / "single" / "model.safetensors"}[layout]  # fmt: skip
    ckpt = open_checkpoint(path)
    assert len({p.name for p in ckpt.shard_of.values()}) == (1 if layout.startswith("single") else
                                                            len(list((d / "sharded").glob("*.safetensors"))))  # fmt: skip
    assert len(list((d / "sharded").glob("*.safetensors"))) > 1
    binding = bind(tiny["graph"], ckpt, "g.json")
    assert binding["lm_head.weight"] == "model.embed_tokens.weight"  # save_pretrained stores a tied head once
    w = tiny["state"]["model.layers.1.mlp.up_proj.weight"]
    np.testing.assert_array_equal(ckpt.read("model.layers.1.mlp.up_proj.weight", [(8, 40), (16, 64)], np.float32),
                                  w[8:40, 16:64].numpy())  # fmt: skip


def _expected_reads(g, devices: np.ndarray) -> dict[tuple[str, tuple, int], int]:
    """(checkpoint key, bounds, device) -> bytes of every weight tile a device's ops read, once per device."""
    binding = {n: h["key"] for n, h in g.meta["weights"].items()}
    binding["lm_head.weight"] = "model.embed_tokens.weight"  # tied: the checkpoint holds it once
    out = {}
    for v, spec in enumerate(g.specs):
        for ref in spec["inputs"]:
            name = ref.get("input")
            if name in binding:
                bounds = tuple(tuple(b) for b in ref.get("slice") or [[0, s] for s in g.meta["inputs"][name]])
                out[(binding[name], bounds, int(devices[v]))] = 4 * int(np.prod([hi - lo for lo, hi in bounds]))
    return out


def _devices(g, how: str) -> np.ndarray:
    """Three placements on 2 devices: op by op, at random, and the first half of the ops on device 0."""
    n = g.num_ops
    return {"round_robin": np.arange(n) % 2, "random": np.random.default_rng(5).integers(0, 2, n),
            "halves": (np.arange(n) >= n // 2).astype(np.int64)}[how]  # fmt: skip


@pytest.mark.parametrize("method", ["round_robin", "random", "halves"])
def test_the_placed_run_equals_the_module_and_reads_only_each_devices_slices(tiny, method: str) -> None:
    """The engine's logits are the module's forward on the same weights and token ids (float32, 1e-4 of the
    largest logit, top-1 at every position). Each device reads from the checkpoint exactly the slices its ops
    read, once; the program keeps no host copy of a weight; a tensor the graph splits is never read whole."""
    g = tiny["graph"]
    ckpt = open_checkpoint(tiny["dir"] / "sharded")
    ids = np.random.default_rng(3).integers(0, 512, size=(1, 16))
    program, _ = _program(g, ckpt, ids)
    assert all(isinstance(t, WeightTile) for t, n in zip(program.tiles, program.tile_inputs) if n in g.meta["weights"])
    devices = _devices(g, method)
    res = run(g, devices, num_devices=2, program=program)
    reads = sorted((key, bounds) for key, bounds, _ in ckpt.reads)
    found = compare_logits(res.outputs, reference_outputs(FACTORY, ckpt, g, {"input_ids": ids}), source=FACTORY,
                           dtype="float32")  # fmt: skip
    assert found.match and found.positions == 16 and found.max_rel_error < 1e-5, found
    want = _expected_reads(g, devices)
    assert reads == sorted((key, bounds) for key, bounds, _ in want)
    assert sum(n for _, _, n in ckpt.reads) == sum(want.values())
    tiled = {key for key, bounds, _ in want if any(b != (0, s) for b, s in zip(bounds, tiny["state"][key].shape))}
    whole = [key for key, bounds in reads if key in tiled and bounds == tuple((0, s) for s in tiny["state"][key].shape)]
    assert len(tiled) > 10 and not whole


def test_no_worker_holds_more_than_its_weights_and_live_activations(tiny) -> None:
    """The weight arrays placed on each device are exactly the simulator's resident weights there (plus the
    recorded rotary tables), and the engine's count of what each worker holds is the memory model applied to
    the measured run: resident weights plus the peak of its live activations."""
    g = tiny["graph"]
    ckpt = open_checkpoint(tiny["dir"] / "single")
    program, _ = _program(g, ckpt)
    devices = _devices(g, "halves")
    placed = program.place(devices, 2)
    held = np.zeros(2)
    seen = set()
    for v, tiles in enumerate(placed.tile_operands):
        for o, arr in zip(program.operands[v], tiles):
            if o.tile >= 0 and (o.tile, int(devices[v])) not in seen and program.tile_inputs[o.tile] != "input_ids":
                seen.add((o.tile, int(devices[v])))
                held[int(devices[v])] += arr.nbytes
    np.testing.assert_allclose(held, memory.resident_bytes(g, devices, 2), rtol=1e-12)
    for _ in range(3):
        res = run(g, devices, num_devices=2, program=program, keep_outputs=False)
        np.testing.assert_allclose(res.peak_memory_bytes, res.trace.peak_memory_bytes(g, 2), rtol=0.05)
        assert (res.peak_memory_bytes >= memory.resident_bytes(g, devices, 2)).all()


def test_bad_checkpoints_name_the_key(tiny, tmp_path: Path) -> None:
    """A missing key, a wrong shape, a wrong element type, a pickle: one line each, before anything runs."""
    from safetensors.torch import save_file

    g, state = tiny["graph"], tiny["state"]
    good = {k: v for k, v in state.items() if k != "lm_head.weight"}
    cases = {
        "missing": ({k: v for k, v in good.items() if k != "model.layers.1.mlp.down_proj.weight"},
                    "no tensor 'model.layers.1.mlp.down_proj.weight'"),
        "shape": ({**good, "model.norm.weight": torch.ones(65)}, "'model.norm.weight' has shape [65], the graph's"),
        "dtype": ({**good, "model.layers.0.self_attn.k_proj.weight": good["model.layers.0.self_attn.k_proj.weight"].half()},
                  "'model.layers.0.self_attn.k_proj.weight' is float16, the graph's"),
        "untied": ({k: v for k, v in good.items() if k != "model.embed_tokens.weight"},
                   "no tensor 'model.embed_tokens.weight' (nor 'lm_head.weight', which holds it too)"),
    }  # fmt: skip
    for case, (tensors, needle) in cases.items():
        path = tmp_path / f"{case}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        with pytest.raises(WeightsError, match=None) as e:
            bind(g, open_checkpoint(path), "g.json")
        assert needle in str(e.value) and "\n" not in str(e.value), (case, str(e.value))
    torch.save(good, tmp_path / "pytorch_model.bin")
    (tmp_path / "odd.safetensors").write_bytes(pickle.dumps({"x": 1}))
    (tmp_path / "hf").mkdir()
    torch.save(good, tmp_path / "hf" / "pytorch_model.bin")
    for path in (tmp_path / "pytorch_model.bin", tmp_path / "hf", tmp_path / "odd.safetensors"):
        with pytest.raises(WeightsError, match="a pickle checkpoint .torch.save.: loading it would run the code"):
            open_checkpoint(path)
    for pad in range(300):  # a safetensors header whose length starts with the byte a pickle starts with
        save_file(good, str(tmp_path / "x80.safetensors"), metadata={"pad": "x" * pad})
        if (tmp_path / "x80.safetensors").read_bytes()[:1] == b"\x80":
            break
    assert (tmp_path / "x80.safetensors").read_bytes()[:1] == b"\x80"
    bind(g, open_checkpoint(tmp_path / "x80.safetensors"), "g.json")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    with pytest.raises(WeightsError, match="is not a file name in this directory"):
        open_checkpoint(tmp_path / "bad")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        open_checkpoint(tmp_path / "junk.safetensors")
    (tmp_path / "bad" / "model.safetensors.index.json").write_text('{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}')
    with pytest.raises(WeightsError, match="model.safetensors.index.json: not a readable JSON index .*key 'a' appears twice in one object"):
        open_checkpoint(tmp_path / "bad")  # (which file holds 'a'?)


def test_a_graph_without_constants_or_keys_is_refused(tiny) -> None:
    from doppler import workloads

    with pytest.raises(WeightsError, match="records no state_dict keys"):
        check_executable(workloads.build("ffnn", size="tiny"), "ffnn.json")
    model, example = hf_models.gqa_llama(meta=True)  # everything on the meta device: no rotary tables
    from doppler.importer import export_model, lower_program

    g = lower_program(export_model(model, example)[0])
    with pytest.raises(WeightsError, match="input 'const.* has no value: it was computed from a buffer on the meta"):
        check_executable(g, "g.json")


def test_input_ids_files_and_counts(tiny, tmp_path: Path) -> None:
    g = tiny["graph"]
    ids = list(range(100, 116))
    (tmp_path / "a.json").write_text(json.dumps([ids]))
    (tmp_path / "a.txt").write_text(" ".join(map(str, ids[:8])) + "\n" + ",".join(map(str, ids[8:])))
    for f in ("a.json", "a.txt"):
        name, got = read_input_ids(str(tmp_path / f), g, "g.json", seed=0)
        assert name == "input_ids" and got.shape == (1, 16) and got.ravel().tolist() == ids
    _, drawn = read_input_ids("16", g, "g.json", seed=4)
    assert drawn.shape == (1, 16) and np.array_equal(drawn, read_input_ids("16", g, "g.json", seed=4)[1])
    assert 0 <= drawn.min() and drawn.max() < 512
    (tmp_path / "big.json").write_text(json.dumps(ids[:15] + [512]))
    (tmp_path / "short.txt").write_text("1 2 3")
    (tmp_path / "word.txt").write_text("1 2 x")
    (tmp_path / "float.json").write_text(json.dumps([1.5] * 16))
    for spec, needle in ((str(tmp_path / "big.json"), "id 512 at position 15 is outside the vocabulary"),
                         (str(tmp_path / "short.txt"), "3 token ids, the graph's 'input_ids' holds 16"),
                         (str(tmp_path / "word.txt"), "'x' is not a token id"),
                         (str(tmp_path / "float.json"), "holds integers"), ("12", "holds 16 ids"),
                         (str(tmp_path / "none.txt"), "cannot read")):  # fmt: skip
        with pytest.raises(WeightsError, match=needle):
            read_input_ids(spec, g, "g.json", seed=0)


def test_a_weight_slice_that_does_not_fit_its_input_is_refused(tiny) -> None:
    import copy

    g = copy.deepcopy(tiny["graph"])
    ref = next(r for spec in g.specs for r in spec["inputs"] if r.get("input") == "model.norm.weight")
    ref["slice"] = [[0, 999]]
    with pytest.raises(EngineError, match=r"slice \[\[0, 999\]\] does not fit its input of shape \[64\]"):
        _program(g, open_checkpoint(tiny["dir"] / "single"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_devices_run_the_same_weights(tiny) -> None:
    """--device-type cuda: each tile read onto its GPU device, the same logits as the module."""
    g = tiny["graph"]
    ckpt = open_checkpoint(tiny["dir"] / "sharded")
    ids = np.random.default_rng(3).integers(0, 512, size=(1, 16))
    program, _ = _program(g, ckpt, ids)
    res = run(g, _devices(g, "halves"), num_devices=2, program=program, options=RunOptions(device_type="cuda"))
    found = compare_logits(res.outputs, reference_outputs(FACTORY, ckpt, g, {"input_ids": ids}), source=FACTORY,
                           dtype="float32")  # fmt: skip
    assert found.match, found
    assert sum(n for _, _, n in ckpt.reads) == sum(_expected_reads(g, _devices(g, "halves")).values())


def _neox(weights: bool):
    """A tiny GPTNeoXForCausalLM, whose head transformers saves as embed_out.weight."""
    import transformers

    from doppler.importer import parameters_on_meta

    cfg = transformers.GPTNeoXConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=64, attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    if weights:
        return transformers.GPTNeoXForCausalLM(cfg).eval(), ()
    with parameters_on_meta():
        model = transformers.GPTNeoXForCausalLM(cfg).eval()
    return model, (torch.empty((1, 16), dtype=torch.long, device="meta"),)


def neox_meta():
    return _neox(False)


def test_a_parameter_saved_under_another_key_is_found(tmp_path) -> None:
    """save_pretrained renames GPT-NeoX's lm_head.weight to embed_out.weight: the import records that key,
    and the run and the reference both read it."""
    model, _ = _neox(True)
    model.save_pretrained(str(tmp_path / "ckpt"))
    source = f"{Path(__file__).resolve()}:neox_meta"
    g = import_model(source, devices=2)
    assert g.meta["weights"]["lm_head.weight"]["saved_as"] == ["embed_out.weight"]
    ckpt = open_checkpoint(tmp_path / "ckpt")
    assert "embed_out.weight" in ckpt.shard_of and "lm_head.weight" not in ckpt.shard_of
    ids = np.random.default_rng(0).integers(0, 256, size=(1, 16))
    program, _ = _program(g, ckpt, ids)
    res = run(g, _devices(g, "round_robin"), num_devices=2, program=program)
    found = compare_logits(res.outputs, reference_outputs(source, ckpt, g, {"input_ids": ids}), source=source,
                           dtype="float32")  # fmt: skip
    assert found.match, found


@pytest.fixture()
def unblocked(tmp_path: Path):
    """Named pipes (made by the function this yields) that another process keeps opening for writing and closing
    while the test runs: a reader that would block on one forever (the fault this guards) gets an empty file
    instead, and the test fails, not hangs (a process, not a thread: a library may block holding the GIL)."""
    import os
    import subprocess

    fifos: list[Path] = []
    code = ("import os, sys, time\n"
            "while True:\n"
            "    time.sleep(0.05)\n"
            "    for f in open(sys.argv[1]).read().split():\n"
            "        try: os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))\n"
            "        except OSError: pass\n")  # fmt: skip
    listing = tmp_path / "fifos.txt"
    listing.write_text("")
    writer = subprocess.Popen([sys.executable, "-c", code, str(listing)])

    def make(name: str) -> Path:
        fifo = tmp_path / name
        os.mkfifo(fifo)
        fifos.append(fifo)
        listing.write_text(" ".join(map(str, fifos)))
        return fifo

    try:
        yield make
    finally:
        writer.kill()
        writer.wait()


def test_a_pipe_or_a_device_is_refused_unread(tiny, unblocked) -> None:
    """A pipe given as the weights, as their index or as --input-ids once blocked the command forever, and
    /dev/zero as --input-ids read until memory ran out (5 GB, then exit 1)."""
    for path in (unblocked("w.safetensors"), unblocked("model.safetensors.index.json"), Path("/dev/zero")):
        with pytest.raises(WeightsError, match=rf"^{path}: not a regular file \(a pipe, socket or device\)$"):
            open_checkpoint(path)
    for path in (unblocked("ids.txt"), Path("/dev/zero")):
        with pytest.raises(WeightsError, match=rf"^--input-ids {path}: not a regular file"):
            read_input_ids(str(path), tiny["graph"], "g.json", seed=0)


def test_a_safetensors_header_naming_a_tensor_twice_or_too_large_is_refused(tiny, tmp_path: Path) -> None:
    """safetensors keeps the last of two entries of one name silently (here: the same bytes read as integers);
    doppler reads the header first and refuses it, as every JSON it reads, and a header past MAX_HEADER_BYTES
    unread (safetensors reads up to 100 MB: 1.4 GB and 17 s to list 1.6 million empty tensors)."""
    from safetensors.torch import save

    from doppler.engine.weights import MAX_HEADER_BYTES

    raw = save({"a": torch.zeros(4), "b": torch.ones(2)})
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].decode().rstrip()
    twin = header[:-1] + ', "b": ' + json.dumps({**json.loads(header)["b"], "dtype": "I32"}) + "}"
    (tmp_path / "twice.safetensors").write_bytes(len(twin).to_bytes(8, "little") + twin.encode() + raw[8 + n :])
    with pytest.raises(WeightsError, match=r"twice.safetensors: its safetensors header names 'b' twice$"):
        open_checkpoint(tmp_path / "twice.safetensors")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "x.safetensors").write_bytes((tmp_path / "twice.safetensors").read_bytes())
    (tmp_path / "ck" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "x.safetensors"}}))
    with pytest.raises(WeightsError, match=r"ck/x.safetensors: its safetensors header names 'b' twice$"):
        open_checkpoint(tmp_path / "ck")
    (tmp_path / "huge.safetensors").write_bytes((MAX_HEADER_BYTES + 1).to_bytes(8, "little") + b"{}")
    with pytest.raises(WeightsError, match=r"its safetensors header takes 16,777,217 bytes, more than the 16,777,216"):
        open_checkpoint(tmp_path / "huge.safetensors")


class _Sinusoid(torch.nn.Module):
    """A model's buffer read at positions made on its input's device (GPT-J gathers its sinusoid table so), and
    heads picked by a list of positions (Falcon's key and value heads): both need the buffer's and the list's
    values at import, with the parameters on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.qkv = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 48)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.register_buffer("table", torch.arange(32 * 16.0).reshape(32, 16).sin(), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids) + self.table[torch.arange(input_ids.shape[1], device=input_ids.device)]
        picked = self.qkv(x).view(*input_ids.shape, 6, 8)[:, :, [0, 5]].flatten(-2)
        return self.head(picked + x)


def sinusoid_meta():
    from doppler.importer import parameters_on_meta

    with parameters_on_meta():
        model = _Sinusoid().eval()
    return model, (torch.empty((1, 16), dtype=torch.long, device="meta"),)


def test_buffers_read_at_positions_and_picked_heads_import_on_meta_and_run(tmp_path) -> None:
    """The export of a model built with its parameters on the meta device computes on the CPU: the buffer
    gathered at the position ids and the list of heads keep their values (the graph lacks only its weights),
    and the placed run with the checkpoint's weights equals the module."""
    from safetensors.torch import save_file

    from doppler.ir.graph import NO_WEIGHTS

    source = f"{Path(__file__).resolve()}:sinusoid_meta"
    g = import_model(source, devices=2)
    assert g.meta["cost_only"] == NO_WEIGHTS
    torch.manual_seed(0)
    save_file(_Sinusoid().state_dict(), str(tmp_path / "w.safetensors"))
    ckpt = open_checkpoint(tmp_path / "w.safetensors")
    ids = np.random.default_rng(0).integers(0, 64, size=(1, 16))
    program, _ = _program(g, ckpt, ids)
    res = run(g, _devices(g, "round_robin"), num_devices=2, program=program)
    found = compare_logits(res.outputs, reference_outputs(source, ckpt, g, {"input_ids": ids}), source=source,
                           dtype="float32")  # fmt: skip
    assert found.match and found.max_rel_error < 1e-5, found


#: the sweep's architectures that route tokens to experts at run time (refused at import)
ROUTED = ("tiny_mixtral", "tiny_qwen2_moe")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(hf_models.ARCHITECTURES))
def test_stock_architectures_run_their_own_weights_placed_on_two_workers(name: str, tmp_path: Path) -> None:
    """Every tiny stock architecture of examples/hf_models.py (benchmarks/hf_weights_sweep.py runs them through
    the CLI): saved in shards, imported on the meta device, run with half its ops on each worker, and its logits
    those of the module's forward; a mixture of experts is refused in one line."""
    from doppler.importer import GraphImportError

    source = f"{EXAMPLES / 'hf_models.py'}:{name}"
    if name in ROUTED:
        with pytest.raises(GraphImportError, match="at run time") as e:
            import_model(source, devices=2)
        assert "\n" not in str(e.value)
        return
    hf_models.save(name, str(tmp_path), max_shard_size="300KB")
    g = import_model(source, devices=2)
    ckpt = open_checkpoint(tmp_path)
    ids = np.random.default_rng(0).integers(0, 1000, size=(1, hf_models.TINY_SEQ_LEN))
    program, _ = _program(g, ckpt, ids)
    res = run(g, _devices(g, "halves"), num_devices=2, program=program)
    found = compare_logits(res.outputs, reference_outputs(source, ckpt, g, {"input_ids": ids}), source=source,
                           dtype="float32")  # fmt: skip
    assert found.match, found
