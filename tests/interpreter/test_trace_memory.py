"""Memory of a trace-only run (``run(..., compute=False)``): what the tuner's model backend
holds per traced instruction.

The tuner traces full-size problems: a matmul 8192x28672x8192 bf16 trial is ~541k
instructions and must fit in 4 GB with its schedule, so that two trials (``--jobs 2``) fit on
a 24 GB, 2-core machine. These tests pin the per-instruction cost on a small kernel, cheaply
(tracemalloc also counts NumPy's buffers). They prove nothing about the hardware, only about
this interpreter's bookkeeping.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from neuron_kernels.interpreter import nki, run

nl, nisa = nki.language, nki.isa

# Bound chosen before measuring, from the budget: 4 GB for ~541k instructions of the 70B trial
# leaves ~7 KiB per instruction for the trace, the schedule and the interpreter together; the
# trace-only run gets at most 4 KiB of it. Before PSUM tiles released their per-element
# accumulation state (one byte per element: 64 KiB for a [128, 512] fp32 tile), each matmul
# group here kept >20 KiB per instruction alive.
MAX_BYTES_PER_INSTRUCTION = 4096
TILES = 96


def _psum_groups(a_t, b):
    """One new PSUM tile per iteration: two accumulating matmuls, then a copy to SBUF."""
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    lhs = nl.ndarray((128, 128), nl.bfloat16, buffer=nl.sbuf)
    rhs = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=lhs, src=a_t)
    nisa.dma_copy(dst=rhs, src=b)
    res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    for _ in range(TILES):
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=lhs, moving=rhs, accumulate=False)
        nisa.nc_matmul(dst=acc, stationary=lhs, moving=rhs, accumulate=True)
        nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def _inputs():
    import ml_dtypes

    a_t = np.zeros((128, 128), ml_dtypes.bfloat16)
    b = np.zeros((128, 512), ml_dtypes.bfloat16)
    return a_t, b


def test_trace_only_run_holds_few_bytes_per_instruction():
    args = _inputs()
    run(_psum_groups, args, compute=False)  # warm: imports, caches
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = run(_psum_groups, args, compute=False)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    n = len(result.trace)
    assert n == 3 * TILES + 3
    assert peak / n <= MAX_BYTES_PER_INSTRUCTION, f"{peak / n:.0f} B per traced instruction"


def test_a_psum_tile_without_views_releases_its_state(monkeypatch):
    """The state is dropped only once no view of the tile is left; the accumulation checks
    of live tiles still see it (each group's accumulate=True matmul is checked against it)."""
    from neuron_kernels.interpreter import execution

    held = []
    capacity = execution.check_capacity

    def spy(sim):
        held.extend(s for s in sim.on_chip if s.psum_state is not None)
        return capacity(sim)

    monkeypatch.setattr(execution, "check_capacity", spy)
    result = run(_psum_groups, _inputs(), compute=False)
    assert held == []
    assert result.trace.count_by_api()["nisa.nc_matmul"] == 2 * TILES


def test_a_copied_view_keeps_its_psum_tile_state():
    """``copy.copy`` of a view counts as a view: the state outlives the original."""
    import copy

    seen = []

    def kernel(a_t, b):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        lhs = nl.ndarray((128, 128), nl.bfloat16, buffer=nl.sbuf)
        rhs = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=lhs, src=a_t)
        nisa.dma_copy(dst=rhs, src=b)
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        acc = copy.copy(acc)  # the original view is gone, the copy is the only one left
        seen.append(acc._storage.psum_state is not None)
        nisa.nc_matmul(dst=acc, stationary=lhs, moving=rhs, accumulate=False)
        res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out, src=res)
        return out

    run(kernel, _inputs(), compute=False)
    assert seen == [True]
