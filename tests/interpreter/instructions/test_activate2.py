"""``nisa.activate2`` (interpreter/instructions/activate2.py) against NumPy (semantics from
its docstring in nki/api/nki/isa/__init__.py), and its documented limits.

Tolerance: activate2 computes in fp32 like the NumPy reference built from the same fp32
steps, so ``rtol=1e-6`` covers only the order of transcendental evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa
RNG = np.random.default_rng(6)


def activate2_kernel(x, bias_col, op, op0, op1, reverse0=False, relu_param=0.0, reduce=None):
    p, f = x.shape
    out = nl.ndarray((p, f + 1), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((p, f), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    col = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=col, src=bias_col)
    y = nl.ndarray((p, f), nl.float32, buffer=nl.sbuf)
    red = nl.zeros((p, 1), nl.float32, buffer=nl.sbuf)
    nisa.activate2(
        dst=y,
        op=op,
        data=t,
        imm0=2.0,
        imm1=col,
        op0=op0,
        op1=op1,
        reverse0=reverse0,
        relu_param=relu_param,
        reduce_op=reduce,
        reduce_res=red if reduce is not None else None,
        reduce_cmd=nisa.reduce_cmd.reset_reduce if reduce is not None else nisa.reduce_cmd.idle,
    )
    nisa.dma_copy(dst=out[:, 0:f], src=y)
    nisa.dma_copy(dst=out[:, f : f + 1], src=red)
    return out


X = RNG.standard_normal((16, 12)).astype(np.float32)
COL = RNG.standard_normal((16, 1)).astype(np.float32)


@pytest.mark.parametrize(
    "op, op0, op1, reverse0, relu_param, reduce, want",
    [
        ("exp", "multiply", "add", False, 0.0, None, lambda x: np.exp(x * 2 + COL)),
        ("copy", "subtract", "bypass", True, 0.0, None, lambda x: 2 - x),
        (
            "prelu",
            "multiply",
            "subtract",
            False,
            0.25,
            None,
            lambda x: np.where(x * 2 - COL > 0, x * 2 - COL, 0.25 * (x * 2 - COL)),
        ),
        ("copy", "bypass", "bypass", False, 0.0, "maximum", lambda x: x),
    ],
)
def test_activate2_matches_numpy(op, op0, op1, reverse0, relu_param, reduce, want):
    ops = [getattr(nl, n) for n in (op, op0, op1)]
    red = getattr(nl, reduce) if reduce else None
    got = run(activate2_kernel, (X, COL, *ops, reverse0, relu_param, red), target="trn3").outputs
    ref = want(X.astype(np.float32))
    np.testing.assert_allclose(got[:, :-1], ref, rtol=1e-6, atol=0)
    if reduce:
        np.testing.assert_array_equal(got[:, -1], ref.max(axis=1))
    else:
        np.testing.assert_array_equal(got[:, -1], 0.0)


def test_activate2_limits():
    with pytest.raises(NkiValidationError, match="NeuronCore-v4"):
        run(activate2_kernel, (X, COL, nl.exp, nl.multiply, nl.add), target="trn2")
    with pytest.raises(NkiValidationError, match="op0, op1"):
        run(activate2_kernel, (X, COL, nl.exp, nl.add, nl.add), target="trn3")
    with pytest.raises(NkiValidationError, match="reverse0"):
        run(activate2_kernel, (X, COL, nl.exp, nl.bypass, nl.bypass, True), target="trn3")
