"""``nisa.nc_stream_shuffle`` against a NumPy reference written from its docstring
(aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py, snapshot 81ce03ae): "shuffle_mask[i]
indicates which input partition the output partition [i] copies from within each
32-partition quadrant. The special value shuffle_mask[i]=255 means the output tensor in
partition [i] will be unmodified ... the same shuffle_mask is used for each quadrant".

The instruction moves bits, so results are compared exactly (no tolerance). What only a
Trn2 run can show: the value of partitions the docstring leaves undefined (none are read
here) and the instruction's real cycle count (the cost rule is the one-pass VectorE rule).
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.cost_model.instruction_costs import COST_RULES
from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa
RNG = np.random.default_rng(27)


def reference(src, dst_before, mask):
    """The docstring, literally: per quadrant q, out[q*32+i] = src[q*32+mask[i]]."""
    out = dst_before.copy()
    for q in range(dst_before.shape[0] // 32):
        for i in range(32):
            if mask[i] != 255:
                out[q * 32 + i, :] = src[q * 32 + mask[i], :]
    return out


def shuffle_kernel(x, before, mask, dst_rows=None, dst_start=0, in_place=False):
    p, f = x.shape
    rows = p if dst_rows is None else dst_rows
    out = nl.ndarray((rows, f), x.dtype, buffer=nl.shared_hbm)
    src = nl.ndarray((p, f), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    big = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
    dst = big[dst_start : dst_start + rows, :]
    nisa.dma_copy(dst=dst, src=before)
    if in_place:
        dst = src
    nisa.nc_stream_shuffle(dst=dst, src=src, shuffle_mask=mask)
    nisa.dma_copy(dst=out, src=dst)
    return out


def _mask():
    mask = [int(m) for m in RNG.integers(0, 32, size=32)]
    mask[3] = mask[17] = 255
    return mask


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_four_quadrants_match_the_docstring(dtype):
    x = (RNG.standard_normal((128, 8)) * 100).astype(dtype)
    before = (RNG.standard_normal((128, 8)) * 100).astype(dtype)
    mask = _mask()
    got = run(shuffle_kernel, (x, before, tuple(mask))).outputs
    np.testing.assert_array_equal(got, reference(x, before, mask))


def test_in_place_keeps_masked_partitions_of_the_source():
    """ "In-place shuffle is allowed, i.e., dst same as src"."""
    x = RNG.standard_normal((64, 4)).astype(np.float32)
    mask = _mask()
    got = run(shuffle_kernel, (x, x, tuple(mask)), {"in_place": True}).outputs
    np.testing.assert_array_equal(got, reference(x, x, mask))


def test_one_quadrant_moves_to_another_start_partition():
    """num_active_partitions 32: "src_start_partition/dst_start_partition must be
    0/32/64/96"; src at 0, dst at 64."""
    x = RNG.standard_normal((32, 4)).astype(np.float32)
    before = np.zeros((32, 4), np.float32)
    mask = _mask()
    got = run(shuffle_kernel, (x, before, tuple(mask)), {"dst_rows": 32, "dst_start": 64})
    np.testing.assert_array_equal(got.outputs, reference(x, before, mask))


@pytest.mark.parametrize(
    "kwargs, mask, arg",
    [
        ({}, [0] * 31, "shuffle_mask"),  # "a 32-element list"
        ({}, [0] * 31 + [40], "shuffle_mask[31]"),  # a partition outside the quadrant
        ({}, [0] * 31 + [1.0], "shuffle_mask[31]"),  # "data type int"
        ({"dst_rows": 64, "dst_start": 32}, [0] * 32, "dst start partition"),  # 64 active: 0/64
    ],
)
def test_documented_limits(kwargs, mask, arg):
    rows = kwargs.get("dst_rows", 128)
    x = np.zeros((rows, 4), np.float32)
    with pytest.raises(NkiValidationError) as info:
        run(shuffle_kernel, (x, np.zeros((rows, 4), np.float32), tuple(mask)), kwargs)
    assert (info.value.op, info.value.arg) == ("nisa.nc_stream_shuffle", arg)


def mismatch_kernel(x, dst_dtype, dst_free):
    src = nl.ndarray((32, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray((32, dst_free), dst_dtype, buffer=nl.sbuf)
    nisa.nc_stream_shuffle(dst=dst, src=src, shuffle_mask=tuple(range(32)))


@pytest.mark.parametrize(
    "dst_dtype, dst_free, arg",
    [(nl.bfloat16, 4, "dst dtype"), (nl.float32, 8, "dst elements per partition")],
)
def test_dtype_and_size_must_match(dst_dtype, dst_free, arg):
    """ "dst must have same data type as src"; "the same number of elements per partition"."""
    with pytest.raises(NkiValidationError) as info:
        run(mismatch_kernel, (np.zeros((32, 4), np.float32), dst_dtype, dst_free))
    assert info.value.arg == arg


def test_has_a_cost_rule():
    assert COST_RULES["nc_stream_shuffle"] == "one pass"
