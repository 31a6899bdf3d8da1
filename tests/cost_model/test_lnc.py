"""The cost model at LNC=2: two physical cores sharing one HBM stack (cost_model/schedule.py).

Sources: about-neuron/arch/neuron-features/logical-neuroncore-config.rst (two physical cores
per logical core at LNC=2, one 24 GB HBM bank shared by the two), nki/api/nki/isa/__init__.py
(core_barrier: semaphores between the cores; sendrecv: DMA engines), the params table
(``hbm_stack_gbps``, ``core_barrier_ns``).

What this proves: the model schedules each core on its own engines and DMA engines, bounds
their HBM traffic together by one stack, makes a core wait at a barrier for the other, and
reports per logical core at the launch's LNC. Every number is modeled. What only a Trn2 run
can show: the real stack bandwidth two busy cores get and the barrier's real latency.
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.cost_model.params import params_for
from neuron_kernels.cost_model.profiler import profile
from neuron_kernels.cost_model.schedule import model_trace
from neuron_kernels.interpreter import nki, run

nl, nisa = nki.language, nki.isa

ROWS, COLS, TILE = 2048, 2048, 2048


@nki.jit
def split_add(a, b):
    """Row tiles dealt round-robin to the cores (lnc.rst's split); DMA-bound."""
    rows, cols = a.shape
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for t in range(nl.program_id(0), rows // 128, nl.num_programs(0)):
        for c0 in range(0, cols, TILE):
            at = nl.ndarray((128, TILE), a.dtype, buffer=nl.sbuf)
            bt = nl.ndarray((128, TILE), a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=at, src=a[t * 128 : (t + 1) * 128, c0 : c0 + TILE])
            nisa.dma_copy(dst=bt, src=b[t * 128 : (t + 1) * 128, c0 : c0 + TILE])
            nisa.tensor_tensor(dst=at, data1=at, data2=bt, op=nl.add)
            nisa.dma_copy(dst=out[t * 128 : (t + 1) * 128, c0 : c0 + TILE], src=at)
    return out


A = np.zeros((ROWS, COLS), np.float32)
BYTES = 3 * A.nbytes  # two loads and one store


@pytest.fixture(scope="module")
def timelines():
    out = {}
    for lnc in (1, 2):
        r = run(split_add[lnc], (A, A), compute=False)
        out[lnc] = (r, model_trace(r.trace))
    return out


def test_lnc2_is_two_cores_each_with_its_own_engines(timelines):
    (_, t1), (r2, t2) = timelines[1], timelines[2]
    assert (t1.cores, t2.cores) == (1, 2)
    assert len(t2.dma_engine_busy_ns) == 2 * int(params_for("trn2").dma_engines)
    # same total work, split: the VectorE busy time adds up to LNC=1's
    assert t2.busy_ns["dve"] == pytest.approx(t1.busy_ns["dve"], rel=1e-9)
    # both cores' VectorE run at once: each core's adds overlap the other's
    dve = {
        c: [
            (t2.start[i], t2.end[i])
            for i in range(len(r2.trace))
            if t2.unit[i] == "dve" and r2.trace.instructions[i].core == c
        ]
        for c in (0, 1)
    }
    assert dve[1][0][0] < dve[0][-1][1]


def test_the_cores_share_one_hbm_stack(timelines):
    p = params_for("trn2")
    t1, t2 = timelines[1][1], timelines[2][1]
    engines = p.dma_engine_gbps * p.dma_engines
    # LNC=1: one core's 16 engines bind (435 GB/s < its stack's 725)
    assert t1.latency_ns >= BYTES / min(engines, p.dma_core_gbps)
    # LNC=2: 32 engines (870 GB/s) but one stack (725 GB/s) for both cores
    assert t2.latency_ns >= BYTES / p.hbm_stack_gbps
    speedup = t1.latency_ns / t2.latency_ns
    assert 1.2 < speedup <= p.hbm_stack_gbps / min(engines, p.dma_core_gbps) + 1e-9


def test_a_wider_stack_speeds_lnc2_up_only():
    """hbm_stack_gbps is the LNC=2 channel; LNC=1 keeps dma_core_gbps (bit-identical)."""
    r1 = run(split_add[1], (A, A), compute=False)
    r2 = run(split_add[2], (A, A), compute=False)
    wide = params_for("trn2", hbm_stack_gbps=2000.0)
    assert model_trace(r1.trace, params=wide).latency_ns == model_trace(r1.trace).latency_ns
    assert model_trace(r2.trace, params=wide).latency_ns < model_trace(r2.trace).latency_ns


@nki.jit
def work_then_barrier(x):
    """Core 0 computes 8 VectorE passes and stores a value to ``out``; both barrier on
    ``out``; then core 1 reads what core 0 stored (the barrier orders ``data``'s accesses)."""
    t = nl.ndarray((128, 2048), nl.float32, buffer=nl.sbuf)
    out = nl.ndarray((2, 1), nl.float32, buffer=nl.shared_hbm)
    c = nl.program_id(0)
    if c == 0:
        nisa.memset(dst=t, value=1.0)
        for _ in range(8):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[0:1, :], src=t[0:1, 0:1], name="store")
    nisa.core_barrier(data=out, cores=(0, 1))
    if c == 1:
        nisa.dma_copy(dst=t[0:1, 0:1], src=out[0:1, :], name="load")
        nisa.dma_copy(dst=out[1:2, :], src=t[0:1, 0:1])
    return out


def test_barrier_holds_the_early_core_until_the_late_one_arrives():
    r = run(work_then_barrier[2], (np.zeros((1, 1), np.float32),), compute=False)
    tl = model_trace(r.trace)
    p = params_for("trn2")
    ins = r.trace.instructions
    barrier = {i.core: i.index for i in ins if i.api == "nisa.core_barrier"}
    store = next(i.index for i in ins if i.name == "store")
    load = next(i.index for i in ins if i.name == "load")
    assert tl.end[barrier[0]] == tl.end[barrier[1]] >= tl.end[store] + p.core_barrier_ns
    assert tl.start[barrier[1]] < tl.end[store]  # core 1 arrived early and waited
    assert tl.start[load] >= tl.end[barrier[1]]


@nki.jit
def swap(x):
    c = nl.program_id(0)
    mine = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    got = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[c * 128 : (c + 1) * 128, :])
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - c, recv_from_rank=1 - c, pipe_id=0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[c * 128 : (c + 1) * 128, :], src=got)
    return out


