"""Invariants of the cost model that a wrong scheduler cannot satisfy by accident.

Each test builds a small NKI kernel, runs it on the interpreter (trace only where values do
not matter) and schedules the trace. Tolerances: the scheduler is plain arithmetic, so
identities (doubling, 4x) are checked to 1e-9 relative; the two published micro-benchmarks
the parameters were derived from (A10, A12) are checked to the rounding of that derivation.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.cost_model.params import PARAMS, params_for
from neuron_kernels.cost_model.profiler import profile
from neuron_kernels.cost_model.schedule import model_trace
from neuron_kernels.cost_model.timeline import Timeline
from neuron_kernels.errors import LimitError
from neuron_kernels.interpreter import nki, run

nl, nisa = nki.language, nki.isa
bf16 = ml_dtypes.bfloat16
TARGETS = ("trn1", "trn2", "trn3")


def _model(kernel, args, target="trn2", kwargs=None, **overrides):
    r = run(kernel, args, kwargs or {}, target=target, compute=False)
    return r, model_trace(r.trace, target, **overrides)


# -- kernels ---------------------------------------------------------------------------------


def vector_ops(x, n_ops):
    """``n_ops`` independent VectorE ops on one loaded tile (each writes its own tile)."""
    t = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for _ in range(n_ops):
        o = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o, data=t, op0=nl.multiply, operand0=2.0)
    return None


def matmuls(a, b, n_mm):
    """``n_mm`` independent matmuls on loaded tiles, each into its own PSUM tile, evacuated."""
    at = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.sbuf)
    bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a)
    nisa.dma_copy(dst=bt, src=b)
    for _ in range(n_mm):
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=at, moving=bt)
        o = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=acc)
    return None


def loads(x, n_loads):
    """``n_loads`` independent [128, 512] loads of ``x`` into fresh tiles."""
    for _ in range(n_loads):
        t = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
    return None


def act_and_vector(x, dependent):
    """One ScalarE activation and one VectorE op on a loaded tile: both read the tile
    (independent), or the VectorE op reads the activation's output (dependent)."""
    tx = nl.ndarray((128, 2048), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tx, src=x)
    a = nl.ndarray((128, 2048), dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=a, op=nl.exp, data=tx)
    v = nl.ndarray((128, 2048), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=v, data=a if dependent else tx, op0=nl.add, operand0=1.0)
    return None


def vector_chain(x, n_ops):
    """``n_ops`` VectorE ops, each reading the previous one's output."""
    t = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for _ in range(n_ops):
        o = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o, data=t, op0=nl.add, operand0=1.0)
        t = o
    return None


def _indices(result, api):
    return [i for i, ins in enumerate(result.trace.instructions) if ins.api == f"nisa.{api}"]


# -- lower bounds ------------------------------------------------------------------------------


@st.composite
def matmul_problems(draw):
    return (
        draw(st.integers(1, 300)),
        draw(st.integers(1, 700)),
        draw(st.integers(1, 300)),
        draw(st.sampled_from([np.float32, bf16])),
        draw(st.sampled_from(TARGETS)),
    )


@settings(max_examples=25, deadline=None)
@given(matmul_problems())
def test_modeled_time_is_at_least_flops_over_peak_and_bytes_over_bandwidth(problem):
    from neuron_kernels.hardware import target_from_name
    from neuron_kernels.kernels.matmul import SPEC, matmul_kernel

    m, n, k, dtype, target = problem
    a, b = np.empty((m, k), dtype), np.empty((k, n), dtype)
    dtype_name = "float32" if dtype is np.float32 else "bfloat16"
    plan = SPEC.check(
        {"m": m, "n": n, "k": k}, dtype_name, SPEC.config.default(), target_from_name(target)
    )
    report = profile(matmul_kernel, target=target)(a, b, plan)
    floors = report.floors_ns()
    assert floors["tensor"] > 0 and floors["dma"] > 0
    assert report.latency_ns >= floors["tensor"] * (1 - 1e-9), (report.latency_ns, floors)
    assert report.latency_ns >= floors["dma"] * (1 - 1e-9), (report.latency_ns, floors)
    # The DMA floor against the engines' own rate, not only the reported one.
    p = params_for(target)
    hbm = sum(report.hbm_bytes().values())
    assert report.latency_ns >= hbm / (p.dma_engines * p.dma_engine_gbps) * (1 - 1e-9)


