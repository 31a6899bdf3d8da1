"""ALU operators and activation functions: the objects kernels pass as ``op=nl.add`` etc.

Each is one :class:`Operator` carrying every role the docs give it (binary/unary ALU op,
reduction, activation function with its valid input range), its fp32 NumPy math, and,
for the experimental ``nl.*`` wrappers, what calling it does. Sources:
aws-neuron/aws-neuron-sdk: nki/api/nki.api.shared.rst (tbl-aluop, tbl-act-func).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from neuron_kernels.interpreter.errors import not_implemented

__all__ = ["OPERATORS", "REDUCTION_ALIASES", "Operator"]

F32 = np.float32


@dataclass(eq=False)
class Operator:
    """One NKI operator or activation function (``nl.<name>``)."""

    name: str
    alu: str | None = None  # "arith", "bitvec", "arith_unary", "bitvec_unary" or None
    reducible: bool = False
    fn2: Callable | None = None  # binary math (fp32 arrays, or ints for bitvec)
    fn1: Callable | None = None  # unary / activation math on fp32 arrays
    activation: bool = False
    valid_range: tuple[float, float] | None = None  # activation input range (inclusive)
    symmetric_range: bool = False  # range applies to |x| (reciprocal)
    alu_min_version: int = 2  # NeuronCore generation where the ALU form exists
    nl_impl: Callable | None = field(default=None, repr=False)  # nl.<name>(...) wrapper

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, *args, **kwargs):
        if self.nl_impl is None:
            raise not_implemented(f"nl.{self.name}")
        return self.nl_impl(*args, **kwargs)

    @property
    def is_binary_alu(self) -> bool:
        return self.alu in ("arith", "bitvec")

    @property
    def is_unary_alu(self) -> bool:
        return self.alu in ("arith_unary", "bitvec_unary")

    @property
    def is_bitvec(self) -> bool:
        return self.alu in ("bitvec", "bitvec_unary")

    def activate(self, x: np.ndarray) -> np.ndarray:
        """Apply the activation to fp32 inputs, rounding once to fp32; inputs outside the
        valid range give NaN (the hardware's output is invalid there). The bounds are
        compared as fp32 values, so fp32(pi) is inside sin's [-pi, pi]."""
        x = np.asarray(x, dtype=F32)
        with np.errstate(all="ignore"):
            y = np.asarray(self.fn1(x.astype(np.float64)), dtype=F32)
            if self.valid_range is not None:
                lo, hi = (F32(b) for b in self.valid_range)
                mag = np.abs(x) if self.symmetric_range else x
                y = np.where((mag >= lo) & (mag <= hi), y, F32(np.nan))
        return y


def _cmp(f):
    return lambda a, b: f(a, b).astype(F32)


def _logical(f):
    return lambda a, b: f(a != 0, b != 0).astype(F32)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)


_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _erf64(x):
    return _erf(np.asarray(x, dtype=np.float64)).astype(np.float64)


def _phi_cdf(x64):
    """Standard normal CDF via erfc: no cancellation in the negative tail."""
    return 0.5 * _erfc(-x64 / math.sqrt(2.0)).astype(np.float64)


def _gelu(x):
    x64 = x.astype(np.float64)
    return x64 * _phi_cdf(x64)


def _gelu_dx(x):
    x64 = x.astype(np.float64)
    return _phi_cdf(x64) + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2.0 * math.pi)


def _gelu_tanh(x):
    """0.5 x (1 + tanh(u)) written as x * sigmoid(2u), which does not cancel for u << 0."""
    x64 = x.astype(np.float64)
    u = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)
    return x64 / (1.0 + np.exp(-2.0 * u))


def _gelu_sigmoid(x):
    x64 = x.astype(np.float64)
    return x64 / (1.0 + np.exp(-1.702 * x64))


def _gelu_sigmoid_dx(x):
    x64 = x.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-1.702 * x64))
    return s + 1.702 * x64 * s * (1.0 - s)


def _silu(x):
    x64 = x.astype(np.float64)
    return x64 / (1.0 + np.exp(-x64))


def _silu_dx(x):
    x64 = x.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-x64))
    return s * (1.0 + x64 * (1.0 - s))


def _softplus(x):
    return np.logaddexp(0.0, x.astype(np.float64))


def _mish(x):
    return x.astype(np.float64) * np.tanh(_softplus(x))


def _abs_max(a, b):
    return np.where(np.abs(a) > np.abs(b), a, b)


def _abs_min(a, b):
    return np.where(np.abs(a) < np.abs(b), a, b)


def _shift_left(a, b):
    return np.left_shift(a, b)


def _shift_right(a, b):  # logical shift: operate on the unsigned bit pattern
    ua = a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.kind == "i" else a
    return np.right_shift(ua, b.astype(ua.dtype)).view(a.dtype)


