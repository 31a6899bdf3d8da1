"""nisa.nc_matmul and nisa.nc_transpose against NumPy float64, and every documented limit.

Source of the limits: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (nc_matmul,
nc_transpose), nki/guides/architecture/trainium_inferentia2_arch.rst and trainium2_arch.rst.

Tolerance (fixed before looking at results): the reference is float64 ``a.T @ b`` of the
values as stored in the operands' dtypes. The Tensor Engine accumulates in fp32, so each
output element may carry up to one fp32 rounding per product and per addition:
``|err| <= (K + tiles + 1) * 2**-24 * (|a|.T @ |b|)``. A bf16 destination adds one bf16
rounding, ``2**-8 * |ref|`` (half an ulp at 8 significant bits).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.interpreter import NkiValidationError, dtypes, nki, run

nl, nisa = nki.language, nki.isa

# Options of nc_matmul / nc_transpose with the stubs' defaults. Test kernels pass options
# through these helpers, spelled out: NKI has no ** unpacking (interpreter/python_subset.py).
MATMUL_OPTIONS = {
    "is_stationary_onezero": False,
    "is_moving_onezero": False,
    "is_transpose": False,
    "accumulate": None,
    "tile_position": (),
    "tile_size": (),
    "perf_mode": nisa.matmul_perf_mode.none,
    "name": None,
}
TRANSPOSE_OPTIONS = {"engine": nisa.engine.unknown, "name": None}


def options(defaults, given):
    """``defaults`` updated with ``given`` (host side: a typo is an error here)."""
    unknown = set(given) - set(defaults)
    assert not unknown, unknown
    out = dict(defaults)
    out.update(given)
    return out


def nc_matmul(dst, stationary, moving, o):
    nisa.nc_matmul(
        dst=dst,
        stationary=stationary,
        moving=moving,
        is_stationary_onezero=o["is_stationary_onezero"],
        is_moving_onezero=o["is_moving_onezero"],
        is_transpose=o["is_transpose"],
        accumulate=o["accumulate"],
        tile_position=o["tile_position"],
        tile_size=o["tile_size"],
        perf_mode=o["perf_mode"],
        name=o["name"],
    )


def nc_transpose(dst, data, o):
    nisa.nc_transpose(dst=dst, data=data, engine=o["engine"], name=o["name"])


NP = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3": ml_dtypes.float8_e4m3,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
}


def stored(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (fp32) as the interpreter stores it in ``dtype``, back in float64."""
    return dtypes.convert(x.astype(np.float32), dtype).astype(np.float32).astype(np.float64)


def assert_matmul_close(out, a64, b64, *, tiles=1, bf16_dst=False):
    ref = a64.T @ b64
    bound = (a64.shape[0] + tiles + 1) * 2.0**-24 * (np.abs(a64).T @ np.abs(b64))
    if bf16_dst:
        bound = bound + 2.0**-8 * np.abs(ref)
    err = np.abs(out.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound + 1e-30).all(), (
        f"worst at {worst}: got {out[worst]}, want {ref[worst]}, bound {bound[worst]}"
    )


