"""The :class:`Trace` of one run: per-op and per-transfer times, critical path, JSON.

Both the simulator (:mod:`doppler.sim`) and the real execution engine
return it, so everything downstream (reports, the CLI) reads one format.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.util.io import atomic_write_text, write_json
from doppler.ir.slices import InputSlices, input_slices
from doppler.memory import activation_input_intervals, resident_bytes

__all__ = ["Trace"]


@dataclass
class Trace:
    """What happened, per op and per transfer (numpy arrays; times in seconds).

    Ops are indexed by op id. Transfers are listed in creation order (by
    producer op id, then by first consumer slot); ``tr_src_op[k]`` is the
    producer, ``tr_dst_device[k]`` the destination.
    """

    op_device: np.ndarray  # int64[n]
    op_ready: np.ndarray  # float64[n]
    op_start: np.ndarray  # float64[n]
    op_end: np.ndarray  # float64[n]
    tr_src_op: np.ndarray  # int64[T]
    tr_src_device: np.ndarray  # int64[T]
    tr_dst_device: np.ndarray  # int64[T]
    tr_bytes: np.ndarray  # float64[T]
    tr_start: np.ndarray  # float64[T]
    tr_end: np.ndarray  # float64[T]
    mode: str = "wc"

    @property
    def num_ops(self) -> int:
        return int(self.op_device.shape[0])

    @property
    def num_transfers(self) -> int:
        return int(self.tr_src_op.shape[0])

    @property
    def makespan_s(self) -> float:
        return float(self.op_end.max()) if self.op_end.size else 0.0

    def busy_s(self, num_devices: int, copies_inbound: np.ndarray | None = None) -> np.ndarray:
        """Summed op time per device (seconds), plus the time of the copies into each device
        flagged in ``copies_inbound`` (a device that makes its inbound copies is busy making them)."""
        busy = np.bincount(self.op_device, weights=self.op_end - self.op_start, minlength=num_devices)
        if copies_inbound is not None and self.num_transfers:
            copies = np.bincount(self.tr_dst_device, weights=self.tr_end - self.tr_start, minlength=num_devices)
            busy = busy + np.where(np.asarray(copies_inbound, dtype=bool), copies, 0.0)
        return busy

    def utilisation(self, cluster: Cluster) -> np.ndarray:
        """Per device: busy time (ops, and inbound copies it makes) / (makespan x streams), in [0, 1]."""
        mk = self.makespan_s
        busy = self.busy_s(cluster.num_devices, cluster.copies_inbound)
        if mk <= 0:
            return np.zeros(cluster.num_devices)
        return busy / (mk * cluster.streams)

    def memory_intervals(self, graph: DataflowGraph,
                         slices: InputSlices | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """Every activation buffer the run held: (device, alloc_s, free_s, bytes), one row per op output, per
        transfer and per activation-input slice a device reads (weights are resident, not listed here:
        :meth:`resident_bytes`; the model is :mod:`doppler.memory`'s).

        An op's output buffer is live on its device from the op's *start* (the kernel writes it) until
        the latest of its own end, the end of every consumer on that device (consumers read while they
        run) and the end of every transfer of it. A received copy is live on the destination from the
        transfer's start until the end of the last consumer there. Outputs nobody consumes (the graph's
        results) stay live until the makespan. A slice of an activation input is live from 0 until its
        last reader on the device ends.
        """
        n, T = self.num_ops, self.num_transfers
        dev, start, end = self.op_device, self.op_start, self.op_end
        src, dst = graph.src, graph.dst
        out_free = end.copy()
        local = dev[src] == dev[dst]
        np.maximum.at(out_free, src[local], end[dst[local]])
        if T:
            np.maximum.at(out_free, self.tr_src_op, self.tr_end)
        out_free[graph.out_degree() == 0] = self.makespan_s
        tr_free = self.tr_end.copy()
        nd = int(max(dev.max(initial=-1), self.tr_dst_device.max(initial=-1))) + 1
        if T:
            tr_key = self.tr_src_op * nd + self.tr_dst_device
            order = np.argsort(tr_key, kind="stable")
            cross = ~local
            edge_key = src[cross] * nd + dev[dst[cross]]
            pos = np.minimum(np.searchsorted(tr_key[order], edge_key), T - 1)
            found = tr_key[order][pos] == edge_key
            np.maximum.at(tr_free, order[pos[found]], end[dst[cross][found]])
        in_dev, in_alloc, in_free, in_bytes = activation_input_intervals(graph, dev, end, max(nd, 1), slices)
        return (
            np.concatenate([dev, self.tr_dst_device, in_dev]).astype(np.int64),
            np.concatenate([start, self.tr_start, in_alloc]),
            np.concatenate([out_free, tr_free, in_free]),
            np.concatenate([graph.output_bytes[:n].astype(np.float64), self.tr_bytes, in_bytes]),
        )

    def resident_bytes(self, graph: DataflowGraph, num_devices: int, slices: InputSlices | None = None) -> np.ndarray:
        """The weight bytes each device holds for the whole run (:func:`doppler.memory.resident_bytes`)."""
        return resident_bytes(graph, self.op_device, num_devices, slices)

    def peak_memory_bytes(self, graph: DataflowGraph, num_devices: int) -> np.ndarray:
        """Largest number of bytes held at once on each device: the resident weights plus the peak of the
        live activation buffers (:meth:`memory_intervals`)."""
        slices = input_slices(graph)
        return self.resident_bytes(graph, num_devices, slices) + self.activation_peak_bytes(graph, num_devices, slices)

    def activation_peak_bytes(self, graph: DataflowGraph, num_devices: int,
                              slices: InputSlices | None = None) -> np.ndarray:  # fmt: skip
        """Largest number of activation bytes live at once on each device (:meth:`activation_timeline`)."""
        device, _, live = self.activation_timeline(graph, num_devices, slices)
        peak = np.zeros(num_devices)
        if live.size:
            np.maximum.at(peak, device, live)
        return peak

    def activation_timeline(self, graph: DataflowGraph, num_devices: int,
                            slices: InputSlices | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """Every allocation and free of :meth:`memory_intervals`, by device, then time: ``(device, time_s,
        live_bytes)``, the activation bytes live on the device just after the event. At one time on one
        device: frees of buffers that lived a while, then allocations, then frees of zero-length buffers
        (so those still count)."""
        device, alloc, free, nbytes = self.memory_intervals(graph, slices)
        m = device.shape[0]
        ev_dev = np.concatenate([device, device, device])
        ev_t = np.concatenate([free, alloc, free])
        zero = alloc == free
        ev_rank = np.concatenate([np.zeros(m), np.ones(m), np.full(m, 2.0)])
        ev_delta = np.concatenate([np.where(zero, 0.0, -nbytes), nbytes, np.where(zero, -nbytes, 0.0)])
        order = np.lexsort((ev_rank, ev_t, ev_dev))
        live = np.cumsum(ev_delta[order])
        ev_dev = ev_dev[order]
        # running sum per device: subtract what the devices before it left (0, up to rounding)
        first = np.searchsorted(ev_dev, np.arange(num_devices))
        before = np.where(first > 0, live[np.maximum(first - 1, 0)], 0.0)
        return ev_dev, ev_t[order], live - before[ev_dev]

    def arrival_s(self, graph: DataflowGraph) -> dict[tuple[int, int], float]:
        """(op, device) -> time the op's output is available on that device."""
        out = {(v, d): t for v, (d, t) in enumerate(zip(self.op_device.tolist(), self.op_end.tolist()))}
        out.update(zip(zip(self.tr_src_op.tolist(), self.tr_dst_device.tolist()), self.tr_end.tolist()))
        return out

    def critical_path(self, graph: DataflowGraph) -> list[int]:
        """The chain of ops that determined the makespan, first op first.

        Walk back from the last-finishing op (ties: lowest id): if it waited for
        its device after becoming ready, step to the op on that device that
        finished when it started (the longest one if several; if none, to the
        producer of the inbound copy the device made until then); otherwise step to
        the predecessor whose output arrived last (ties: the one that finished
        last, then the lowest id). In BSP mode an op released by a barrier that
        no predecessor explains steps to the previous level's op (or the
        producer of the transfer) that finished at the barrier.
        """
        n = self.num_ops
        if n == 0:
            return []
        arrival = self.arrival_s(graph)
        dev, ready, start, end = self.op_device, self.op_ready, self.op_start, self.op_end
        by_device: dict[int, np.ndarray] = {}
        v = int(np.argmax(end))  # the first of the latest
        path = [v]
        seen = {v}
        while True:
            d = int(dev[v])
            nxt = -1
            if start[v] > ready[v]:
                if d not in by_device:
                    by_device[d] = np.flatnonzero(dev == d)
                ops_d = by_device[d]
                cand = ops_d[(end[ops_d] == start[v]) & (start[ops_d] < start[v])]
                if cand.size:
                    nxt = int(cand[np.argmax(end[cand] - start[cand])])
                else:  # the device was busy making an inbound copy (``copies_inbound``): step to its producer
                    ks = np.flatnonzero((self.tr_dst_device == d) & (self.tr_end == start[v]) & (self.tr_start < start[v]))
                    if ks.size:
                        nxt = int(self.tr_src_op[ks[np.argmax(self.tr_end[ks] - self.tr_start[ks])]])
            elif ready[v] > 0:
                preds = graph.predecessors(v)
                arr = np.array([arrival[(int(u), d)] for u in preds]) if preds.size else np.empty(0)
                cand = preds[arr == ready[v]] if preds.size else preds
                if cand.size:
                    nxt = int(cand[np.argmax(end[cand])])
                else:  # BSP barrier
                    lvl = graph.level[v] - 1
                    ops_l = np.flatnonzero(graph.level == lvl)
                    hit = ops_l[end[ops_l] == ready[v]]
                    if hit.size:
                        nxt = int(hit[0])
                    else:
                        ks = np.flatnonzero((self.tr_end == ready[v]) & (graph.level[self.tr_src_op] == lvl))
                        if ks.size:
                            nxt = int(self.tr_src_op[ks[0]])
            if nxt < 0 or nxt in seen:
                break
            seen.add(nxt)
            path.append(nxt)
            v = nxt
        return path[::-1]

    def to_json(self, graph: DataflowGraph | None = None, num_devices: int | None = None) -> dict[str, Any]:
        """Plain JSON; with ``graph``, each op's name, kind, group and block too (readable without the
        graph) and ``peak_memory_bytes`` per device (``num_devices`` of them; by default up to the
        highest device used)."""
        ops: dict[str, Any] = {
            "device": self.op_device.tolist(),
            "ready_s": self.op_ready.tolist(),
            "start_s": self.op_start.tolist(),
            "end_s": self.op_end.tolist(),
        }
        out: dict[str, Any] = {"mode": self.mode, "makespan_s": self.makespan_s}
        if graph is not None:
            ops["name"] = [graph.op_name(v) for v in range(graph.num_ops)]
            ops["kind"] = graph.kind_labels()
            ops["group"] = graph.group.tolist()
            ops["block"] = [[int(x) for x in row if x >= 0] for row in graph.block]
            if num_devices is None:
                num_devices = int(max(self.op_device.max(initial=-1), self.tr_dst_device.max(initial=-1))) + 1
            out["peak_memory_bytes"] = self.peak_memory_bytes(graph, num_devices).tolist()
        return {
            **out,
            "ops": ops,
            "transfers": {
                "src_op": self.tr_src_op.tolist(),
                "src_device": self.tr_src_device.tolist(),
                "dst_device": self.tr_dst_device.tolist(),
                "bytes": self.tr_bytes.tolist(),
                "start_s": self.tr_start.tolist(),
                "end_s": self.tr_end.tolist(),
            },
        }

    def save(self, path: str | Path, graph: DataflowGraph | None = None, num_devices: int | None = None) -> None:
        """Write :meth:`to_json` atomically."""
        write_json(path, self.to_json(graph, num_devices))

    def chrome_trace(self, graph: DataflowGraph, device_names: list[str]) -> dict[str, Any]:
        """The Chrome trace-event format (Perfetto, chrome://tracing): one track per device,
        one per ordered link for its transfers; times in microseconds."""
        D = len(device_names)
        links = sorted({(int(a), int(b)) for a, b in zip(self.tr_src_device, self.tr_dst_device)})
        link_tid = {ab: D + i for i, ab in enumerate(links)}
        tracks = [*device_names, *(f"{device_names[a]} -> {device_names[b]}" for a, b in links)]  # tid order
        meta = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"doppler ({self.mode})"}}]
        meta += [{"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": name}}
                 for tid, name in enumerate(tracks)]  # fmt: skip
        kinds = graph.kind_labels()
        events = [
            {"ph": "X", "pid": 0, "tid": int(self.op_device[v]), "name": graph.op_name(v), "cat": kinds[v],
             "ts": float(self.op_start[v]) * 1e6, "dur": float(self.op_end[v] - self.op_start[v]) * 1e6,
             "args": {"op": v, "ready_us": float(self.op_ready[v]) * 1e6}}
            for v in range(self.num_ops)
        ]  # fmt: skip
        for k in range(self.num_transfers):
            u, a, b = int(self.tr_src_op[k]), int(self.tr_src_device[k]), int(self.tr_dst_device[k])
            events.append({"ph": "X", "pid": 0, "tid": link_tid[(a, b)], "name": f"{graph.op_name(u)} -> {device_names[b]}",
                           "cat": "transfer", "ts": float(self.tr_start[k]) * 1e6,
                           "dur": float(self.tr_end[k] - self.tr_start[k]) * 1e6,
                           "args": {"op": u, "bytes": float(self.tr_bytes[k])}})  # fmt: skip
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def save_chrome_trace(self, path: str | Path, graph: DataflowGraph, device_names: list[str]) -> None:
        """Write :meth:`chrome_trace` atomically."""
        write_json(path, self.chrome_trace(graph, device_names))

    def save_ops_csv(self, path: str | Path, graph: DataflowGraph) -> None:
        """One row per op: op, name, kind, device, ready_s, start_s, end_s (written atomically)."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["op", "name", "kind", "device", "ready_s", "start_s", "end_s"])
        kinds = graph.kind_labels()
        for v in range(self.num_ops):
            w.writerow([v, graph.op_name(v), kinds[v], int(self.op_device[v]), repr(float(self.op_ready[v])),
                        repr(float(self.op_start[v])), repr(float(self.op_end[v]))])  # fmt: skip
        atomic_write_text(path, buf.getvalue())
