"""The checkpoint format of a DOPPLER policy: writing and reading the file, its fields, and fit checks.

A checkpoint is one ``checkpoint.pt`` (a dict of tensors and plain values, read with
``torch.load(..., weights_only=True)``) beside a readable ``config.json``. It holds the policy's
shape (``policy_config``) and weights, the training state to continue exactly, the cluster and
the fingerprints of the graphs it was trained on (none for a pretrained policy). The package
ships one pretrained checkpoint, :data:`PRETRAINED_CHECKPOINT`.

This module is the format alone, below every network: rebuilding a policy from a checkpoint
(:func:`~doppler.policy.architectures.read_checkpoint`, :func:`~doppler.policy.architectures.load_policy`)
lives with the architectures.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.importer.files import load_failure, load_plain
from doppler.util.io import DuplicateKeyError, atomic_write_bytes, loads_json, write_json

if TYPE_CHECKING:  # torch is imported where a checkpoint is read or written: doppler.policy.infer runs without it
    import torch

CHECKPOINT_FORMAT = "doppler-checkpoint-1"
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
PRETRAINED_CHECKPOINT = PRETRAINED_DIR / "checkpoint.pt"
#: every name ``doppler train`` writes in its run directory (``doppler pretrain``: the checkpoint, the config and
#: TensorBoard's directory); a run directory in which one of them is a symbolic link is refused before any work
RUN_DIR_MEMBERS = ("checkpoint.pt", "config.json", "best_assignment.json", "training_curve.png", "tensorboard")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, of another format, or that does not fit (exit code 2)."""


def weight_fault(weights: Any) -> str | None:
    """What is wrong with the first tensor of ``weights`` (a state dict) that is not one of floating-point numbers
    finite as float32, the type of every policy's weights: "weight NAME is a DTYPE tensor, ..." (torch would cast
    an integer one, and a complex one to its real part, as it loads it) or "weight NAME holds values that are not
    finite numbers (NaN or inf)" (a float64 1e300 is inf as float32); None if none. Entries that are not tensors
    are the layout check's to name."""
    import torch

    for name, w in weights.items() if isinstance(weights, dict) else ():
        if torch.is_tensor(w) and not w.is_floating_point():
            return f"weight {str(name)!r} is a {w.dtype} tensor, not one of floating-point numbers"
        if torch.is_tensor(w) and not bool(torch.isfinite(w.float()).all()):
            return f"weight {str(name)!r} holds values that are not finite numbers (NaN or inf)"
    return None