def matmul_kernel(dst_dtype="float32", **kw):
    """One nc_matmul of HBM operands loaded into SBUF; returns dst (via SBUF)."""
    o = options(MATMUL_OPTIONS, kw)

    def kernel(s, m):
        st_ = nl.ndarray(s.shape, s.dtype, buffer=nl.sbuf)
        mv = nl.ndarray(m.shape, m.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=st_, src=s)
        nisa.dma_copy(dst=mv, src=m)
        shape = (st_.elems_per_partition, mv.elems_per_partition)
        if kw.get("perf_mode") == nisa.matmul_perf_mode.double_row:
            shape = (s.shape[2], m.shape[2])
        ps = nl.ndarray(shape, dst_dtype, buffer=nl.psum)
        nc_matmul(ps, st_, mv, o)
        sb = nl.ndarray(shape, dst_dtype, buffer=nl.sbuf)
        for c in range(0, shape[1], 2048):  # engines read at most 4K elements from PSUM
            w = min(2048, shape[1] - c)
            nisa.tensor_copy(dst=sb[:, c : c + w], src=ps[:, c : c + w])
        out = nl.ndarray(shape, dst_dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    return kernel


PAIRS = [
    ("float32", "float32"),
    ("bfloat16", "bfloat16"),
    ("float16", "bfloat16"),
    ("float8_e4m3", "bfloat16"),
    ("float8_e5m2", "float8_e4m3"),
    ("float16", "float16"),
]


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 128),
    m=st.integers(1, 128),
    n=st.integers(1, 512),
    pair=st.sampled_from(PAIRS),
    seed=st.integers(0, 2**16),
)
def test_matmul_matches_float64(k, m, n, pair, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a_st, b_st = dtypes.convert(a, pair[0]), dtypes.convert(b, pair[1])
    out = run(matmul_kernel(), (a_st, b_st), target="trn2").outputs
    assert out.shape == (m, n) and out.dtype == np.float32
    assert_matmul_close(out, stored(a, pair[0]), stored(b, pair[1]))


def test_matmul_tfloat32_operands_use_their_stored_values():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((64, 48)).astype(np.float32)

    def kernel(a, b):
        s = nl.ndarray(a.shape, nl.tfloat32, buffer=nl.sbuf)
        mv = nl.ndarray(b.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)  # rounds to tf32
        nisa.dma_copy(dst=mv, src=b)
        ps = nl.ndarray((32, 48), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=s, moving=mv)
        sb = nl.ndarray((32, 48), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        out = nl.ndarray((32, 48), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    out = run(kernel, (a, b)).outputs
    assert_matmul_close(out, stored(a, "tfloat32"), b.astype(np.float64))


def test_multi_free_dim_operands_are_flattened():
    rng = np.random.default_rng(6)
    a = rng.standard_normal((32, 4, 8)).astype(np.float32)
    b = rng.standard_normal((32, 2, 3, 5)).astype(np.float32)
    out = run(matmul_kernel(), (a, b)).outputs
    assert out.shape == (32, 30)
    assert_matmul_close(
        out, a.reshape(32, 32).astype(np.float64), b.reshape(32, 30).astype(np.float64)
    )


# -- PSUM accumulation ----------------------------------------------------------------------


def k_loop_kernel(accumulate_of, k_tiles, reuse_psum=False, n_out=1):
    """C[:, j] = A^T B_j with K accumulated over ``k_tiles`` 128-row tiles in PSUM."""

    def kernel(a, b):
        K, M = a.shape
        N = b.shape[1] // n_out
        out = nl.ndarray((M, N * n_out), nl.float32, buffer=nl.shared_hbm)
        shared_ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum, name="shared_ps")
        for j in range(n_out):
            ps = shared_ps if reuse_psum else nl.ndarray((M, N), nl.float32, buffer=nl.psum)
            for k in range(k_tiles):
                s = nl.ndarray((128, M), a.dtype, buffer=nl.sbuf)
                mv = nl.ndarray((128, N), b.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=s, src=a[k * 128 : (k + 1) * 128, :])
                nisa.dma_copy(dst=mv, src=b[k * 128 : (k + 1) * 128, j * N : (j + 1) * N])
                accumulate = None if accumulate_of == None else accumulate_of(k)  # noqa: E711
                nisa.nc_matmul(dst=ps, stationary=s, moving=mv, accumulate=accumulate)
            sb = nl.ndarray((M, N), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=sb, src=ps)
            nisa.dma_copy(dst=out[:, j * N : (j + 1) * N], src=sb)
        return out

    return kernel


@pytest.fixture
def ab512():
    rng = np.random.default_rng(7)
    return (
        rng.standard_normal((512, 64)).astype(np.float32),
        rng.standard_normal((512, 256)).astype(np.float32),
    )


@pytest.mark.parametrize("accumulate_of", [lambda k: k > 0, None], ids=["explicit", "inferred"])
def test_k_accumulation_in_psum(ab512, accumulate_of):
    a, b = ab512
    r = run(k_loop_kernel(accumulate_of, 4), (a, b))
    assert_matmul_close(r.outputs, a.astype(np.float64), b.astype(np.float64), tiles=4)
    modes = [i.attrs["accumulate"] for i in r.trace if i.api == "nisa.nc_matmul"]
    assert modes == ["overwrite", "accumulate", "accumulate", "accumulate"]


def test_accumulate_false_overwrites(ab512):
    a, b = ab512
    out = run(k_loop_kernel(lambda k: False, 4), (a, b)).outputs
    assert_matmul_close(out, a[384:].astype(np.float64), b[384:].astype(np.float64))


def test_inferred_accumulate_continues_on_a_reused_psum_tile(ab512):
    """ "First write overwrites, subsequent writes accumulate": a PSUM tile reused for a second
    output tile keeps accumulating; accumulate=(k > 0) restarts it."""
    a, b = ab512
    out = run(k_loop_kernel(None, 4, reuse_psum=True, n_out=2), (a, b)).outputs
    first = a.T.astype(np.float64) @ b[:, :128]
    np.testing.assert_allclose(
        out[:, 128:], first + a.T.astype(np.float64) @ b[:, 128:], rtol=1e-4, atol=1e-3
    )
    out = run(k_loop_kernel(lambda k: k > 0, 4, reuse_psum=True, n_out=2), (a, b)).outputs
    assert_matmul_close(out[:, 128:], a.astype(np.float64), b[:, 128:].astype(np.float64), tiles=4)


def test_accumulation_state_is_per_element():
    """Overlapping destinations (the convolution pattern): only the overlap accumulates."""
    a = np.ones((8, 4), np.float32)
    b = np.ones((8, 64), np.float32)

    def kernel(a, b):
        s = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
        mv = nl.ndarray((8, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        nisa.dma_copy(dst=mv, src=b)
        ps = nl.ndarray((4, 128), nl.float32, buffer=nl.psum)
        nisa.memset(dst=ps, value=0.0)
        nisa.nc_matmul(dst=ps[:, 0:64], stationary=s, moving=mv)
        nisa.nc_matmul(dst=ps[:, 32:96], stationary=s, moving=mv)
        sb = nl.ndarray((4, 128), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        out = nl.ndarray((4, 128), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    r = run(kernel, (a, b), target="trn2")
    want = np.zeros((4, 128), np.float32)
    want[:, 0:32] = 8  # first matmul only
    want[:, 32:64] = 16  # matmul-written by the first: the second accumulates
    want[:, 64:96] = 8  # memset only (value-written): the second starts a new group on trn2
    np.testing.assert_array_equal(r.outputs, want)
    assert [i.attrs.get("accumulate") for i in r.trace if i.api == "nisa.nc_matmul"] == [
        "overwrite",
        "mixed",
    ]


def _init_then_matmul(init, accumulate):
    def kernel(a, b):
        s = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
        mv = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        nisa.dma_copy(dst=mv, src=b)
        ps = nl.ndarray((4, 16), nl.float32, buffer=nl.psum)
        if init == "memset":
            nisa.memset(dst=ps, value=100.0)
        acc = None if accumulate == "default" else accumulate  # None: the stub's default
        nisa.nc_matmul(dst=ps, stationary=s, moving=mv, accumulate=acc)
        sb = nl.ndarray((4, 16), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        out = nl.ndarray((4, 16), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    return kernel


AB = (np.ones((8, 4), np.float32), np.ones((8, 16), np.float32))


@pytest.mark.parametrize(
    "target, init, accumulate, want",
    [
        # v2/v3: accumulating onto value-initialised PSUM is UB, so None starts a new group.
        ("trn2", "memset", "default", 8.0),
        ("trn1", "memset", "default", 8.0),
        # v4 may accumulate onto PSUM a memset initialised ("previously written").
        ("trn3", "memset", "default", 108.0),
        ("trn3", "memset", True, 108.0),
        ("trn2", "memset", False, 8.0),
        ("trn2", None, "default", 8.0),
    ],
)
def test_accumulate_after_value_initialisation(target, init, accumulate, want):
    out = run(_init_then_matmul(init, accumulate), AB, target=target).outputs
    assert (out == want).all()


@pytest.mark.parametrize(
    "target, init, why",
    [
        ("trn2", None, "never written"),
        ("trn3", None, "never written"),
        ("trn2", "memset", "non-matmul"),
        ("trn1", "memset", "non-matmul"),
    ],
)
@pytest.mark.parametrize("compute", [True, False])
def test_accumulate_true_needs_a_matmul_initialised_location(target, init, why, compute):
    with pytest.raises(NkiValidationError) as info:
        run(_init_then_matmul(init, True), AB, target=target, compute=compute)
    err = info.value
    assert (err.op, err.arg) == ("nisa.nc_matmul", "accumulate")
    assert why in str(err.value) and "must follow an overwriting matmul" in str(err)


# -- generation-specific shapes and dtypes ---------------------------------------------------


@pytest.mark.parametrize("dst_dtype, n", [("float32", 4096), ("bfloat16", 8192), ("bfloat16", 700)])
def test_trn3_wide_moving_tiles(dst_dtype, n):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((128, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((128, n)).astype(ml_dtypes.bfloat16)
    out = run(matmul_kernel(dst_dtype), (a, b), target="trn3").outputs
    assert out.dtype == np.dtype(NP[dst_dtype])
    assert_matmul_close(
        out.astype(np.float32),
        a.astype(np.float64),
        b.astype(np.float64),
        bf16_dst=dst_dtype == "bfloat16",
    )


def test_double_row_fp8_contracts_256():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((128, 2, 24)).astype(ml_dtypes.float8_e4m3)
    b = rng.standard_normal((128, 2, 40)).astype(ml_dtypes.float8_e5m2)
    out = run(
        matmul_kernel(perf_mode=nisa.matmul_perf_mode.double_row), (a, b), target="trn2"
    ).outputs
    assert_matmul_close(
        out, a.astype(np.float64).reshape(256, 24), b.astype(np.float64).reshape(256, 40)
    )


def test_tiling_mode_computes_the_same_product():
    rng = np.random.default_rng(10)
    a = rng.standard_normal((32, 64)).astype(np.float32)
    b = rng.standard_normal((32, 100)).astype(np.float32)
    out = run(
        matmul_kernel(tile_position=(32, 64), tile_size=(32, 64)), (a, b), target="trn2"
    ).outputs
    assert_matmul_close(out, a.astype(np.float64), b.astype(np.float64))


def transpose_kernel(
    in_dtype, dst_dtype, *, via="matmul", moving="identity", engine=None, target_dst=nl.psum
):
    def kernel(x, eye):
        p, f = x.shape
        t = nl.ndarray((p, f), in_dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        dst = nl.ndarray((f, p), dst_dtype, buffer=target_dst)
        if via == "matmul":
            ident = nl.ndarray((p, p), in_dtype, buffer=nl.sbuf)
            if moving == "identity":
                nisa.dma_copy(dst=ident, src=eye)
            else:
                nisa.memset(dst=ident, value=0.0)
            nisa.nc_matmul(dst=dst, stationary=t, moving=ident, is_transpose=True)
        else:
            eng = nisa.engine.unknown if engine == None else engine  # noqa: E711
            nisa.nc_transpose(dst=dst, data=t, engine=eng)
        sb = nl.ndarray((f, p), dst_dtype, buffer=nl.sbuf)
        if target_dst == nl.psum:
            nisa.tensor_copy(dst=sb, src=dst)
        else:
            sb = dst
        out = nl.ndarray((f, p), dst_dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    return kernel


def eye(x):
    return np.eye(x.shape[0], dtype=np.float32).astype(x.dtype)


def _special(shape, dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 1], x[1, 0], x[2, 2] = np.nan, np.inf, -np.inf
    return x.astype(dtype)


@pytest.mark.parametrize("via", ["matmul", "nc_transpose"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_transpose_mode_is_bit_accurate_from_trn2(via, dtype):
    x = _special((24, 40), NP[dtype])
    out = run(transpose_kernel(dtype, dtype, via=via), (x, eye(x)), target="trn2").outputs
    np.testing.assert_array_equal(out.view(np.uint8), np.ascontiguousarray(x.T).view(np.uint8))


def test_transpose_mode_to_fp32_dst_is_exact():
    x = _special((16, 8), ml_dtypes.bfloat16)
    out = run(transpose_kernel("bfloat16", "float32"), (x, eye(x)), target="trn2").outputs
    np.testing.assert_array_equal(out, x.T.astype(np.float32))


@pytest.mark.parametrize("via", ["matmul", "nc_transpose"])
def test_trn1_transpose_is_a_matmul_that_spreads_nan(via):
    x = _special((8, 8), np.float32)
    out = run(transpose_kernel("float32", "float32", via=via), (x, eye(x)), target="trn1").outputs
    # out[f, :] sums x[:, f] * I over all partitions: a NaN/Inf in input column f (columns 0-2
    # here) spreads over that whole output row (NaN * 1, inf * 0 = NaN); other rows are exact.
    assert not np.isfinite(out[0:3]).any()
    assert np.isnan(out[1]).all()  # x[0, 1] is NaN
    np.testing.assert_array_equal(out[3:], x.T[3:])


def test_vector_engine_transpose_32x32_on_psum():
    x = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)

    def kernel(x):
        t = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        ps = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=t)
        back = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(dst=back, data=ps)  # PSUM -> SBUF: Vector Engine by default
        out = nl.ndarray((32, 32), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=back)
        return out

    r = run(kernel, (x,))
    np.testing.assert_array_equal(r.outputs, x.T)
    assert [i.engine for i in r.trace if i.api == "nisa.nc_transpose"] == ["vector"]


# -- limits ----------------------------------------------------------------------------------


def op_kernel(
    *,
    s=((128, 128), "float32", nl.sbuf),
    m=((128, 512), "float32", nl.sbuf),
    d=((128, 512), "float32", nl.psum),
    d_view=None,
    **kw,
):
    o = options(MATMUL_OPTIONS, kw)

    def kernel():
        st_ = nl.ndarray(s[0], s[1], buffer=s[2])
        mv = nl.ndarray(m[0], m[1], buffer=m[2])
        dst = nl.ndarray(d[0], d[1], buffer=d[2])
        for t in (st_, mv):
            if t.buffer == nl.sbuf:
                nisa.memset(dst=t, value=0 if t.dtype == "int8" else 0.0)
        # (== None: kernels may not use `is` on tensors)
        nc_matmul(dst if d_view == None else d_view(dst), st_, mv, o)  # noqa: E711

    return kernel


F8, F8FN, BF = "float8_e4m3", "float8_e4m3fn", "bfloat16"
V3_IN = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32")
DR = {"perf_mode": nisa.matmul_perf_mode.double_row}


@pytest.mark.parametrize(
    "target, kernel, arg, limit",
    [
        ("trn2", op_kernel(s=((128, 128), "float32", nl.psum)), "stationary", None),
        ("trn2", op_kernel(m=((128, 512), "float32", nl.shared_hbm)), "moving", None),
        ("trn2", op_kernel(d=((128, 512), "float32", nl.sbuf)), "dst", None),
        ("trn2", op_kernel(m=((64, 512), "float32", nl.sbuf)), "moving partition dimension", 128),
        ("trn2", op_kernel(s=((128, 129), "float32", nl.sbuf)), "stationary free size", 128),
        ("trn2", op_kernel(m=((128, 513), "float32", nl.sbuf)), "moving free size", 512),
        ("trn3", op_kernel(m=((128, 4097), "float32", nl.sbuf)), "moving free size", 4096),
        (
            "trn3",
            op_kernel(
                m=((128, 8193), BF, nl.sbuf),
                s=((128, 128), BF, nl.sbuf),
                d=((128, 512), BF, nl.psum),
            ),
            "moving free size",
            8192,
        ),
        ("trn2", op_kernel(s=((128, 128), "int8", nl.sbuf)), "stationary dtype", V3_IN),
        (
            "trn2",
            op_kernel(s=((128, 128), F8FN, nl.sbuf), m=((128, 512), F8FN, nl.sbuf)),
            "stationary dtype",
            V3_IN,
        ),
        ("trn2", op_kernel(m=((128, 512), BF, nl.sbuf)), "moving dtype", None),
        (
            "trn3",
            op_kernel(s=((128, 128), F8, nl.sbuf), m=((128, 512), F8FN, nl.sbuf)),
            "moving dtype",
            None,
        ),
        ("trn2", op_kernel(d=((128, 512), BF, nl.psum)), "dst dtype", ["float32"]),
        (
            "trn3",
            op_kernel(d=((128, 512), "float16", nl.psum)),
            "dst dtype",
            ["float32", "bfloat16"],
        ),
        ("trn2", op_kernel(d=((64, 512), "float32", nl.psum)), "dst partition dimension", 128),
        ("trn2", op_kernel(d=((128, 256), "float32", nl.psum)), "dst elements per partition", 512),
        (
            "trn2",
            op_kernel(d=((128, 1024), "float32", nl.psum), d_view=lambda t: t[:, 256:768]),
            "dst",
            2048,
        ),
        ("trn2", op_kernel(accumulate=1), "accumulate", None),
        ("trn2", op_kernel(is_transpose=0), "is_transpose", None),
        ("trn2", op_kernel(perf_mode="double_row"), "perf_mode", None),
        (
            "trn1",
            op_kernel(
                s=((128, 2, 8), F8, nl.sbuf),
                m=((128, 2, 8), F8, nl.sbuf),
                d=((8, 8), "float32", nl.psum),
                **DR,
            ),
            "perf_mode",
            None,
        ),
        (
            "trn2",
            op_kernel(
                s=((128, 2, 8), BF, nl.sbuf),
                m=((128, 2, 8), BF, nl.sbuf),
                d=((8, 8), "float32", nl.psum),
                **DR,
            ),
            "perf_mode",
            None,
        ),
        (
            "trn2",
            op_kernel(
                s=((128, 4, 8), F8, nl.sbuf),
                m=((128, 2, 8), F8, nl.sbuf),
                d=((8, 8), "float32", nl.psum),
                **DR,
            ),
            "stationary shape",
            None,
        ),
        (
            "trn2",
            op_kernel(
                s=((128, 2, 8), F8, nl.sbuf),
                m=((128, 2, 8), F8, nl.sbuf),
                d=((8, 8), "float32", nl.psum),
                is_transpose=True,
                **DR,
            ),
            "perf_mode",
            None,
        ),
        (
            "trn2",
            op_kernel(
                s=((64, 2, 8), F8, nl.sbuf),
                m=((64, 2, 8), F8, nl.sbuf),
                d=((8, 8), "float32", nl.psum),
                tile_position=(0, 0),
                tile_size=(64, 64),
                **DR,
            ),
            "tile_size",
            None,
        ),
        ("trn2", op_kernel(tile_size=(128, 128)), "tile_position/tile_size", None),
        (
            "trn1",
            op_kernel(
                s=((32, 32), "float32", nl.sbuf),
                m=((32, 512), "float32", nl.sbuf),
                d=((32, 512), "float32", nl.psum),
                tile_position=(0, 0),
                tile_size=(32, 32),
            ),
            "tile_size row_size",
            (64, 128),
        ),
        (
            "trn2",
            op_kernel(
                s=((32, 32), "float32", nl.sbuf),
                m=((32, 512), "float32", nl.sbuf),
                d=((32, 512), "float32", nl.psum),
                tile_position=(16, 0),
                tile_size=(32, 32),
            ),
            "tile_position start_row",
            32,
        ),
        (
            "trn2",
            op_kernel(
                s=((32, 32), "float32", nl.sbuf),
                m=((32, 512), "float32", nl.sbuf),
                d=((32, 512), "float32", nl.psum),
                tile_position=(0, 32),
                tile_size=(32, 64),
            ),
            "tile_position start_column",
            64,
        ),
        (
            "trn2",
            op_kernel(tile_position=(0, 0), tile_size=(64, 128)),
            "stationary partition dimension",
            64,
        ),
        (
            "trn2",
            op_kernel(
                s=((64, 128), "float32", nl.sbuf),
                m=((64, 512), "float32", nl.sbuf),
                tile_position=(0, 0),
                tile_size=(64, 64),
            ),
            "stationary free size",
            64,
        ),
        ("trn2", op_kernel(is_transpose=True), "moving free size", 128),
        (
            "trn2",
            op_kernel(
                s=((128, 128), BF, nl.sbuf),
                m=((128, 128), BF, nl.sbuf),
                d=((128, 128), "float16", nl.psum),
                is_transpose=True,
            ),
            "dst dtype",
            ["float32", "bfloat16 (transpose mode)"],
        ),
    ],
)
def test_nc_matmul_limits(target, kernel, arg, limit):
    with pytest.raises(NkiValidationError) as info:
        run(kernel, target=target)
    err = info.value
    assert (err.op, err.arg) == ("nisa.nc_matmul", arg), str(err)
    assert err.limit == limit
    assert str(err).startswith(f"nisa.nc_matmul: {arg} {err.rule}, got ")
    if isinstance(limit, int):
        assert str(limit) in err.rule
    elif limit is not None:
        assert all(str(item) in err.rule for item in limit)


def test_transpose_mode_limits():
    with pytest.raises(NkiValidationError) as info:
        x = np.ones((8, 8), np.float32)
        run(transpose_kernel("bfloat16", "bfloat16", moving="zeros"), (x, eye(x)), target="trn2")
    assert (info.value.arg, info.value.value) == ("moving", "a non-identity tile")

    def accumulate_bf16(x):
        t = nl.ndarray((8, 8), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        ps = nl.ndarray((8, 8), nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=t, moving=t, is_transpose=True, accumulate=True)

    with pytest.raises(NkiValidationError) as info:
        run(accumulate_bf16, (np.eye(8, dtype=np.float32),), target="trn2")
    assert (info.value.arg, info.value.value) == ("accumulate", True)
    assert "float32" in info.value.rule


def test_engine_operand_access_pattern_limits():
    def too_many_dims():
        t = nl.ndarray((8, 2, 3, 4, 5, 6), nl.float32, buffer=nl.sbuf)
        ps = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        # Free dims (2, 2, 3, 4, 5) with strides (360, 120, 30, 6, 1): none merge, 5 > 4.
        nisa.nc_matmul(
            dst=ps, stationary=t[:, :, 0:2, 0:3, 0:4, 0:5], moving=t[:, 0, 0, 0, 0:2, 0:4]
        )

    with pytest.raises(NkiValidationError) as info:
        run(too_many_dims)
    assert (info.value.arg, info.value.limit) == ("stationary access pattern", 4)

    def huge_stride():
        t = nl.ndarray((2, 80001), nl.float8_e4m3, buffer=nl.sbuf)
        ps = nl.ndarray((3, 4), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=t[:, 0 : 40000 * 2 + 1 : 40000], moving=t[:, 0:4])

    with pytest.raises(NkiValidationError) as info:
        run(huge_stride)
    assert (info.value.arg, info.value.value) == ("stationary free-dim stride", 40000)


def test_trn1_start_partition_rule():
    def kernel():
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        ps = nl.ndarray((64, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=t[16:48], moving=t[16:48])

    run(kernel, target="trn2")  # the rule is documented for NeuronCore-v2 only
    with pytest.raises(NkiValidationError) as info:
        run(kernel, target="trn1")
    assert (info.value.arg, info.value.value, info.value.limit) == (
        "stationary start partition",
        16,
        (0, 32, 64, 96),
    )


def tp_kernel(d_shape, d_dtype="float32", d_buf=nl.psum, data=((64, 64), "float32"), **kw):
    o = options(TRANSPOSE_OPTIONS, kw)

    def kernel():
        t = nl.ndarray(data[0], data[1], buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        nc_transpose(nl.ndarray(d_shape, d_dtype, buffer=d_buf), t, o)

    return kernel


@pytest.mark.parametrize(
    "target, kernel, arg, limit",
    [
        ("trn2", tp_kernel((64, 64), data=((64, 129), "float32")), "data shape", 128),
        ("trn2", tp_kernel((64, 64), d_buf=nl.sbuf, engine=nisa.engine.vector), "data shape", 32),
        ("trn2", tp_kernel((64, 64), d_buf=nl.sbuf, engine=nisa.engine.tensor), "dst", None),
        ("trn2", tp_kernel((64, 64), engine=nisa.engine.gpsimd), "engine", None),
        ("trn2", tp_kernel((32, 64)), "dst shape", None),
        ("trn2", tp_kernel((64, 64), data=((64, 64), "bfloat16")), "dst dtype", "bfloat16"),
        ("trn1", tp_kernel((64, 64), d_dtype="bfloat16"), "dst dtype", "float32"),
        ("trn2", tp_kernel((128, 1024), data=((128, 128), "float32")), "dst shape", None),
    ],
)
def test_nc_transpose_limits(target, kernel, arg, limit):
    with pytest.raises(NkiValidationError) as info:
        run(kernel, target=target)
    err = info.value
    assert (err.op, err.arg, err.limit) == ("nisa.nc_transpose", arg, limit), str(err)


def test_nc_transpose_dst_within_one_bank():
    def kernel():
        t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        ps = nl.ndarray((128, 1024), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=ps[:, 448:576], data=t)

    with pytest.raises(NkiValidationError) as info:
        run(kernel)
    assert (info.value.arg, info.value.limit) == ("dst", 2048)


def test_matmul_without_compute_keeps_state_and_trace(ab512):
    a, b = ab512
    full = run(k_loop_kernel(None, 4, reuse_psum=True, n_out=2), (a, b))
    traced = run(k_loop_kernel(None, 4, reuse_psum=True, n_out=2), (a, b), compute=False)
    assert [(i.api, i.attrs) for i in traced.trace] == [(i.api, i.attrs) for i in full.trace]
    assert traced.memory == full.memory
    assert not traced.outputs.any()


@pytest.mark.parametrize(
    "kw, arg",
    [
        ({"tile_position": (0, 0), "tile_size": (128,)}, "tile_size/tile_position"),
        ({"tile_position": (0, 0.0), "tile_size": (128, 128)}, "tile_position"),
    ],
)
def test_tiling_argument_types(kw, arg):
    with pytest.raises(NkiValidationError) as info:
        run(op_kernel(**kw))
    assert (info.value.op, info.value.arg) == ("nisa.nc_matmul", arg)


def test_psum_dst_reinterpreted_and_engine_free_size_from_psum():
    with pytest.raises(NkiValidationError) as info:  # bf16 dst is fine on trn3, a bf16 view not
        run(
            op_kernel(
                m=((128, 256), "float32", nl.sbuf),
                d=((128, 256), "float32", nl.psum),
                d_view=lambda t: t.view(nl.bfloat16)[:, 0:256],
            ),
            target="trn3",
        )
    assert (info.value.arg, info.value.value) == ("dst", "bfloat16")
    assert "reinterpret" in str(info.value)

    def kernel():
        ps = nl.ndarray((128, 8192), nl.bfloat16, buffer=nl.psum)
        sb = nl.ndarray((128, 4097), nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps[:, 0:4097])  # engines read at most 4K elements from PSUM

    with pytest.raises(NkiValidationError) as info:
        run(kernel)
    assert (info.value.arg, info.value.value, info.value.limit) == ("src free size", 4097, 4096)
