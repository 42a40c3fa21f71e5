"""Cluster files: :func:`load_cluster` reads and validates one, :func:`save_cluster` writes one (the format
is in :mod:`doppler.hardware.cluster`).

Every error is a :class:`~doppler.hardware.cluster.ClusterError` that names the file, the field and the
device or link at fault. A file's ``format_version`` (1 where absent) says which device fields it may
use: version 1 plain devices only (``flops_per_s``, exactly their meaning before roofline devices
existed), version 2 plain, measured or roofline devices (:data:`ROOFLINE_FIELDS`; a device gives
``flops_per_s`` or ``peak_flops_by_dtype``, not both; ``flops_per_s`` with ``memory_bandwidth_Bps`` and no
other roofline field is a measured device, which may add :data:`MEASURED_FIELDS`). :func:`save_cluster` (:meth:`Cluster.to_json`) writes version 2.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from doppler.hardware.cluster import FORMAT_VERSION, MAX_DEVICES, Cluster, ClusterError, Device
from doppler.util.io import read_json, write_json

__all__ = ["FORMAT_VERSIONS", "MEASURED_FIELDS", "ROOFLINE_FIELDS", "cluster_from_json", "load_cluster", "save_cluster"]

#: the cluster-file versions this doppler reads (it writes the last)
FORMAT_VERSIONS = (1, FORMAT_VERSION)
#: the device fields of a roofline device (format version 2)
ROOFLINE_FIELDS = ("peak_flops_by_dtype", "vector_flops_per_s", "memory_bandwidth_Bps", "achieved_compute_fraction",
                   "achieved_memory_fraction")  # fmt: skip
#: the device fields of a measured device beyond ``memory_bandwidth_Bps`` (format version 2)
MEASURED_FIELDS = ("weight_read_Bps_by_kind",)
_DEVICE_FIELDS = {
    "name", "kind", "flops_per_s", "flops_per_s_by_kind", "overhead_s", "overhead_s_by_kind", "memory_bytes", "streams",
    "copies_inbound",
}  # fmt: skip
_LINK_FIELDS = {"src", "dst", "bandwidth_Bps", "latency_s"}
_CLUSTER_FIELDS = {"format_version", "name", "devices", "links", "default_link", "meta"}


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster JSON file; every error is a :class:`~doppler.hardware.cluster.ClusterError` naming the file."""
    return cluster_from_json(read_json(path, "cluster file", ClusterError), source=str(path))


def save_cluster(cluster: Cluster, path: str | Path) -> None:
    """Write ``cluster`` to ``path`` as a JSON cluster file (:meth:`Cluster.to_json`), atomically."""
    write_json(path, cluster.to_json(), indent=1)


def cluster_from_json(obj: Any, source: str = "") -> Cluster:
    """Build and validate a cluster from :meth:`Cluster.to_json` output; errors are prefixed by ``source``."""
    where = f"{source}: " if source else ""
    if not isinstance(obj, dict):
        raise ClusterError(f"{where}a cluster must be a JSON object, got {type(obj).__name__}")
    _no_unknown(obj, _CLUSTER_FIELDS, where)
    version = obj.get("format_version", 1)
    if isinstance(version, bool) or version not in FORMAT_VERSIONS:
        raise ClusterError(f"{where}format_version must be one of {', '.join(map(str, FORMAT_VERSIONS))}, got "
                           f"{version!r:.40}")  # fmt: skip
    _check_counts(obj, where)
    devices = _devices(obj, where, version)
    bw, lat = _link_matrices(obj, [d.name for d in devices], where)
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise ClusterError(f"{where}'meta' must be an object")
    if meta.get("time_unit", "s") not in ("s", "unit"):  # the one key of meta that doppler reads
        raise ClusterError(f"{where}meta.time_unit must be \"s\" (seconds, the default) or \"unit\" (unitless times), "
                           f"got {meta['time_unit']!r}")  # fmt: skip
    name = obj.get("name", Path(source).stem if source else "cluster")
    if not isinstance(name, str):
        raise ClusterError(f"{where}'name' must be a string")
    try:
        return Cluster(name=name, devices=devices, bandwidth_Bps=bw, latency_s=lat, meta=dict(meta))
    except ClusterError as e:
        if where and not str(e).startswith(where):
            raise ClusterError(f"{where}{e}") from None
        raise


def _no_unknown(obj: dict[str, Any], allowed: set[str], head: str) -> None:
    """ClusterError ``head`` + the fields of ``obj`` that are not ``allowed``, if any."""
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ClusterError(f"{head}unknown field(s) {', '.join(map(repr, unknown))} (allowed: {', '.join(sorted(allowed))})")