def write_checkpoint(run_dir: Path, state: dict[str, Any], config_json: dict[str, Any]) -> None:
    """``run_dir/checkpoint.pt`` (``state``) and ``run_dir/config.json``, each written atomically. Weights that are
    not finite are never written (:func:`read_archive` would refuse them): a ValueError naming one, and the
    files already there stay as they are."""
    import torch

    for where, weights in (("", state.get("state_dict")), ("distill_best ", (state.get("distill_best") or {}).get("state_dict"))):
        fault = weight_fault(weights)
        if fault is not None:
            raise ValueError(f"{run_dir}: not saved: {where}{fault}")
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(run_dir / "checkpoint.pt", buf.getvalue())
    write_json(run_dir / "config.json", config_json, indent=2)


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file ``path`` names: itself, or the ``checkpoint.pt`` of a run directory."""
    p = Path(path)
    if p.is_dir():
        if not (p / "checkpoint.pt").is_file():
            raise CheckpointError(f"{path}: a directory without checkpoint.pt (give a checkpoint file or a run directory)")
        p = p / "checkpoint.pt"
    if not p.is_file():
        what = "not a regular file (a pipe, socket or device)" if p.exists() else "no such checkpoint"
        raise CheckpointError(f"{path}: {what}")
    return p


def read_archive(path: str | Path) -> dict[str, Any]:
    """A checkpoint (a file, or a run directory holding ``checkpoint.pt``) loaded with ``weights_only=True``
    and checked as a file of this format: finite weights, and every field of its kind. Whether its
    ``policy_config`` builds the network of its weights is the architectures' check: readers call
    :func:`doppler.policy.architectures.read_checkpoint`, which makes both."""
    p = checkpoint_file(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    if head != b"PK\x03\x04":  # torch.save's zip archive; anything else would go to torch's legacy unpickler
        why = "the file ends early: empty or cut short" if not head else "not a zip archive, the format torch.save writes"
        raise CheckpointError(f"{p}: not a readable doppler checkpoint ({why})")
    try:
        ck = load_plain(p)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(f"{p}: not a readable doppler checkpoint ({load_failure(e)})") from None
    fault = weight_fault(ck.get("state_dict") if isinstance(ck, dict) else None)
    if fault is not None:  # NaN or inf weights make NaN scores: refused here, not met in a decode
        raise CheckpointError(f"{p}: {fault}: a diverged or damaged checkpoint")
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{p}: not a doppler checkpoint (format {ck.get('format') if isinstance(ck, dict) else '?'!r})")
    _check_layout(ck, p)
    return ck


#: the fields every checkpoint holds (a policy's), by the kind of their value
_POLICY_FIELDS: dict[str, Any] = {"policy_config": dict, "state_dict": dict, "graphs": list}
#: the fields that continue a run (``--resume``; pretraining's ``--init``), which every checkpoint that ``doppler
#: train`` and ``doppler pretrain`` write holds ("count": an integer >= 0; "object", "list": the JSON text of one)
TRAINING_FIELDS: dict[str, Any] = {
    "optimizer": dict, "torch_rng": "tensor", "numpy_rng": "object", "config": "object", "il_episode": "count",
    "episode": "count", "distill_step": "count", "history": "list",
}  # fmt: skip
_OPTIONAL_FIELDS: dict[str, Any] = {"real_episode": "count", "pretrain": "object", "distill_best": dict}
_KIND_NAMES = {dict: "a dict", list: "a list", "tensor": "a tensor", "count": "an integer >= 0",
               "object": "the JSON text of an object", "list": "the JSON text of a list"}  # fmt: skip


def _is_kind(value: Any, kind: Any) -> bool:
    import torch

    if kind == "count":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == "tensor":
        return torch.is_tensor(value)
    if isinstance(kind, str):
        try:
            doc = loads_json(value) if isinstance(value, str) else None
        except DuplicateKeyError:
            raise
        except (ValueError, RecursionError):
            return False
        return isinstance(doc, dict if kind == "object" else list)
    return isinstance(value, kind)


def _check_layout(ck: dict[str, Any], p: Path) -> None:
    """CheckpointError unless ``ck`` holds every field of a checkpoint, each of its kind, and graphs that each
    have a name, a fingerprint and an op count."""
    def check(fields: dict[str, Any]) -> None:
        for key, kind in fields.items():
            if key not in ck:
                raise CheckpointError(f"{p}: a damaged checkpoint: it has no {key!r}")
            try:
                ok = _is_kind(ck[key], kind)
            except DuplicateKeyError as e:  # (JSON text whose objects name a key twice: which value is meant?)
                raise CheckpointError(f"{p}: a damaged checkpoint: the JSON text of {key} is not valid ({e})") from None
            if not ok:
                raise CheckpointError(f"{p}: a damaged checkpoint: {key} is {shown_value(ck[key])}, not {_KIND_NAMES[kind]}")

    check(_POLICY_FIELDS)
    check({k: v for k, v in {**TRAINING_FIELDS, **_OPTIONAL_FIELDS}.items() if k in ck})
    if ck["graphs"] or not (ck.get("cluster") is None or ck.get("cluster") == ""):  # (a policy trained on no one
        check({"cluster": "object"})  # graph may name no cluster: the pretrained policy's form)
    for i, g in enumerate(ck["graphs"]):
        if not (isinstance(g, dict) and isinstance(g.get("name"), str) and isinstance(g.get("fingerprint"), str)
                and _is_kind(g.get("num_ops"), "count")):  # fmt: skip
            raise CheckpointError(f"{p}: a damaged checkpoint: graphs[{i}] is {shown_value(g)}, not an object with a "
                                  "name, a fingerprint and num_ops")  # fmt: skip


def require_training_state(ck: dict[str, Any], path: str | Path) -> None:
    """CheckpointError unless ``ck`` (read by :func:`~doppler.policy.architectures.read_checkpoint`, which
    checked the kind of each field it holds) holds the state that continues its run: a policy-only
    checkpoint has none."""
    missing = [key for key in TRAINING_FIELDS if key not in ck]
    if missing:
        raise CheckpointError(f"{path}: holds a policy but not the state of a run to continue (no "
                              f"{', '.join(map(repr, missing))})")  # fmt: skip


def shown_value(value: Any) -> str:
    """A value of a damaged checkpoint in a message: its type, and the value itself if short."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 40 and text.isprintable() else f"a {type(value).__name__}"


