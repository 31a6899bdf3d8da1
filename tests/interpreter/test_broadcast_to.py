"""``nl.broadcast_to`` (nki/api/nki/language/__init__.py) against ``numpy.broadcast_to``.

Exact comparisons: broadcasting moves values (a 1.0 * x product through fp32 PSUM for the
partition dim of float tiles), so no rounding is expected beyond the output dtype's own.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


def broadcast_kernel(x, shape, dtype=None):
    tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    got = nl.broadcast_to(tile, shape, dtype=dtype)
    out = nl.ndarray(got.shape, got.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out


RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "src_shape, shape, dtype",
    [
        ((8, 1), (8, 16), np.float32),  # free dim
        ((1, 16), (128, 16), np.float32),  # partition dim, Tensor Engine
        ((1, 1), (4, 600), np.float32),  # both, moving free size over one matmul's 512
        ((1, 3, 1), (5, 3, 4), ml_dtypes.bfloat16),  # 3-D, bf16
        ((1, 6), (3, 6), np.int32),  # integer partition broadcast: DMA rows
        ((4, 5), (4, 5), np.float32),  # unchanged
    ],
)
def test_matches_numpy(src_shape, shape, dtype):
    x = (
        RNG.standard_normal(src_shape).astype(dtype)
        if dtype != np.int32
        else (RNG.integers(-(2**30), 2**30, src_shape).astype(np.int32))
    )
    got = run(broadcast_kernel, (x, shape)).outputs
    np.testing.assert_array_equal(got, np.broadcast_to(x, shape))


def test_dtype_cast_and_identity():
    x = RNG.standard_normal((2, 1)).astype(np.float32)
    got = run(broadcast_kernel, (x, (2, 3), nl.bfloat16)).outputs
    np.testing.assert_array_equal(got, np.broadcast_to(x.astype(ml_dtypes.bfloat16), (2, 3)))

    seen = []

    def same(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        seen.extend([t, nl.broadcast_to(t, x.shape)])

    run(same, (x,))
    assert seen[1] is seen[0]  # (outside the kernel: tensor identity is refused inside)


@pytest.mark.parametrize(
    "shape, phrase",
    [((4,), "rank"), ((3, 3), "shape\\[0\\]"), ((2, 0), "positive"), ("2x3", "tuple")],
)
def test_bad_shapes_are_refused(shape, phrase):
    x = np.zeros((2, 1), np.float32)
    with pytest.raises(NkiValidationError, match=phrase):
        run(broadcast_kernel, (x, shape))


def test_hbm_input_is_refused():
    def kernel(x):
        return nl.broadcast_to(x, (2, 2))

    with pytest.raises(NkiValidationError, match="SBUF or PSUM"):
        run(kernel, (np.zeros((1, 2), np.float32),))
