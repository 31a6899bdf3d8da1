"""Races between the two cores of an LNC=2 launch on shared HBM (interpreter/races.py).

Sources: nki/get-started/about/lnc.rst (``kernel[2]``, split by ``nl.program_id``),
nki/api/nki/isa/__init__.py ``core_barrier`` (cores write disjoint parts of a shared tensor,
then barrier before consuming it), about-neuron/arch/neuron-features/
logical-neuroncore-config.rst (the two cores share one HBM stack and address space).

What this proves: the interpreter reports, deterministically and naming both instructions,
two same-epoch accesses of the same HBM bytes from different cores when one writes; it
accepts disjoint splits (also interleaved columns whose bounding boxes overlap) and
accesses ordered by a barrier on the tensor. What only a Trn2 run can show: that the
hardware's actual interleaving would corrupt the racy kernels (the check is conservative
by construction: a race is reported whether or not a given run would observe it).
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


@nki.jit
def add_unsplit(a, b):
    """Both cores do all the work: every output byte is written by both cores."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm, name="out")
    at = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    bt = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a)
    nisa.dma_copy(dst=bt, src=b)
    nisa.tensor_tensor(dst=at, data1=at, data2=bt, op=nl.add)
    nisa.dma_copy(dst=out, src=at, name="store_out")
    return out


@nki.jit
def add_split_rows(a, b):
    """Each core adds its half of the rows (lnc.rst's pattern)."""
    rows, cols = a.shape
    half = rows // nl.num_programs(0)
    r0 = nl.program_id(0) * half
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    at = nl.ndarray((half, cols), a.dtype, buffer=nl.sbuf)
    bt = nl.ndarray((half, cols), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a[r0 : r0 + half, :])
    nisa.dma_copy(dst=bt, src=b[r0 : r0 + half, :])
    nisa.tensor_tensor(dst=at, data1=at, data2=bt, op=nl.add)
    nisa.dma_copy(dst=out[r0 : r0 + half, :], src=at)
    return out


