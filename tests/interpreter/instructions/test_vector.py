"""Vector Engine instructions against float64 NumPy, and every documented limit.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (per-instruction docstrings),
nki/api/nki.api.shared.rst (ALU operators), release-notes/components/nki.rst.

Tolerances (fixed before looking at results):
- copies, selections, max/min, comparisons, and one IEEE add/subtract/multiply/divide:
  exact. An fp32 IEEE operation is correctly rounded, so the engine's fp32 result is the
  fp32 rounding of the float64 result, and the write into dst is one more deterministic
  rounding (``round_to``). Two-op instructions round their intermediate to fp32, which the
  reference does too (``f32``), so they are exact as well.
- reductions over n elements (add/multiply): the hardware's fp32 running sum carries up
  to n fp32 roundings: ``n * 2**-24 * sum|x|`` (product: ``n * 2**-24 * |prod|``), plus one
  rounding into dst.
- transcendental ALU ops (power, exp): the engine's fp32 function may be off by a couple
  of fp32 ulps: ``4 * 2**-24 * |y|`` plus the dst rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from _compute_helpers import (
    F32,
    FLOATS,
    HALF_ULP,
    TINY,
    In,
    Out,
    T,
    as64,
    assert_close,
    expect_error,
    f32,
    launch,
    make,
    nisa,
    nl,
    np_dtype,
    present,
    random_values,
    round_to,
    run_body,
    stored,
    tile,
    tile_shapes,
    views,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.interpreter import NkiValidationError, run

SETTINGS = settings(max_examples=25, deadline=None)


def eq(a, b):
    return (a == b) * 1.0


REF = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": eq,
    "not_equal": lambda a, b: (a != b) * 1.0,
    "greater": lambda a, b: (a > b) * 1.0,
    "greater_equal": lambda a, b: (a >= b) * 1.0,
    "less": lambda a, b: (a < b) * 1.0,
    "less_equal": lambda a, b: (a <= b) * 1.0,
    "logical_and": lambda a, b: ((a != 0) & (b != 0)) * 1.0,
    "logical_or": lambda a, b: ((a != 0) | (b != 0)) * 1.0,
    "logical_xor": lambda a, b: ((a != 0) ^ (b != 0)) * 1.0,
    "abs_max": lambda a, b: np.where(np.abs(a) > np.abs(b), a, b),
    "abs_min": lambda a, b: np.where(np.abs(a) < np.abs(b), a, b),
}
ARITH = [k for k in REF if not k.startswith("abs_")]


def binary(name, a, b, reverse=False):
    return REF[name](b, a) if reverse else REF[name](a, b)


def exact(got, want64, dtype, context=""):
    """got must equal the engine rounding of the exact float64 result."""
    assert_close(got, round_to(want64, dtype), 0.0, context)


def rounded_bound(want, dtype, rel_f32):
    """``rel_f32`` fp32 roundings plus one rounding into ``dtype``, relative to |want|."""
    return (
        rel_f32 * F32 * np.abs(want)
        + HALF_ULP.get(dtype, 0.5) * np.abs(want)
        + TINY.get(dtype, 0.5)
    )


# -- tensor_copy ----------------------------------------------------------------------------------


@SETTINGS
@given(
    shape=tile_shapes(),
    src=st.sampled_from(FLOATS + ("int32", "int8", "uint16")),
    dst=st.sampled_from(FLOATS + ("int32", "int16", "uint8")),
    engine=st.sampled_from(["vector", "gpsimd", "scalar"]),
    psum=st.booleans(),
    view=views,
    seed=st.integers(0, 2**16),
)
def test_tensor_copy(shape, src, dst, engine, psum, view, seed):
    """Same dtype on Vector/GpSimd: bit-exact; otherwise (and always on ScalarE) via fp32."""
    values = random_values(np.random.default_rng(seed), shape, src, -300.0, 300.0)
    buffer = "psum" if psum and engine != "gpsimd" else "sbuf"
    eng = getattr(nisa.engine, engine)
    (out,) = launch(
        lambda s, d: nisa.tensor_copy(dst=d, src=s, engine=eng),
        [In(values, src, buffer, view)],
        [Out(shape, dst, "sbuf", view)],
    )
    if src == dst and engine != "scalar":
        assert out.tobytes() == values.astype(np_dtype(dst)).tobytes()
    else:
        exact(out, f32(values), dst, f"{src}->{dst} on {engine}")


def test_tensor_copy_scalar_engine_is_lossy_for_int32_and_vector_is_not():
    big = np.array([[2**24 + 1, -(2**31), 2**31 - 1, 7]], dtype=np.int32)
    outs = launch(
        lambda s, a, b: (
            nisa.tensor_copy(dst=a, src=s, engine=nisa.engine.vector),
            nisa.tensor_copy(dst=b, src=s, engine=nisa.engine.scalar),
        ),
        [In(big, "int32")],
        [Out(big.shape, "int32"), Out(big.shape, "int32")],
    )
    np.testing.assert_array_equal(outs[0], big)
    np.testing.assert_array_equal(outs[1], [[2**24, -(2**31), 2**31 - 1, 7]])  # fp32, saturated


def test_tensor_copy_limits():
    expect_error(
        lambda: nisa.tensor_copy(dst=tile((4, 8)), src=tile((4, 8)), engine=nisa.engine.scalar),
        target="trn1",
        op="nisa.tensor_copy",
        arg="engine",
        rule="NeuronCore-v2",
    )
    expect_error(
        lambda: nisa.tensor_copy(
            dst=tile((4, 8)), src=tile((4, 8), buffer="psum"), engine=nisa.engine.gpsimd
        ),
        op="nisa.tensor_copy",
        arg="src",
        rule="must be in SBUF",
    )
    expect_error(
        lambda: nisa.tensor_copy(
            dst=tile((4, 8), buffer="psum"), src=tile((4, 8)), engine=nisa.engine.gpsimd
        ),
        op="nisa.tensor_copy",
        arg="dst",
        rule="must be in SBUF",
    )
    expect_error(
        lambda: nisa.tensor_copy(dst=tile((5, 8)), src=tile((4, 8))),
        op="nisa.tensor_copy",
        arg="dst partition dimension",
        limit=4,
        value=5,
    )
    expect_error(
        lambda: nisa.tensor_copy(dst=tile((4, 9)), src=tile((4, 8))),
        op="nisa.tensor_copy",
        arg="dst elements per partition",
        limit=8,
        value=9,
    )
    expect_error(
        lambda: nisa.tensor_copy(dst=tile((4, 8)), src=tile((4, 8)), engine=nisa.engine.tensor),
        op="nisa.tensor_copy",
        arg="engine",
    )
    expect_error(
        lambda: nisa.tensor_copy(dst=tile((4, 8)), src=tile((4, 8)), engine=5),
        op="nisa.tensor_copy",
        arg="engine",
        rule="nisa.engine member",
    )
    # Free-size limits: 64K elements per partition from SBUF, 4K from PSUM.
    expect_error(
        lambda: nisa.tensor_copy(dst=tile((1, 65537), "int8"), src=tile((1, 65537), "int8")),
        op="nisa.tensor_copy",
        arg="src free size",
        rule="65536 elements per partition from SBUF",
        limit=65536,
        value=65537,
    )
    expect_error(
        lambda: nisa.tensor_copy(
            dst=tile((1, 4097), "bfloat16"), src=tile((1, 4097), "bfloat16", "psum")
        ),
        op="nisa.tensor_copy",
        arg="src free size",
        rule="4096 elements per partition from PSUM",
        limit=4096,
        value=4097,
    )


def test_more_than_128_partitions_is_rejected_at_allocation():
    expect_error(
        lambda: tile((129, 4)),
        op="nl.ndarray",
        arg="partition dimension (shape[0])",
        limit=128,
        value=129,
    )


# -- memset -----------------------------------------------------------------------------------------


@SETTINGS
@given(
    shape=tile_shapes(),
    dtype=st.sampled_from(FLOATS + ("int32", "int8", "uint16", "bool_")),
    engine=st.sampled_from(["vector", "gpsimd"]),
    psum=st.booleans(),
    view=views,
    value=st.floats(-100, 100, allow_nan=False),
)
def test_memset(shape, dtype, engine, psum, view, value):
    integer = dtype in ("int32", "int8", "uint16", "bool_")
    v = int(abs(value)) if integer else value
    if dtype == "bool_":
        v = min(v, 1)  # bool_ holds 0 and 1 only; other values are refused (test_memset_limits)
    buffer = "psum" if psum and engine == "vector" else "sbuf"
    eng = getattr(nisa.engine, engine)
    (out,) = launch(
        lambda d: nisa.memset(dst=d, value=v, engine=eng), [], [Out(shape, dtype, buffer, view)]
    )
    want = (v != 0) * 1.0 if dtype == "bool_" else round_to(np.float32(v), dtype)
    assert_close(out, np.full(shape, want), 0.0)


def test_memset_limits():
    err = expect_error(
        lambda: nisa.memset(dst=tile((4, 4), "int32"), value=2.0),
        op="nisa.memset",
        arg="value",
        rule="int literal",
    )
    assert err.value == 2.0
    expect_error(lambda: nisa.memset(dst=tile((4, 4)), value=True), op="nisa.memset", arg="value")
    for dtype, value in (("bool_", 2), ("int8", 300), ("uint16", -1), ("float16", 1e5)):
        expect_error(
            lambda dtype=dtype, value=value: nisa.memset(dst=tile((4, 4), dtype), value=value),
            op="nisa.memset",
            arg="value",
            rule="range",
        )
    expect_error(
        lambda: nisa.memset(dst=tile((4, 4), buffer="psum"), value=0.0, engine=nisa.engine.gpsimd),
        op="nisa.memset",
        arg="dst",
        rule="must be in SBUF",
    )
    expect_error(
        lambda: nisa.memset(dst=tile((4, 4)), value=0.0, engine=nisa.engine.scalar),
        op="nisa.memset",
        arg="engine",
    )


@pytest.mark.parametrize(
    "dtype,value",
    [("int8", 300), ("int8", -129), ("uint8", -1), ("int32", 2**31), ("bfloat16", 1e39)],
)
def test_memset_refuses_a_value_the_dtype_cannot_hold(dtype, value):
    def kernel(x):
        t = nl.ndarray((2, 2), getattr(nl, dtype), buffer=nl.sbuf)
        nisa.memset(dst=t, value=value)
        return x

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (np.zeros((2, 2), np.float32),))
    assert (info.value.op, info.value.arg) == ("nisa.memset", "value")
    assert "range" in info.value.rule


@pytest.mark.parametrize("dtype,value", [("int8", 127), ("int8", -128), ("float32", -np.inf)])
def test_memset_keeps_values_in_range(dtype, value):
    def kernel(x):
        t = nl.ndarray((2, 2), getattr(nl, dtype), buffer=nl.sbuf)
        nisa.memset(dst=t, value=value)
        o = nl.ndarray((2, 2), getattr(nl, dtype), buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o

    out = run(kernel, (np.zeros((2, 2), np.float32),)).outputs
    assert (np.asarray(out, dtype=np.float64) == value).all()


# -- tensor_tensor --------------------------------------------------------------------------------------


@SETTINGS
@given(
    shape=tile_shapes(),
    op=st.sampled_from(ARITH),
    dts=st.tuples(*[st.sampled_from(FLOATS + ("int8", "int16", "uint8"))] * 3),
    psum=st.sampled_from([None, 0, 1, 2]),
    engine=st.sampled_from(["unknown", "vector", "gpsimd"]),
    vws=st.tuples(views, views, views),
    seed=st.integers(0, 2**16),
)
def test_tensor_tensor_arithmetic(shape, op, dts, psum, engine, vws, seed):
    rng = np.random.default_rng(seed)
    a, b = random_values(rng, shape, dts[0]), random_values(rng, shape, dts[1])
    if op.startswith("logical"):
        a = stored(rng.integers(0, 2, shape), dts[0])
    if engine == "gpsimd":
        psum = None  # GpSimd cannot access PSUM
    buf = ["psum" if psum == i else "sbuf" for i in range(3)]
    eng = getattr(nisa.engine, engine)
    body = lambda x, y, d: nisa.tensor_tensor(
        dst=d, data1=x, data2=y, op=getattr(nl, op), engine=eng
    )
    (out,) = launch(
        body,
        [In(a, dts[0], buf[0], vws[0]), In(b, dts[1], buf[1], vws[1])],
        [Out(shape, dts[2], buf[2], vws[2])],
    )
    exact(out, binary(op, f32(a), f32(b)), dts[2], f"{op} {dts}")


@SETTINGS
@given(
    shape=tile_shapes(),
    op=st.sampled_from(["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]),
    dtype=st.sampled_from(["int8", "int16", "int32", "uint8", "uint16", "uint32"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_tensor_bitvec_on_bit_patterns(shape, op, dtype, seed):
    rng = np.random.default_rng(seed)
    nd = np_dtype(dtype)
    bits = np.dtype(nd).itemsize * 8
    a = random_values(rng, shape, dtype, full_range=True)
    b = (
        rng.integers(0, bits, shape).astype(nd)
        if "shift" in op
        else random_values(rng, shape, dtype, full_range=True)
    )
    body = lambda x, y, d: nisa.tensor_tensor(dst=d, data1=x, data2=y, op=getattr(nl, op))
    (out,) = launch(body, [In(a, dtype), In(b, dtype)], [Out(shape, dtype)])
    unsigned = a.view(f"u{np.dtype(nd).itemsize}")
    want = {
        "bitwise_and": a & b,
        "bitwise_or": a | b,
        "bitwise_xor": a ^ b,
        "left_shift": np.left_shift(a, b),
        "right_shift": np.right_shift(unsigned, b.astype(unsigned.dtype)).view(nd),
    }[op]
    np.testing.assert_array_equal(out, want)


def test_tensor_tensor_int32_defaults_to_exact_gpsimd_and_vector_goes_through_fp32():
    a = np.array([[2**24 + 1, 2**31 - 1, -7, 100000]], dtype=np.int32)
    b = np.array([[2, 1, 3, 100000]], dtype=np.int32)
    ops = ("add", "multiply", "subtract", "maximum", "greater")

    def body(x, y, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        outs = present(r0, r1, r2, r3, r4, r5)
        for op, o in zip(ops, outs[:5]):
            nisa.tensor_tensor(dst=o, data1=x, data2=y, op=getattr(nl, op))  # GpSimd (default)
        nisa.tensor_tensor(dst=outs[5], data1=x, data2=y, op=nl.add, engine=nisa.engine.vector)

    outs = launch(body, [In(a, "int32"), In(b, "int32")], [Out(a.shape, "int32") for _ in range(6)])
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    wrap = lambda v: v.astype(np.uint32).view(np.int32)
    for o, want in zip(
        outs, (wrap(a64 + b64), wrap(a64 * b64), a64 - b64, np.maximum(a64, b64), (a64 > b64))
    ):
        np.testing.assert_array_equal(o, want)
    exact(outs[5], f32(a) + f32(b), "int32")  # Vector Engine: fp32 math, saturating write


def test_tensor_tensor_int32_with_psum_falls_back_to_vector():
    a = np.array([[2**24 + 1]], dtype=np.int32)
    r = run_body(lambda: _int_psum_add())
    assert r.trace.instructions[-1].engine == "vector"
    (out,) = launch(
        lambda x, y, d: nisa.tensor_tensor(dst=d, data1=x, data2=y, op=nl.add),
        [In(a, "int32", "psum"), In(a, "int32")],
        [Out(a.shape, "int32")],
    )
    assert (
        out[0, 0] == 2**25
    )  # each input rounds to fp32 2^24 (ties to even); exact GpSimd would give 2^25 + 2


def _int_psum_add():
    x, y = tile((1, 1), "int32", "psum"), tile((1, 1), "int32")
    nisa.tensor_tensor(dst=tile((1, 1), "int32"), data1=x, data2=y, op=nl.add)


@SETTINGS
@given(
    shape=tile_shapes(max_free=64),
    dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_tensor_power_runs_on_gpsimd(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    a, b = stored(rng.uniform(0.1, 3.0, shape), dtype), stored(rng.uniform(-2.0, 2.0, shape), dtype)
    (out,) = launch(
        lambda x, y, d: nisa.tensor_tensor(dst=d, data1=x, data2=y, op=nl.power),
        [In(a, dtype), In(b, dtype)],
        [Out(shape, dtype)],
    )
    want = np.power(as64(a), as64(b))
    assert_close(out, want, rounded_bound(want, dtype, 4))


def test_abs_max_and_abs_min_on_trn3_break_ties_toward_data2():
    a = np.array([[-5.0, 1.0, 2.0, -3.0]], dtype=np.float32)
    b = np.array([[3.0, -1.0, -2.0, 4.0]], dtype=np.float32)

    def body(x, y, mx, mn):
        nisa.tensor_tensor(dst=mx, data1=x, data2=y, op=nl.abs_max)
        nisa.tensor_tensor(dst=mn, data1=x, data2=y, op=nl.abs_min)

    mx, mn = launch(
        body, [In(a, "float32"), In(b, "float32")], [Out(a.shape, "float32")] * 2, target="trn3"
    )
    np.testing.assert_array_equal(mx, [[-5.0, -1.0, -2.0, 4.0]])
    np.testing.assert_array_equal(mn, [[3.0, -1.0, -2.0, -3.0]])


def test_tensor_tensor_limits():
    tt = nisa.tensor_tensor
    expect_error(
        lambda: tt(
            dst=tile((4, 8)),
            data1=tile((4, 8), buffer="psum"),
            data2=tile((4, 8), buffer="psum"),
            op=nl.add,
        ),
        op="nisa.tensor_tensor",
        arg="data1 and data2",
        rule="must not both be in PSUM",
    )
    expect_error(
        lambda: tt(dst=tile((4, 8)), data1=tile((4, 8)), data2=tile((3, 8)), op=nl.add),
        op="nisa.tensor_tensor",
        arg="data2 partition dimension",
        limit=4,
        value=3,
    )
    expect_error(
        lambda: tt(dst=tile((4, 8)), data1=tile((4, 8)), data2=tile((4, 2, 3)), op=nl.add),
        op="nisa.tensor_tensor",
        arg="data2 elements per partition",
        limit=8,
        value=6,
    )
    expect_error(
        lambda: tt(dst=tile((4, 8)), data1=tile((4, 8)), data2=tile((4, 8)), op=nl.abs),
        op="nisa.tensor_tensor",
        arg="op",
        rule="binary ALU operator",
    )
    expect_error(
        lambda: tt(dst=tile((4, 8)), data1=tile((4, 8)), data2=tile((4, 8)), op=nl.exp),
        op="nisa.tensor_tensor",
        arg="op",
    )
    expect_error(
        lambda: tt(dst=tile((4, 8)), data1=tile((4, 8)), data2=tile((4, 8)), op=nl.bitwise_and),
        op="nisa.tensor_tensor",
        arg="data1 dtype",
        rule="integer dtype for bitvec",
    )
    expect_error(
        lambda: tt(
            dst=tile((4, 8)),
            data1=tile((4, 8)),
            data2=tile((4, 8)),
            op=nl.power,
            engine=nisa.engine.vector,
        ),
        op="nisa.tensor_tensor",
        arg="engine",
        rule="GpSimd Engine for nl.power",
    )
    expect_error(
        lambda: tt(
            dst=tile((4, 8)), data1=tile((4, 8), buffer="psum"), data2=tile((4, 8)), op=nl.power
        ),
        op="nisa.tensor_tensor",
        arg="data1",
        rule="must be in SBUF",
    )
    expect_error(
        lambda: tt(
            dst=tile((4, 8), buffer="psum"), data1=tile((4, 8)), data2=tile((4, 8)), op=nl.power
        ),
        op="nisa.tensor_tensor",
        arg="dst",
        rule="must be in SBUF",
    )
    expect_error(
        lambda: tt(dst=tile((4, 8)), data1=tile((4, 8)), data2=tile((4, 8)), op=nl.abs_max),
        op="nisa.tensor_tensor",
        arg="op",
        rule="NeuronCore-v4",
    )
    expect_error(
        lambda: tt(dst=tile((4, 8)), data1=tile((4, 8)), data2=tile((4, 8)), op=np.add),
        op="nisa.tensor_tensor",
        arg="op",
        rule="nl operator",
    )
    # v2 start-partition rule: 33..64 partitions start at partition 0 or 64.
    expect_error(
        lambda: tt(dst=tile((64, 8)), data1=tile((128, 8))[32:96], data2=tile((64, 8)), op=nl.add),
        target="trn1",
        op="nisa.tensor_tensor",
        arg="data1 start partition",
        value=32,
    )


# -- tensor_scalar ------------------------------------------------------------------------------------


TS_OPS = ["add", "subtract", "multiply", "maximum", "minimum", "greater", "less_equal", "not_equal"]


@st.composite
def operands(draw, p):
    """A tensor_scalar operand: a compile-time scalar or an fp32 (P, 1) tile (SBUF/PSUM)."""
    if draw(st.booleans()):
        return ("scalar", draw(st.floats(-3, 3, allow_nan=False, width=32)))
    return ("column", draw(st.sampled_from(["sbuf", "psum"])))


@SETTINGS
@given(
    data=st.data(),
    shape=tile_shapes(),
    op0=st.sampled_from(TS_OPS),
    op1=st.sampled_from([None] + TS_OPS),
    rev=st.tuples(st.booleans(), st.booleans()),
    dts=st.tuples(st.sampled_from(FLOATS + ("int16",)), st.sampled_from(FLOATS + ("int8",))),
    psum=st.booleans(),
    vws=st.tuples(views, views),
    on=st.sampled_from([("trn2", "unknown"), ("trn2", "vector"), ("trn3", "scalar")]),
    seed=st.integers(0, 2**16),
)
def test_tensor_scalar_arithmetic(data, shape, op0, op1, rev, dts, psum, vws, on, seed):
    """Vector Engine, or the trn3 Scalar Engine (any arithmetic pair there)."""
    rng = np.random.default_rng(seed)
    p = shape[0]
    x = random_values(rng, shape, dts[0])
    specs = [data.draw(operands(p)), data.draw(operands(p)) if op1 else None]
    ins, cols = [In(x, dts[0], "psum" if psum else "sbuf", vws[0])], []
    for s in specs:
        if s is not None and s[0] == "column":
            col = random_values(rng, (p, 1), "float32")
            cols.append(col)
            ins.append(In(col, "float32", s[1] if not psum else "sbuf"))

    def body(t, a, b=None, c=None):  # data, then 0-2 column operands, then dst
        rest = [a]
        if b is not None:
            rest.append(b)
        if c is not None:
            rest.append(c)
        opnds, k = [], 0
        for s in specs:
            if s is None:
                opnds.append(None)
            elif s[0] == "scalar":
                opnds.append(s[1])
            else:
                opnds.append(rest[k])
                k += 1
        nisa.tensor_scalar(
            dst=rest[-1],
            data=t,
            op0=getattr(nl, op0),
            operand0=opnds[0],
            reverse0=rev[0],
            op1=getattr(nl, op1) if op1 else None,
            operand1=opnds[1],
            reverse1=rev[1],
            engine=getattr(nisa.engine, on[1]),
        )

    (out,) = launch(body, ins, [Out(shape, dts[1], "sbuf", vws[1])], target=on[0])
    it = iter(cols)
    vals = [
        None
        if s is None
        else (
            np.float32(s[1])
            if s[0] == "scalar"
            else as64(next(it)).reshape(p, *[1] * (len(shape) - 1))
        )
        for s in specs
    ]
    t = f32(binary(op0, f32(x), vals[0], rev[0]))
    if op1:
        t = binary(op1, t, vals[1], rev[1])
    exact(out, t, dts[1], f"{op0}/{op1} rev={rev} {dts}")


@SETTINGS
@given(
    shape=tile_shapes(),
    op0=st.sampled_from(["abs", "reciprocal", "rsqrt", "square", "relu"]),
    dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_scalar_unary_operators(shape, op0, dtype, seed):
    """Unary ALU ops take operand0 None or 0; square/relu exist from NeuronCore-v4."""
    rng = np.random.default_rng(seed)
    x = random_values(rng, shape, dtype, 0.25, 4.0) * np.where(
        rng.random(shape) < 0.5, -1, 1
    ).astype(np.float32)
    x = stored(x, dtype)
    if op0 == "rsqrt":
        x = stored(np.abs(as64(x)), dtype)
    target = "trn3" if op0 in ("square", "relu") else "trn2"
    (out,) = launch(
        lambda t, d: nisa.tensor_scalar(
            dst=d, data=t, op0=getattr(nl, op0), operand0=0, op1=nl.add, operand1=1.0
        ),
        [In(x, dtype)],
        [Out(shape, "float32")],
        target=target,
    )
    ref = {
        "abs": np.abs,
        "reciprocal": lambda v: 1 / v,
        "rsqrt": lambda v: 1 / np.sqrt(v),
        "square": np.square,
        "relu": lambda v: np.maximum(v, 0),
    }[op0](as64(x))
    want = f32(ref) + 1.0
    # abs/square/relu/reciprocal: exact fp32 ops; rsqrt: the fp32 result may be 1 ulp off.
    assert_close(out, round_to(want, "float32"), (0 if op0 != "rsqrt" else 2 * F32) * np.abs(want))


def test_tensor_scalar_rsqrt_defaults_to_gpsimd_and_vector_elsewhere():
    r = run_body(
        lambda: (
            nisa.tensor_scalar(dst=tile((2, 4)), data=tile((2, 4)), op0=nl.rsqrt, operand0=0.0),
            nisa.tensor_scalar(
                dst=tile((2, 4)), data=tile((2, 4), buffer="psum"), op0=nl.rsqrt, operand0=None
            ),
            nisa.tensor_scalar(dst=tile((2, 4)), data=tile((2, 4)), op0=nl.add, operand0=1.0),
        )
    )
    assert [i.engine for i in r.trace.instructions] == ["gpsimd", "vector", "vector"]


@SETTINGS
@given(
    shape=tile_shapes(),
    dtype=st.sampled_from(["int8", "int16", "int32", "uint8", "uint16", "uint32"]),
    op0=st.sampled_from(
        ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "invert"]
    ),
    op1=st.sampled_from([None, "bitwise_xor", "invert"]),
    column=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tensor_scalar_bitvec(shape, dtype, op0, op1, column, seed):
    rng = np.random.default_rng(seed)
    nd = np.dtype(np_dtype(dtype))
    bits = nd.itemsize * 8
    p = shape[0]
    x = random_values(rng, shape, dtype, full_range=True)
    imm = int(rng.integers(0, bits)) if "shift" in op0 else int(rng.integers(0, 100))
    col = np.full((p, 1), imm, dtype=nd)
    ins = [In(x, dtype)] + ([In(col, dtype)] if column and op0 != "invert" else [])

    def body(t, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        o0 = None if op0 == "invert" else (rest[0] if len(rest) == 2 else imm)
        nisa.tensor_scalar(
            dst=rest[-1],
            data=t,
            op0=getattr(nl, op0),
            operand0=o0,
            op1=getattr(nl, op1) if op1 else None,
            operand1=None if op1 in (None, "invert") else 5,
        )

    (out,) = launch(body, ins, [Out(shape, dtype)])
    u = f"u{nd.itemsize}"
    v = {
        "bitwise_and": lambda a: a & nd.type(imm),
        "bitwise_or": lambda a: a | nd.type(imm),
        "bitwise_xor": lambda a: a ^ nd.type(imm),
        "left_shift": lambda a: np.left_shift(a, nd.type(imm)),
        "right_shift": lambda a: np.right_shift(a.view(u), np.dtype(u).type(imm)).view(nd),
        "invert": np.invert,
    }[op0](x)
    if op1 == "bitwise_xor":
        v = v ^ nd.type(5)
    elif op1 == "invert":
        v = np.invert(v)
    np.testing.assert_array_equal(out, v)


def test_tensor_scalar_on_the_scalar_engine_of_trn2_multiply_add():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (out,) = launch(
        lambda t, d: nisa.tensor_scalar(
            dst=d,
            data=t,
            op0=nl.multiply,
            operand0=0.5,
            op1=nl.add,
            operand1=2.0,
            engine=nisa.engine.scalar,
        ),
        [In(x, "float32")],
        [Out(x.shape, "float32")],
    )
    np.testing.assert_array_equal(out, x * 0.5 + 2.0)


def test_tensor_scalar_limits():
    ts = nisa.tensor_scalar

    def run_ts(target="trn2", **kw):
        args = {"dst": T((4, 8)), "data": T((4, 8)), "op0": nl.add, "operand0": 1.0}
        args.update(kw)
        return lambda: ts(**make(args))

    E = {"op": "nisa.tensor_scalar"}
    expect_error(run_ts(operand0=T((4, 1), "bfloat16")), arg="operand0 dtype", limit="float32", **E)
    expect_error(run_ts(operand0=T((4, 2))), arg="operand0 shape", rule="must be (4, 1)", **E)
    expect_error(run_ts(operand0=T((3, 1))), arg="operand0 shape", **E)
    expect_error(run_ts(operand0="1.0"), arg="operand0", rule="compile-time number", **E)
    expect_error(
        run_ts(op0=nl.abs, operand0=1.0), arg="operand0", rule="None or 0 for the unary", **E
    )
    expect_error(run_ts(op0=nl.add, operand0=None), arg="operand0", rule="must be set", **E)
    expect_error(run_ts(op1=nl.bitwise_and, operand1=1), arg="op1", rule="same class as op0", **E)
    expect_error(run_ts(operand1=1.0), arg="operand1", rule="None when op1 is unused", **E)
    expect_error(
        run_ts(op0=nl.bitwise_and, operand0=3), arg="data dtype", rule="integer dtype", **E
    )
    expect_error(
        run_ts(dst=T((4, 8), "int32"), data=T((4, 8), "int32"), op0=nl.bitwise_and, operand0=1.5),
        arg="operand0",
        rule="must be an int",
        **E,
    )
    expect_error(
        run_ts(
            dst=T((4, 8), "int32"), data=T((4, 8), "int32"), op0=nl.bitwise_and, operand0=T((4, 1))
        ),
        arg="operand0 dtype",
        rule="integer dtype",
        **E,
    )
    expect_error(
        run_ts(
            dst=T((4, 8), "int32"),
            data=T((4, 8), "int32"),
            op0=nl.bitwise_and,
            operand0=1,
            engine=nisa.engine.scalar,
        ),
        arg="engine",
        rule="Vector Engine for bitvec",
        **E,
    )
    expect_error(run_ts(engine=nisa.engine.gpsimd), arg="engine", rule="only for nl.rsqrt", **E)
    expect_error(
        run_ts(op0=nl.rsqrt, operand0=0.0, op1=nl.add, operand1=1.0, engine=nisa.engine.gpsimd),
        arg="engine",
        rule="only for nl.rsqrt",
        **E,
    )
    expect_error(
        run_ts(op0=nl.subtract, engine=nisa.engine.scalar), arg="op0/op1", rule="Scalar Engine", **E
    )
    expect_error(
        run_ts(op0=nl.add, op1=nl.add, operand1=1.0, engine=nisa.engine.scalar), arg="op0/op1", **E
    )
    expect_error(run_ts(op0=nl.power), arg="op0", rule="nl.power", **E)
    expect_error(run_ts(op0=nl.abs_max), arg="op0", rule="NeuronCore-v4", **E)
    expect_error(run_ts(op0=nl.square, operand0=None), arg="op0", rule="NeuronCore-v4", **E)
    expect_error(run_ts(op0=nl.exp), arg="op0", **E)
    expect_error(
        run_ts(
            data=T((4, 8), buffer="psum"), op0=nl.rsqrt, operand0=0.0, engine=nisa.engine.gpsimd
        ),
        arg="data",
        rule="must be in SBUF",
        **E,
    )
    expect_error(run_ts(dst=T((4, 9))), arg="dst elements per partition", **E)
    expect_error(run_ts(reverse0=1), arg="reverse0", rule="bool", **E)


# -- scalar_tensor_tensor --------------------------------------------------------------------------


STT_OPS = ["add", "subtract", "multiply", "maximum", "minimum", "greater_equal"]


@SETTINGS
@given(
    shape=tile_shapes(),
    ops=st.tuples(st.sampled_from(STT_OPS), st.sampled_from(STT_OPS)),
    rev=st.tuples(st.booleans(), st.booleans()),
    column=st.sampled_from([None, "float32", "bfloat16"]),
    dts=st.tuples(*[st.sampled_from(FLOATS)] * 3),
    psum=st.sampled_from([None, 0, 1]),
    vws=st.tuples(views, views, views),
    seed=st.integers(0, 2**16),
)
def test_scalar_tensor_tensor(shape, ops, rev, column, dts, psum, vws, seed):
    rng = np.random.default_rng(seed)
    p = shape[0]
    x, y = random_values(rng, shape, dts[0]), random_values(rng, shape, dts[1])
    col = random_values(rng, (p, 1), column or "float32")
    ins = [
        In(x, dts[0], "psum" if psum == 0 else "sbuf", vws[0]),
        In(y, dts[1], "psum" if psum == 1 else "sbuf", vws[1]),
    ]
    if column:
        ins.append(In(col, column))

    def body(t, u, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        nisa.scalar_tensor_tensor(
            dst=rest[-1],
            data=t,
            op0=getattr(nl, ops[0]),
            operand0=rest[0] if column else 1.5,
            op1=getattr(nl, ops[1]),
            operand1=u,
            reverse0=rev[0],
            reverse1=rev[1],
        )

    (out,) = launch(body, ins, [Out(shape, dts[2], "sbuf", vws[2])])
    v0 = as64(col).reshape(p, *[1] * (len(shape) - 1)) if column else 1.5
    t = f32(binary(ops[0], f32(x), v0, rev[0]))
    exact(out, binary(ops[1], t, f32(y), rev[1]), dts[2], f"{ops} rev={rev}")


def test_scalar_tensor_tensor_limits():
    stt = nisa.scalar_tensor_tensor
    E = {"op": "nisa.scalar_tensor_tensor"}

    def call(**kw):
        args = {
            "dst": T((4, 8)),
            "data": T((4, 8)),
            "op0": nl.multiply,
            "operand0": 2.0,
            "op1": nl.add,
            "operand1": T((4, 8)),
        }
        args.update(kw)
        return lambda: stt(**make(args))

    expect_error(
        call(data=T((4, 8), buffer="psum"), operand1=T((4, 8), buffer="psum")),
        arg="data and operand1",
        rule="must not both be in PSUM",
        **E,
    )
    expect_error(call(op1=nl.bitwise_or), arg="op1", rule="arithmetic", **E)
    expect_error(call(op0=nl.power), arg="op0", rule="nl.power", **E)
    expect_error(call(operand0=T((4, 3))), arg="operand0 shape", **E)
    expect_error(
        call(operand1=T((4, 7))), arg="operand1 elements per partition", limit=8, value=7, **E
    )
    expect_error(call(operand1=T((2, 8))), arg="operand1 partition dimension", **E)
    expect_error(call(operand1=2.0), arg="operand1", rule="NkiTensor", **E)


# -- tensor_reduce ----------------------------------------------------------------------------------


@st.composite
def reduce_case(draw):
    shape = draw(tile_shapes(max_free=300))
    nfree = len(shape) - 1
    k = draw(st.integers(1, nfree))
    return shape, tuple(range(len(shape) - k, len(shape)))


@SETTINGS
@given(
    case=reduce_case(),
    op=st.sampled_from(["add", "maximum", "minimum", "multiply", "subtract", "logical_or"]),
    negate=st.booleans(),
    keepdims=st.booleans(),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
    as_list=st.booleans(),
    psum=st.booleans(),
    view=views,
    seed=st.integers(0, 2**16),
)
def test_tensor_reduce(case, op, negate, keepdims, dts, as_list, psum, view, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    x = (
        random_values(rng, shape, dts[0], 0.5, 1.5)
        if op == "multiply"
        else random_values(rng, shape, dts[0])
    )
    out_shape = (
        tuple(1 if d in axes else n for d, n in enumerate(shape))
        if keepdims
        else tuple(n for d, n in enumerate(shape) if d not in axes)
        + ((1,) if len(shape) - len(axes) == 1 else ())
    )
    axis = list(axes) if as_list else (axes[0] if len(axes) == 1 else axes)
    (out,) = launch(
        lambda t, d: nisa.tensor_reduce(
            dst=d, op=getattr(nl, op), data=t, axis=axis, negate=negate, keepdims=keepdims
        ),
        [In(x, dts[0], "psum" if psum else "sbuf", view)],
        [Out(out_shape, dts[1])],
    )
    x64 = f32(x)
    n = int(np.prod([shape[a] for a in axes]))
    if op == "subtract":
        flat = x64.reshape(*shape[: len(shape) - len(axes)], n)
        want = flat[..., 0] - flat[..., 1:].sum(axis=-1)
        err = n * F32 * np.abs(flat).sum(axis=-1)
    elif op == "logical_or":
        want, err = (x64 != 0).any(axis=axes) * 1.0, 0.0
    else:
        want = {"add": np.sum, "maximum": np.max, "minimum": np.min, "multiply": np.prod}[op](
            x64, axis=axes
        )
        err = {"add": n * F32 * np.abs(x64).sum(axis=axes), "multiply": n * F32 * np.abs(want)}.get(
            op, 0.0
        )
    if negate:
        want = -want
    want = want.reshape(out_shape)
    bound = np.reshape(err, want.shape) if np.ndim(err) else err
    assert_close(
        out,
        round_to(want, dts[1]),
        bound + HALF_ULP[dts[1]] * np.abs(want) * (bound != 0),
        f"{op} axes={axes}",
    )


def test_tensor_reduce_bitvec_on_integers():
    x = np.array([[0b1100, 0b1010, 0b0110], [7, 1, 3]], dtype=np.int16)

    def body(t, a, o, xo):
        nisa.tensor_reduce(dst=a, op=nl.bitwise_and, data=t, axis=1)
        nisa.tensor_reduce(dst=o, op=nl.bitwise_or, data=t, axis=1)
        nisa.tensor_reduce(dst=xo, op=nl.bitwise_xor, data=t, axis=(1,))

    a, o, xo = launch(body, [In(x, "int16")], [Out((2, 1), "int16")] * 3)
    np.testing.assert_array_equal(a.ravel(), np.bitwise_and.reduce(x, axis=1))
    np.testing.assert_array_equal(o.ravel(), np.bitwise_or.reduce(x, axis=1))
    np.testing.assert_array_equal(xo.ravel(), np.bitwise_xor.reduce(x, axis=1))


def test_tensor_reduce_limits():
    E = {"op": "nisa.tensor_reduce"}

    def call(**kw):
        args = {"dst": T((4, 1)), "op": nl.add, "data": T((4, 8)), "axis": 1}
        args.update(kw)
        return lambda: nisa.tensor_reduce(**make(args))

    expect_error(call(axis=0), arg="axis", rule="must not include 0", **E)
    expect_error(call(axis=(0, 1)), arg="axis", rule="must not include 0", **E)
    expect_error(
        call(data=T((4, 3, 5)), dst=T((4, 5)), axis=1),
        arg="axis",
        rule="last contiguous",
        limit=(2,),
        **E,
    )
    expect_error(
        call(data=T((4, 3, 5, 2)), dst=T((4, 5)), axis=(1, 3)),
        arg="axis",
        rule="last contiguous",
        **E,
    )
    expect_error(call(axis=2), arg="axis", rule="last contiguous", **E)
    expect_error(call(axis=()), arg="axis", **E)
    expect_error(call(axis=1.0), arg="axis", **E)
    expect_error(call(dst=T((4, 2))), arg="dst elements per partition", limit=1, value=2, **E)
    expect_error(call(dst=T((3, 1))), arg="dst partition dimension", **E)
    expect_error(call(op=nl.equal), arg="op", rule="reduction operator", **E)
    expect_error(call(op=nl.power), arg="op", rule="reduction operator", **E)
    expect_error(call(op=nl.bitwise_or), arg="data dtype", rule="integer dtype", **E)
    expect_error(
        call(op=nl.bitwise_or, data=T((4, 8), "int32"), dst=T((4, 1), "int32"), negate=True),
        arg="negate",
        rule="arithmetic",
        **E,
    )


# -- tensor_scalar_reduce and the Vector Engine accumulators ---------------------------------------------


@SETTINGS
@given(
    shape=tile_shapes(max_free=256),
    op0=st.sampled_from(["add", "multiply", "subtract", "maximum", "abs"]),
    rop=st.sampled_from(["add", "maximum", "minimum", "multiply", "max", "min"]),
    column=st.booleans(),
    negate=st.booleans(),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
    res_dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_scalar_reduce(shape, op0, rop, column, negate, dts, res_dtype, seed):
    rng = np.random.default_rng(seed)
    p = shape[0]
    lo, hi = (0.7, 1.3) if rop == "multiply" else (-4.0, 4.0)
    x = stored(rng.uniform(lo, hi, shape), dts[0])
    col = stored(rng.uniform(0.9, 1.1, (p, 1)), "float32")
    ins = [In(x, dts[0])] + ([In(col, "float32")] if column and op0 != "abs" else [])

    def body(t, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        o0 = None if op0 == "abs" else (rest[0] if len(rest) == 3 else 1.0)
        nisa.tensor_scalar_reduce(
            dst=rest[-2],
            data=t,
            op0=getattr(nl, op0),
            operand0=o0,
            reduce_op=getattr(nl, rop),
            reduce_res=rest[-1],
            reduce_res_negate=negate,
        )

    out, res = launch(body, ins, [Out(shape, dts[1]), Out((p, 1), res_dtype)])
    v = as64(col).reshape(p, *[1] * (len(shape) - 1)) if len(ins) == 2 else 1.0
    y = f32(np.abs(f32(x)) if op0 == "abs" else binary(op0, f32(x), v))
    exact(out, y, dts[1])
    flat = y.reshape(p, -1)
    n = flat.shape[1]
    name = {"max": "maximum", "min": "minimum"}.get(rop, rop)
    want = {
        "add": flat.sum(1),
        "maximum": flat.max(1),
        "minimum": flat.min(1),
        "multiply": flat.prod(1),
    }[name]
    err = {"add": n * F32 * np.abs(flat).sum(1), "multiply": n * F32 * np.abs(want)}.get(name, 0.0)
    want = (-want if negate else want).reshape(p, 1)
    bound = np.reshape(err, (p, 1)) if np.ndim(err) else err
    assert_close(
        res, round_to(want, res_dtype), bound + HALF_ULP[res_dtype] * np.abs(want) * (bound != 0)
    )


def test_tensor_scalar_reduce_accumulates_across_instructions():
    """reset_reduce -> reduce (no read-out) -> reduce (read, negated) -> load_reduce."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0
    init = np.array([[100.0], [-100.0], [0.5]], dtype=np.float32)

    def body(t, i, d, r1, r2, r3, r4):
        tsr = nisa.tensor_scalar_reduce
        tsr(
            dst=d,
            data=t,
            op0=nl.multiply,
            operand0=1.0,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        tsr(
            dst=d,
            data=t,
            op0=nl.add,
            operand0=1.0,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
        )
        tsr(
            dst=d,
            data=t,
            op0=nl.add,
            operand0=0.0,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=r1,
        )
        tsr(
            dst=d,
            data=t,
            op0=nl.add,
            operand0=0.0,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=r2,
            reduce_res_negate=True,
        )
        tsr(
            dst=d,
            data=t,
            op0=nl.add,
            operand0=0.0,
            reduce_op=nl.maximum,
            reduce_cmd=nisa.reduce_cmd.load_reduce,
            reduce_init=i,
            reduce_res=r3,
        )
        tsr(
            dst=d,
            data=t,
            op0=nl.add,
            operand0=0.0,
            reduce_op=nl.minimum,
            reduce_cmd=nisa.reduce_cmd.load_reduce,
            reduce_init=2.0,
            reduce_res=r4,
        )

    outs = launch(
        body,
        [In(x, "float32"), In(init, "float32")],
        [Out(x.shape, "float32")] + [Out((3, 1), "float32")] * 4,
    )
    s = x.sum(axis=1, keepdims=True).astype(np.float64)
    np.testing.assert_array_equal(outs[1], 3 * s + 4)
    np.testing.assert_array_equal(outs[2], -(4 * s + 4))  # negated read-out; registers unchanged
    np.testing.assert_array_equal(outs[3], np.maximum(init, x.max(axis=1, keepdims=True)))
    np.testing.assert_array_equal(outs[4], np.minimum(2.0, x.min(axis=1, keepdims=True)))


def test_vector_accumulators_start_undefined_nan():
    x = np.ones((2, 3), dtype=np.float32)
    _, res = launch(
        lambda t, d, r: nisa.tensor_scalar_reduce(
            dst=d,
            data=t,
            op0=nl.add,
            operand0=0.0,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=r,
        ),
        [In(x, "float32")],
        [Out(x.shape, "float32"), Out((2, 1), "float32")],
    )
    assert np.isnan(res).all()


def test_an_idle_vector_accumulator_instruction_leaves_the_registers_undefined():
    x = np.ones((2, 3), dtype=np.float32)
    pred = np.ones((2, 3), dtype=np.uint8)

    def body(t, pr, d, r):
        nisa.tensor_scalar_reduce(
            dst=d, data=t, op0=nl.add, operand0=0.0, reduce_op=nl.add
        )  # regs = 3
        nisa.select_reduce(dst=d, predicate=pr, on_true=t, on_false=0.0)  # idle: state may change
        nisa.tensor_scalar_reduce(
            dst=d,
            data=t,
            op0=nl.add,
            operand0=0.0,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=r,
        )

    _, res = launch(
        body,
        [In(x, "float32"), In(pred, "uint8")],
        [Out(x.shape, "float32"), Out((2, 1), "float32")],
    )
    assert np.isnan(res).all()


def test_tensor_scalar_reduce_limits():
    E = {"op": "nisa.tensor_scalar_reduce"}

    def call(**kw):
        args = {
            "dst": T((4, 8)),
            "data": T((4, 8)),
            "op0": nl.add,
            "operand0": 1.0,
            "reduce_op": nl.add,
        }
        args.update(kw)
        return lambda: nisa.tensor_scalar_reduce(**make(args))

    expect_error(call(reverse0=True), arg="reverse0", rule="not supported", **E)
    expect_error(call(reduce_init=1.0), arg="reduce_init", rule="load_reduce", **E)
    expect_error(
        call(reduce_cmd=nisa.reduce_cmd.load_reduce), arg="reduce_init", rule="load_reduce", **E
    )
    expect_error(call(reduce_cmd=nisa.reduce_cmd.idle), arg="reduce_cmd", **E)
    expect_error(call(reduce_cmd=nisa.reduce_cmd.reset), arg="reduce_cmd", **E)
    expect_error(call(reduce_cmd=3), arg="reduce_cmd", rule="nisa.reduce_cmd member", **E)
    expect_error(call(reduce_op=nl.subtract), arg="reduce_op", **E)
    expect_error(call(reduce_op=nl.bitwise_or), arg="reduce_op", **E)
    expect_error(call(op0=nl.bitwise_and, operand0=1), arg="op0", rule="arithmetic", **E)
    expect_error(call(op0=nl.power), arg="op0", rule="nl.power", **E)
    expect_error(call(op0=nl.abs, operand0=2.0), arg="operand0", rule="None or 0", **E)
    expect_error(call(operand0=T((4, 1), "bfloat16")), arg="operand0 dtype", **E)
    expect_error(
        call(reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=T((4, 1), "float16")),
        arg="reduce_init dtype",
        **E,
    )
    expect_error(call(reduce_res=T((4, 2))), arg="reduce_res shape", limit=(4, 1), **E)
    expect_error(call(dst=T((4, 7))), arg="dst elements per partition", **E)


# -- tensor_scalar_cumulative --------------------------------------------------------------------------


def _cumulative_ref(x, op0, v0, op1, start):
    t = f32(binary(op0, f32(x), v0))
    out = np.empty_like(t)
    reg = start
    for i in range(t.shape[1]):
        reg = f32(binary(op1, t[:, i : i + 1], reg))  # reg = op1(t[i], reg), fp32 each step
        out[:, i : i + 1] = reg
    return out


@SETTINGS
@given(
    p=st.integers(1, 128),
    f=st.integers(1, 80),
    op0=st.sampled_from(["add", "multiply", "maximum"]),
    op1=st.sampled_from(["add", "subtract", "multiply", "max", "min"]),
    cmd=st.sampled_from(["reset_reduce", "load_reduce"]),
    column=st.booleans(),
    dtype=st.sampled_from(["float32", "bfloat16", "float16", "int16"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_scalar_cumulative(p, f, op0, op1, cmd, column, dtype, seed):
    rng = np.random.default_rng(seed)
    lo, hi = (0.9, 1.1) if op1 == "multiply" else (-3.0, 3.0)
    x = stored(rng.uniform(lo, hi, (p, f)), dtype)
    imm0 = stored(rng.uniform(0.9, 1.1, (p, 1)), "float32")
    ins = [In(x, dtype)] + ([In(imm0, "float32")] if column else [])

    def body(t, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        nisa.tensor_scalar_cumulative(
            dst=rest[-1],
            src=t,
            op0=getattr(nl, op0),
            op1=getattr(nl, op1),
            imm0=rest[0] if column else 1.0,
            imm1=0.5 if cmd == "load_reduce" else None,
            reduce_cmd=getattr(nisa.reduce_cmd, cmd),
        )

    (out,) = launch(body, ins, [Out((p, f), "float32")])
    name = {"max": "maximum", "min": "minimum"}.get(op1, op1)
    start = (
        0.5
        if cmd == "load_reduce"
        else {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}[
            name
        ]
    )
    want = _cumulative_ref(x, op0, as64(imm0) if column else 1.0, name, np.full((p, 1), start))
    assert_close(out, want, 0.0, f"{op0}/{op1}/{cmd}")


def test_tensor_scalar_cumulative_chains_through_the_accumulator():
    x = np.ones((2, 4), dtype=np.float32)

    def body(t, a, b):
        nisa.tensor_scalar_cumulative(
            dst=a,
            src=t,
            op0=nl.add,
            op1=nl.add,
            imm0=0.0,
            imm1=1.0,
            reduce_cmd=nisa.reduce_cmd.load_reduce,
        )
        nisa.tensor_scalar_cumulative(
            dst=b, src=t, op0=nl.add, op1=nl.add, imm0=0.0, reduce_cmd=nisa.reduce_cmd.reduce
        )

    a, b = launch(body, [In(x, "float32")], [Out(x.shape, "float32")] * 2)
    np.testing.assert_array_equal(a, [[2, 3, 4, 5]] * 2)
    np.testing.assert_array_equal(b, [[6, 7, 8, 9]] * 2)


def test_tensor_scalar_cumulative_limits():
    E = {"op": "nisa.tensor_scalar_cumulative"}

    def call(**kw):
        args = {"dst": T((4, 8)), "src": T((4, 8)), "op0": nl.add, "op1": nl.add, "imm0": 0.0}
        args.update(kw)
        return lambda: nisa.tensor_scalar_cumulative(**make(args))

    expect_error(call(src=T((4, 8), "int32")), arg="src dtype", rule="no 32-bit integers", **E)
    expect_error(call(dst=T((4, 8), "uint32")), arg="dst dtype", **E)
    expect_error(call(op1=nl.logical_or), arg="op1", **E)
    expect_error(call(op0=nl.bitwise_and), arg="op0", **E)
    expect_error(call(reduce_cmd=nisa.reduce_cmd.load_reduce), arg="imm1", rule="load_reduce", **E)
    expect_error(call(reduce_cmd=nisa.reduce_cmd.idle), arg="reduce_cmd", **E)
    expect_error(call(imm0=T((4, 1), "bfloat16")), arg="imm0 dtype", limit="float32", **E)
    expect_error(call(dst=T((4, 9))), arg="dst elements per partition", **E)


# -- reciprocal, bn_stats / bn_aggr, tensor_tensor_scan, tensor_copy_predicated ---------------------------


@SETTINGS
@given(
    shape=tile_shapes(),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
    psum=st.tuples(st.booleans(), st.booleans()),
    vws=st.tuples(views, views),
    seed=st.integers(0, 2**16),
)
def test_reciprocal(shape, dts, psum, vws, seed):
    rng = np.random.default_rng(seed)
    x = stored(rng.uniform(0.5, 4.0, shape) * rng.choice([-1, 1], shape), dts[0])
    (out,) = launch(
        lambda t, d: nisa.reciprocal(dst=d, data=t),
        [In(x, dts[0], "psum" if psum[0] else "sbuf", vws[0])],
        [Out(shape, dts[1], "psum" if psum[1] else "sbuf", vws[1])],
    )
    exact(out, 1.0 / f32(x), dts[1])  # IEEE fp32 division is correctly rounded


def test_reciprocal_limits():
    expect_error(
        lambda: nisa.reciprocal(dst=tile((4, 8)), data=tile((4, 9))),
        op="nisa.reciprocal",
        arg="dst elements per partition",
        limit=9,
        value=8,
    )
    expect_error(
        lambda: nisa.reciprocal(dst=tile((3, 8)), data=tile((4, 8))),
        op="nisa.reciprocal",
        arg="dst partition dimension",
    )


@SETTINGS
@given(
    p=st.integers(1, 128),
    chunks=st.lists(st.integers(1, 512), min_size=1, max_size=3),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_bn_stats_and_bn_aggr_give_mean_and_population_variance(p, chunks, dtype, seed):
    rng = np.random.default_rng(seed)
    x = stored(rng.normal(1.0, 2.0, (p, sum(chunks))), dtype)

    def body(t, stats, mv):
        at = 0
        for i, n in enumerate(chunks):
            nisa.bn_stats(dst=stats[:, 6 * i : 6 * i + 6], data=t[:, at : at + n])
            at += n
        nisa.bn_aggr(dst=mv, data=stats)

    stats, mv = launch(
        body, [In(x, dtype)], [Out((p, 6 * len(chunks)), "float32"), Out((p, 2), "float32")]
    )
    x64 = as64(x)
    first = x64[:, : chunks[0]]
    ev, od = first[:, 0::2], first[:, 1::2]
    # fp32 statistics over n <= 512 elements: n fp32 roundings relative to sum|x| and sum x^2.
    n0 = chunks[0]
    want = [ev.shape[1] + 0 * ev[:, 0], ev.mean(1), ev.var(1) * ev.shape[1]]
    if od.shape[1]:
        want += [od.shape[1] + 0 * od[:, 0], od.mean(1), od.var(1) * od.shape[1]]
        got_cols = range(6)
    else:
        got_cols = range(3)
    mag = [0 * ev[:, 0], np.abs(first).mean(1), (first**2).sum(1)] * 2
    for c in got_cols:
        assert_close(stats[:, c], want[c], 4 * n0 * F32 * mag[c] + 1e-30, f"bn_stats column {c}")
    n = x.shape[1]
    assert_close(mv[:, 0], x64.mean(1), 4 * n * F32 * np.abs(x64).mean(1) + 1e-30, "mean")
    assert_close(mv[:, 1], x64.var(1), 8 * n * F32 * (x64**2).mean(1) + 1e-30, "variance")


def test_bn_stats_limits():
    expect_error(
        lambda: nisa.bn_stats(dst=tile((4, 6)), data=tile((4, 513))),
        op="nisa.bn_stats",
        arg="data free size",
        rule="512",
        limit=512,
        value=513,
    )
    expect_error(
        lambda: nisa.bn_stats(dst=tile((4, 5)), data=tile((4, 8))),
        op="nisa.bn_stats",
        arg="dst elements per partition",
        limit=6,
        value=5,
    )
    expect_error(
        lambda: nisa.bn_stats(dst=tile((3, 6)), data=tile((4, 8))),
        op="nisa.bn_stats",
        arg="dst partition dimension",
    )
    expect_error(
        lambda: nisa.bn_aggr(dst=tile((4, 2)), data=tile((4, 7))),
        op="nisa.bn_aggr",
        arg="data elements per partition",
        rule="multiple of 3",
    )
    expect_error(
        lambda: nisa.bn_aggr(dst=tile((4, 3)), data=tile((4, 6))),
        op="nisa.bn_aggr",
        arg="dst elements per partition",
        limit=2,
        value=3,
    )


SCAN_OPS = ["add", "subtract", "multiply", "maximum", "minimum"]


@SETTINGS
@given(
    p=st.integers(1, 128),
    f=st.integers(1, 70),
    ops=st.tuples(st.sampled_from(SCAN_OPS), st.sampled_from(SCAN_OPS)),
    rev=st.tuples(st.booleans(), st.booleans()),
    initial=st.sampled_from([None, "float32", "bfloat16"]),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
    psum=st.sampled_from([None, 0, 1]),
    seed=st.integers(0, 2**16),
)
def test_tensor_tensor_scan(p, f, ops, rev, initial, dts, psum, seed):
    rng = np.random.default_rng(seed)
    a = stored(rng.uniform(0.8, 1.2, (p, f)), dts[0])
    b = stored(rng.uniform(-1.0, 1.0, (p, f)), dts[1])
    init = stored(rng.uniform(-1, 1, (p, 1)), initial or "float32")
    ins = [
        In(a, dts[0], "psum" if psum == 0 else "sbuf"),
        In(b, dts[1], "psum" if psum == 1 else "sbuf"),
    ]
    ins += [In(init, initial)] if initial else []

    def body(x, y, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        nisa.tensor_tensor_scan(
            dst=rest[-1],
            data0=x,
            data1=y,
            initial=rest[0] if initial else 0.25,
            op0=getattr(nl, ops[0]),
            op1=getattr(nl, ops[1]),
            reverse0=rev[0],
            reverse1=rev[1],
        )

    (out,) = launch(body, ins, [Out((p, f), "float32")])
    prev = as64(init) if initial else np.full((p, 1), 0.25)
    want = np.empty((p, f))
    for i in range(f):  # fp32 after each op, as the engine
        t = f32(binary(ops[0], f32(a[:, i : i + 1]), prev, rev[0]))
        prev = f32(binary(ops[1], t, f32(b[:, i : i + 1]), rev[1]))
        want[:, i : i + 1] = prev
    assert_close(out, want, 0.0)


def test_tensor_tensor_scan_limits():
    E = {"op": "nisa.tensor_tensor_scan"}

    def call(**kw):
        args = {
            "dst": T((4, 8)),
            "data0": T((4, 8)),
            "data1": T((4, 8)),
            "initial": 0.0,
            "op0": nl.multiply,
            "op1": nl.add,
        }
        args.update(kw)
        return lambda: nisa.tensor_tensor_scan(**make(args))

    expect_error(
        call(data0=T((4, 8), buffer="psum"), data1=T((4, 8), buffer="psum")),
        arg="data0 and data1",
        rule="PSUM",
        **E,
    )
    expect_error(call(initial=T((4, 2))), arg="initial shape", **E)
    expect_error(call(op1=nl.bitwise_and), arg="op1", **E)
    expect_error(call(data1=T((4, 9))), arg="data1 elements per partition", **E)


@SETTINGS
@given(
    shape=tile_shapes(),
    dtype=st.sampled_from(FLOATS + ("int32", "uint8")),
    pdtype=st.sampled_from(["uint8", "uint16", "uint32"]),
    scalar_src=st.booleans(),
    reverse=st.booleans(),
    psum=st.sampled_from([None, "src", "predicate", "dst"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_copy_predicated(shape, dtype, pdtype, scalar_src, reverse, psum, seed):
    rng = np.random.default_rng(seed)
    src = random_values(rng, shape, dtype)
    old = random_values(rng, shape, dtype)
    pred = (rng.integers(0, 2, shape) * rng.integers(1, 200, shape)).astype(np_dtype(pdtype))
    ins = [In(pred, pdtype, "psum" if psum == "predicate" else "sbuf")]
    ins += [] if scalar_src else [In(src, dtype, "psum" if psum == "src" else "sbuf")]

    def body(pr, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        nisa.tensor_copy_predicated(
            dst=rest[-1], src=2.5 if scalar_src else rest[0], predicate=pr, reverse_pred=reverse
        )

    (out,) = launch(body, ins, [Out(shape, dtype, "psum" if psum == "dst" else "sbuf", init=old)])
    mask = (pred != 0) ^ reverse
    values = round_to(np.full(shape, 2.5), dtype) if scalar_src else as64(src)
    assert_close(out, np.where(mask, values, as64(old)), 0.0)


def test_tensor_copy_predicated_limits():
    E = {"op": "nisa.tensor_copy_predicated"}
    expect_error(
        lambda: nisa.tensor_copy_predicated(
            dst=tile((4, 8)), src=tile((4, 8)), predicate=tile((4, 8))
        ),
        arg="predicate dtype",
        **E,
    )
    expect_error(
        lambda: nisa.tensor_copy_predicated(
            dst=tile((4, 8)), src=tile((4, 8)), predicate=tile((4, 8), "int8")
        ),
        arg="predicate dtype",
        **E,
    )
    expect_error(
        lambda: nisa.tensor_copy_predicated(
            dst=tile((4, 8)), src=tile((4, 8), "bfloat16"), predicate=tile((4, 8), "uint8")
        ),
        arg="src dtype",
        limit="float32",
        **E,
    )
    expect_error(
        lambda: nisa.tensor_copy_predicated(
            dst=tile((4, 8)),
            src=tile((4, 8), buffer="psum"),
            predicate=tile((4, 8), "uint8", "psum"),
        ),
        arg="src and predicate",
        rule="PSUM",
        **E,
    )
    expect_error(
        lambda: nisa.tensor_copy_predicated(
            dst=tile((4, 8)), src=tile((4, 8)), predicate=tile((4, 7), "uint8")
        ),
        arg="dst elements per partition",
        **E,
    )


# -- exponential (v4), range_select (v3+), select_reduce, max8 -----------------------------------------------


@SETTINGS
@given(
    shape=tile_shapes(max_free=256, max_dims=3),
    column=st.booleans(),
    cmd=st.sampled_from(["idle", "reset_reduce", "load_reduce"]),
    dts=st.tuples(
        st.sampled_from(["float32", "bfloat16", "float16", "int8"]),
        st.sampled_from(["float32", "bfloat16", "float16"]),
    ),
    seed=st.integers(0, 2**16),
)
def test_exponential(shape, column, cmd, dts, seed):
    rng = np.random.default_rng(seed)
    p = shape[0]
    x = random_values(rng, shape, dts[0])  # ints in [-20, 20]: exp may overflow fp16 (to inf)
    m = stored(rng.uniform(-1, 1, (p, 1)), "float32")
    ins = [In(x, dts[0])] + ([In(m, "float32")] if column else [])

    def body(t, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        nisa.exponential(
            dst=rest[-2],
            src=t,
            max_value=rest[0] if column else 0.5,
            reduce_res=rest[-1],
            reduce_cmd=getattr(nisa.reduce_cmd, cmd),
            reduce_init=3.0 if cmd == "load_reduce" else 0.0,
        )

    out, res = launch(body, ins, [Out(shape, dts[1]), Out((p, 1), "float32")], target="trn3")
    mv = as64(m).reshape(p, *[1] * (len(shape) - 1)) if column else 0.5
    want = np.exp(f32(f32(x) - mv))
    # The engine's fp32 exp may be a couple of ulps off, plus the dst rounding.
    assert_close(out, round_to(want, dts[1]), rounded_bound(want, dts[1], 4))
    flat = want.reshape(p, -1)
    if cmd == "idle":
        assert np.isnan(res).all()  # no accumulation: the read-out register is undefined
    else:
        s = flat.sum(1, keepdims=True) + (3.0 if cmd == "load_reduce" else 0.0)
        assert_close(
            res, s, (flat.shape[1] + 4) * F32 * np.abs(flat).sum(1, keepdims=True) + 3.0 * F32
        )


def test_exponential_reduce_continues_an_accumulation():
    x = np.zeros((2, 5), dtype=np.float32)

    def body(t, d, r):
        nisa.exponential(dst=d, src=t, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(
            dst=d, src=t, max_value=-1.0, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=r
        )

    _, res = launch(
        body, [In(x, "float32")], [Out(x.shape, "float32"), Out((2, 1), "float32")], target="trn3"
    )
    assert_close(res, np.full((2, 1), 5 + 5 * np.e), 8 * F32 * 20)


def test_exponential_limits():
    E = {"op": "nisa.exponential", "target": "trn3"}

    def call(**kw):
        args = {"dst": T((4, 8)), "src": T((4, 8))}
        args.update(kw)
        return lambda: nisa.exponential(**make(args))

    expect_error(
        call(), op="nisa.exponential", arg="target", rule="NeuronCore-v4", limit=4, target="trn2"
    )
    expect_error(call(reduce_cmd=nisa.reduce_cmd.reduce, reduce_init=1.0), arg="reduce_init", **E)
    expect_error(call(reduce_cmd=nisa.reduce_cmd.reset), arg="reduce_cmd", **E)
    expect_error(call(dst=T((4, 8), "uint32")), arg="dst dtype", **E)
    expect_error(call(src=T((4, 8), "tfloat32")), arg="src dtype", **E)
    expect_error(call(max_value=T((4, 1), "bfloat16")), arg="max_value dtype", **E)
    expect_error(call(reduce_res=T((4, 1), "int32")), arg="reduce_res dtype", **E)
    expect_error(call(reduce_res=T((4, 3))), arg="reduce_res shape", **E)
    expect_error(call(dst=T((4, 2, 2, 1, 2)), src=T((4, 2, 2, 1, 2))), arg="src rank", limit=4, **E)
    expect_error(call(dst=T((4, 9))), arg="dst elements per partition", **E)


FP32_MIN = float(np.finfo(np.float32).min)
CMP = ["equal", "less", "less_equal", "greater", "greater_equal"]


@SETTINGS
@given(
    p=st.integers(1, 128),
    f=st.integers(1, 300),
    ops=st.tuples(st.sampled_from(CMP), st.sampled_from(CMP)),
    start=st.integers(-50, 50),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
    psum=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_range_select(p, f, ops, start, dts, psum, seed):
    rng = np.random.default_rng(seed)
    x = random_values(rng, (p, f), dts[0])
    b0 = stored(rng.integers(-60, 200, (p, 1)), "float32")
    b1 = stored(rng.integers(-60, 300, (p, 1)), "float32")

    def body(t, lo, hi, d, r):
        nisa.range_select(
            dst=d,
            on_true_tile=t,
            comp_op0=getattr(nl, ops[0]),
            comp_op1=getattr(nl, ops[1]),
            bound0=lo,
            bound1=hi,
            reduce_res=r,
            range_start=start,
            on_false_value=FP32_MIN,
        )

    out, res = launch(
        body,
        [In(x, dts[0], "psum" if psum else "sbuf"), In(b0, "float32"), In(b1, "float32")],
        [Out((p, f), dts[1]), Out((p, 1), "float32")],
    )
    idx = start + np.arange(f, dtype=np.float64)[None, :]
    mask = (REF[ops[0]](idx, as64(b0)) != 0) & (REF[ops[1]](idx, as64(b1)) != 0)
    sel = np.where(mask, as64(x), FP32_MIN)
    exact(out, sel, dts[1])  # FP32_MIN rounds to -inf in bf16/fp16 (documented)
    assert_close(
        res, sel.max(axis=1, keepdims=True), 0.0
    )  # the max stays fp32 (FP32_MIN, not -inf)


def test_range_select_chains_the_max_across_calls():
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    lo, hi = np.zeros((1, 1), np.float32), np.full((1, 1), 4.0, np.float32)

    def body(t, b0, b1, d, r):
        nisa.range_select(
            dst=d, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1
        )
        nisa.range_select(
            dst=d,
            on_true_tile=t,
            comp_op0=nl.greater_equal,
            comp_op1=nl.less,
            bound0=b0,
            bound1=b1,
            range_start=2,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=r,
        )

    d, r = launch(
        body,
        [In(x, "float32"), In(lo, "float32"), In(hi, "float32")],
        [Out((1, 8), "float32"), Out((1, 1), "float32")],
    )
    np.testing.assert_array_equal(
        d, [[0, 1, FP32_MIN, FP32_MIN, FP32_MIN, FP32_MIN, FP32_MIN, FP32_MIN]]
    )
    assert r[0, 0] == 3.0  # max(3 from the first call, 1 from the second)


def test_range_select_limits():
    E = {"op": "nisa.range_select"}

    def call(**kw):
        args = {
            "dst": T((4, 8)),
            "on_true_tile": T((4, 8)),
            "comp_op0": nl.greater_equal,
            "comp_op1": nl.less,
            "bound0": T((4, 1)),
            "bound1": T((4, 1)),
        }
        args.update(kw)
        return lambda: nisa.range_select(**make(args))

    expect_error(
        call(), arg="target", rule="NeuronCore-v3", limit=3, target="trn1", op="nisa.range_select"
    )
    expect_error(call(on_false_value=0.0), arg="on_false_value", rule="FP32_MIN", **E)
    expect_error(call(on_false_value=float("-inf")), arg="on_false_value", **E)
    expect_error(call(comp_op0=nl.not_equal), arg="comp_op0", **E)
    expect_error(call(comp_op1=nl.add), arg="comp_op1", **E)
    expect_error(call(reduce_op=nl.add), arg="reduce_op", **E)
    expect_error(call(reduce_cmd=nisa.reduce_cmd.load_reduce), arg="reduce_cmd", **E)
    expect_error(call(bound0=1.0), arg="bound0", rule="(4, 1) tile", **E)
    expect_error(call(bound1=T((4, 1), "bfloat16")), arg="bound1 dtype", **E)
    expect_error(call(on_true_tile=T((4, 8), "int32")), arg="on_true_tile dtype", **E)
    expect_error(call(range_start=2**24), arg="range_start", rule="2^24", **E)
    expect_error(call(range_start=1.0), arg="range_start", **E)
    expect_error(call(reduce_res=T((4, 2))), arg="reduce_res shape", **E)
    expect_error(call(dst=T((4, 7))), arg="dst elements per partition", **E)


@SETTINGS
@given(
    shape=tile_shapes(),
    pdtype=st.sampled_from(["int8", "uint8", "int16", "uint16"]),
    column=st.booleans(),
    reverse=st.booleans(),
    cmd=st.sampled_from(["reset_reduce", "idle"]),
    dts=st.tuples(st.sampled_from(FLOATS + ("int8",)), st.sampled_from(FLOATS)),
    psum=st.sampled_from([None, "on_true", "predicate"]),
    seed=st.integers(0, 2**16),
)
def test_select_reduce(shape, pdtype, column, reverse, cmd, dts, psum, seed):
    rng = np.random.default_rng(seed)
    p = shape[0]
    x = random_values(rng, shape, dts[0])
    pred = random_values(rng, shape, pdtype) * rng.integers(0, 2, shape).astype(np_dtype(pdtype))
    off = stored(rng.uniform(-5, 5, (p, 1)), "float32")
    ins = [
        In(pred, pdtype, "psum" if psum == "predicate" else "sbuf"),
        In(x, dts[0], "psum" if psum == "on_true" else "sbuf"),
    ] + ([In(off, "float32")] if column else [])

    def body(pr, t, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        nisa.select_reduce(
            dst=rest[-2],
            predicate=pr,
            on_true=t,
            on_false=rest[0] if column else -1.5,
            reduce_res=rest[-1],
            reduce_cmd=getattr(nisa.reduce_cmd, cmd),
            reverse_pred=reverse,
        )

    out, res = launch(body, ins, [Out(shape, dts[1]), Out((p, 1), "float32")])
    mask = (pred != 0) ^ reverse
    ov = as64(off).reshape(p, *[1] * (len(shape) - 1)) if column else -1.5
    sel = np.where(mask, as64(x), ov)
    exact(out, sel, dts[1])
    if cmd == "idle":
        assert np.isnan(res).all()
    else:
        assert_close(res, sel.reshape(p, -1).max(1, keepdims=True), 0.0)


def test_select_reduce_limits():
    E = {"op": "nisa.select_reduce"}

    def call(**kw):
        args = {
            "dst": T((4, 8)),
            "predicate": T((4, 8), "uint8"),
            "on_true": T((4, 8)),
            "on_false": 0.0,
        }
        args.update(kw)
        return lambda: nisa.select_reduce(**make(args))

    expect_error(call(predicate=T((4, 8))), arg="predicate dtype", **E)
    expect_error(call(predicate=T((4, 8), "uint32")), arg="predicate dtype", **E)
    expect_error(call(on_true=T((4, 8), "int32")), arg="on_true dtype", **E)
    expect_error(
        call(on_true=T((4, 8), buffer="psum"), predicate=T((4, 8), "uint8", "psum")),
        arg="on_true and predicate",
        rule="PSUM",
        **E,
    )
    expect_error(call(reduce_op=nl.add), arg="reduce_op", **E)
    expect_error(call(reduce_cmd=nisa.reduce_cmd.load_reduce), arg="reduce_cmd", **E)
    expect_error(call(reduce_res=T((4, 1), "int32")), arg="reduce_res dtype", **E)
    expect_error(call(reduce_res=T((4, 2))), arg="reduce_res shape", **E)
    expect_error(call(on_false=T((4, 2))), arg="on_false shape", **E)
    expect_error(call(predicate=T((4, 7), "uint8")), arg="predicate elements per partition", **E)


@SETTINGS
@given(
    p=st.integers(1, 128),
    free=st.sampled_from([(8,), (9,), (3, 5), (21, 3), (16384,), (130, 7)]),
    dts=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
    seed=st.integers(0, 2**16),
)
def test_max8(p, free, dts, seed):
    rng = np.random.default_rng(seed)
    if int(np.prod(free)) > 2000:
        p = min(p, 4)
    x = random_values(rng, (p, *free), dts[0], -100, 100)
    (out,) = launch(lambda s, d: nisa.max8(dst=d, src=s), [In(x, dts[0])], [Out((p, 8), dts[1])])
    want = -np.sort(-as64(x).reshape(p, -1), axis=1)[:, :8]
    exact(out, want, dts[1])


def test_max8_limits():
    E = {"op": "nisa.max8"}
    expect_error(
        lambda: nisa.max8(dst=tile((4, 8)), src=tile((4, 7))),
        arg="src elements per partition",
        limit=(8, 16384),
        value=7,
        **E,
    )
    expect_error(
        lambda: nisa.max8(dst=tile((1, 8)), src=tile((1, 16385), "bfloat16")),
        arg="src elements per partition",
        value=16385,
        **E,
    )
    expect_error(lambda: nisa.max8(dst=tile((4, 4)), src=tile((4, 16))), arg="dst shape", **E)
    expect_error(lambda: nisa.max8(dst=tile((4, 2, 4)), src=tile((4, 16))), arg="dst shape", **E)
    expect_error(
        lambda: nisa.max8(dst=tile((4, 8)), src=tile((4, 2, 2, 2, 2))), arg="src rank", limit=3, **E
    )
    expect_error(
        lambda: nisa.max8(dst=tile((3, 8)), src=tile((4, 16))), arg="dst partition dimension", **E
    )


def test_operand_column_obeys_the_start_partition_rule_on_trn1():
    """A (P, 1) operand tile is an engine operand too: on trn1 a 64-partition column must
    start at partition 0 or 64 (trainium_inferentia2_arch.rst, "Data streaming")."""
    import pytest

    from neuron_kernels.backend import nisa, nl
    from neuron_kernels.interpreter import NkiValidationError, run

    def kernel(x):
        col = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=col, value=1.0)
        t = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=col[32:96])
        return x

    import numpy as np

    with pytest.raises(NkiValidationError) as err:
        run(kernel, (np.zeros((1, 1), np.float32),), target="trn1")
    assert err.value.arg == "operand0 start partition" and err.value.value == 32