_OPS = [
    # Binary arithmetic (fp32 math). Reducible ones per tbl-aluop.
    Operator("add", "arith", True, fn2=np.add),
    Operator("subtract", "arith", True, fn2=np.subtract),
    Operator("multiply", "arith", True, fn2=np.multiply),
    Operator("maximum", "arith", True, fn2=np.maximum),
    Operator("minimum", "arith", True, fn2=np.minimum),
    Operator("equal", "arith", fn2=_cmp(np.equal)),
    Operator("not_equal", "arith", fn2=_cmp(np.not_equal)),
    Operator("greater_equal", "arith", fn2=_cmp(np.greater_equal)),
    Operator("greater", "arith", fn2=_cmp(np.greater)),
    Operator("less_equal", "arith", fn2=_cmp(np.less_equal)),
    Operator("less", "arith", fn2=_cmp(np.less)),
    Operator("logical_and", "arith", True, fn2=_logical(np.logical_and)),
    Operator("logical_or", "arith", True, fn2=_logical(np.logical_or)),
    Operator("logical_xor", "arith", True, fn2=_logical(np.logical_xor)),
    Operator("power", "arith", fn2=np.power),  # GpSimd only
    Operator("abs_max", "arith", fn2=_abs_max, alu_min_version=4),
    Operator("abs_min", "arith", fn2=_abs_min, alu_min_version=4),
    # Bitvec (integer bit patterns).
    Operator("bitwise_and", "bitvec", True, fn2=np.bitwise_and),
    Operator("bitwise_or", "bitvec", True, fn2=np.bitwise_or),
    Operator("bitwise_xor", "bitvec", True, fn2=np.bitwise_xor),
    Operator("left_shift", "bitvec", fn2=_shift_left),
    Operator("right_shift", "bitvec", fn2=_shift_right),
    Operator("invert", "bitvec_unary", fn1=np.invert),
    # Unary ALU ops that are also activation functions.
    Operator("abs", "arith_unary", fn1=np.abs, activation=True),
    Operator("square", "arith_unary", fn1=np.square, activation=True, alu_min_version=4),
    Operator(
        "relu", "arith_unary", fn1=lambda x: np.maximum(x, 0), activation=True, alu_min_version=4
    ),
    Operator(
        "rsqrt",
        "arith_unary",
        fn1=lambda x: 1.0 / np.sqrt(x.astype(np.float64)),
        activation=True,
        valid_range=(2.0**-87, 2.0**97),
    ),
    Operator(
        "reciprocal",
        "arith_unary",
        fn1=lambda x: 1.0 / x.astype(np.float64),
        activation=True,
        valid_range=(2.0**-42, 2.0**42),
        symmetric_range=True,
    ),
    # Activation functions (ScalarE).
    Operator("copy", fn1=lambda x: x, activation=True),
    Operator("sigmoid", fn1=_sigmoid, activation=True),
    Operator("prelu", activation=True),
    Operator("gelu", fn1=_gelu, activation=True),
    Operator("gelu_dx", fn1=_gelu_dx, activation=True),
    Operator("gelu_apprx_tanh", fn1=_gelu_tanh, activation=True),
    Operator("gelu_apprx_sigmoid", fn1=_gelu_sigmoid, activation=True),
    Operator("gelu_apprx_sigmoid_dx", fn1=_gelu_sigmoid_dx, activation=True),
    Operator("silu", fn1=_silu, activation=True),
    Operator("silu_dx", fn1=_silu_dx, activation=True),
    Operator("tanh", fn1=np.tanh, activation=True),
    Operator("softplus", fn1=_softplus, activation=True),
    Operator("mish", fn1=_mish, activation=True),
    Operator("erf", fn1=_erf64, activation=True),
    Operator(
        "erf_dx",
        fn1=lambda x: 2.0 / math.sqrt(math.pi) * np.exp(-(x.astype(np.float64) ** 2)),
        activation=True,
    ),
    Operator("exp", fn1=lambda x: np.exp(x.astype(np.float64)), activation=True),
    Operator(
        "log",
        fn1=lambda x: np.log(x.astype(np.float64)),
        activation=True,
        valid_range=(2.0**-64, 2.0**64),
    ),
    Operator("sin", fn1=np.sin, activation=True, valid_range=(-math.pi, math.pi)),
    Operator("arctan", fn1=np.arctan, activation=True, valid_range=(-math.pi / 2, math.pi / 2)),
    Operator(
        "sqrt",
        fn1=lambda x: np.sqrt(x.astype(np.float64)),
        activation=True,
        valid_range=(2.0**-116, 2.0**118),
    ),
    Operator("sign", fn1=np.sign, activation=True),
    # Neither ALU op nor activation: nl-level functions and special markers.
    Operator("divide"),
    Operator("bypass"),
    Operator("average"),
    Operator("negative"),
    Operator("logical_not"),
    Operator("cos"),
    Operator("tan"),
    Operator("ceil"),
    Operator("floor"),
    Operator("trunc"),
    Operator("fmod"),
    Operator("mod"),
    # Reduction functions (nl.sum, nl.max, ...); nl.max/nl.min also name reduce ops.
    Operator("sum"),
    Operator("max"),
    Operator("min"),
    Operator("mean"),
    Operator("prod"),
    Operator("var"),
    Operator("all"),
]

OPERATORS: dict[str, Operator] = {op.name: op for op in _OPS}

# Docs name nl.max / nl.min as reduce ops in places (tensor_scalar_reduce's reduce_op).
REDUCTION_ALIASES = {"max": OPERATORS["maximum"], "min": OPERATORS["minimum"]}
