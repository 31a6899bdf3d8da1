"""Scalar Engine: ``nisa.activation`` / ``nisa.activation_reduce`` against float64 references,
the accumulator-register semantics, and every documented limit.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (activation,
activation_reduce), nki/api/nki.api.shared.rst (activation functions, valid input ranges,
"Engine Selection" note on reciprocal bias). The references are torch float64 functions,
an implementation independent of the interpreter's.

Tolerances (fixed before looking at results):
- ``pre = data * scale + bias`` is two fp32 operations; the reference rounds the same way,
  so it is exact.
- the activation itself: the interpreter evaluates the function in float64 and rounds
  once to fp32; another float64 implementation can differ by a few float64 ulps, which may
  flip that fp32 rounding: ``2 * 2**-24 * |y|``, plus one rounding into dst.
- plus ``2**-50 * (1 + |pre|)`` absolute: near a root (silu_dx, gelu_dx) two float64
  evaluations differ by about a float64 ulp of their terms. The references avoid the
  ``1 + erf`` / ``1 + tanh`` forms (torch's gelu and ndtr lose 1e-5 relative in the tail).
- accumulated sums over n elements: fp32 running sum, ``n * 2**-24 * sum|y|``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
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
    present,
    random_values,
    round_to,
    stored,
    tile,
    tile_shapes,
    views,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.interpreter import NotImplementedByInterpreter

SETTINGS = settings(max_examples=30, deadline=None)
F = torch.nn.functional


def _t(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _sig(x):
    return torch.sigmoid(_t(x)).numpy()


def _cdf(x):
    """Standard normal CDF through erfc (accurate in the negative tail)."""
    return 0.5 * torch.special.erfc(-_t(x) / math.sqrt(2)).numpy()


# float64 references (torch) of every activation function in tbl-act-func.
ACT = {
    "copy": lambda x: x,
    "square": np.square,
    "sigmoid": _sig,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: x * _cdf(x),
    "gelu_dx": lambda x: _cdf(x) + x * np.exp(-0.5 * np.square(x)) / math.sqrt(2 * math.pi),
    "gelu_apprx_tanh": lambda x: x * _sig(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)),
    "gelu_apprx_sigmoid": lambda x: x * _sig(1.702 * x),
    "gelu_apprx_sigmoid_dx": lambda x: (
        _sig(1.702 * x) + 1.702 * x * _sig(1.702 * x) * (1 - _sig(1.702 * x))
    ),
    "silu": lambda x: F.silu(_t(x)).numpy(),
    "silu_dx": lambda x: _sig(x) * (1 + x * (1 - _sig(x))),
    "tanh": np.tanh,
    "softplus": lambda x: torch.log1p(torch.exp(-torch.abs(_t(x)))).numpy() + np.maximum(x, 0),
    "mish": lambda x: F.mish(_t(x)).numpy(),
    "erf": lambda x: torch.special.erf(_t(x)).numpy(),
    "erf_dx": lambda x: 2 / math.sqrt(math.pi) * np.exp(-np.square(x)),
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x,
    "sin": np.sin,
    "arctan": np.arctan,
    "sign": np.sign,
    "abs": np.abs,
}
# Valid input ranges (tbl-act-func); outside them the hardware output is invalid (NaN here).
PI32 = float(np.float32(math.pi))
RANGE = {
    "log": (2.0**-64, 2.0**64),
    "sqrt": (2.0**-116, 2.0**118),
    "rsqrt": (2.0**-87, 2.0**97),
    "sin": (-PI32, PI32),
    "arctan": (-float(np.float32(math.pi / 2)), float(np.float32(math.pi / 2))),
}
# Input intervals inside the valid range (before scale and bias).
DOMAIN = {
    "log": (0.05, 8.0),
    "sqrt": (0.05, 8.0),
    "rsqrt": (0.05, 8.0),
    "reciprocal": (0.2, 8.0),
    "sin": (-2.5, 2.5),
    "arctan": (-1.2, 1.2),
}


def reference(op, pre):
    with np.errstate(all="ignore"):
        y = ACT[op](pre)
    if op in RANGE:
        lo, hi = RANGE[op]
        y = np.where((pre >= lo) & (pre <= hi), y, np.nan)
    if op == "reciprocal":
        y = np.where((np.abs(pre) >= 2.0**-42) & (np.abs(pre) <= 2.0**42), y, np.nan)
    return y


@pytest.mark.parametrize("op", sorted(ACT))
@settings(max_examples=8, deadline=None)
@given(
    shape=tile_shapes(max_free=256),
    dts=st.tuples(st.sampled_from(FLOATS + ("int8",)), st.sampled_from(FLOATS)),
    scale=st.sampled_from(["one", "scalar", "column"]),
    bias=st.sampled_from([None, "scalar", "float32", "bfloat16"]),
    target=st.sampled_from(["trn1", "trn2", "trn3"]),
    psum=st.tuples(st.booleans(), st.booleans()),
    vws=st.tuples(views, views),
    seed=st.integers(0, 2**16),
)
def test_activation(shape, op, dts, scale, bias, target, psum, vws, seed):
    rng = np.random.default_rng(seed)
    p = shape[0]
    lo, hi = DOMAIN.get(op, (-3.0, 3.0))
    x = (
        stored(rng.uniform(lo, hi, shape), dts[0])
        if dts[0] != "int8"
        else random_values(rng, shape, "int8")
    )
    if op == "reciprocal":
        x = stored(as64(x) * rng.choice([-1, 1], shape), dts[0])
    if target == "trn1":
        vws = (None, None)  # v2 start-partition rule: keep tiles at partition 0
        if bias == "scalar" or op == "reciprocal":
            bias = None
    s_col = stored(rng.uniform(0.75, 1.25, (p, 1)), "float32")
    b_col = stored(
        rng.uniform(-0.04, 0.04, (p, 1)), bias if bias not in (None, "scalar") else "float32"
    )
    ins = [In(x, dts[0], "psum" if psum[0] else "sbuf", vws[0])]
    ins += [In(s_col, "float32")] if scale == "column" else []
    ins += [In(b_col, bias)] if bias in ("float32", "bfloat16") else []

    def body(t, r0=None, r1=None, r2=None, r3=None, r4=None, r5=None):
        rest = present(r0, r1, r2, r3, r4, r5)
        it = iter(rest[:-1])
        sc = next(it) if scale == "column" else (0.875 if scale == "scalar" else 1.0)
        bi = (
            next(it) if bias in ("float32", "bfloat16") else (0.03125 if bias == "scalar" else None)
        )
        nisa.activation(dst=rest[-1], op=getattr(nl, op), data=t, bias=bi, scale=sc)

    (out,) = launch(
        body, ins, [Out(shape, dts[1], "psum" if psum[1] else "sbuf", vws[1])], target=target
    )
    bshape = (p, *[1] * (len(shape) - 1))
    s = as64(s_col).reshape(bshape) if scale == "column" else (0.875 if scale == "scalar" else 1.0)
    b = (
        as64(b_col).reshape(bshape)
        if bias in ("float32", "bfloat16")
        else (0.03125 if bias == "scalar" else 0.0)
    )
    pre = f32(f32(f32(x) * s) + b)
    want = reference(op, pre)
    assert_close(
        out,
        round_to(want, dts[1]),
        2 * F32 * np.abs(want)
        + HALF_ULP[dts[1]] * np.abs(want)
        + TINY[dts[1]]
        + 2.0**-50 * (1 + np.abs(pre)),
        f"{op} {dts}",
    )


@pytest.mark.parametrize(
    "op, bad",
    [
        ("log", [0.0, -1.0, 2.0**-65, 2.0**65]),
        ("sqrt", [-1.0, 0.0, 2.0**119]),
        ("rsqrt", [0.0, -4.0, 2.0**-88, 2.0**98]),
        ("reciprocal", [0.0, 2.0**-43, -(2.0**43)]),
        ("sin", [3.2, -3.2, 9.0]),
        ("arctan", [1.6, -2.0, 100.0]),
    ],
)
def test_activation_outside_the_valid_input_range_is_nan(op, bad):
    x = np.array([bad + [1.0]], dtype=np.float32)
    (out,) = launch(
        lambda t, d: nisa.activation(dst=d, op=getattr(nl, op), data=t),
        [In(x, "float32")],
        [Out(x.shape, "float32")],
    )
    assert np.isnan(out[0, :-1]).all(), out
    assert np.isfinite(out[0, -1])  # 1.0 is inside every range


def test_activation_range_bounds_are_inclusive_in_fp32():
    x = np.array([[PI32, -PI32, 2.0**-64, 2.0**64]], dtype=np.float32)

    def body(t, d1, d2):
        nisa.activation(dst=d1, op=nl.sin, data=t[:, 0:2])
        nisa.activation(dst=d2, op=nl.log, data=t[:, 2:4])

    s, lg = launch(body, [In(x, "float32")], [Out((1, 2), "float32"), Out((1, 2), "float32")])
    assert np.isfinite(s).all() and np.isfinite(lg).all()


# -- accumulator registers -----------------------------------------------------------------------------


def _sums(x, op="copy", bias=0.0):
    y = reference(op, f32(f32(x) + bias))
    return f32(y).reshape(x.shape[0], -1).sum(axis=1, keepdims=True)


@SETTINGS
@given(
    shape=tile_shapes(max_free=256),
    op=st.sampled_from(["copy", "exp", "square", "tanh"]),
    api=st.sampled_from(["activation", "activation_reduce"]),
    res_dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_activation_reduce_sums_the_activated_values(shape, op, api, res_dtype, seed):
    rng = np.random.default_rng(seed)
    x = stored(rng.uniform(-2, 2, shape), "float32")

    def body(t, d, r):
        if api == "activation":
            nisa.activation(
                dst=d,
                op=getattr(nl, op),
                data=t,
                reduce_op=nl.add,
                reduce_res=r,
                reduce_cmd=nisa.reduce_cmd.reset_reduce,
            )
        else:
            nisa.activation_reduce(
                dst=d, op=getattr(nl, op), data=t, reduce_op=nl.add, reduce_res=r
            )

    _, res = launch(
        body, [In(x, "float32")], [Out(shape, "bfloat16"), Out((shape[0], 1), res_dtype)]
    )
    want = _sums(x, op)
    n = want.size and x[0].size
    y = f32(reference(op, f32(x))).reshape(shape[0], -1)
    bound = (n + 2) * F32 * np.abs(y).sum(axis=1, keepdims=True) + HALF_ULP[res_dtype] * np.abs(
        want
    )
    assert_close(
        res, round_to(want, res_dtype), bound
    )  # the sum is of fp32 values, not the bf16 dst


def test_activation_accumulator_chain_reset_reduce_idle_and_read_out():
    """reset (0) -> reduce -> reduce -> idle read-out -> reset_reduce read-out -> reset read-out."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 4), dtype=np.float32)
    cmd = nisa.reduce_cmd

    def body(x, y, d1, d2, r1, r2, r3, r4):
        act = nisa.activation
        act(dst=d1, op=nl.copy, data=x, reduce_cmd=cmd.reset)  # regs = 0, no reduction
        act(dst=d1, op=nl.copy, data=x, reduce_op=nl.add, reduce_cmd=cmd.reduce)  # + 3, 12
        act(
            dst=d2, op=nl.exp, data=y, reduce_op=nl.add, reduce_cmd=cmd.reduce, reduce_res=r1
        )  # + 4e
        act(dst=d2, op=nl.copy, data=y, reduce_cmd=cmd.idle, reduce_res=r2)  # unchanged
        act(
            dst=d2, op=nl.copy, data=y, reduce_op=nl.add, reduce_cmd=cmd.reset_reduce, reduce_res=r3
        )  # 4
        act(dst=d2, op=nl.copy, data=y, reduce_cmd=cmd.reset, reduce_res=r4)  # 0

    outs = launch(
        body,
        [In(a, "float32"), In(b, "float32")],
        [Out(a.shape, "float32"), Out(b.shape, "float32")] + [Out((2, 1), "float32")] * 4,
    )
    want = np.array([[3.0], [12.0]]) + 4 * float(np.float32(np.exp(1.0)))
    assert_close(outs[2], want, 8 * F32 * want)
    np.testing.assert_array_equal(outs[3], outs[2])
    np.testing.assert_array_equal(outs[4], [[4.0], [4.0]])
    np.testing.assert_array_equal(outs[5], [[0.0], [0.0]])


