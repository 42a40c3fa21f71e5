"""The checkpoint format of a DOPPLER policy: writing, reading, loading and fit checks.

A checkpoint is one ``checkpoint.pt`` (a dict of tensors and plain values, read with
``torch.load(..., weights_only=True)``) beside a readable ``config.json``. It holds the policy's
shape (``policy_config``) and weights, the training state to continue exactly, the cluster and
the fingerprints of the graphs it was trained on (none for a pretrained policy). The package
ships one pretrained checkpoint, :data:`PRETRAINED_CHECKPOINT`.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doppler.graph import DataflowGraph
from doppler.hardware import Cluster
from doppler.io_util import atomic_write_bytes, write_json

if TYPE_CHECKING:  # torch is imported where a checkpoint is read or written: doppler.policy.infer runs without it
    import torch

CHECKPOINT_FORMAT = "doppler-checkpoint-1"
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
PRETRAINED_CHECKPOINT = PRETRAINED_DIR / "checkpoint.pt"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, of another format, or that does not fit (exit code 2)."""


def write_checkpoint(run_dir: Path, state: dict[str, Any], config_json: dict[str, Any]) -> None:
    """``run_dir/checkpoint.pt`` (``state``) and ``run_dir/config.json``, each written atomically."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(run_dir / "checkpoint.pt", buf.getvalue())
    write_json(run_dir / "config.json", config_json, indent=2)


def _load_error(e: Exception) -> str:
    """``torch.load``'s failure in one short phrase. A weights-only refusal gives the unpickler's reason
    (for a file that is not a torch file at all, or one that pickles code), not torch's advice to load
    the file unsafely, which doppler never does."""
    def first_sentence(text: str) -> str:
        text = re.sub(r"^\s*\[enforce fail at [^\]]*\]", "", text)  # torch's C++ source location
        return " ".join(text.split()).lstrip(" .:").split(". ", 1)[0][:120]

    text = str(e)
    if "Weights only load failed" in text:
        reason = first_sentence(text.split("WeightsUnpickler error:", 1)[-1].split("Check the documentation", 1)[0])
        return "not a file of plain tensors: " + (reason or "refused by the weights-only loader")
    if isinstance(e, EOFError):
        return "the file ends early: empty or cut short"
    if isinstance(e, OSError) or "PytorchStreamReader" in text:
        return f"a damaged or cut-short zip archive: {first_sentence(text) or type(e).__name__}"
    return f"{type(e).__name__}: {first_sentence(text) or 'no message'}"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint (a file, or a run directory holding ``checkpoint.pt``) with ``weights_only=True``."""
    p = Path(path)
    if p.is_dir():
        if not (p / "checkpoint.pt").is_file():
            raise CheckpointError(f"{path}: a directory without checkpoint.pt (give a checkpoint file or a run directory)")
        p = p / "checkpoint.pt"
    if not p.is_file():
        what = "not a regular file (a pipe, socket or device)" if p.exists() else "no such checkpoint"
        raise CheckpointError(f"{path}: {what}")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    if head != b"PK\x03\x04":  # torch.save's zip archive; anything else would go to torch's legacy unpickler
        why = "the file ends early: empty or cut short" if not head else "not a zip archive, the format torch.save writes"
        raise CheckpointError(f"{p}: not a readable doppler checkpoint ({why})")
    import torch

    try:
        ck = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(f"{p}: not a readable doppler checkpoint ({_load_error(e)})") from None
    weights = ck.get("state_dict") if isinstance(ck, dict) else None
    if isinstance(weights, dict):  # NaN or inf weights make NaN scores: refused here, not met in a decode
        bad = next((k for k, w in weights.items()
                    if torch.is_tensor(w) and w.is_floating_point() and not bool(torch.isfinite(w).all())), None)  # fmt: skip
        if bad is not None:
            raise CheckpointError(f"{p}: weight {bad!r} holds values that are not finite numbers (NaN or inf): a "
                                  "diverged or damaged checkpoint")  # fmt: skip
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{p}: not a doppler checkpoint (format {ck.get('format') if isinstance(ck, dict) else '?'!r})")
    return ck


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
    return (bool(known) and meta.get("cluster") is not None
            and devices_and_links(json.loads(meta["cluster"])) == devices_and_links(cluster.to_json()))  # fmt: skip


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


def load_policy(path: str | Path, cluster: Cluster | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The trained policy of a checkpoint (in eval mode; any learned method's) and the checkpoint's metadata.
    ``cluster``: where it will decode; a policy with device identity leaves it out on any cluster but
    its training one (:func:`identity_serves`). Without ``cluster`` the identity is kept: decode such a
    policy on its training cluster only."""
    from doppler.policy.architectures import policy_from_config

    ck = read_checkpoint(path)
    try:
        config, weights = ck["policy_config"], ck["state_dict"]
        if cluster is not None and identity_left_out(ck, cluster):
            config, weights = strip_device_identity(config, weights)
        policy = policy_from_config(config)
        policy.load_state_dict(weights)
    except (KeyError, RuntimeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: checkpoint weights do not match the policy ({str(e).splitlines()[0][:120]})") from None
    policy.eval()
    return policy, ck


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
        return json.loads(meta["cluster"]) != cluster.to_json()
    if len(graphs) == 1 and not transferable:
        raise CheckpointError(
            f"{where}: trained on graph {graphs[0]['name']!r} ({graphs[0]['num_ops']} ops), which is not "
            f"{graph.name!r} ({graph.num_ops} ops): fingerprints differ (the shipped pretrained policy, "
            "--method doppler without --checkpoint, places any graph)"
        )
    return True
