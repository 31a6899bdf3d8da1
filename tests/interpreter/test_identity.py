"""``is`` / ``is not`` in kernels: accepted on trace-time values and against None, refused
on tensors otherwise, with the file's line number (interpreter/identity.py)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


def _copy_scaled(x, scale):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    if scale is not None:
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=scale)
    nisa.dma_copy(dst=out, src=tile)
    return out


def optional_bias(x, bias=None, scale=None):
    """nki-library's idiom: optional tensor and scalar arguments tested with is None."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    if bias is not None:
        b = nl.ndarray(bias.shape, bias.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=bias)
        nisa.tensor_tensor(dst=tile, data1=tile, data2=b, op=nl.add)
    if scale is None:
        scale = 1.0
    nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=scale)
    nisa.dma_copy(dst=out, src=tile)
    return out


X = np.arange(8, dtype=np.float32).reshape(2, 4)


def test_is_none_on_optional_tensor_and_scalar_arguments():
    np.testing.assert_array_equal(run(optional_bias, (X,)).outputs, X)
    np.testing.assert_array_equal(run(optional_bias, (X, X)).outputs, 2 * X)
    np.testing.assert_array_equal(run(optional_bias, (X, X, 0.5)).outputs, X)


def identity_of_constants(x, mode):
    flag = mode is True
    same_dtype = x.dtype is not None and nl.float32 is nl.float32
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    nisa.tensor_scalar(dst=tile, data=tile, op0=nl.add, operand0=float(flag) + float(same_dtype))
    nisa.dma_copy(dst=out, src=tile)
    return out


def test_is_on_trace_time_python_values_follows_python():
    np.testing.assert_array_equal(run(identity_of_constants, (X, True)).outputs, X + 2)
    np.testing.assert_array_equal(run(identity_of_constants, (X, 1)).outputs, X + 1)


def tensor_is_true(x):
    return x if x is True else None


def tensor_is_tensor(x, y):
    return None if x is not y else None


@pytest.mark.parametrize(
    "kernel, args, phrase",
    [
        (tensor_is_true, (X,), "'is' at "),
        (tensor_is_tensor, (X, X + 1), "'is not' at "),
    ],
)
def test_tensor_identity_is_refused_with_the_file_line(kernel, args, phrase):
    with pytest.raises(NkiValidationError) as info:
        run(kernel, args)
    message = str(info.value)
    lines, first = inspect.getsourcelines(kernel)
    line = first + next(i for i, text in enumerate(lines) if " is " in text)
    assert phrase in message and f"{__file__}:{line}" in message, message


def register_is_value(x):
    reg, one = nisa.register_alloc(1), 1
    return x if reg is one else None


def test_register_identity_is_refused():
    with pytest.raises(NkiValidationError, match="register may only be tested against None"):
        run(register_is_value, (X,))


def test_closures_and_nested_bodies_keep_their_cells():
    scale = 3.0

    def closure_kernel(x, bias=None):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)

        def body(i):
            if bias is None:
                nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=scale)

        nl.fori_loop(0, 2, body)
        nisa.dma_copy(dst=out, src=tile)
        return out

    np.testing.assert_array_equal(run(closure_kernel, (X,)).outputs, X * 9)


def test_chained_identity_is_refused():
    def chained(x):
        return x if None is None is None else None

    with pytest.raises(NkiValidationError, match="chain"):
        run(chained, (X,))


def test_jitted_kernel_and_unchanged_helper():
    kernel = nki.jit(_copy_scaled)
    np.testing.assert_array_equal(kernel(X, 2.0), 2 * X)
    np.testing.assert_array_equal(kernel(X, None), X)


@nki.jit
def aliasing_check_kernel(x, y):
    if x is y:  # identity of two tensors: no trace-time meaning, refused
        return None
    return None


def test_tensor_identity_is_still_refused():
    a = np.zeros((2, 2), np.float32)
    with pytest.raises(NkiValidationError, match="'is' at .*test_identity.py:"):
        aliasing_check_kernel(a, a + 1)