def test_activation_accumulators_start_undefined_nan():
    x = np.ones((3, 2), dtype=np.float32)
    _, r = launch(
        lambda t, d, res: nisa.activation(
            dst=d,
            op=nl.copy,
            data=t,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=res,
        ),
        [In(x, "float32")],
        [Out(x.shape, "float32"), Out((3, 1), "float32")],
    )
    assert np.isnan(r).all()


def test_activation_reduce_shares_the_scalar_registers_and_not_the_vector_ones():
    x = np.full((2, 5), 2.0, dtype=np.float32)

    def body(t, d, r):
        nisa.activation_reduce(
            dst=d, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=None
        )  # regs = 10
        nisa.tensor_scalar_reduce(
            dst=d, data=t, op0=nl.add, operand0=0.0, reduce_op=nl.add
        )  # VectorE regs
        nisa.activation(
            dst=d,
            op=nl.copy,
            data=t,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=r,
        )

    _, r = launch(body, [In(x, "float32")], [Out(x.shape, "float32"), Out((2, 1), "float32")])
    np.testing.assert_array_equal(r, [[20.0], [20.0]])


def test_activation_reduce_res_may_alias_dst():
    """NKI 0.6 fix: a reduce_res view of dst keeps the reduction result."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    def body(t, d):
        nisa.activation(
            dst=d,
            op=nl.copy,
            data=t,
            reduce_op=nl.add,
            reduce_res=d[:, 0:1],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )

    (out,) = launch(body, [In(x, "float32")], [Out(x.shape, "float32")])
    np.testing.assert_array_equal(out, [[6, 1, 2, 3], [22, 5, 6, 7]])


def test_activation_in_place():
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    (out,) = launch(
        lambda d: nisa.activation(dst=d, op=nl.exp, data=d, scale=2.0),
        [],
        [Out(x.shape, "float32", init=x)],
    )
    want = np.exp(f32(f32(x) * 2.0))
    assert_close(out, want, 2 * F32 * want)


# -- limits ----------------------------------------------------------------------------------------------


def test_activation_limits():
    E = {"op": "nisa.activation"}

    def call(**kw):
        args = {"dst": T((4, 8)), "op": nl.exp, "data": T((4, 8))}
        args.update(kw)
        return lambda: nisa.activation(**make(args))

    expect_error(call(op=nl.add), arg="op", rule="activation function", **E)
    expect_error(call(op=np.exp), arg="op", **E)
    expect_error(
        call(reduce_op=nl.maximum, reduce_cmd=nisa.reduce_cmd.reset_reduce),
        arg="reduce_op",
        rule="nl.add",
        **E,
    )
    expect_error(call(reduce_cmd=nisa.reduce_cmd.load_reduce), arg="reduce_cmd", **E)
    expect_error(
        call(reduce_cmd=nisa.reduce_cmd.reduce), arg="reduce_op", rule="nl.add to reduce", **E
    )
    expect_error(call(reduce_cmd=1), arg="reduce_cmd", rule="member", **E)
    expect_error(call(bias=0.5), target="trn1", arg="bias", rule="NeuronCore-v3", **E)
    expect_error(call(bias=T((4, 1), "tfloat32")), arg="bias dtype", rule="tfloat32", **E)
    expect_error(call(bias=T((4, 2))), arg="bias shape", rule="(4, 1)", **E)
    expect_error(call(bias=T((2, 1))), arg="bias shape", **E)
    expect_error(call(scale=T((4, 1), "bfloat16")), arg="scale dtype", limit="float32", **E)
    expect_error(call(scale=T((4, 3))), arg="scale shape", **E)
    expect_error(call(scale="2"), arg="scale", **E)
    expect_error(
        call(reduce_res=T((4, 2)), reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce),
        arg="reduce_res shape",
        limit=(4, 1),
        **E,
    )
    expect_error(call(dst=T((3, 8))), arg="dst partition dimension", limit=4, value=3, **E)
    expect_error(call(dst=T((4, 9))), arg="dst elements per partition", limit=8, value=9, **E)
    expect_error(
        call(op=nl.reciprocal, bias=T((4, 1))), target="trn1", arg="bias", rule="reciprocal", **E
    )
    expect_error(
        call(data=T((4, 4097), "bfloat16", "psum"), dst=T((4, 4097), "bfloat16")),
        arg="data free size",
        limit=4096,
        **E,
    )
    expect_error(
        lambda: nisa.activation(
            dst=tile((4, 8)), op=nl.exp, data=nl.ndarray((4, 8), nl.float32, buffer=nl.hbm)
        ),
        arg="data",
        rule="must be in SBUF/PSUM",
        **E,
    )


def test_activation_reduce_limits():
    E = {"op": "nisa.activation_reduce"}
    expect_error(
        lambda: nisa.activation_reduce(
            dst=tile((4, 8)), op=nl.exp, data=tile((4, 8)), reduce_op=None, reduce_res=tile((4, 1))
        ),
        arg="reduce_op",
        **E,
    )
    expect_error(
        lambda: nisa.activation_reduce(
            dst=tile((4, 8)),
            op=nl.exp,
            data=tile((4, 8)),
            reduce_op=nl.maximum,
            reduce_res=tile((4, 1)),
        ),
        arg="reduce_op",
        **E,
    )
    expect_error(
        lambda: nisa.activation_reduce(
            dst=tile((4, 8)),
            op=nl.exp,
            data=tile((4, 8)),
            reduce_op=nl.add,
            reduce_res=tile((4, 1)),
            bias=1.0,
        ),
        target="trn1",
        arg="bias",
        **E,
    )


def test_prelu_is_refused_by_activation_for_want_of_a_slope():
    """Stub nki/api/nki/language/__init__.py, prelu: "Used as the ``op`` parameter in
    activation ISA instructions such as nki.isa.activation. The slope for negative inputs is
    controlled by the ``relu_param`` argument"; nki/api/nki/isa/__init__.py: activation and
    activation_reduce take no relu_param (activate2 does, line 1543). The refusal names the
    API and quotes the reason from the table that generates the README."""
    from _compute_helpers import run_body

    from neuron_kernels.interpreter.unimplemented import UNIMPLEMENTED

    calls = {
        "nisa.activation": lambda: nisa.activation(
            dst=tile((2, 2)), op=nl.prelu, data=tile((2, 2))
        ),
        "nisa.activation_reduce": lambda: nisa.activation_reduce(
            dst=tile((2, 2)),
            op=nl.prelu,
            data=tile((2, 2)),
            reduce_op=nl.add,
            reduce_res=tile((2, 1)),
        ),
    }
    for api, call in calls.items():
        with pytest.raises(NotImplementedByInterpreter) as info:
            run_body(call)
        why = UNIMPLEMENTED[f"nki.isa.{api[5:]}(op=nl.prelu)"]
        assert str(info.value).startswith(f"{api}(op=nl.prelu) is not implemented")
        assert why in str(info.value) and "relu_param" in why