def widen_op_features(state_dict: dict[str, torch.Tensor], policy: torch.nn.Module,
                      from_features: str) -> dict[str, torch.Tensor]:  # fmt: skip
    """``state_dict`` of a policy that read the op features ``from_features``, for ``policy``, which
    reads a superset of them (``structural`` -> ``full``): each layer over the op features gets zero
    weights for the new ones, so the widened policy computes exactly what the old one did and
    fine-tuning can learn to use them (position features let one graph's identical tiles differ)."""
    import torch

    from doppler.policy.features import OP_FEATURE_SETS

    old, new = OP_FEATURE_SETS[from_features], OP_FEATURE_SETS[policy.config["op_features"]]
    if not set(old) <= set(new):
        raise CheckpointError(f"a policy that reads the {from_features} op features cannot be narrowed to "
                              f"{policy.config['op_features']} ones")  # fmt: skip
    cols = [new.index(f) for f in old]
    out = {}
    for key, target in policy.state_dict().items():
        w = state_dict[key]
        if w.shape != target.shape and w.dim() == 2 and w.shape[1] == len(old) and target.shape[1] == len(new):
            widened = torch.zeros_like(target)
            widened[:, cols] = w
            w = widened
        out[key] = w
    for key, w in state_dict.items():  # inputs the op features do not shape (a device identity) stay as they are
        out.setdefault(key, w)
    return out


def device_identity_mismatch(known: int, num_devices: int) -> str:
    """The one line that says a policy with device identity cannot serve this device count."""
    return (f"this policy knows its {known} devices by identity (doppler train's default); the cluster has "
            f"{num_devices} devices (load it with load_policy(path, cluster), which leaves the identity out there)")  # fmt: skip


def identity_serves(meta: dict, cluster: Cluster) -> bool:
    """Whether the learned per-device states of a checkpoint (``--device-identity``) apply on ``cluster``:
    they name the devices of the cluster it was trained on, so only there: the same devices and links
    (its name and notes may differ). False for a policy without them."""
    def devices_and_links(obj: dict) -> dict:
        return {k: v for k, v in obj.items() if k not in ("name", "meta")}

    known = meta.get("policy_config", {}).get("device_identity")
    return (bool(known) and bool(meta.get("cluster"))
            and devices_and_links(loads_json(meta["cluster"])) == devices_and_links(cluster.to_json()))  # fmt: skip


def identity_left_out(meta: dict, cluster: Cluster) -> int:
    """The device count of a checkpoint's learned per-device states that do not apply on ``cluster``
    (:func:`identity_serves`), so are left out there; 0 if there are none to leave out."""
    known = int(meta.get("policy_config", {}).get("device_identity") or 0)
    return known if known and not identity_serves(meta, cluster) else 0


