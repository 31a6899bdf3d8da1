"""GpSimd Engine: ``nisa.iota``, ``nisa.affine_select``, ``nisa.tensor_partition_reduce``
against NumPy, and every documented limit (GpSimd cannot access PSUM).

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (iota, affine_select,
tensor_partition_reduce), nki/test/test_nki_isa_partition_reduce.py (legacy example).

Tolerances (fixed before looking at results): iota and affine_select are integer
arithmetic and selections: exact. tensor_partition_reduce add/average over P partitions:
an fp32 running sum, ``P * 2**-24 * sum|x|``, plus one rounding into dst; max: exact.
"""

from __future__ import annotations

import numpy as np
from _compute_helpers import (
    F32,
    FLOATS,
    HALF_ULP,
    In,
    Out,
    T,
    as64,
    assert_close,
    expect_error,
    launch,
    make,
    nisa,
    nl,
    np_dtype,
    random_values,
    round_to,
    stored,
    tile,
)
from hypothesis import given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=30, deadline=None)


@st.composite
def patterns(draw, max_elems=300):
    levels = draw(st.integers(1, 4))
    pat, budget = [], max_elems
    for _ in range(levels):
        num = draw(st.integers(1, max(1, min(budget, 12))))
        pat.append([draw(st.integers(-50, 50)), num])
        budget = max(1, budget // num)
    return pat


def affine(p, pattern, offset, cm):
    """offset + p*cm + sum(i_k * step_k), flattened row-major over the pattern, int32 wrap."""
    grid = np.zeros(1, dtype=np.int64)
    for step, num in pattern:
        grid = (grid[:, None] + np.arange(num) * step).reshape(-1)
    v = offset + np.arange(p)[:, None] * cm + grid[None, :]
    return v.astype(np.int64).astype(np.uint32).view(np.int32).astype(np.int64)


@SETTINGS
@given(
    p=st.integers(1, 128),
    pattern=patterns(),
    offset=st.integers(-1000, 1000),
    cm=st.integers(-20, 20),
    dtype=st.sampled_from(["int32", "float32", "bfloat16", "int16", "uint16"]),
    shaped=st.booleans(),
)
def test_iota(p, pattern, offset, cm, dtype, shaped):
    n = int(np.prod([num for _, num in pattern]))
    shape = (p, *[num for _, num in pattern]) if shaped else (p, n)
    (out,) = launch(
        lambda d: nisa.iota(dst=d, pattern=pattern, offset=offset, channel_multiplier=cm),
        [],
        [Out(shape, dtype)],
    )
    want = affine(p, pattern, offset, cm).reshape(shape)
    if dtype in (
        "int32",
        "int16",
        "uint16",
    ):  # int32 results narrowed to the dst width (bit patterns)
        np.testing.assert_array_equal(out, want.astype(np.int32).astype(np_dtype(dtype)))
    else:
        assert_close(out, round_to(want.astype(np.float64), dtype), 0.0)


def test_iota_production_query_index_pattern():
    """attention_bwd: a (128, n) tile holding query t*128 + p at [p, t] (pattern [[128, n]])."""
    (out,) = launch(
        lambda d: nisa.iota(dst=d, pattern=[[128, 3]], offset=1, channel_multiplier=1),
        [],
        [Out((128, 3), "int32")],
    )
    np.testing.assert_array_equal(out, np.arange(3)[None, :] * 128 + np.arange(128)[:, None] + 1)


def test_iota_limits():
    E = {"op": "nisa.iota"}
    expect_error(
        lambda: nisa.iota(dst=tile((4, 8), buffer="psum"), pattern=[[1, 8]]),
        arg="dst",
        rule="must be in SBUF",
        **E,
    )
    expect_error(
        lambda: nisa.iota(dst=tile((4, 8)), pattern=[[1, 7]]),
        arg="pattern",
        rule="elements per partition",
        limit=8,
        value=7,
        **E,
    )
    expect_error(
        lambda: nisa.iota(dst=tile((4, 32)), pattern=[[1, 2]] * 5),
        arg="pattern",
        rule="1 to 4",
        limit=4,
        value=5,
        **E,
    )
    expect_error(lambda: nisa.iota(dst=tile((4, 8)), pattern=[]), arg="pattern", **E)
    expect_error(
        lambda: nisa.iota(dst=tile((4, 8)), pattern=[[1, 8], [1, 0]]),
        arg="pattern",
        rule="positive",
        **E,
    )
    expect_error(lambda: nisa.iota(dst=tile((4, 8)), pattern=[1, 8]), arg="pattern", **E)
    expect_error(
        lambda: nisa.iota(dst=tile((4, 8)), pattern=[[1, 8]], offset=0.5),
        arg="offset",
        rule="int32",
        **E,
    )
    expect_error(
        lambda: nisa.iota(dst=tile((4, 8)), pattern=[[1, 8]], offset=2**31),
        arg="offset",
        rule="fit an int32",
        **E,
    )
    expect_error(
        lambda: nisa.iota(dst=tile((4, 8)), pattern=[[1, 8]], channel_multiplier=True),
        arg="channel_multiplier",
        **E,
    )


CMP = ["equal", "not_equal", "greater", "greater_equal", "less", "less_equal"]


@SETTINGS
@given(
    p=st.integers(1, 128),
    pattern=patterns(),
    offset=st.integers(-200, 200),
    cm=st.integers(-5, 5),
    cmp=st.sampled_from(CMP),
    dts=st.tuples(st.sampled_from(FLOATS + ("int32",)), st.sampled_from(FLOATS)),
    fill=st.sampled_from([float(np.finfo(np.float32).min), -9984.0, 0.0, 1.5]),
    seed=st.integers(0, 2**16),
)
def test_affine_select(p, pattern, offset, cm, cmp, dts, fill, seed):
    n = int(np.prod([num for _, num in pattern]))
    x = random_values(np.random.default_rng(seed), (p, n), dts[0])

    def body(t, d):
        nisa.affine_select(
            dst=d,
            pattern=pattern,
            channel_multiplier=cm,
            on_true_tile=t,
            on_false_value=fill,
            cmp_op=getattr(nl, cmp),
            offset=offset,
        )

    (out,) = launch(body, [In(x, dts[0])], [Out((p, n), dts[1])])
    a = affine(p, pattern, offset, cm)
    keep = {
        "equal": a == 0,
        "not_equal": a != 0,
        "greater": a > 0,
        "greater_equal": a >= 0,
        "less": a < 0,
        "less_equal": a <= 0,
    }[cmp]
    want = np.where(
        keep, as64(x).astype(np.float32), np.float32(fill)
    )  # selected via fp32 when dtypes differ
    if dts[0] == dts[1]:
        assert np.array_equal(np.where(keep, out, 0).tobytes(), np.where(keep, x, 0).tobytes())
    assert_close(out, round_to(want, dts[1]), 0.0)


def test_affine_select_causal_mask_recipe():
    """Scores tile S[p, j] = query q0+p, key k0+j: keep q >= k (the nki-library recipe)."""
    q0, k0, n = 64, 32, 96
    s = np.ones((64, n), dtype=np.float32)
    fill = float(np.finfo(np.float32).min)
    (out,) = launch(
        lambda t, d: nisa.affine_select(
            dst=d,
            pattern=[[-1, n]],
            channel_multiplier=1,
            on_true_tile=t,
            on_false_value=fill,
            cmp_op=nl.greater_equal,
            offset=q0 - k0,
        ),
        [In(s, "float32")],
        [Out(s.shape, "float32")],
    )
    q, k = q0 + np.arange(64)[:, None], k0 + np.arange(n)[None, :]
    np.testing.assert_array_equal(out, np.where(q >= k, 1.0, fill))


def test_affine_select_limits():
    E = {"op": "nisa.affine_select"}

    def call(**kw):
        args = {
            "dst": T((4, 8)),
            "pattern": [[1, 8]],
            "channel_multiplier": 1,
            "on_true_tile": T((4, 8)),
            "on_false_value": 0.0,
        }
        args.update(kw)
        return lambda: nisa.affine_select(**make(args))

    expect_error(
        call(on_true_tile=T((4, 8), buffer="psum")), arg="on_true_tile", rule="must be in SBUF", **E
    )
    expect_error(call(dst=T((4, 8), buffer="psum")), arg="dst", rule="must be in SBUF", **E)
    expect_error(call(cmp_op=nl.add), arg="cmp_op", rule="comparison", **E)
    expect_error(call(on_false_value=T((4, 1))), arg="on_false_value", rule="fp32 scalar", **E)
    expect_error(call(pattern=[[1, 4]]), arg="pattern", limit=8, value=4, **E)
    expect_error(call(on_true_tile=T((3, 8))), arg="dst partition dimension", **E)
    expect_error(call(on_true_tile=T((4, 9))), arg="dst elements per partition", **E)
    expect_error(call(offset=1.5), arg="offset", **E)


@SETTINGS
@given(
    p=st.integers(1, 128),
    free=st.sampled_from([(1,), (7,), (32, 4), (3, 5, 2), (300,)]),
    op=st.sampled_from(["add", "average", "maximum", "max"]),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
    seed=st.integers(0, 2**16),
)
def test_tensor_partition_reduce(p, free, op, dts, seed):
    x = random_values(np.random.default_rng(seed), (p, *free), dts[0])
    (out,) = launch(
        lambda t, d: nisa.tensor_partition_reduce(dst=d, op=getattr(nl, op), data=t),
        [In(x, dts[0])],
        [Out((1, *free), dts[1])],
    )
    x64 = as64(x)
    want = {"add": x64.sum(0), "average": x64.mean(0), "maximum": x64.max(0), "max": x64.max(0)}[
        op
    ][None]
    bound = 0.0 if op in ("maximum", "max") else p * F32 * np.abs(x64).sum(0)[None]
    assert_close(
        out, round_to(want, dts[1]), bound + HALF_ULP[dts[1]] * np.abs(want) * (bound != 0) * 2
    )


def test_tensor_partition_reduce_bitwise_on_integers():
    x = np.array([[1, 2, 4], [8, 2, 6], [1, 3, 4]], dtype=np.uint16)

    def body(t, o, a):
        nisa.tensor_partition_reduce(dst=o, op=nl.bitwise_or, data=t)
        nisa.tensor_partition_reduce(dst=a, op=nl.bitwise_and, data=t)

    o, a = launch(body, [In(x, "uint16")], [Out((1, 3), "uint16")] * 2)
    np.testing.assert_array_equal(o[0], np.bitwise_or.reduce(x, axis=0))
    np.testing.assert_array_equal(a[0], np.bitwise_and.reduce(x, axis=0))


def test_tensor_partition_reduce_matches_the_legacy_example():
    x = stored(np.random.default_rng(1).random((128, 32, 4)) * 100, "float32")
    (out,) = launch(
        lambda t, d: nisa.tensor_partition_reduce(dst=d, op=nl.add, data=t),
        [In(x, "float32")],
        [Out((1, 32, 4), "float32")],
    )
    assert_close(
        out, x.astype(np.float64).sum(0, keepdims=True), 128 * F32 * np.abs(x).sum(0, keepdims=True)
    )


def test_tensor_partition_reduce_limits():
    E = {"op": "nisa.tensor_partition_reduce"}

    def call(**kw):
        args = {"dst": T((1, 8)), "op": nl.add, "data": T((4, 8))}
        args.update(kw)
        return lambda: nisa.tensor_partition_reduce(**make(args))

    expect_error(call(data=T((4, 8), buffer="psum")), arg="data", rule="must be in SBUF", **E)
    expect_error(call(dst=T((1, 8), buffer="psum")), arg="dst", rule="must be in SBUF", **E)
    expect_error(call(dst=T((2, 8))), arg="dst partition dimension", limit=1, value=2, **E)
    expect_error(call(dst=T((1, 7))), arg="dst elements per partition", limit=8, value=7, **E)
    expect_error(call(op=nl.subtract), arg="op", **E)
    expect_error(call(op=nl.multiply), arg="op", **E)
    expect_error(call(op=nl.bitwise_or), arg="data dtype", rule="integer", **E)
