"""A straightforward SimPy implementation of the execution semantics (docs/design.md, Execution semantics).

It exists to validate ``doppler.sim`` (identical makespans and traces) and
to show how much faster the compiled event loop is. It follows the textbook
SimPy style: one ``simpy.Resource`` per device (capacity = its streams), one
``simpy.Resource`` (capacity 1) per ordered link in link-contention mode, one
process per op and one process per transfer.

How ties are resolved exactly as §5 says
----------------------------------------
SimPy's own ``Resource`` grants a request the moment it is made (or the moment
a holder releases), so if ops simply requested their device when they became
ready, the winner among simultaneous events would depend on the order in which
SimPy happens to process them. Instead:

* An op that becomes ready does not request its device; it files itself in its
  device's ready heap, keyed (ready time, op id), and asks for a *dispatch*.
* A dispatch is a single event per timestamp scheduled with priority
  ``DISPATCH = 2``. SimPy orders the event queue by (time, priority, insertion
  id) and every ordinary event (timeouts, process resumptions, ``succeed()``)
  has priority 0 (URGENT) or 1 (NORMAL), so the dispatch runs after *every*
  completion and arrival at that timestamp, including chains of zero-delay
  events they trigger.
* The dispatcher, for every device with a free slot, pops the best ready op,
  makes the ``Resource`` request on the op's behalf (it is granted at once,
  since a slot is free — requests never queue inside SimPy), and wakes the op's
  process, which then runs for its duration and releases the slot. Links in
  contention mode work the same way, with transfer requests keyed (request
  time, producer op id, destination device).
* A transfer into a device with ``copies_inbound`` is made by that device: it
  files itself in the device's ready heap keyed (request time, ``n`` + producer
  op id), so it is dispatched FIFO with the device's ops (ops first on equal
  times) and holds one of the device's slots while it runs.
* If a zero-duration op or transfer completes at the same timestamp, a new
  dispatch event for that timestamp is scheduled (it again runs after all
  ordinary events), exactly like the "further rounds" of the compiled loop.

Durations come from the same cluster arrays and the same noise draws as the
compiled simulator (``SimContext.noise``) and SimPy computes ``now + delay``
with the same floating-point addition, so results are bit-identical, which
``simulator_speed.py`` checks.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import simpy

from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.sim import SimContext

DISPATCH = 2  # lower priority than simpy's URGENT (0) and NORMAL (1)


class SimpyReference:
    """One simulation run in SimPy; ``run()`` returns the makespan, attributes hold the trace."""

    def __init__(
        self,
        graph: DataflowGraph,
        cluster: Cluster,
        devices: np.ndarray,
        *,
        mode: str = "wc",
        link_contention: bool = False,
        noise_sigma: float = 0.0,
        seed: int = 0,
        ctx: SimContext | None = None,
    ) -> None:
        self.g = graph
        self.c = cluster
        self.dev = [int(d) for d in devices]
        self.bsp = mode == "bsp"
        self.contention = link_contention
        self.copies_in = [bool(x) for x in cluster.copies_inbound]
        ctx = ctx or SimContext(graph, cluster)
        self.ctx = ctx
        self.op_f, self.edge_f = ctx.noise(noise_sigma, seed)
        self.env = simpy.Environment()
        D = cluster.num_devices
        self.dev_res = [simpy.Resource(self.env, capacity=int(s)) for s in cluster.streams]
        self.link_res: dict[tuple[int, int], simpy.Resource] = {}
        self.ready_heap: list[list[tuple[float, int]]] = [[] for _ in range(D)]
        self.link_heap: dict[tuple[int, int], list[tuple[float, int, int, int]]] = {}
        self.go: dict[Any, simpy.Event] = {}
        self.dispatch_pending = False
        n = graph.num_ops
        self.pending = np.diff(graph.pred_ptr).astype(int).tolist()
        self.inputs_ready = [self.env.event() for _ in range(n)]
        self.ready_t = [0.0] * n
        self.start_t = [0.0] * n
        self.end_t = [0.0] * n
        self.transfers: list[dict[str, Any]] = []
        # BSP: level release events and outstanding counts (ops + transfers per level)
        self.level = graph.level.tolist()
        self.nlev = int(graph.level.max()) + 1
        self.release = [self.env.event() for _ in range(self.nlev)]
        self.left = np.bincount(graph.level, minlength=self.nlev).astype(int).tolist()
        self.cur = 0
        # count transfers per level up front (they are known from the assignment alone)
        self.tr_plan: dict[int, list[tuple[int, int]]] = {}
        for u in range(n):
            seen: set[int] = set()
            for sl in range(int(graph.succ_ptr[u]), int(graph.succ_ptr[u + 1])):
                b = self.dev[int(graph.succ_idx[sl])]
                if b != self.dev[u] and b not in seen:
                    seen.add(b)
                    self.tr_plan.setdefault(u, []).append((b, sl))
                    self.left[self.level[u]] += 1

    # ----------------------------------------------------------- dispatching
    def request_dispatch(self) -> None:
        if not self.dispatch_pending:
            self.dispatch_pending = True
            ev = simpy.Event(self.env)
            ev._ok = True
            ev._value = None
            ev.callbacks.append(self._dispatch)
            self.env.schedule(ev, priority=DISPATCH)

    def _dispatch(self, _event: simpy.Event) -> None:
        self.dispatch_pending = False
        for d, heap in enumerate(self.ready_heap):
            res = self.dev_res[d]
            while res.count < res.capacity and heap:
                _, v = heapq.heappop(heap)
                req = res.request()  # granted synchronously: a slot is free
                self.go[v if v < self.g.num_ops else ("copy", v, d)].succeed(req)
        for link, heap in self.link_heap.items():
            res = self.link_res[link]
            while res.count < res.capacity and heap:
                _, _, _, k = heapq.heappop(heap)
                req = res.request()
                self.go[("tr", k)].succeed(req)

    def make_ready(self, v: int) -> None:
        self.ready_t[v] = self.env.now
        self.go[v] = self.env.event()
        heapq.heappush(self.ready_heap[self.dev[v]], (self.env.now, v))
        self.request_dispatch()

    # ------------------------------------------------------------ processes
    def op_process(self, v: int):
        if self.bsp:
            yield self.release[self.level[v]]
        else:
            yield self.inputs_ready[v]
        self.make_ready(v)
        req = yield self.go[v]
        d = self.dev[v]
        self.start_t[v] = self.env.now
        yield self.env.timeout(float(self.ctx.comp[v, d]) * float(self.op_f[v]))
        self.end_t[v] = self.env.now
        self.dev_res[d].release(req)
        for b, sl in self.tr_plan.get(v, ()):
            self.env.process(self.transfer_process(v, b, sl))
        if not self.bsp:
            self.deliver(v, d)
        self.finished(v)
        self.request_dispatch()

    def transfer_process(self, u: int, b: int, sl: int):
        a = self.dev[u]
        k = len(self.transfers)
        rec = {"src_op": u, "src_device": a, "dst_device": b, "bytes": float(self.ctx.out_bytes[u])}
        self.transfers.append(rec)
        req = None
        if self.copies_in[b]:  # the destination makes the copy: wait in its ready heap
            item = self.g.num_ops + u
            self.go[("copy", item, b)] = self.env.event()
            heapq.heappush(self.ready_heap[b], (self.env.now, item))
            self.request_dispatch()
            req = yield self.go[("copy", item, b)]
        elif self.contention:
            link = (a, b)
            if link not in self.link_res:
                self.link_res[link] = simpy.Resource(self.env, capacity=1)
                self.link_heap[link] = []
            self.go[("tr", k)] = self.env.event()
            heapq.heappush(self.link_heap[link], (self.env.now, u, b, k))
            self.request_dispatch()
            req = yield self.go[("tr", k)]
        rec["start"] = self.env.now
        dur = (float(self.ctx.lat[a, b]) + float(self.ctx.out_bytes[u]) / float(self.ctx.bw[a, b])) * float(self.edge_f[sl])
        yield self.env.timeout(dur)
        rec["end"] = self.env.now
        if req is not None:
            (self.dev_res[b] if self.copies_in[b] else self.link_res[(a, b)]).release(req)
            self.request_dispatch()
        if not self.bsp:
            self.deliver(u, b)
        self.finished(u)

    def deliver(self, u: int, b: int) -> None:
        g = self.g
        for sl in range(int(g.succ_ptr[u]), int(g.succ_ptr[u + 1])):
            w = int(g.succ_idx[sl])
            if self.dev[w] == b:
                self.pending[w] -= 1
                if self.pending[w] == 0:
                    self.inputs_ready[w].succeed()

    def finished(self, u: int) -> None:
        """An op or a transfer of level(u) is done; open the next barrier when the level is complete."""
        if not self.bsp:
            return
        self.left[self.level[u]] -= 1
        if self.left[self.cur] == 0 and self.cur + 1 < self.nlev:
            self.cur += 1
            self.release[self.cur].succeed()

    # ------------------------------------------------------------------ run
    def run(self) -> float:
        n = self.g.num_ops
        for v in range(n):
            self.env.process(self.op_process(v))
        if self.bsp:
            self.release[0].succeed()
        else:
            for v in range(n):
                if self.pending[v] == 0:
                    self.inputs_ready[v].succeed()
        self.env.run()
        return max(self.end_t) if n else 0.0


def simulate_simpy(
    graph: DataflowGraph,
    cluster: Cluster,
    devices: np.ndarray,
    *,
    mode: str = "wc",
    link_contention: bool = False,
    noise_sigma: float = 0.0,
    seed: int = 0,
    ctx: SimContext | None = None,
) -> SimpyReference:
    """Run the SimPy reference; the returned object has ``makespan_s`` and trace lists."""
    ref = SimpyReference(
        graph, cluster, devices, mode=mode, link_contention=link_contention, noise_sigma=noise_sigma, seed=seed, ctx=ctx
    )
    ref.makespan_s = ref.run()
    return ref
