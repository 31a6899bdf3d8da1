"""The ``nl`` operator objects against the docs' operator and activation tables.

Source: aws-neuron/aws-neuron-sdk nki/api/nki.api.shared.rst (tbl-aluop: class and "Legal
Reduction op"; tbl-act-func: functions and valid input ranges), release-notes 0.4.0
(abs_max/abs_min trn3 only; square/relu as tensor_scalar op0 on trn3).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from neuron_kernels.interpreter import NotImplementedByInterpreter, nki
from neuron_kernels.interpreter.operators import OPERATORS, REDUCTION_ALIASES

nl = nki.language

# tbl-aluop, transcribed: name -> (class, legal reduction)
ALU = {
    "invert": ("bitvec_unary", False),
    "bitwise_and": ("bitvec", True),
    "bitwise_or": ("bitvec", True),
    "bitwise_xor": ("bitvec", True),
    "left_shift": ("bitvec", False),
    "right_shift": ("bitvec", False),
    "add": ("arith", True),
    "subtract": ("arith", True),
    "multiply": ("arith", True),
    "maximum": ("arith", True),
    "minimum": ("arith", True),
    "equal": ("arith", False),
    "not_equal": ("arith", False),
    "greater_equal": ("arith", False),
    "greater": ("arith", False),
    "less_equal": ("arith", False),
    "less": ("arith", False),
    "logical_and": ("arith", True),
    "logical_or": ("arith", True),
    "logical_xor": ("arith", True),
    "power": ("arith", False),
    "abs_max": ("arith", False),
    "abs_min": ("arith", False),
    "abs": ("arith_unary", False),
    "square": ("arith_unary", False),
    "relu": ("arith_unary", False),
    "rsqrt": ("arith_unary", False),
    "reciprocal": ("arith_unary", False),
}
# tbl-act-func, transcribed.
ACTIVATIONS = {
    "copy",
    "square",
    "sigmoid",
    "relu",
    "prelu",
    "gelu",
    "gelu_dx",
    "gelu_apprx_tanh",
    "gelu_apprx_sigmoid",
    "gelu_apprx_sigmoid_dx",
    "silu",
    "silu_dx",
    "tanh",
    "softplus",
    "mish",
    "erf",
    "erf_dx",
    "exp",
    "log",
    "sin",
    "arctan",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sign",
    "abs",
}


@pytest.mark.parametrize("name", sorted(ALU))
def test_alu_class_and_reduction_legality_match_the_table(name):
    op = getattr(nl, name)
    assert (op.alu, op.reducible) == ALU[name]
    assert op.is_bitvec == ALU[name][0].startswith("bitvec")


def test_only_table_operators_are_alu_operators():
    alu = {n for n, op in OPERATORS.items() if op.alu is not None}
    assert alu == set(ALU)


def test_activation_set_matches_the_table():
    assert {n for n, op in OPERATORS.items() if op.activation} == ACTIVATIONS


def test_generation_gates_of_alu_forms():
    versions = {n: op.alu_min_version for n, op in OPERATORS.items() if op.alu}
    assert {n for n, v in versions.items() if v == 4} == {"abs_max", "abs_min", "square", "relu"}


def test_reduction_aliases_name_maximum_and_minimum():
    assert REDUCTION_ALIASES["max"] is nl.maximum and REDUCTION_ALIASES["min"] is nl.minimum
    assert nl.max is not nl.maximum  # nl.max is the reduction function


def test_valid_input_ranges_match_the_table():
    want = {
        "log": (2.0**-64, 2.0**64),
        "sin": (-math.pi, math.pi),
        "arctan": (-math.pi / 2, math.pi / 2),
        "sqrt": (2.0**-116, 2.0**118),
        "rsqrt": (2.0**-87, 2.0**97),
        "reciprocal": (2.0**-42, 2.0**42),
    }
    got = {n: op.valid_range for n, op in OPERATORS.items() if op.valid_range is not None}
    assert got == want
    assert nl.reciprocal.symmetric_range and not nl.log.symmetric_range


def test_activate_gives_nan_outside_the_range_and_rounds_once_to_fp32():
    x = np.array([-1.0, 0.0, 2.0**-65, 1.0, 2.0**64, 2.0**65], dtype=np.float32)
    y = nl.log.activate(x)
    assert y.dtype == np.float32
    assert np.isnan(y[[0, 1, 2, 5]]).all()
    assert y[3] == 0.0 and y[4] == np.float32(64 * math.log(2))
    r = nl.reciprocal.activate(np.array([-3.0, 2.0**-43, -(2.0**-42), 4.0], dtype=np.float32))
    np.testing.assert_array_equal(r[[0, 2, 3]], np.float32([-1 / 3, -(2.0**42), 0.25]))
    assert np.isnan(r[1])
    # fp32(pi) > pi, yet it is inside sin's [-pi, pi] when the bound is read as an fp32 value.
    assert np.isfinite(nl.sin.activate(np.float32([np.float32(math.pi)]))).all()
    assert np.isnan(
        nl.sin.activate(np.float32([np.nextafter(np.float32(math.pi), np.float32(4))]))
    ).all()


def test_binary_math_semantics():
    a = np.float32([-5.0, 1.0, 2.0, 0.0])
    b = np.float32([3.0, -1.0, 2.5, -0.0])
    np.testing.assert_array_equal(nl.abs_max.fn2(a, b), [-5.0, -1.0, 2.5, -0.0])  # ties -> b
    np.testing.assert_array_equal(nl.abs_min.fn2(a, b), [3.0, -1.0, 2.0, -0.0])
    np.testing.assert_array_equal(nl.greater.fn2(a, b), [0, 1, 0, 0])
    np.testing.assert_array_equal(nl.logical_xor.fn2(a, b), [0, 0, 0, 0])
    np.testing.assert_array_equal(nl.logical_and.fn2(a, np.float32([0, 2, 0, 1])), [0, 1, 0, 0])
    assert nl.greater.fn2(a, b).dtype == np.float32  # comparisons produce 1.0 / 0.0


def test_right_shift_is_logical_and_left_shift_wraps():
    x = np.array([-8, -1, 16], dtype=np.int8)
    np.testing.assert_array_equal(
        nl.right_shift.fn2(x, np.int8(1)), np.array([124, 127, 8], dtype=np.int8)
    )
    np.testing.assert_array_equal(
        nl.left_shift.fn2(np.array([0x41], np.uint8), np.uint8(2)), [0x04]
    )
    np.testing.assert_array_equal(nl.invert.fn1(np.array([0, 5], np.uint16)), [0xFFFF, 0xFFFA])


def test_activation_functions_at_known_points():
    x = np.float32([0.0, 1.0, -1.0])
    np.testing.assert_allclose(
        nl.gelu.activate(x), np.float32([0.0, 0.8413447, -0.15865526]), rtol=2**-23
    )
    np.testing.assert_allclose(
        nl.silu.activate(x), np.float32([0.0, 0.7310586, -0.26894143]), rtol=2**-23
    )
    np.testing.assert_allclose(
        nl.softplus.activate(x), np.float32([math.log(2), 1.3132616, 0.3132617]), rtol=2**-23
    )
    np.testing.assert_array_equal(nl.sign.activate(np.float32([-2, 0, 3])), [-1, 0, 1])
    # Far negative tails keep their relative precision (no 1 + tanh / 1 + erf cancellation).
    assert nl.gelu.activate(np.float32([-8.0]))[0] == np.float32(
        -8.0 * 0.5 * math.erfc(8 / math.sqrt(2))
    )
    assert nl.gelu_apprx_tanh.activate(np.float32([-9.0]))[0] < 0


def test_calling_an_operator_without_a_wrapper_names_it():
    with pytest.raises(NotImplementedByInterpreter, match="nl.bypass"):
        nl.bypass(1, 2)
    with pytest.raises(NotImplementedByInterpreter, match="nl.divide"):
        nl.divide(1, 2)
    assert repr(nl.add) == "nl.add"
