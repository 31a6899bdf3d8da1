"""The experimental ``nki.language`` convenience wrappers, built on the ISA instructions.

In NKI 0.6 these (``nl.load``, ``nl.add``, ``nl.exp``, ``nl.sum``, ...) are "experimental
and may change"; production kernels write ``nisa`` calls. Each wrapper here allocates a
new SBUF (or PSUM) tile and issues the instruction the docs name, so it is checked,
traced and costed like any other. Known limits are kept: no broadcasting between tiles,
no ``divide``, ``nl.matmul`` needs ``transpose_x=True``.
"""

from __future__ import annotations

import numbers

import numpy as np

from neuron_kernels.simulator import dtypes
from neuron_kernels.simulator.context import current
from neuron_kernels.simulator.errors import NkiValidationError, not_implemented
from neuron_kernels.simulator.instructions import dma, gpsimd, scalar, tensor_engine, vector
from neuron_kernels.simulator.memory import allocate
from neuron_kernels.simulator.operators import OPERATORS
from neuron_kernels.simulator.tensor import MemoryRegion, NkiTensor

__all__ = [
    "zeros", "ones", "full", "zeros_like", "empty_like", "shared_identity_matrix", "shared_constant",
    "load", "store", "load_transpose2d", "copy", "matmul", "transpose",
]

SBUF, PSUM = MemoryRegion.sbuf, MemoryRegion.psum


def _new(shape, dtype, buffer=SBUF, name=""):
    return allocate(current(), shape, dtype, buffer, name)


def _fill(t: NkiTensor, value) -> NkiTensor:
    if t.on_chip:
        value = int(value) if dtypes.info(t.dtype).is_integer else float(value)
        vector.memset(dst=t, value=value)
    else:  # HBM: fill through an SBUF row tile and DMA (memset cannot write HBM)
        rows = t.reshape((t.size,)) if t.ndim > 1 else t
        tile = _new((1, t.size), t.dtype, name=f"{t.name}_fill")
        vector.memset(dst=tile, value=int(value) if dtypes.info(t.dtype).is_integer else float(value))
        dma.dma_copy(dst=rows, src=tile)
    return t


def zeros(shape, dtype, buffer=SBUF, name=""):
    return _fill(_new(shape, dtype, buffer, name), 0)


def ones(shape, dtype, buffer=SBUF, name=""):
    return _fill(_new(shape, dtype, buffer, name), 1)


