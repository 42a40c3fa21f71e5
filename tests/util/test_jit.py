"""doppler.util.jit: loops that start numba on first use and can run as Python with numpy twins.

What runs before numba starts can only be seen in a fresh process, so those tests run a script in
a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from doppler.util import jit as _jit


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_importing_the_package_and_its_cli_does_not_import_numba():
    assert _run("""
        import sys
        import doppler, doppler.cli, doppler.policy.method, doppler.policy.decode, doppler.listsched
        print('numba' in sys.modules)
    """) == "False"


def test_small_cheap_methods_and_one_greedy_decode_run_as_python():
    assert _run("""
        from doppler import workloads
        from doppler.methods.placement import PYTHON_ASSIGN_MAX_OPS, runs_as_python
        from doppler.methods.registry import PYTHON_RUNS
        g = workloads.build("llama_block")
        big = workloads.build("random", num_ops=PYTHON_ASSIGN_MAX_OPS + 1)
        assert g.num_ops <= PYTHON_ASSIGN_MAX_OPS and big.num_ops > PYTHON_ASSIGN_MAX_OPS
        print(runs_as_python(g, 8, "doppler"), runs_as_python(g, 8, "heft"), runs_as_python(g, 8, "enumerative"),
              runs_as_python(g, 8, "doppler", options={"checkpoint": "c.pt"}),
              runs_as_python(g, 8, "doppler", options={"samples": 4}),
              runs_as_python(g, 8, "doppler", 5.0), runs_as_python(g, 8, "anneal"), runs_as_python(g, 8, "lookahead"),
              runs_as_python(g, 8, "doppler_sel", options={"checkpoint": "c.pt"}), runs_as_python(big, 8, "doppler"),
              runs_as_python(big, 8, "heft"))
        for m in ("doppler", "heft"):  # their Python cost grows with ops x devices: a limit of their own
            most = PYTHON_RUNS[m].max_work
            print(runs_as_python(g, most // g.num_ops, m), runs_as_python(g, most // g.num_ops + 1, m),
                  runs_as_python(g, most // g.num_ops + 1, "critical_path"))
    """) == "True True True False False False False False False False False\nTrue False True\nTrue False True"


#: the start of a script that runs ``run()`` as Python (numba never imported), then compiled, and
#: asserts the two results equal, array by array (each a list of results, or of lists of arrays)
BOTH_WAYS = """
    import sys
    import numpy as np
    from doppler.util.jit import as_python, started

    def both_ways(run):
        with as_python() as on:
            assert on
            python = run()
        assert "numba" not in sys.modules and not started()
        compiled = run()
        assert started()
        for a, b in zip(python, compiled, strict=True):
            for x, y in zip(a, b, strict=True) if isinstance(a, list) else [(a, b)]:
                np.testing.assert_array_equal(x, y)
        return python
"""


DECODE_BOTH_WAYS = BOTH_WAYS + """
    from doppler.workloads.corpus import sample_pair
    from doppler.policy.decode import make_plan, run_heads
    from doppler.policy.features import graph_features
    from doppler.policy.infer import load_shipped
    from doppler.sim import simulate, simulate_many

    policy = load_shipped()
    rng = np.random.default_rng(SEED)
    cases = []
    while len(cases) < 6:  # training pairs: 2-16 devices, mixed speeds, every topology
        g, c = sample_pair(rng)
        if g.num_ops <= 160:
            cases.append((g, c))

    def decode_all():
        out = []
        for i, (g, c) in enumerate(cases):
            gf = graph_features(g, c)
            heads = policy.heads(gf)
            for list_schedule in ("critical_path", "heft"):
                for ties in (False, True):
                    for mode, batch in (("greedy", 1), ("sample", 3)):
                        plan = make_plan(gf.num_ops, batch=batch, mode=mode, rng=np.random.default_rng(i),
                                         eps=0.1, plc_ties_only=ties)
                        ro = run_heads(gf, heads, plan, "both", list_schedule)
                        out.append([ro.order, ro.assignment, ro.enter_step, ro.est_tied, ro.device_features,
                                    simulate_many(g, c, ro.assignment),
                                    simulate(g, c, ro.assignment[0], trace=True).trace.op_end])
        return out

    print(len(both_ways(decode_all)))
"""


@pytest.mark.parametrize("seed", [0, 1])
def test_python_and_compiled_kernels_decode_and_simulate_alike(seed):
    """Every decode mode, both list schedules, with and without PLC ties: the same actions, what each
    step saw, and the same simulated makespans and op end times, as Python (with the numpy twins)
    and compiled."""
    assert _run(DECODE_BOTH_WAYS.replace("SEED", str(seed))) == str(6 * 8)


@pytest.mark.parametrize("method", ["doppler", "heft"])
def test_assign_cmd_runs_as_python_and_never_starts_numba(tmp_path, method):
    """`doppler assign --method doppler` (zero-shot greedy) and a cheap method run as Python: numba is
    never imported, and the assignment is the compiled one."""
    from doppler import cluster, workloads
    from doppler.ir.formats import save_graph
    from doppler.methods import assign

    g = workloads.build("llama_block")
    save_graph(g, tmp_path / "g.json")
    out = _run(f"""
        import json, sys
        from doppler.cli import app
        try:
            app(["assign", {str(tmp_path / 'g.json')!r}, "-c", "v100x8", "-m", {method!r}, "-o",
                 {str(tmp_path / 'a.json')!r}])
        except SystemExit as e:
            assert e.code in (0, None), e.code
        print("numba" in sys.modules)
    """)
    assert out.splitlines()[-1] == "False"
    import json

    written = json.loads((tmp_path / "a.json").read_text())["assignment"]
    np.testing.assert_array_equal(written, assign(g, cluster("v100x8"), method).devices)


def test_nothing_runs_as_python_once_numba_has_started():
    from doppler import workloads
    from doppler.methods.placement import PYTHON_ASSIGN_MAX_OPS, runs_as_python

    g = workloads.build("llama_block")
    assert g.num_ops <= PYTHON_ASSIGN_MAX_OPS
    _jit.start()  # (this process: numba has started, so nothing runs as Python)
    assert not runs_as_python(g, 8, "doppler") and not runs_as_python(g, 8, "heft")
    with _jit.as_python() as on:
        assert not on


def test_once_numba_has_started_a_kernel_runs_its_dispatcher():
    """A loop stays the same object in every module that holds it (no module is rewritten); its
    calls, and those of compiled loops that call it, run its dispatcher."""
    import importlib

    _jit.start()
    listsched = importlib.import_module("doppler.listsched")
    decode = importlib.import_module("doppler.policy.decode")
    loops = importlib.import_module("doppler.sim.loops")
    assert decode.features_into is listsched.features_into
    assert isinstance(loops.heap_push, _jit.Loop) and all(k.dispatcher is not None for k in _jit._LOOPS)
    ht, hi = np.zeros(4), np.zeros(4, np.int64)
    assert loops.heap_push(ht, hi, 0, 0, 2.0, 7) == 1 and loops.heap_push.dispatcher.signatures
    from doppler.sim import context
    from doppler.workloads import build

    g = build("chainmm")
    ctx = context(g, "p100x4")  # sim_loop calls heap_push and heap_pop: numba types them as their dispatchers
    # every op on device 0 (one stream, never idle): the sum of their times
    assert ctx.makespan(np.zeros(g.num_ops, np.int64)) == pytest.approx(ctx.comp[:, 0].sum(), rel=1e-12)


METHODS_BOTH_WAYS = BOTH_WAYS + """
    from doppler import workloads
    from doppler.hardware import presets
    from doppler.workloads.corpus import sample_pair
    from doppler.methods import assign, list_methods
    from doppler.methods.registry import PYTHON_RUNS

    rng = np.random.default_rng(3)
    cases = [(workloads.build(name), presets.cluster(c))
             for name, c in (("llama_block", "v100x8"), ("ffnn", "h100x8"), ("chainmm", "p100x4"))]
    while len(cases) < 8:  # training pairs: 2-16 devices, mixed speeds, every topology
        g, c = sample_pair(rng)
        if g.num_ops <= 300:
            cases.append((g, c))
    methods = [m for m in list_methods() if m in PYTHON_RUNS and PYTHON_RUNS[m].rule is True]

    def assign_all():
        return [assign(g, c, m, seed=i).devices for i, (g, c) in enumerate(cases) for m in methods]

    print(sorted(methods), len(both_ways(assign_all)))
"""


def test_python_and_compiled_cheap_methods_assign_alike():
    """Every method that may run as Python gives the same assignment as Python and compiled."""
    methods = ["critical_path", "enumerative", "heft", "metis", "pipeline", "random", "round_robin", "round_robin_block",
               "sequential_fill", "single"]
    assert _run(METHODS_BOTH_WAYS) == f"{methods} {8 * len(methods)}"


SIMULATE_BOTH_WAYS = BOTH_WAYS + """
    from doppler.workloads.corpus import sample_pair
    from doppler.sim import lower_bound, simulate

    rng = np.random.default_rng(7)
    runs = []
    while len(runs) < 24:
        g, c = sample_pair(rng)
        if g.num_ops > 300:
            continue
        a = rng.integers(0, c.num_devices, g.num_ops)
        mode = ("wc", "bsp")[len(runs) % 2]
        options = dict(mode=mode, noise_sigma=(0.0, 0.3)[len(runs) // 2 % 2], seed=len(runs),
                       link_contention=bool(len(runs) // 4 % 2),
                       dispatch="priority" if mode == "wc" and len(runs) // 8 % 2 else "fifo")
        runs.append((g, c, a, options))

    def simulate_all():
        out = []
        for g, c, a, options in runs:
            r = simulate(g, c, a, trace=True, **options)
            t = r.trace
            out.append([np.array([r.makespan_s, lower_bound(g, c)]), r.peak_memory_bytes, t.op_ready, t.op_start,
                        t.op_end, t.tr_src_op, t.tr_dst_device, t.tr_start, t.tr_end])
        return out

    print(len(both_ways(simulate_all)))
"""


def test_python_and_compiled_simulations_agree_with_every_option():
    """WC and BSP, noise, link contention and priority dispatch: the same makespans, peak memory and
    trace, bit for bit, as Python and compiled."""
    assert _run(SIMULATE_BOTH_WAYS) == "24"


def test_simulate_cmd_never_starts_numba(tmp_path):
    from doppler import workloads
    from doppler.ir.formats import save_graph
    from doppler.sim import simulate

    g = workloads.build("llama_block")
    save_graph(g, tmp_path / "g.json")
    a = np.arange(g.num_ops) % 8
    (tmp_path / "a.json").write_text(__import__("json").dumps({"assignment": a.tolist()}))
    out = _run(f"""
        import json, sys
        from doppler.cli import app
        try:
            app(["simulate", {str(tmp_path / 'g.json')!r}, "-a", {str(tmp_path / 'a.json')!r}, "-c", "v100x8",
                 "--json"])
        except SystemExit as e:
            assert e.code in (0, None), e.code
        print("numba" in sys.modules)
    """)
    lines = out.splitlines()
    assert lines[-1] == "False"
    from doppler import cluster

    record = __import__("json").loads("\n".join(lines[:-1]))
    assert record["makespan_s"] == simulate(g, cluster("v100x8"), a).makespan_s