def test_sendrecv_costs_a_dma_transfer_after_both_arrive():
    r = run(swap[2], (np.zeros((256, 512), np.float32),), compute=False)
    tl = model_trace(r.trace)
    p = params_for("trn2")
    sr = [i.index for i in r.trace.instructions if i.api == "nisa.sendrecv"]
    both = max(tl.start[i] for i in sr)
    per_engine = 8 * 512 * 4  # 8 partitions of 2 KiB per DMA engine
    floor = both + p.dma_latency_ns + p.dma_transfer_ns + per_engine / p.dma_engine_gbps
    assert all(tl.end[i] >= floor for i in sr)
    assert tl.end[sr[0]] == tl.end[sr[1]]
    assert r.trace.instructions[sr[0]].reads[0].buffer == "sbuf"
    assert tl.dma_hbm_bytes["read"] == 2 * 128 * 512 * 4  # the exchange is not HBM traffic


def test_profile_reports_per_logical_core_at_the_launch_lnc():
    one = profile(split_add[1])(A, A)
    two = profile(split_add[2])(A, A)
    assert (one.unit, two.unit) == ("per logical core, LNC=1", "per logical core, LNC=2")
    assert two.peak_flops_per_s == 2 * one.peak_flops_per_s
    p = params_for("trn2")
    assert one.floors_ns()["dma"] == pytest.approx(BYTES / (p.dma_engine_gbps * p.dma_engines))
    assert two.floors_ns()["dma"] == pytest.approx(BYTES / p.hbm_stack_gbps)
    d = two.to_dict()
    assert (d["lnc"], d["unit"]) == (2, "per logical core, LNC=2")
    assert 0 < d["utilization"]["dve"] <= 1 and 0 < d["utilization"]["dma"] <= 1
    assert "per logical core, LNC=2" in two.text() and "LNC=1" in one.text()


@nki.jit
def big_tile_per_core(x):
    """Each core holds 60% of trn2's usable SBUF per partition at the same time."""
    big = nl.ndarray((128, 212984 * 6 // 10 // 4), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=big, value=0.0)
    out = nl.ndarray((2, 1), nl.float32, buffer=nl.shared_hbm)
    c = nl.program_id(0)
    nisa.dma_copy(dst=out[c : c + 1, :], src=big[0:1, 0:1])
    return out


def test_sbuf_in_flight_is_per_physical_core():
    rep = profile(big_tile_per_core[2])(np.zeros((1, 1), np.float32))
    mem = rep.memory()
    per_core = 212984 * 6 // 10 // 4 * 4
    assert mem["sbuf_bytes_per_partition"] == per_core
    assert mem["sbuf_in_flight_bytes_per_partition"] == per_core  # not the two cores' sum
    assert "per physical core" in rep.text()