def full(shape, fill_value, dtype, buffer=SBUF, name=""):
    return _fill(_new(shape, dtype, buffer, name), fill_value)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x, dtype=None, buffer=None, name=""):
    return _new(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def shared_identity_matrix(n, dtype="uint8", dst=None):
    """An ``n x n`` identity in SBUF (e.g. the moving operand of a transpose matmul)."""
    if dst is None:
        dst = _new((n, n), dtype, SBUF, f"identity{n}")
    ones_tile = _new((n, n), dtype, SBUF, f"identity{n}_ones")
    vector.memset(dst=ones_tile, value=1 if dtypes.info(dst.dtype).is_integer else 1.0)
    gpsimd.affine_select(
        dst=dst, pattern=[[-1, n]], channel_multiplier=1, on_true_tile=ones_tile, on_false_value=0.0,
        cmp_op=OPERATORS["equal"],
    )
    return dst


def shared_constant(constant):
    """An ndarray constant as a ``shared_hbm`` tensor."""
    array = np.asarray(constant)
    t = _new(array.shape or (1,), dtypes.normalize(array.dtype, "nl.shared_constant"), MemoryRegion.shared_hbm)
    t._write(array.reshape(t.shape))
    return t


def load(src, dtype=None):
    """HBM -> a new SBUF tile of ``src.shape`` (``nl.load``)."""
    dst = _new(src.shape, dtype or src.dtype)
    dma.dma_copy(dst=dst, src=src)
    return dst


def store(dst, value):
    """SBUF tile -> HBM (``nl.store``); PSUM values are rejected like any DMA."""
    return dma.dma_copy(dst=dst, src=value)


def load_transpose2d(src, dtype=None):
    """HBM ``[a, b]`` -> SBUF ``[b, a]`` through a transposing DMA access pattern."""
    if src.ndim != 2:
        raise NkiValidationError("nl.load_transpose2d", "src rank", "must be 2", src.ndim)
    dst = _new((src.shape[1], src.shape[0]), dtype or src.dtype)
    dma.dma_copy(dst=dst, src=src.permute((1, 0)))
    return dst


def copy(x, dtype=None):
    """A copy of an SBUF/PSUM tile into a new SBUF tile (Vector Engine)."""
    dst = _new(x.shape, dtype or x.dtype)
    vector.tensor_copy(dst=dst, src=x)
    return dst


def matmul(x, y, transpose_x=False):
    """``x.T @ y`` into a new PSUM tile; ``transpose_x=True`` is required (known issue)."""
    if not transpose_x:
        raise NkiValidationError(
            "nl.matmul", "transpose_x", "must be True (x laid out [K, M])", transpose_x,
            hint="known issue of the experimental wrapper; use nisa.nc_matmul",
        )
    dst = _new((x.elems_per_partition, y.elems_per_partition), "float32", PSUM)
    tensor_engine.nc_matmul(dst=dst, stationary=x, moving=y)
    return dst


def transpose(x, dtype=None):
    """2-D partition/free transpose into a new PSUM tile (Tensor Engine)."""
    dst = _new((x.elems_per_partition, x.partitions), dtype or x.dtype, PSUM)
    tensor_engine.nc_transpose(dst=dst, data=x)
    return dst


# -- element-wise and reduction wrappers, attached to the operator objects -------------------


def _binary(op_name):
    op = OPERATORS[op_name]

    def wrapper(x, y, dtype=None):
        tiles = [v for v in (x, y) if isinstance(v, NkiTensor)]
        if not tiles:
            raise NkiValidationError(f"nl.{op_name}", "x, y", "must include at least one tile", (x, y))
        ref = tiles[0]
        out = _new(ref.shape, dtype or ref.dtype)
        if len(tiles) == 2:
            if x.shape != y.shape:
                raise NkiValidationError(f"nl.{op_name}", "y shape", f"must equal x shape {x.shape} (no broadcasting)",
                                         y.shape)
            vector.tensor_tensor(dst=out, data1=x, data2=y, op=op)
        else:
            other = y if isinstance(x, NkiTensor) else x
            if not isinstance(other, numbers.Real):
                raise NkiValidationError(f"nl.{op_name}", "scalar operand", "must be a number", other)
            vector.tensor_scalar(dst=out, data=ref, op0=op, operand0=float(other), reverse0=not isinstance(x, NkiTensor))
        return out

    return wrapper


def _activation(op_name):
    op = OPERATORS[op_name]

    def wrapper(x, dtype=None):
        out = _new(x.shape, dtype or x.dtype)
        scalar.activation(dst=out, op=op, data=x)
        return out

    return wrapper


def _vector_unary(op_name):
    op = OPERATORS[op_name]

    def wrapper(x, dtype=None):
        out = _new(x.shape, dtype or x.dtype)
        vector.tensor_scalar(dst=out, data=x, op0=op, operand0=None)
        return out

    return wrapper


def _negative(x, dtype=None):
    out = _new(x.shape, dtype or x.dtype)
    vector.tensor_scalar(dst=out, data=x, op0=OPERATORS["multiply"], operand0=-1.0)
    return out


def _reduction(op_name):
    op = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply", "mean": "add"}[op_name]

    def wrapper(x, axis, dtype=None, keepdims=False):
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a % x.ndim for a in axes)
        kept = [n for d, n in enumerate(x.shape) if d not in axes or d == 0]
        shape = [n if d not in axes else 1 for d, n in enumerate(x.shape)] if keepdims else kept
        if len(shape) < 2:
            shape = list(shape) + [1]
        out = _new(tuple(shape), dtype or x.dtype)
        vector.tensor_reduce(dst=out, op=OPERATORS[op], data=x, axis=axes)
        if op_name == "mean":
            n = int(np.prod([x.shape[a] for a in axes]))
            vector.tensor_scalar(dst=out, data=out, op0=OPERATORS["multiply"], operand0=1.0 / n)
        return out

    return wrapper


def _unsupported(name):
    def wrapper(*args, **kwargs):
        raise not_implemented(f"nl.{name} (not supported on hardware)")

    return wrapper


for _name in ("add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal", "greater",
              "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor", "power",
              "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "abs_max", "abs_min"):
    OPERATORS[_name].nl_impl = _binary(_name)
for _name in ("exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_dx", "gelu_apprx_tanh",
              "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "softplus", "mish", "erf",
              "erf_dx", "square", "abs", "sign", "arctan", "sin"):
    OPERATORS[_name].nl_impl = _activation(_name)
OPERATORS["rsqrt"].nl_impl = _vector_unary("rsqrt")  # GpSimd rsqrt since NKI 0.5
OPERATORS["reciprocal"].nl_impl = _activation("reciprocal")
OPERATORS["invert"].nl_impl = _vector_unary("invert")
OPERATORS["negative"].nl_impl = _negative
OPERATORS["copy"].nl_impl = copy
for _name in ("sum", "max", "min", "prod", "mean"):
    OPERATORS[_name].nl_impl = _reduction(_name)
for _name in ("divide", "fmod", "mod"):
    OPERATORS[_name].nl_impl = _unsupported(_name)