# -- doubling, overlap, serialization -------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_doubling_independent_work_doubles_busy_time(target):
    x = np.empty((128, 512), np.float32)
    w = np.empty((128, 128), bf16), np.empty((128, 512), bf16)
    cases = [
        (vector_ops, (x,), "n_ops", "dve"),
        (matmuls, w, "n_mm", "pe"),
    ]
    for kernel, args, knob, unit in cases:
        busy = [_model(kernel, args, target, {knob: n})[1].busy_ns[unit] for n in (8, 16)]
        assert busy[1] == pytest.approx(2 * busy[0], rel=1e-9), (kernel.__name__, busy)
    dma = [sum(_model(loads, (x,), target, {"n_loads": n})[1].dma_engine_busy_ns) for n in (8, 16)]
    assert dma[1] == pytest.approx(2 * dma[0], rel=1e-9)


def test_independent_instructions_on_two_engines_overlap():
    x = np.empty((128, 2048), np.float32)
    r, tl = _model(act_and_vector, (x,), kwargs={"dependent": False})
    (ia,), (iv,) = _indices(r, "activation"), _indices(r, "tensor_scalar")
    a0, a1 = tl.start[ia], tl.start[ia] + tl.occupancy[ia]
    v0, v1 = tl.start[iv], tl.start[iv] + tl.occupancy[iv]
    overlap = min(a1, v1) - max(a0, v0)
    assert overlap >= 0.5 * min(a1 - a0, v1 - v0), (a0, a1, v0, v1)


def test_dependent_chain_serializes():
    x = np.empty((128, 2048), np.float32)
    r, tl = _model(act_and_vector, (x,), kwargs={"dependent": True})
    (ia,), (iv,) = _indices(r, "activation"), _indices(r, "tensor_scalar")
    assert tl.start[iv] >= tl.end[ia] + params_for("trn2").sync_ns - 1e-9
    # A chain of n dependent VectorE ops: each adds exactly II + pipeline latency.
    p = params_for("trn2")
    per_op = (512 + p.engine_latency_cycles) / p.dve_ghz  # fp32 tensor_scalar: N cycles
    lat = [
        _model(vector_chain, (np.empty((128, 512), np.float32),), kwargs={"n_ops": n})[1].latency_ns
        for n in (4, 8)
    ]
    assert lat[1] - lat[0] == pytest.approx(4 * per_op, rel=1e-9)


@pytest.mark.parametrize("target", TARGETS)
def test_fp32_matmul_costs_four_times_bf16(target):
    busy = {}
    for dt in (np.float32, bf16):
        busy[dt] = _model(
            matmuls, (np.empty((128, 128), dt), np.empty((128, 512), dt)), target, {"n_mm": 8}
        )[1].busy_ns["pe"]
    assert busy[np.float32] == pytest.approx(4 * busy[bf16], rel=1e-9)


def test_psum_has_eight_banks():
    """Matmul i + 8 reuses the bank of group i, so it waits for group i's evacuation; the
    VectorE copy (fp32 [128, 512]) is slower than the BF16 matmul, so this binds."""
    args = (np.empty((128, 128), bf16), np.empty((128, 512), bf16))
    r, tl = _model(matmuls, args, kwargs={"n_mm": 32})
    mm, cp = _indices(r, "nc_matmul"), _indices(r, "tensor_copy")
    assert all(tl.start[mm[i + 8]] >= tl.end[cp[i]] - 1e-9 for i in range(24))
    # Without the bank model the PE runs ahead of the evacuations.
    _, free = _model(matmuls, args, kwargs={"n_mm": 32}, psum_allocator="unbounded")
    assert any(free.start[mm[i + 8]] < free.end[cp[i]] for i in range(24))
    assert free.busy_ns["pe"] == pytest.approx(tl.busy_ns["pe"])


def test_stores_to_disjoint_tiles_of_one_output_do_not_wait_for_each_other():
    """Side-by-side HBM tiles share a byte bounding box but no bytes: no false WAW edge."""

    def k(x):
        out = nl.ndarray((128, 1024), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out[:, 0:512], src=t)
        nisa.dma_copy(dst=out[:, 512:1024], src=t)
        return out

    r, tl = _model(k, (np.empty((128, 512), np.float32),))
    _, s1, s2 = _indices(r, "dma_copy")
    # Same queue, so the second runs after the first on each engine, but without waiting
    # for the first's completion semaphore plus a fresh DMA latency (1.3 us).
    assert tl.start[s2] - tl.end[s1] < 0.1 * params_for("trn2").dma_latency_ns


