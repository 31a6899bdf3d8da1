"""nisa.dma_copy and nisa.dma_transpose against NumPy, and every documented limit.

Limits: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (dma_copy, dma_transpose),
release-notes/components/nki.rst (0.6 DmaTranspose relaxations), trainium2_arch.rst.
DMA moves bits: same-dtype copies must be bit-exact (compared as raw bytes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa
bf16 = ml_dtypes.bfloat16


def expect_error(kernel, args=(), *, target="trn2", op, arg):
    with pytest.raises(NkiValidationError) as info:
        run(kernel, args, target=target)
    err = info.value
    assert (err.op, err.arg) == (op, arg), str(err)
    assert str(err).startswith(f"{op}: {arg} {err.rule}, got ")
    return err


# -- dma_copy --------------------------------------------------------------------------------


@st.composite
def copy_shapes(draw):
    rows = draw(st.integers(1, 8))
    cols = draw(st.sampled_from([1, 2, 3, 4, 6, 12]))
    split = draw(st.sampled_from([c for c in (1, 2, 3, 4, 6, 12) if cols % c == 0]))
    return rows, cols, split


@settings(max_examples=30, deadline=None)
@given(shapes=copy_shapes(), dtype=st.sampled_from([np.float32, np.int8, bf16, np.uint16]))
def test_dma_copy_moves_elements_row_major_bit_exactly(shapes, dtype):
    rows, cols, split = shapes
    rng = np.random.default_rng(rows * 100 + cols)
    x = rng.integers(0, 255, size=(rows, cols * np.dtype(dtype).itemsize), dtype=np.uint8).view(
        dtype
    )

    def kernel(x):
        # HBM (r, c) -> SBUF (r, c/split, split) -> SBUF -> HBM flat (r*c,): same elements.
        t = nl.ndarray((rows, cols // split, split), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        u = nl.ndarray((rows, cols), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=t)
        out = nl.ndarray((rows * cols,), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    out = run(kernel, (x,)).outputs
    np.testing.assert_array_equal(out.view(np.uint8), x.reshape(-1).view(np.uint8))


def test_dma_copy_strided_views_and_hbm_to_hbm():
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)

    def kernel(x):
        t = nl.ndarray((4, 8), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[1:8:2, 0:16:2])  # strided HBM rows and columns
        out = nl.ndarray((8, 4), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out.permute((1, 0)), src=t)  # transposing destination pattern
        out2 = nl.ndarray((8, 4), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out2, src=out)  # HBM -> HBM
        return out, out2

    out, out2 = run(kernel, (x,)).outputs
    np.testing.assert_array_equal(out, x[1:8:2, 0:16:2].T)
    np.testing.assert_array_equal(out2, out)


def test_dma_copy_overlapping_views_read_before_write():
    x = np.arange(10, dtype=np.float32).reshape(1, 10)

    def kernel(x):
        t = nl.ndarray((1, 10), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=t[:, 1:10], src=t[:, 0:9])  # shift right by one, in place
        out = nl.ndarray((1, 10), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    want = x.copy()
    want[:, 1:] = x[:, :9]
    np.testing.assert_array_equal(run(kernel, (x,)).outputs, want)


def test_dma_copy_converts_through_fp32():
    x = np.array([[2**24 + 1, -7, 100000]], np.int32)

    def kernel(x):
        f = nl.ndarray((1, 3), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=x)
        b = nl.ndarray((1, 3), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=f)
        back = nl.ndarray((1, 3), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=back, src=b)
        return back

    # int32 -> fp32 rounds 2**24+1 to 2**24; fp32 -> bf16 keeps 8 significant bits.
    want = x.astype(np.float32).astype(bf16).astype(np.float32).astype(np.int32)
    np.testing.assert_array_equal(run(kernel, (x,)).outputs, want)


def test_dma_copy_hwdge_with_a_trigger_engine():
    x = np.ones((4, 4), np.float32)

    def kernel(x):
        t = nl.ndarray((4, 4), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync)
        out = nl.ndarray((4, 4), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)
        return out

    r = run(kernel, (x,), target="trn2")
    np.testing.assert_array_equal(r.outputs, x)
    assert [i.attrs["trigger"] for i in r.trace] == ["sync", "scalar"]


def _copy_kernel(
    src_buf,
    dst_buf,
    dst_shape=(4, 4),
    dst_dtype=nl.float32,
    priority=None,
    oob_mode=nisa.oob_mode.error,
    dge_mode=nisa.dge_mode.unknown,
    engine=nisa.engine.unknown,
):
    """A dma_copy kernel; every option spelled out (NKI has no ** unpacking)."""

    def kernel(x):
        src = x
        if src_buf != "hbm":
            src = nl.ndarray((4, 4), nl.float32, buffer=src_buf)
        dst = nl.ndarray(dst_shape, dst_dtype, buffer=dst_buf)
        nisa.dma_copy(
            dst=dst, src=src, priority=priority, oob_mode=oob_mode, dge_mode=dge_mode, engine=engine
        )

    return kernel


X = np.zeros((4, 4), np.float32)


@pytest.mark.parametrize(
    "kernel, target, arg, limit",
    [
        (_copy_kernel("hbm", nl.psum), "trn2", "dst", None),
        (_copy_kernel(nl.psum, nl.sbuf), "trn2", "src", None),
        (_copy_kernel("hbm", nl.sbuf, dst_shape=(4, 5)), "trn2", "dst element count", 16),
        (
            _copy_kernel("hbm", nl.sbuf, dst_dtype=nl.bfloat16, dge_mode=nisa.dge_mode.hwdge),
            "trn2",
            "dst dtype",
            None,
        ),
        (_copy_kernel("hbm", nl.sbuf, dge_mode=nisa.dge_mode.hwdge), "trn1", "dge_mode", None),
        (_copy_kernel("hbm", nl.sbuf, dge_mode="hwdge"), "trn2", "dge_mode", None),
        (_copy_kernel("hbm", nl.sbuf, engine=nisa.engine.sync), "trn2", "engine", None),
        (
            _copy_kernel("hbm", nl.sbuf, engine=nisa.engine.vector, dge_mode=nisa.dge_mode.hwdge),
            "trn2",
            "engine",
            None,
        ),
        (_copy_kernel("hbm", nl.sbuf, priority=1), "trn2", "priority", None),
        (_copy_kernel("hbm", nl.sbuf, priority=4), "trn3", "priority", (0, 3)),
        (_copy_kernel("hbm", nl.sbuf, oob_mode=nisa.oob_mode.skip), "trn2", "oob_mode", None),
    ],
)
def test_dma_copy_limits(kernel, target, arg, limit):
    err = expect_error(kernel, (X,), target=target, op="nisa.dma_copy", arg=arg)
    assert err.limit == limit
    if arg in ("dst", "src"):
        assert "PSUM" in str(err)


def test_dma_copy_priority_allowed_on_trn3():
    def kernel(x):
        t = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, priority=0)
        out = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t, priority=3)
        return out

    np.testing.assert_array_equal(run(kernel, (X + 2,), target="trn3").outputs, X + 2)


def test_dma_copy_rejects_non_tensors():
    def kernel(x):
        nisa.dma_copy(dst=x, src=np.zeros((4, 4), np.float32))

    expect_error(kernel, (X,), op="nisa.dma_copy", arg="src")


# -- dma_transpose -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, perm",
    [
        ((16, 128), (1, 0)),
        ((5, 40), (1, 0)),
        ((2, 8, 64), (2, 1, 0)),
        ((4, 3, 2, 32), (3, 1, 2, 0)),
    ],
)
@pytest.mark.parametrize("dtype", [bf16, np.float16, np.float32, np.int16])
@pytest.mark.parametrize("src_in", ["hbm", "sbuf"])
def test_dma_transpose_matches_numpy(shape, perm, dtype, src_in):
    rng = np.random.default_rng(3)
    x = rng.integers(
        0, 255, size=shape[:-1] + (shape[-1] * np.dtype(dtype).itemsize,), dtype=np.uint8
    ).view(dtype)
    if src_in == "sbuf" and shape[0] > 128:
        pytest.skip("SBUF source needs <= 128 partitions")

    def kernel(x):
        src = x
        if src_in == "sbuf":
            src = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=src, src=x)
        dst_shape = ()
        for p in perm:
            dst_shape = dst_shape + (x.shape[p],)
        dst = nl.ndarray(dst_shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=src, axes=perm)
        out = nl.ndarray(dst.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out

    out = run(kernel, (x,)).outputs
    want = np.ascontiguousarray(np.transpose(x, perm))
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


def test_dma_transpose_hwdge_relaxed_shapes():
    """0.6: src.shape[0] in {1, 2, 4, 8, 16} for 3-D/4-D with shape[0]*shape[-2] % 16 == 0."""
    x = np.arange(2 * 8 * 32, dtype=np.float32).astype(bf16).reshape(2, 8, 32)

    def kernel(x):
        dst = nl.ndarray((32, 8, 2), x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=x, dge_mode=nisa.dge_mode.hwdge)
        out = nl.ndarray(dst.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out

    np.testing.assert_array_equal(
        run(kernel, (x,)).outputs.astype(np.float32), np.transpose(x, (2, 1, 0)).astype(np.float32)
    )


def _transpose_kernel(
    src_shape,
    dst_shape,
    *,
    src_dtype=nl.bfloat16,
    dst_dtype=None,
    src_buf="hbm",
    dst_buf=nl.sbuf,
    axes=None,
    priority=None,
    dge_mode=nisa.dge_mode.unknown,
    oob_mode=nisa.oob_mode.error,
):
    """A dma_transpose kernel; every option spelled out (NKI has no ** unpacking)."""

    def kernel(x):
        src = nl.ndarray(
            src_shape, src_dtype, buffer=nl.shared_hbm if src_buf == "hbm" else src_buf
        )
        dst = nl.ndarray(dst_shape, dst_dtype or src_dtype, buffer=dst_buf)
        nisa.dma_transpose(
            dst=dst, src=src, axes=axes, priority=priority, dge_mode=dge_mode, oob_mode=oob_mode
        )

    return kernel


HW = nisa.dge_mode.hwdge


@pytest.mark.parametrize(
    "kernel, target, arg, limit",
    [
        (_transpose_kernel((16, 32), (32, 16)), "trn1", "target", None),
        (_transpose_kernel((16, 32), (32, 16), dst_buf=nl.shared_hbm), "trn2", "dst", None),
        (_transpose_kernel((16, 32), (32, 16), src_buf=nl.psum), "trn2", "src", None),
        (
            _transpose_kernel((16, 32), (32, 16), dge_mode=nisa.dge_mode.swdge),
            "trn2",
            "dge_mode",
            None,
        ),
        (
            _transpose_kernel((16, 32), (32, 16), oob_mode=nisa.oob_mode.skip),
            "trn2",
            "oob_mode",
            None,
        ),
        (_transpose_kernel((16, 32), (32, 16), priority=0), "trn2", "priority", None),
        (_transpose_kernel((32,), (32,)), "trn2", "src rank", (2, 3, 4)),
        (_transpose_kernel((1, 1, 1, 1, 4), (4, 1, 1, 1, 1)), "trn2", "src rank", (2, 3, 4)),
        (_transpose_kernel((16, 32), (32, 16), axes=(0, 1)), "trn2", "axes", (1, 0)),
        (_transpose_kernel((2, 16, 32), (32, 32)), "trn2", "dst rank", None),
        (_transpose_kernel((16, 32), (16, 32)), "trn2", "dst shape", None),
        (
            _transpose_kernel((16, 32), (32, 16), dst_dtype=nl.float16),
            "trn2",
            "dst dtype",
            "bfloat16",
        ),
        (
            _transpose_kernel((16, 32), (32, 16), src_dtype=nl.float8_e4m3),
            "trn2",
            "src dtype",
            (2, 4),
        ),
        (
            _transpose_kernel((16, 32), (32, 16), src_dtype=nl.float32, dge_mode=HW),
            "trn2",
            "src dtype",
            (2,),
        ),
        (_transpose_kernel((8, 32), (32, 8), dge_mode=HW), "trn2", "src.shape[0]", 16),
        (
            _transpose_kernel((3, 16, 32), (32, 16, 3), dge_mode=HW),
            "trn2",
            "src.shape[0]",
            (1, 2, 4, 8, 16),
        ),
        (
            _transpose_kernel((2, 4, 32), (32, 4, 2), dge_mode=HW),
            "trn2",
            "src.shape[0] * src.shape[-2]",
            16,
        ),
    ],
)
def test_dma_transpose_limits(kernel, target, arg, limit):
    err = expect_error(kernel, (X,), target=target, op="nisa.dma_transpose", arg=arg)
    assert err.limit == limit


def test_dma_transpose_destination_partitions_bound_src_last_dim():
    """src.shape[-1] <= 128: the transposed destination puts it on SBUF partitions."""
    expect_error(
        _transpose_kernel((16, 256), (256, 16)),
        (X,),
        op="nl.ndarray",
        arg="partition dimension (shape[0])",
    )


def test_dma_without_compute_records_and_writes_nothing():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)

    def kernel(x):
        t = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        u = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=u, src=t)
        out = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    full = run(kernel, (x,))
    traced = run(kernel, (x,), compute=False)
    assert [i.api for i in traced.trace] == [i.api for i in full.trace]
    assert [i.reads for i in traced.trace] == [i.reads for i in full.trace]
    assert not traced.outputs.astype(np.float32).any()
    np.testing.assert_array_equal(full.outputs.astype(np.float32), x.T)