@nki.jit
def add_interleaved_columns(a, b):
    """Core c writes columns c, c + 2, ...: the cores' tiles share a bounding box but no byte."""
    rows, cols = a.shape
    n, c = nl.num_programs(0), nl.program_id(0)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    at = nl.ndarray((rows, cols // n), a.dtype, buffer=nl.sbuf)
    bt = nl.ndarray((rows, cols // n), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a[:, c::n])
    nisa.dma_copy(dst=bt, src=b[:, c::n])
    nisa.tensor_tensor(dst=at, data1=at, data2=bt, op=nl.add)
    nisa.dma_copy(dst=out[:, c::n], src=at)
    return out


def _exchange_halves(barrier_on):
    """Each core writes its half of a shared scratch, then reads the other core's half.
    ``barrier_on``: "scratch" (correct), "other" (a barrier on an unrelated tensor) or None."""

    @nki.jit
    def kernel(x):
        rows, cols = x.shape
        half = rows // 2
        c = nl.program_id(0)
        scratch = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="scratch")
        other = nl.ndarray((1, 1), x.dtype, buffer=nl.shared_hbm, name="other")
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="out")
        t = nl.ndarray((half, cols), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[c * half : (c + 1) * half, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=scratch[c * half : (c + 1) * half, :], src=t, name="write_mine")
        if barrier_on == "scratch":
            nisa.core_barrier(data=scratch, cores=(0, 1))
        elif barrier_on == "other":
            nisa.core_barrier(data=other, cores=(0, 1))
        peer = 1 - c
        u = nl.ndarray((half, cols), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=scratch[peer * half : (peer + 1) * half, :], name="read_peer")
        nisa.dma_copy(dst=out[c * half : (c + 1) * half, :], src=u)
        return out

    return kernel


X = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)


def test_unsplit_kernel_at_lnc2_is_a_race_naming_both_instructions():
    with pytest.raises(NkiValidationError) as info:
        run(add_unsplit[2], (X, X))
    err = info.value
    assert (err.op, err.arg) == ("nki.jit", "HBM tensor 'out'")
    assert "core 0 instruction #3 (nisa.dma_copy, writes" in err.value
    assert "core 1 instruction #7 (nisa.dma_copy, writes" in err.value


def test_unsplit_kernel_passes_at_lnc1():
    np.testing.assert_array_equal(add_unsplit(X, X), 2 * X)


@pytest.mark.parametrize("kernel", [add_split_rows, add_interleaved_columns])
def test_split_kernels_pass_at_lnc2(kernel):
    r = run(kernel[2], (X, X + 1))
    np.testing.assert_array_equal(r.outputs, 2 * X + 1)
    assert {i.core for i in r.trace} == {0, 1}


def test_barrier_orders_the_exchange_through_shared_hbm():
    r = run(_exchange_halves("scratch")[2], (X,))
    want = np.concatenate([2 * X[64:], 2 * X[:64]])
    np.testing.assert_array_equal(r.outputs, want)
    barriers = [i for i in r.trace if i.api == "nisa.core_barrier"]
    assert [b.core for b in barriers] == [0, 1]


@pytest.mark.parametrize("barrier_on", [None, "other"])
def test_reading_the_other_cores_writes_without_a_barrier_on_them_is_a_race(barrier_on):
    """A barrier orders the accesses of the tensor it names only (core_barrier ``data``)."""
    with pytest.raises(NkiValidationError) as info:
        run(_exchange_halves(barrier_on)[2], (X,))
    err = info.value
    assert err.arg == "HBM tensor 'scratch'"
    assert "writes" in err.value and "reads" in err.value
    assert err.value.count("nisa.dma_copy") == 2


def test_race_report_is_deterministic():
    messages = set()
    for _ in range(3):
        with pytest.raises(NkiValidationError) as info:
            run(add_unsplit[2], (X, X))
        messages.add(str(info.value))
    assert len(messages) == 1


def test_race_is_found_without_arithmetic():
    """compute=False (the profiler's mode) keeps the check: it needs only the access patterns."""
    with pytest.raises(NkiValidationError, match="HBM tensor 'out'"):
        run(add_unsplit[2], (X, X), compute=False)


def _two_writers(region0, region1, transposed=False):
    """Core 0 writes ``out[region0]`` and core 1 ``out[region1]`` (slices of a [128, 8] tensor);
    ``transposed``: each writes its slice's transpose ``out[region].permute((1, 0))``, as the
    matmul kernel stores C^T tiles (row stride 1 element, column stride a whole row)."""

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="out")
        region = region0 if nl.program_id(0) == 0 else region1
        view = out[region].permute((1, 0)) if transposed else out[region]
        t = nl.ndarray(tuple(view.shape), x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        nisa.dma_copy(dst=view, src=t)
        return out

    return kernel


@pytest.mark.parametrize(
    ("region0", "region1", "race"),
    [
        ((slice(0, 64), slice(0, 4)), (slice(64, 128), slice(None)), False),  # tile vs rows
        ((slice(0, 64), slice(0, 4)), (slice(60, 128), slice(None)), True),  # rows 60-63 meet
        ((slice(0, 64), slice(0, 4)), (slice(0, 128), slice(4, 8)), False),  # side by side
        ((slice(0, 64), slice(0, 8, 2)), (slice(0, 64), slice(1, 8, 2)), False),  # interleaved
        ((slice(0, 64), slice(0, 8, 2)), (slice(32, 64), slice(2, 3)), True),  # column 2 meets
        ((slice(0, 128, 2), slice(None)), (slice(1, 128, 2), slice(None)), False),  # odd/even rows
    ],
)
def test_race_needs_the_same_bytes_not_just_the_same_box(region0, region1, race):
    """Bounding boxes overlap in every case; only the exact bytes decide."""
    kernel = _two_writers(region0, region1)[2]
    if race:
        with pytest.raises(NkiValidationError, match="HBM tensor 'out'"):
            run(kernel, (X,))
    else:
        run(kernel, (X,))


@pytest.mark.parametrize(
    ("region0", "region1", "race"),
    [
        ((slice(0, 64), slice(0, 4)), (slice(0, 64), slice(4, 8)), False),  # side by side
        ((slice(0, 64), slice(0, 4)), (slice(64, 128), slice(0, 4)), False),  # one above other
        ((slice(0, 64), slice(0, 4)), (slice(32, 128), slice(2, 6)), True),  # [32:64, 2:4] meet
        ((slice(0, 64), slice(0, 4)), (slice(63, 64), slice(3, 4)), True),  # one element meets
    ],
)
def test_transposed_tiles_race_exactly_when_they_share_an_element(region0, region1, race):
    """Transposed tiles span every row they cover, so their byte ranges overlap whenever their
    rows do; they are compared as boxes of the tensor (row range x column range), exactly."""
    kernel = _two_writers(region0, region1, transposed=True)[2]
    if race:
        with pytest.raises(NkiValidationError, match="HBM tensor 'out'"):
            run(kernel, (X,))
    else:
        run(kernel, (X,))


def test_transposed_tile_is_a_box_of_its_tensor():
    """The box of ``out[8:24, 2:6].permute((1, 0))`` is rows 8..23 x columns 2..5; a strided
    view (every other column) is not a box and keeps the exact byte comparison."""
    from neuron_kernels.interpreter.races import _box

    seen = {}

    @nki.jit
    def kernel(x):
        out = nl.ndarray((32, 8), x.dtype, buffer=nl.shared_hbm, name="out")
        seen["t"] = _box(out[8:24, 2:6].permute((1, 0)))
        seen["strided"] = _box(out[8:24, 0:8:2])
        seen["rows"] = _box(out[8:24, :])
        return out

    run(kernel, (X,))
    assert seen == {"t": ((8, 23), (2, 5)), "strided": None, "rows": ((8, 23), (0, 7))}


@nki.jit
def column_sums_split_then_combined(x):
    """RMSNorm-backward-style reduction at LNC=2: each core sums its half of the rows into
    its own row of a shared scratch, both barrier on the scratch, then core 0 alone adds the
    two partials in a fixed order and stores the result (no race, bitwise deterministic)."""
    rows, cols = x.shape
    n, c = nl.num_programs(0), nl.program_id(0)
    half = rows // n
    scratch = nl.ndarray((n, cols), nl.float32, buffer=nl.shared_hbm, name="partials")
    out = nl.ndarray((1, cols), nl.float32, buffer=nl.shared_hbm, name="sums")
    t = nl.ndarray((half, cols), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[c * half : (c + 1) * half, :])
    ones = nl.ndarray((half, 1), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    acc = nl.ndarray((1, cols), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=ones, moving=t)  # ones.T @ t: the column sums
    part = nl.ndarray((1, cols), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=part, src=acc)
    nisa.dma_copy(dst=scratch[c : c + 1, :], src=part)
    if n > 1:
        nisa.core_barrier(data=scratch, cores=(0, 1))
    if c == 0:
        both = nl.ndarray((1, cols), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=part, src=scratch[0:1, :])
        for k in range(1, n):
            nisa.dma_copy(dst=both, src=scratch[k : k + 1, :])
            nisa.tensor_tensor(dst=part, data1=part, data2=both, op=nl.add)
        nisa.dma_copy(dst=out, src=part)
    return out


def test_split_reduction_combined_after_a_barrier_is_race_free_and_deterministic():
    x = np.random.default_rng(0).standard_normal((128, 16)).astype(np.float32)
    outs = [np.asarray(run(column_sums_split_then_combined[2], (x,)).outputs) for _ in range(2)]
    np.testing.assert_array_equal(outs[0], outs[1])  # bitwise the same run to run
    # fp32 sums of 64 then 2 terms: 1e-5 relative is loose for fp32 rounding, tight for a bug
    np.testing.assert_allclose(outs[0], x.sum(axis=0, keepdims=True), rtol=1e-5, atol=1e-5)