def _check_counts(obj: dict[str, Any], where: str) -> None:
    """Bound the lists before any of their entries is read: at most :data:`~doppler.hardware.cluster.MAX_DEVICES`
    devices, and no more links than ordered pairs of distinct devices (each is listed at most once)."""
    raw_devices, raw_links = obj.get("devices"), obj.get("links")
    if not isinstance(raw_devices, list):
        return  # (_devices says what is wrong, as it does of an empty list)
    d = len(raw_devices)
    if d > MAX_DEVICES:
        raise ClusterError(f"{where}'devices' lists {d:,} devices; at most {MAX_DEVICES:,} are supported")
    if d and isinstance(raw_links, list) and len(raw_links) > d * (d - 1):
        raise ClusterError(f"{where}'links' lists {len(raw_links):,} links, more than the {d * (d - 1):,} ordered pairs "
                           f"of its {d} devices: a pair is listed twice")  # fmt: skip


def _devices(obj: dict[str, Any], where: str, version: int) -> list[Device]:
    """The devices, each validated, with distinct names (the fields of format ``version``)."""
    if "devices" not in obj:
        raise ClusterError(f"{where}missing field 'devices'")
    raw_devices = obj["devices"]
    if not isinstance(raw_devices, list) or not raw_devices:
        raise ClusterError(f"{where}'devices' must be a non-empty list")
    devices = [_device_from_json(rd, f"{where}devices[{i}]", version) for i, rd in enumerate(raw_devices)]
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ClusterError(f"{where}two devices are named {dup!r}")
    return devices


def _link_matrices(obj: dict[str, Any], names: list[str], where: str) -> tuple[np.ndarray, np.ndarray]:
    """Bandwidth and latency of every ordered device pair: ``default_link``, then each listed link."""
    d = len(names)
    raw_links = obj.get("links", [])
    if not isinstance(raw_links, list):
        raise ClusterError(f"{where}'links' must be a list of {{src, dst, bandwidth_Bps, latency_s}} objects")
    bw = np.full((d, d), np.nan)
    lat = np.full((d, d), np.nan)
    default = obj.get("default_link")
    if default is not None:
        bw[:], lat[:] = _link_numbers(default, f"{where}default_link", require_endpoints=False)
    listed = np.zeros((d, d), dtype=bool)
    index = {n: i for i, n in enumerate(names)}
    for k, rl in enumerate(raw_links):
        at = f"{where}links[{k}]"
        if not isinstance(rl, dict):
            raise ClusterError(f"{at}: a link must be an object with src, dst, bandwidth_Bps, latency_s")
        _no_unknown(rl, _LINK_FIELDS, f"{at}: ")
        i, j = (_endpoint(rl, end, index, names, at) for end in ("src", "dst"))
        if i == j:
            raise ClusterError(f"{at}: link from device {names[i]!r} to itself (same-device moves are free)")
        if listed[i, j]:
            raise ClusterError(f"{at}: link {names[i]} -> {names[j]} is listed twice")
        listed[i, j] = True
        bw[i, j], lat[i, j] = _link_numbers(rl, f"{at} ({names[i]} -> {names[j]})", require_endpoints=True)
    missing = ~np.eye(d, dtype=bool) & np.isnan(bw)
    if missing.any():
        i, j = (int(x) for x in np.argwhere(missing)[0])
        count = int(missing.sum())
        raise ClusterError(
            f"{where}no link from device {names[i]!r} to {names[j]!r}"
            + (f" ({count - 1} more ordered pairs are missing)" if count > 1 else "")
            + "; list every ordered pair in 'links' or give a 'default_link'"
        )
    np.fill_diagonal(bw, np.inf)
    np.fill_diagonal(lat, 0.0)
    return bw, lat


def _endpoint(link: dict[str, Any], end: str, index: dict[str, int], names: list[str], at: str) -> int:
    """The device index a link's ``src`` or ``dst`` names (by device name or index)."""
    if end not in link:
        raise ClusterError(f"{at}: missing field {end!r}")
    ref = link[end]
    if isinstance(ref, str) and ref in index:
        return index[ref]
    if isinstance(ref, int) and not isinstance(ref, bool) and 0 <= ref < len(names):
        return ref
    raise ClusterError(f"{at}: {end} {ref!r} is not a device (devices: {', '.join(names)})")


