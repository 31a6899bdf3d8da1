"""The two cores of an LNC=2 launch in lock-step (interpreter/cores.py).

Sources: nki/get-started/about/lnc.rst (``kernel[2]``; both cores run "the same" program;
dynamic control flow that differs between them is undefined), nki/guides/nki_simulator.rst
(AWS's simulator runs the two instances as threads), logical-neuroncore-config.rst (each
physical core keeps its own SBUF/PSUM; HBM is shared).

What this proves: one core really waits for the other at a barrier (it sees the other
core's writes made before it), the interleaving is deterministic, unmatched barriers and
diverging register-driven loops are refused, and SBUF capacity is per core. What only a Trn2
run can show: the hang or runtime error the hardware gives for the refused kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


@nki.jit
def core1_reads_what_core0_wrote(x):
    """Core 0 writes flag = x + 1, both barrier, core 1 copies flag to out. Sequential
    instances (the old runner) would give core 1 the flag only because core 0 ran first;
    here core 1 runs its segment before the barrier only after core 0 reached it."""
    flag = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="flag")
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    if nl.program_id(0) == 0:
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=flag, src=t)
    nisa.core_barrier(data=flag, cores=(0, 1))
    if nl.program_id(0) == 1:
        nisa.dma_copy(dst=t, src=flag)
        nisa.dma_copy(dst=out, src=t)
    return out


def test_barrier_makes_core0s_write_visible_to_core1():
    x = np.full((2, 3), 4.0, np.float32)
    r = run(core1_reads_what_core0_wrote[2], (x,))
    np.testing.assert_array_equal(r.outputs, x + 1)
    # Trace order: core 0's segment and barrier, core 1's barrier, then core 1's reads.
    assert [(i.core, i.api) for i in r.trace] == [
        (0, "nisa.dma_copy"),
        (0, "nisa.tensor_scalar"),
        (0, "nisa.dma_copy"),
        (0, "nisa.core_barrier"),
        (1, "nisa.core_barrier"),
        (1, "nisa.dma_copy"),
        (1, "nisa.dma_copy"),
    ]


def test_lock_step_trace_is_deterministic():
    x = np.ones((2, 3), np.float32)
    traces = {
        tuple((i.core, i.api) for i in run(core1_reads_what_core0_wrote[2], (x,)).trace)
        for _ in range(3)
    }
    assert len(traces) == 1


@nki.jit
def barrier_on_core0_only(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    if nl.program_id(0) == 0:
        nisa.core_barrier(data=out, cores=(0, 1))
    return out


def test_barrier_one_core_never_reaches_is_refused():
    with pytest.raises(NkiValidationError) as info:
        run(barrier_on_core0_only[2], (np.ones((1, 1), np.float32),))
    err = info.value
    assert (err.op, err.arg) == ("nisa.core_barrier", "core 0")
    assert "other core ended" in err.rule


@nki.jit
def barriers_on_different_tensors(x):
    a = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="a")
    b = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="b")
    nisa.core_barrier(data=a if nl.program_id(0) == 0 else b, cores=(0, 1))
    return a


def test_barriers_must_match_across_cores():
    with pytest.raises(NkiValidationError) as info:
        run(barriers_on_different_tensors[2], (np.ones((1, 1), np.float32),))
    assert info.value.arg == "core 1"
    assert "'a'" in info.value.value and "'b'" in info.value.value


@nki.jit
def loop_count_from_data(counts):
    """Each core loops counts[core] times (a register loaded from HBM)."""
    out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
    reg = nisa.register_alloc()
    c = nl.program_id(0)
    nisa.register_load(reg, counts[c : c + 1, :])
    acc = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)

    def body(i):
        nisa.memset(dst=acc, value=1)

    nl.fori_loop(0, reg, body)
    if c == 0:
        nisa.dma_copy(dst=out, src=acc)
    return out


def test_dynamic_control_flow_must_agree_between_cores():
    ok = run(loop_count_from_data[2], (np.array([[3], [3]], np.int32),))
    np.testing.assert_array_equal(ok.outputs, [[1]])
    with pytest.raises(NkiValidationError) as info:
        run(loop_count_from_data[2], (np.array([[3], [2]], np.int32),))
    err = info.value
    assert err.arg.startswith("dynamic control flow at nl.fori_loop at test_cores.py:")
    assert err.value == "3 iterations on core 0, 2 on core 1 (occurrence 1)"


@nki.jit
def uses_most_of_sbuf(x):
    """Each core holds ~60% of trn2's usable SBUF per partition: fine per core, and would be
    over capacity if the two cores' tiles were counted together."""
    n = 212984 * 6 // 10 // 4
    big = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=big, value=0.0)
    out = nl.ndarray((2, 1), nl.float32, buffer=nl.shared_hbm)
    c = nl.program_id(0)
    nisa.dma_copy(dst=out[c : c + 1, :], src=big[0:1, 0:1])
    return out


def test_sbuf_capacity_is_per_core():
    r = run(uses_most_of_sbuf[2], (np.ones((1, 1), np.float32),), compute=False)
    assert len(r.memory) == 2
    assert all(m.sbuf_bytes == 212984 * 6 // 10 // 4 * 4 for m in r.memory)


def test_kernel_error_on_one_core_propagates_and_stops_the_other():
    @nki.jit
    def bad_on_core1(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.core_barrier(data=out, cores=(0, 1))
        if nl.program_id(0) == 1:
            nl.ndarray((129, 1), nl.float32, buffer=nl.sbuf)
        nisa.core_barrier(data=out, cores=(0, 1))
        return out

    with pytest.raises(NkiValidationError) as info:
        run(bad_on_core1[2], (np.ones((1, 1), np.float32),))
    assert info.value.op == "nl.ndarray"