def test_critical_engine_follows_the_bottleneck():
    _, dma_bound = _model(loads, (np.empty((128, 512), np.float32),), kwargs={"n_loads": 64})
    _, pe_bound = _model(
        matmuls,
        (np.empty((128, 128), np.float32), np.empty((128, 512), np.float32)),
        kwargs={"n_mm": 64},
    )
    assert dma_bound.critical_unit == "dma"
    assert pe_bound.critical_unit == "pe"


# -- the published micro-measurements the parameters come from ----------------------------


def test_single_engine_dma_matches_a10():
    """A10: one DMA engine moves [4, 4096] BF16 (32 KiB) HBM->SBUF in 1,416 ns on Trn2."""

    def k(x):
        t = nl.ndarray((4, 4096), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        return None

    r, tl = _model(k, (np.empty((4, 4096), bf16),))
    (i,) = _indices(r, "dma_copy")
    assert sum(1 for b in tl.dma_engine_busy_ns if b > 0) == 1  # 4 partitions: one engine
    assert tl.end[i] - tl.start[i] == pytest.approx(1416.0, rel=0.02)


def test_dependent_scalar_chain_matches_a12():
    """A12: dependent one-element ScalarE instructions issue every ~189 ns on NC-v2."""

    def k(x, n):
        t = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        for _ in range(n):
            o = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.sbuf)
            nisa.activation(dst=o, op=nl.exp, data=t)
            t = o
        return None

    lat = [
        _model(k, (np.empty((128, 1), np.float32),), "trn1", {"n": n})[1].latency_ns
        for n in (10, 20)
    ]
    assert (lat[1] - lat[0]) / 10 == pytest.approx(189.0, rel=0.01)


# -- parameters and timelines ----------------------------------------------------------------------


def test_every_parameter_has_source_and_confidence():
    names = set(PARAMS["trn2"])
    for target, table in PARAMS.items():
        assert set(table) == names, target
        for name, p in table.items():
            assert p.source.strip() and p.unit.strip(), (target, name)
            assert p.confidence in ("high", "medium", "low"), (target, name, p.confidence)


def test_overrides_change_the_fingerprint_and_the_model():
    base = params_for("trn2")
    slow = base.replace(dma_engine_gbps=base.dma_engine_gbps / 2)
    assert slow.fingerprint() != base.fingerprint()
    x = np.empty((128, 512), np.float32)
    r = run(loads, (x,), {"n_loads": 32}, target="trn2", compute=False)
    assert (
        model_trace(r.trace, "trn2", params=slow).latency_ns
        > model_trace(r.trace, "trn2").latency_ns
    )
    with pytest.raises(LimitError) as err:
        base.replace(no_such_parameter=1.0)
    assert err.value.arg == "parameter" and "no_such_parameter" in str(err.value)


def test_timeline_fill_uses_gaps_and_counts_busy_once():
    t = Timeline()
    t.reserve(10.0, 10.0)  # busy [10, 20)
    t.reserve(30.0, 10.0)  # busy [30, 40)
    start, end = t.fill(0.0, 25.0)  # 10 before, 10 in the gap, 5 after
    assert (start, end) == (0.0, 45.0)
    assert t.busy == pytest.approx(45.0)
    assert t.earliest(0.0, 1.0) == 45.0
    t.reserve(44.0, 2.0)  # overlaps 1 ns of busy time: only 1 ns is new
    assert t.busy == pytest.approx(46.0)
    assert math.isclose(t.last_end, 46.0)


@pytest.mark.parametrize(
    "dtype, target, cycles",
    [(bf16, "trn2", 4096 / 4), (bf16, "trn1", 4096), (np.float32, "trn2", 4096)],
)
def test_vector_performance_mode(dtype, target, cycles):
    """NC-v3 VectorE copies BF16 SBUF->SBUF at 4x ([arch-v2]; [isa-old]; [arch-v3]); FP32 and NC-v2 at 1x."""

    def k(x):
        t = nl.ndarray((128, 4096), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        o = nl.ndarray((128, 4096), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=t)
        return None

    _, tl = _model(k, (np.empty((128, 4096), dtype),), target)
    assert tl.busy_ns["dve"] == pytest.approx(cycles / params_for(target).dve_ghz, rel=1e-9)