def _number(obj: dict[str, Any], key: str, at: str, name: str | None = None) -> float:
    """``obj[key]`` as a float, or a ClusterError naming it (as ``name``: a key the file chose is shown quoted)."""
    name = name or key
    if key not in obj:
        raise ClusterError(f"{at}: missing field {key!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ClusterError(f"{at}: {name} must be a number, got {v!r}")
    try:
        return float(v)
    except OverflowError:  # an integer literal past a float's range (JSON integers have no limit)
        raise ClusterError(f"{at}: {name} is an integer too large for a float (over 1.8e308)") from None


def _link_numbers(obj: Any, at: str, *, require_endpoints: bool) -> tuple[float, float]:
    if not isinstance(obj, dict):
        raise ClusterError(f"{at}: must be an object with bandwidth_Bps and latency_s")
    if not require_endpoints:
        _no_unknown(obj, {"bandwidth_Bps", "latency_s"}, f"{at}: ")
    bw = _number(obj, "bandwidth_Bps", at)
    lat = _number(obj, "latency_s", at)
    if not (math.isfinite(bw) and bw > 0):
        raise ClusterError(f"{at}: bandwidth_Bps must be a finite number > 0, got {bw!r}")
    if not (math.isfinite(lat) and lat >= 0):
        raise ClusterError(f"{at}: latency_s must be a finite number >= 0, got {lat!r}")
    return bw, lat


def _device_from_json(obj: Any, at: str, version: int) -> Device:
    if not isinstance(obj, dict):
        raise ClusterError(f"{at}: a device must be an object")
    if version == 1 and set(obj) & set(ROOFLINE_FIELDS + MEASURED_FIELDS):
        field_name = sorted(set(obj) & set(ROOFLINE_FIELDS + MEASURED_FIELDS))[0]
        what = "a roofline" if field_name in ROOFLINE_FIELDS else "a measured device's"
        raise ClusterError(f"{at}: {field_name!r} is {what} field: give the file \"format_version\": 2 (a file "
                           "without one is version 1, plain devices only)")  # fmt: skip
    _no_unknown(obj, _DEVICE_FIELDS | set(ROOFLINE_FIELDS + MEASURED_FIELDS), f"{at}: ")
    if "name" not in obj:
        raise ClusterError(f"{at}: missing field 'name'")
    name = obj["name"]
    if not isinstance(name, str) or not name:
        raise ClusterError(f"{at}: 'name' must be a non-empty string, got {name!r}")
    at = f"{at} ({name!r})"
    kwargs: dict[str, Any] = {k: obj[k] for k in ("name", "kind", "copies_inbound") if k in obj}  # (checked by Device)
    if "peak_flops_by_dtype" in obj:
        if "flops_per_s" in obj:
            raise ClusterError(f"{at}: give flops_per_s (a plain device) or peak_flops_by_dtype (a roofline device), "
                               "not both")  # fmt: skip
        kwargs.update(_roofline_fields(obj, at))
        if "weight_read_Bps_by_kind" in obj:
            raise ClusterError(f"{at}: weight_read_Bps_by_kind needs a measured device (flops_per_s and "
                               "memory_bandwidth_Bps), not peak_flops_by_dtype")  # fmt: skip
    else:
        kwargs["flops_per_s"] = _number(obj, "flops_per_s", at)
        if "memory_bandwidth_Bps" in obj:  # a measured device (doppler.hardware.cluster)
            kwargs["memory_bandwidth_Bps"] = _number(obj, "memory_bandwidth_Bps", at)
            if "weight_read_Bps_by_kind" in obj:
                kwargs["weight_read_Bps_by_kind"] = _number_map(obj, "weight_read_Bps_by_kind", "bytes/s", at)
        elif "weight_read_Bps_by_kind" in obj:
            raise ClusterError(f"{at}: weight_read_Bps_by_kind needs memory_bandwidth_Bps (a measured device)")
        for field_name in ROOFLINE_FIELDS:
            if field_name in obj and field_name != "memory_bandwidth_Bps":
                raise ClusterError(f"{at}: {field_name} needs peak_flops_by_dtype (a roofline device)")
    if "overhead_s" in obj:
        kwargs["overhead_s"] = _number(obj, "overhead_s", at)
    for field_name, unit in (("flops_per_s_by_kind", "FLOP/s"), ("overhead_s_by_kind", "seconds")):
        if field_name in obj:
            kwargs[field_name] = _number_map(obj, field_name, unit, at)
    if obj.get("memory_bytes") is not None:
        kwargs["memory_bytes"] = _number(obj, "memory_bytes", at)
    if "streams" in obj:
        s = obj["streams"]
        if isinstance(s, bool) or not isinstance(s, int):
            raise ClusterError(f"{at}: streams must be an integer >= 1, got {s!r}")
        kwargs["streams"] = s
    dev = Device(**kwargs)
    try:
        dev.validate()
    except ClusterError as e:
        raise ClusterError(f"{at.rsplit(' (', 1)[0]}: {e}") from None
    return dev


def _number_map(obj: dict[str, Any], field_name: str, unit: str, at: str) -> dict[str, float]:
    """``obj[field_name]``, an object of numbers (keys checked by :meth:`Device.validate`)."""
    values = obj[field_name]
    if not isinstance(values, dict):
        keys = "number formats" if "dtype" in field_name else "op kinds"
        raise ClusterError(f"{at}: {field_name} must be an object mapping {keys} to {unit}")
    return {str(k): _number(values, k, f"{at} {field_name}", repr(k)) for k in values}


def _roofline_fields(obj: dict[str, Any], at: str) -> dict[str, Any]:
    """A roofline device's fields, as numbers (their ranges are checked by :meth:`Device.validate`)."""
    out: dict[str, Any] = {"peak_flops_by_dtype": _number_map(obj, "peak_flops_by_dtype", "FLOP/s", at),
                           "memory_bandwidth_Bps": _number(obj, "memory_bandwidth_Bps", at)}  # fmt: skip
    for field_name in ("vector_flops_per_s", "achieved_compute_fraction", "achieved_memory_fraction"):
        if field_name in obj:
            out[field_name] = _number(obj, field_name, at)
    return out