def strip_device_identity(policy_config: dict, state_dict: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """A checkpoint's ``policy_config`` and ``state_dict`` without their learned per-device states: the
    policy as it decodes on a cluster other than its training one. Identity enters only as each
    device's starting state, and a state of zero is the same as none, so this is the policy with its
    devices' states at zero."""
    return ({k: v for k, v in policy_config.items() if k != "device_identity"},
            {k: v for k, v in state_dict.items() if k != "plc.device_init"})  # fmt: skip


def add_device_identity(state_dict: dict[str, torch.Tensor], policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict`` of a policy without device identity, for ``policy``, which has it
    (``--device-identity`` from a checkpoint without): each device's learned state starts at zero, so
    the policy decodes exactly as the checkpoint did."""
    own = policy.state_dict()
    if "plc.device_init" not in own or "plc.device_init" in state_dict:
        return state_dict
    return {**state_dict, "plc.device_init": own["plc.device_init"].new_zeros(own["plc.device_init"].shape)}


def checkpoint_method(policy_config: dict) -> str:
    """The learned method a checkpoint's ``policy_config`` makes (``doppler``, ``gdp``, ...)."""
    from doppler.policy import LEARNED_HEADS

    return policy_config.get("architecture") or LEARNED_HEADS.get(policy_config.get("learned", "both"), "?")


def resolve_checkpoint(checkpoint: str | Path | None) -> tuple[Path, bool]:
    """The checkpoint to load, and whether it is the shipped pretrained policy (``checkpoint`` None)."""
    if checkpoint is not None:
        return Path(checkpoint), False
    if not PRETRAINED_CHECKPOINT.is_file():
        raise CheckpointError(f"the shipped pretrained policy is missing ({PRETRAINED_CHECKPOINT}): reinstall doppler, "
                              "or pass --checkpoint")  # fmt: skip
    return PRETRAINED_CHECKPOINT, True


def trained_on_graph(meta: dict, graph: DataflowGraph) -> bool:
    """Whether the checkpoint was trained on ``graph`` (by fingerprint)."""
    return any(graph.matches_fingerprint(g["fingerprint"]) for g in meta["graphs"])


def check_checkpoint_fits(meta: dict, graph: DataflowGraph, cluster: Cluster, where: str) -> bool:
    """Raise if a checkpoint cannot serve ``graph`` on ``cluster``; True if its use is zero-shot.

    A pretrained policy, or one trained on several graphs, serves any graph and cluster. A
    policy trained on one graph with position-free op features (``structural``, as fine-tuned
    from the pretrained one) serves any graph and cluster zero-shot too. One with the ``full``
    features (op ids, block coordinates: positions within its graph) serves only its own graph,
    on any cluster: on another one zero-shot (the paper's hardware transfer; positions are of the
    graph, and the device head reads each device's features, not its index). One trained with
    device identity serves other clusters without its learned per-device states
    (:func:`identity_serves`, :func:`strip_device_identity`)."""
    graphs = meta["graphs"]
    config = meta.get("policy_config", {})
    trained_devices = config.get("num_devices")
    if trained_devices is not None and trained_devices != cluster.num_devices:
        raise CheckpointError(
            f"{where}: a {config.get('architecture')} policy with {trained_devices} device outputs cannot serve "
            f"cluster {cluster.name!r} ({cluster.num_devices} devices): its output layer has one unit per device; "
            f"train one on a {cluster.num_devices}-device cluster"
        )
    transferable = config.get("op_features", "full") != "full"
    if trained_on_graph(meta, graph):
        return loads_json(meta["cluster"]) != cluster.to_json()
    if len(graphs) == 1 and not transferable:
        raise CheckpointError(
            f"{where}: trained on graph {graphs[0]['name']!r} ({graphs[0]['num_ops']} ops), which is not "
            f"{graph.name!r} ({graph.num_ops} ops): fingerprints differ (the shipped pretrained policy, "
            "--method doppler without --checkpoint, places any graph)"
        )
    return True
