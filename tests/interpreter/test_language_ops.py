"""The experimental ``nl.*`` wrappers against NumPy, and their documented limits.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/language/__init__.py (each wrapper's
docstring and examples), nki/api/nki.api.shared.rst (``nl.sin`` range reduction),
release-notes/components/nki.rst (known issues: no broadcasting, no scalar exponent for
``nl.power``, ``nl.matmul`` needs ``transpose_x=True``, no divide/fmod/mod; 0.5: ``nl.rsqrt``
on GpSimd without PSUM input; 0.6: ``nl.copy`` on VectorE, bit-exact).

Tolerances (fixed before looking at results): element-wise wrappers issue one instruction
and are exact against the rounded float64 result, as in instructions/test_vector.py;
activations get 2 fp32 ulps (instructions/test_scalar.py); ``nl.sin``/``nl.cos`` reduce the
angle with a two-part 2*pi (about 2**-24 * |x| of absolute error in the reduced angle) then
evaluate sin: ``4 * 2**-24 * (1 + |x|)``; sums over n elements ``n * 2**-24 * sum|x|``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _compute_helpers import (
    F32,
    FLOATS,
    HALF_ULP,
    as64,
    assert_close,
    expect_error,
    f32,
    round_to,
    run_body,
    stored,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.interpreter import NkiValidationError, NotImplementedByInterpreter, nki, run

nl, nisa = nki.language, nki.isa
SETTINGS = settings(max_examples=25, deadline=None)


def run_nl(fn, *arrays, target="trn2"):
    """``fn(*hbm_inputs)`` returns on-chip tiles; they come back as NumPy arrays."""

    n = len(arrays)

    def kernel(hbm):  # a tuple of HBM tensors; NKI has no * unpacking, so arity by branch
        if n == 0:
            tiles = fn()
        elif n == 1:
            tiles = fn(hbm[0])
        elif n == 2:
            tiles = fn(hbm[0], hbm[1])
        elif n == 3:
            tiles = fn(hbm[0], hbm[1], hbm[2])
        else:
            tiles = fn(hbm[0], hbm[1], hbm[2], hbm[3])
        outs = []
        for t in tiles:
            if t.buffer == nl.psum:
                t = nl.copy(t)
            o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
            nl.store(o, t)
            outs.append(o)
        return tuple(outs)

    assert n <= 4, n
    args = arrays or (np.zeros((1, 1), np.float32),)  # one unused argument when fn takes none
    return list(run(kernel, (tuple(args),), target=target).outputs)


def rng_values(seed, shape, dtype, lo=-4.0, hi=4.0):
    return stored(np.random.default_rng(seed).uniform(lo, hi, shape), dtype)


# -- creation, load/store, copy ---------------------------------------------------------------------


@pytest.mark.parametrize("buffer", ["sbuf", "psum"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "uint8"])
def test_zeros_ones_full_on_chip(buffer, dtype):
    buf = getattr(nl, buffer)
    z, o, f = run_nl(
        lambda: (
            nl.zeros((4, 5), dtype, buffer=buf),
            nl.ones((4, 5), dtype, buffer=buf),
            nl.full((4, 5), 7, dtype, buffer=buf),
        )
    )
    np.testing.assert_array_equal(as64(z), 0)
    np.testing.assert_array_equal(as64(o), 1)
    np.testing.assert_array_equal(as64(f), 7)


def test_zeros_and_full_in_hbm_of_any_size():
    def kernel():
        a = nl.zeros((3, 70001), nl.bfloat16, buffer=nl.shared_hbm)
        b = nl.full((129, 7), -2.5, nl.float32, buffer=nl.shared_hbm)
        c = nl.full((5,), 3, nl.int16, buffer=nl.shared_hbm)
        return a, b, c

    a, b, c = run_body(kernel).outputs
    assert (as64(a) == 0).all() and (b == -2.5).all() and (c == 3).all() and c.dtype == np.int16


def test_full_float_into_integer_dtype_is_rejected_and_like_helpers():
    expect_error(
        lambda: nl.full((2, 2), 2.5, nl.int32), op="nl.full", arg="fill_value", rule="integer"
    )

    def kernel(x):
        z = nl.zeros_like(x)  # buffer defaults to SBUF (the stub's default), dtype to x's
        e = nl.empty_like(x)  # buffer defaults to x's
        z2 = nl.zeros_like(x, dtype=nl.int8, buffer=nl.psum)
        assert (z.buffer, z.dtype, e.buffer, z2.buffer, z2.dtype) == (
            nl.sbuf,
            "float16",
            nl.private_hbm,
            nl.psum,
            "int8",
        )
        out = nl.ndarray(z.shape, z.dtype, buffer=nl.shared_hbm)
        nl.store(out, z)
        return out

    np.testing.assert_array_equal(run(kernel, (np.ones((3, 4), np.float16),)).outputs, 0)


@SETTINGS
@given(
    shape=st.tuples(st.integers(1, 128), st.integers(1, 50)),
    dts=st.tuples(st.sampled_from(FLOATS + ("int32",)), st.sampled_from(FLOATS + ("int16",))),
    seed=st.integers(0, 2**16),
)
def test_load_store_and_copy(shape, dts, seed):
    x = (
        rng_values(seed, shape, dts[0], -50, 50)
        if dts[0] != "int32"
        else np.random.default_rng(seed).integers(-(2**31), 2**31 - 1, shape, dtype=np.int32)
    )

    def fn(h):
        t = nl.load(h)
        return t, nl.copy(t), nl.load(h, dtype=dts[1]), nl.copy(t, dtype=dts[1])

    t, c, l2, c2 = run_nl(fn, x)
    assert (
        t.tobytes() == x.tobytes() and c.tobytes() == x.tobytes()
    )  # same dtype: bit-exact (VectorE)
    exact = round_to(f32(x), dts[1])
    assert_close(c2, exact, 0.0)  # VectorE copy through fp32
    assert_close(l2, exact, 0.0)  # DMA conversion: src -> fp32 -> dst


def test_copy_from_psum_and_load_store_limits():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (out,) = run_nl(lambda h: (nl.copy(nl.transpose(nl.load(h))),), x)
    np.testing.assert_array_equal(out, x.T)
    expect_error(
        lambda: nl.store(
            nl.ndarray((2, 2), nl.float32, buffer=nl.shared_hbm),
            nl.ndarray((2, 2), nl.float32, buffer=nl.psum),
        ),
        op="nl.store",
        arg="value",
        rule="SBUF",
    )
    expect_error(
        lambda: nl.store(nl.ndarray((2, 2), nl.float32), nl.ndarray((2, 2), nl.float32)),
        op="nl.store",
        arg="dst",
        rule="HBM",
    )
    expect_error(
        lambda: nl.load(nl.ndarray((2, 2), nl.float32)), op="nl.load", arg="src", rule="HBM"
    )
    expect_error(
        lambda: nl.load_transpose2d(nl.ndarray((2, 2, 2), nl.float32, buffer=nl.hbm)),
        op="nl.load_transpose2d",
        arg="src rank",
        limit=2,
    )


def test_load_transpose2d():
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    (out,) = run_nl(lambda h: (nl.load_transpose2d(h),), x)
    np.testing.assert_array_equal(out, x.T)


def test_shared_identity_matrix_and_constant():
    def fn():
        i8 = nl.shared_identity_matrix(5)
        bf = nl.shared_identity_matrix(n=7, dtype=nl.bfloat16)
        dst = nl.ndarray((3, 3), nl.int32)
        nl.shared_identity_matrix(3, dst=dst)
        c = nl.load(nl.shared_constant(np.arange(6, dtype=np.int16).reshape(2, 3)))
        return i8, bf, dst, c

    i8, bf, i32, c = run_nl(fn)
    assert i8.dtype == np.uint8 and np.array_equal(i8, np.eye(5))
    np.testing.assert_array_equal(as64(bf), np.eye(7))
    np.testing.assert_array_equal(i32, np.eye(3))
    np.testing.assert_array_equal(c, np.arange(6).reshape(2, 3))
    expect_error(
        lambda: nl.shared_identity_matrix(129), op="nl.shared_identity_matrix", arg="n", limit=128
    )


# -- matmul / transpose -----------------------------------------------------------------------------------


@SETTINGS
@given(
    k=st.integers(1, 128),
    m=st.integers(1, 128),
    n=st.integers(1, 512),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_matmul_transpose_x(k, m, n, dtype, seed):
    x, y = rng_values(seed, (k, m), dtype, -1, 1), rng_values(seed + 1, (k, n), dtype, -1, 1)
    (out,) = run_nl(lambda a, b: (nl.matmul(nl.load(a), nl.load(b), transpose_x=True),), x, y)
    want = as64(x).T @ as64(y)
    # fp32 accumulation over k products: (k + 1) fp32 roundings of sum|x||y|.
    assert_close(out, want, (k + 1) * F32 * (np.abs(as64(x)).T @ np.abs(as64(y))))


def test_matmul_limits():
    expect_error(
        lambda: nl.matmul(nl.ndarray((4, 4), nl.float32), nl.ndarray((4, 4), nl.float32)),
        op="nl.matmul",
        arg="transpose_x",
        rule="must be True",
    )
    expect_error(
        lambda: nl.matmul(
            nl.ndarray((4, 129), nl.float32), nl.ndarray((4, 4), nl.float32), transpose_x=True
        ),
        op="nl.matmul",
        arg="partition dimension (shape[0])",
        limit=128,
    )
    expect_error(
        lambda: nl.matmul(
            nl.ndarray((4, 4), nl.float32), nl.ndarray((4, 513), nl.float32), transpose_x=True
        ),
        op="nisa.nc_matmul",
        arg="moving free size",
    )


@pytest.mark.parametrize(
    "dtype, out_dtype", [("float32", None), ("bfloat16", None), ("bfloat16", "float32")]
)
def test_transpose(dtype, out_dtype):
    x = rng_values(3, (40, 100), dtype)
    (out,) = run_nl(lambda h: (nl.transpose(nl.load(h), dtype=out_dtype),), x)
    assert out.dtype == (np.float32 if out_dtype else x.dtype)
    np.testing.assert_array_equal(as64(out), as64(x).T)


# -- element-wise ----------------------------------------------------------------------------------------


BIN = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": lambda a, b: (a == b) * 1.0,
    "greater": lambda a, b: (a > b) * 1.0,
    "less_equal": lambda a, b: (a <= b) * 1.0,
    "not_equal": lambda a, b: (a != b) * 1.0,
    "logical_or": lambda a, b: ((a != 0) | (b != 0)) * 1.0,
}


@SETTINGS
@given(
    shape=st.tuples(st.integers(1, 128), st.integers(1, 40), st.integers(1, 3)),
    op=st.sampled_from(sorted(BIN)),
    form=st.sampled_from(["tiles", "tile_scalar", "scalar_tile"]),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from([None] + list(FLOATS))),
    seed=st.integers(0, 2**16),
)
def test_binary_wrappers(shape, op, form, dts, seed):
    x, y = rng_values(seed, shape, dts[0]), rng_values(seed + 1, shape, dts[0])
    s = 1.25

    def fn(a, b):
        ta, tb = nl.load(a), nl.load(b)
        f = getattr(nl, op)
        if form == "tiles":
            return (f(ta, tb, dtype=dts[1]),)
        return (f(ta, s, dtype=dts[1]) if form == "tile_scalar" else f(s, ta, dtype=dts[1]),)

    (out,) = run_nl(fn, x, y)
    a, b = as64(x), as64(y) if form == "tiles" else s
    want = BIN[op](b, a) if form == "scalar_tile" else BIN[op](a, b)
    assert_close(out, round_to(want, dts[1] or dts[0]), 0.0)


def test_bitvec_and_power_wrappers():
    x = np.array([[12, 10, 7]], dtype=np.int32)

    def fn(h, f):
        t, tf = nl.load(h), nl.load(f)
        return (
            nl.bitwise_and(t, 6),
            nl.left_shift(t, 2),
            nl.right_shift(t, t),
            nl.invert(t),
            nl.logical_not(nl.equal(t, 10)),
            nl.power(tf, tf),
        )

    f = np.array([[2.0, 0.5, 3.0]], dtype=np.float32)
    a, ls, rs, inv, lnot, pw = run_nl(fn, x, f)
    np.testing.assert_array_equal(a, x & 6)
    np.testing.assert_array_equal(ls, x << 2)
    np.testing.assert_array_equal(rs, [[0, 0, 0]])
    np.testing.assert_array_equal(inv, ~x)
    np.testing.assert_array_equal(lnot, [[1, 0, 1]])
    assert_close(pw, np.power(as64(f), as64(f)), 4 * F32 * np.power(as64(f), as64(f)))


def test_element_wise_wrapper_limits():
    def tiles(*shapes):
        return [nl.ndarray(s, nl.float32) for s in shapes]

    expect_error(
        lambda: nl.add(*tiles((4, 8), (4, 1))), op="nl.add", arg="y shape", rule="no broadcasting"
    )
    expect_error(lambda: nl.add(1.0, 2.0), op="nl.add", arg="x, y")
    expect_error(
        lambda: nl.power(tiles((4, 8))[0], 2.0), op="nl.power", arg="x, y", rule="both be tiles"
    )
    expect_error(lambda: nl.multiply(tiles((4, 8))[0], "2"), op="nl.multiply", arg="scalar operand")
    expect_error(
        lambda: nl.bitwise_and(nl.ndarray((4, 8), nl.int32), 1.5),
        op="nl.bitwise_and",
        arg="scalar operand",
        rule="int",
    )
    expect_error(
        lambda: nl.abs_max(*tiles((4, 8), (4, 8))),
        op="nisa.tensor_tensor",
        arg="op",
        rule="NeuronCore-v4",
    )
    for name in ("divide", "fmod", "mod"):
        with pytest.raises(NotImplementedByInterpreter, match=f"nl.{name}"):
            run_body(lambda n=name: getattr(nl, n)(*tiles((2, 2), (2, 2))))


def test_abs_max_and_abs_min_docstring_examples_pair_a_tile_with_a_column():
    def fn():
        a = nl.full((128, 512), -5.0, dtype=nl.float32, buffer=nl.sbuf)
        b = nl.full((128, 1), 3.0, dtype=nl.float32, buffer=nl.sbuf)
        one = nl.full((128, 512), 1.0, dtype=nl.float32, buffer=nl.sbuf)
        neg = nl.full((128, 1), -1.0, dtype=nl.float32, buffer=nl.sbuf)
        five = nl.full((128, 512), 5.0, dtype=nl.float32, buffer=nl.sbuf)
        m3 = nl.full((128, 1), -3.0, dtype=nl.float32, buffer=nl.sbuf)
        return (
            nl.abs_max(a, b),
            nl.abs_max(one, neg),
            nl.abs_min(five, m3),
            nl.abs_min(one, neg),
            nl.abs_max(b, a),
        )

    mx, tie_mx, mn, tie_mn, rev = run_nl(fn, target="trn3")
    assert (mx == -5).all() and (tie_mx == -1).all() and (mn == -3).all() and (tie_mn == -1).all()
    assert rev.shape == (128, 512) and (rev == -5).all()
    expect_error(
        lambda: nl.maximum(nl.ndarray((4, 8), nl.float32), nl.ndarray((4, 1), nl.float32)),
        op="nl.maximum",
        arg="y shape",
        rule="no broadcasting",
        target="trn3",
    )


def test_abs_max_wrapper_on_trn3():
    a, b = np.float32([[-5.0, 1.0]]), np.float32([[3.0, -1.0]])
    (out,) = run_nl(lambda x, y: (nl.abs_max(nl.load(x), nl.load(y)),), a, b, target="trn3")
    np.testing.assert_array_equal(out, [[-5.0, -1.0]])


UNARY = {
    "exp": np.exp,
    "tanh": np.tanh,
    "square": np.square,
    "abs": np.abs,
    "sign": np.sign,
    "sqrt": np.sqrt,
    "log": np.log,
    "relu": lambda v: np.maximum(v, 0),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "negative": np.negative,
    "rsqrt": lambda v: 1 / np.sqrt(v),
    "reciprocal": lambda v: 1 / v,
    "arctan": np.arctan,
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_unary_wrappers(op, dtype):
    lo = 0.1 if op in ("sqrt", "log", "rsqrt") else -1.5
    x = rng_values(7, (64, 33), dtype, lo, 1.5)
    (out,) = run_nl(lambda h: (getattr(nl, op)(nl.load(h)),), x)
    want = UNARY[op](as64(x))
    assert_close(
        out, round_to(want, dtype), 2 * F32 * np.abs(want) + HALF_ULP[dtype] * np.abs(want)
    )


def test_rsqrt_runs_on_gpsimd_without_psum_and_reciprocal_on_vector_without_range_limit():
    def kernel():
        t = nl.full((2, 4), 4.0, nl.float32)
        nl.rsqrt(t)
        nl.reciprocal(t)

    r = run_body(kernel)
    assert [i.engine for i in r.trace.instructions[-2:]] == ["gpsimd", "vector"]
    expect_error(
        lambda: nl.rsqrt(nl.zeros((2, 4), nl.float32, buffer=nl.psum)),
        op="nisa.tensor_scalar",
        arg="data",
        rule="must be in SBUF",
    )
    x = np.float32([[2.0**-50, -(2.0**60), 3.0]])  # outside ScalarE's reciprocal range
    (out,) = run_nl(lambda h: (nl.reciprocal(nl.load(h)),), x)
    np.testing.assert_array_equal(out, 1 / x)


@SETTINGS
@given(
    x=st.lists(st.floats(-200, 200, allow_nan=False, width=32), min_size=1, max_size=64),
    fn=st.sampled_from(["sin", "cos", "tan"]),
)
def test_trigonometric_wrappers_reduce_the_range(x, fn):
    arr = np.float32([x])
    (out,) = run_nl(lambda h: (getattr(nl, fn)(nl.load(h)),), arr)
    a64 = as64(arr)
    want = getattr(np, fn)(a64)
    err = 4 * F32 * (1 + np.abs(a64))
    if fn == "tan":  # d tan = (1 + tan^2): the angle error is amplified near the poles
        err = err * (1 + want**2) + 4 * F32 * np.abs(want)
    assert_close(out, want, err)


def test_sin_matches_the_documented_example_and_hardware_extrapolation_is_not_used():
    (out,) = run_nl(lambda h: (nl.sin(nl.load(h)),), np.float32([[0.0, 9.0]]))
    assert (
        out[0, 0] == 0.0 and abs(out[0, 1] - math.sin(9.0)) < 1e-6
    )  # not ~27.65 (nisa.activation)


# -- reductions ---------------------------------------------------------------------------------------


@SETTINGS
@given(
    shape=st.sampled_from([(5, 7), (128, 3, 4), (3, 2, 5, 6), (1, 300)]),
    fn=st.sampled_from(["sum", "max", "min", "mean", "prod"]),
    k=st.integers(1, 3),
    keepdims=st.booleans(),
    dts=st.tuples(
        st.sampled_from(["float32", "bfloat16"]), st.sampled_from([None, "float32", "bfloat16"])
    ),
    negative_axes=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_reductions(shape, fn, k, keepdims, dts, negative_axes, seed):
    k = min(k, len(shape) - 1)
    axes = tuple(range(len(shape) - k, len(shape)))
    lo, hi = (0.8, 1.2) if fn == "prod" else (-3, 3)
    x = rng_values(seed, shape, dts[0], lo, hi)
    axis = (
        tuple(a - len(shape) for a in axes)
        if negative_axes
        else (axes[0] if k == 1 else list(axes))
    )
    (out,) = run_nl(
        lambda h: (getattr(nl, fn)(nl.load(h), axis=axis, dtype=dts[1], keepdims=keepdims),), x
    )
    x64 = as64(x)
    want = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod}[fn](
        x64, axis=axes, keepdims=keepdims
    )
    if not keepdims and want.ndim < 2:
        want = want.reshape(-1, 1)
    n = int(np.prod([shape[a] for a in axes]))
    dst = dts[1] or dts[0]
    err = {
        "sum": n * F32 * np.abs(x64).sum(axis=axes),
        "mean": (n + 2) * F32 * np.abs(x64).mean(axis=axes),
        "prod": n * F32 * np.abs(np.prod(x64, axis=axes)),
    }.get(fn, 0.0)
    err = np.reshape(err, want.shape) if np.ndim(err) else err
    assert out.shape == want.shape
    # Exact ops (max/min) must equal the rounded reference; inexact ones are bounded
    # against the exact value: accumulation error plus one rounding (half an ulp) of the
    # result. (Comparing an inexact result with the *rounded* reference is off by a whole
    # ulp whenever the fp32 value and the exact one straddle a rounding midpoint.)
    inexact = np.broadcast_to(np.asarray(err) != 0, want.shape)
    assert_close(
        out,
        np.where(inexact, want, round_to(want, dst)),
        err + HALF_ULP[dst] * np.abs(want) * inexact,
    )


def test_mean_uses_an_fp32_intermediate():
    """bf16 output of a mean: one rounding of the fp32 mean, not a bf16 sum then a scale."""
    x = np.full((1, 3), 1.0 + 2.0**-7, dtype=np.float32)  # sum 3.0234375 rounds in bf16 to 3.03125
    (out,) = run_nl(lambda h: (nl.mean(nl.load(h), axis=1, dtype=nl.bfloat16),), x)
    assert as64(out)[0, 0] == as64(stored(np.float32(1.0 + 2.0**-7), "bfloat16"))


def test_reduction_limits():
    def t():
        return nl.ndarray((4, 3, 5), nl.float32)

    expect_error(
        lambda: nl.sum(t(), axis=0), op="nisa.tensor_reduce", arg="axis", rule="must not include 0"
    )
    expect_error(
        lambda: nl.max(t(), axis=1), op="nisa.tensor_reduce", arg="axis", rule="last contiguous"
    )
    expect_error(lambda: nl.min(t(), axis=3), op="nl.min", arg="axis")
    expect_error(lambda: nl.mean(t(), axis=1.0), op="nl.mean", arg="axis")
    with pytest.raises(NkiValidationError):
        run_body(lambda: nl.prod(nl.ndarray((4, 8), nl.float32, buffer=nl.hbm), axis=1))
