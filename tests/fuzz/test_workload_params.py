"""Fuzzing ``doppler graph build WORKLOAD --set key=value``: every workload (and some that are not), its
keys and odd ones, values that are huge, negative, not numbers, not finite or not text at all.

The cap: an example whose parameters are valid and make more than :data:`BUILT_OPS_CAP` ops is not run
(it is a valid graph, only slow to build: up to 2,000,000 ops take minutes); ``workloads.count_ops``
says so in milliseconds, without building. Parameters past the tool's own maximum are run: they must be
refused at once (within :data:`REFUSAL_BOUND_S`)."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from doppler import workloads

from tests.fuzz.common import fuzz, sandbox

#: the most ops of a graph the fuzzer builds
BUILT_OPS_CAP = 5000
#: the most seconds a refusal of parameters may take
REFUSAL_BOUND_S = 10.0

NAMES = st.one_of(st.sampled_from(workloads.list_workloads()),
                  st.sampled_from(["", "llama", "RANDOM", "chainmm ", "ffnn=1", "-", "--set"]))  # fmt: skip
KEYS = st.one_of(
    st.sampled_from(sorted({k for n in workloads.list_workloads() for k in workloads.param_spec(n)})),
    st.sampled_from(["", " ", "size ", "SIZE", "n_", "unknown", "=", "seq_len=3", "dtype\x00", "\u00e9"]),
    st.text(max_size=6),
)  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "1e308", "1e309", "-0", "0", "-1", "1.5", "1e3", "2e0",
                     "0x10", "1_000", "true", "tiny", "small", "paper", "float16", "bfloat16", "float64", "int8",
                     " 2 ", "\u00b2", "\u0663", "9" * 50, "9" * 5000, "1" + "0" * 120, "=", "a=b"]),
    st.integers(-(10**6), 10**6).map(str), st.integers(-(2**70), 2**70).map(str), st.integers(1, 64).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6),
)  # fmt: skip
ITEMS = st.lists(st.one_of(st.tuples(KEYS, VALUES).map("=".join), st.text(max_size=8)), max_size=4)


@fuzz(ci=200)
@given(name=NAMES, items=ITEMS, tiny=st.booleans(), out=st.sampled_from(["g.json", "g.txt"]))
def test_graph_build_set_values(fuzz_base, name, items, tiny, out) -> None:
    sets = (["size=tiny"] if tiny else []) + items
    try:
        ops = workloads.count_ops(name, **workloads.parse_set(sets, name))
    except workloads.WorkloadError:
        ops = None  # refused: the command must refuse it too, at once
    assume(ops is None or ops <= BUILT_OPS_CAP)  # (the cap: a valid graph, only slow to build)
    args = ["graph", "build", name, "-o", out]
    for item in sets:
        args += ["--set", item]
    with sandbox(fuzz_base) as box:
        res = box.run(*args, outputs=[out])
        if ops is None:
            assert res.exit_code == 2 and res.elapsed_s < REFUSAL_BOUND_S, (res.exit_code, res.elapsed_s, res.stderr)
        elif res.exit_code == 0:
            assert (box.root / out).is_file()
