"""The experimental ``nki.language`` convenience wrappers, built on the ISA instructions.

In NKI 0.6 these (``nl.load``, ``nl.add``, ``nl.exp``, ``nl.sum``, ...) are "experimental
and may change"; production kernels write ``nisa`` calls. Each wrapper here allocates a
new SBUF (or PSUM) tile and issues the instructions the docs name, so it is checked,
traced and costed like any other. Known limits are kept (release-notes/components/nki.rst,
0.3-0.5 known issues): no broadcasting between tiles (except the ``(P, 1)`` operand the
abs_max/abs_min docstrings show), no ``divide``/``fmod``/``mod``, no scalar exponent for
``nl.power``, ``nl.matmul`` needs ``transpose_x=True``.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.context import current
from neuron_kernels.interpreter.enums import engine as Engine
from neuron_kernels.interpreter.errors import NkiValidationError, not_implemented
from neuron_kernels.interpreter.instructions import dma, gpsimd, scalar, tensor_engine, vector
from neuron_kernels.interpreter.memory import allocate
from neuron_kernels.interpreter.operators import OPERATORS
from neuron_kernels.interpreter.storage import MemoryRegion
from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = [
    "broadcast_to",
    "copy",
    "empty_like",
    "full",
    "load",
    "load_transpose2d",
    "matmul",
    "ones",
    "shared_constant",
    "shared_identity_matrix",
    "store",
    "transpose",
    "zeros",
    "zeros_like",
]

SBUF, PSUM = MemoryRegion.sbuf, MemoryRegion.psum
_OP = OPERATORS


def _new(shape, dtype, buffer=SBUF, name="", api="nl.ndarray"):
    return allocate(current(), shape, dtype, buffer, name, api=api)


def _fail(api, arg, rule, value, **kw):
    raise NkiValidationError(api, arg, rule, value, **kw)


def _tile(api, arg, x) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        _fail(api, arg, "must be an NkiTensor", type(x).__name__)
    return x


def _out_dtype(api, dtype, like: NkiTensor) -> str:
    return like.dtype if dtype is None else dtypes.normalize(dtype, api)


# -- creation ---------------------------------------------------------------------------------


def _fill_value(api, value, dtype: str):
    """The memset value for ``dtype``: an int for integer tiles (integral floats accepted,
    as NumPy would store them), a float otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        _fail(api, "fill_value", "must be a number", repr(value))
    if dtypes.info(dtype).is_integer:
        if not float(value).is_integer():
            _fail(api, "fill_value", f"must be an integer for the integer dtype {dtype}", value)
        return int(value)
    return float(value)


def _fill(api, t: NkiTensor, value) -> NkiTensor:
    value = _fill_value(api, value, t.dtype)
    if t.on_chip:
        vector.memset(dst=t, value=value)
        return t
    # HBM: memset cannot write HBM; fill one SBUF tile and DMA it over the flat tensor.
    flat = t.reshape((t.size,))
    cols = min(512, -(-t.size // 128))
    rows = min(128, -(-t.size // cols))
    tile = _new((rows, cols), t.dtype, name=f"{t.name}_fill", api=api)
    vector.memset(dst=tile, value=value)
    chunk, start = rows * cols, 0
    while start < t.size:
        n = min(chunk, t.size - start)
        full_rows, rest = divmod(n, cols)
        if full_rows:
            dma.dma_copy(dst=flat[start : start + full_rows * cols], src=tile[0:full_rows, :])
        if rest:
            at = start + full_rows * cols
            dma.dma_copy(dst=flat[at : at + rest], src=tile[0:1, 0:rest])
        start += n
    return t


def zeros(shape, dtype, buffer=SBUF, name=""):
    return _fill("nl.zeros", _new(shape, dtype, buffer, name, "nl.zeros"), 0)


def ones(shape, dtype, buffer=SBUF, name=""):
    return _fill("nl.ones", _new(shape, dtype, buffer, name, "nl.ones"), 1)


def full(shape, fill_value, dtype, buffer=SBUF, name=""):
    t = _new(shape, dtype, buffer, name, "nl.full")
    return _fill("nl.full", t, fill_value)


def zeros_like(x, dtype=None, buffer=None, name=""):
    """Zeros shaped like ``x``; ``buffer`` defaults to SBUF (the stub's documented default)."""
    x = _tile("nl.zeros_like", "x", x)
    return zeros(x.shape, dtype or x.dtype, SBUF if buffer is None else buffer, name)


def empty_like(x, dtype=None, buffer=None, name=""):
    """Uninitialised tensor shaped like ``x``; dtype and buffer default to ``x``'s."""
    x = _tile("nl.empty_like", "x", x)
    return _new(
        x.shape, dtype or x.dtype, x.buffer if buffer is None else buffer, name, "nl.empty_like"
    )


def shared_identity_matrix(n, dtype="uint8", dst=None):
    """An ``n x n`` identity in SBUF (e.g. the moving operand of a transpose matmul)."""
    api = "nl.shared_identity_matrix"
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 128:
        _fail(api, "n", "must be an int in 1..128 (an SBUF tile's partitions)", n, limit=128)
    if dst is None:
        dst = _new((n, n), dtype, SBUF, f"identity{n}", api)
    elif _tile(api, "dst", dst).shape != (n, n):
        _fail(api, "dst shape", f"must be ({n}, {n})", dst.shape)
    ones_tile = _new((n, n), dst.dtype, SBUF, f"identity{n}_ones", api)
    vector.memset(dst=ones_tile, value=1 if dtypes.info(dst.dtype).is_integer else 1.0)
    gpsimd.affine_select(
        dst=dst,
        pattern=[[-1, n]],
        channel_multiplier=1,
        on_true_tile=ones_tile,
        on_false_value=0.0,
        cmp_op=_OP["equal"],
    )
    return dst


def shared_constant(constant):
    """An ndarray (or a ``.npy`` file path) as a ``shared_hbm`` tensor."""
    if isinstance(constant, (str, os.PathLike)):
        constant = np.load(constant)
    array = np.asarray(constant)
    t = _new(
        array.shape or (1,),
        dtypes.normalize(array.dtype, "nl.shared_constant"),
        MemoryRegion.shared_hbm,
        api="nl.shared_constant",
    )
    t._write(array.reshape(t.shape))
    return t


# -- data movement ----------------------------------------------------------------------------


def load(src, dtype=None):
    """HBM -> a new SBUF tile of ``src.shape`` (``nl.load``)."""
    src = _tile("nl.load", "src", src)
    if not src.buffer.is_hbm:
        _fail("nl.load", "src", "must be an HBM tensor", src.buffer.value.upper())
    dst = _new(src.shape, _out_dtype("nl.load", dtype, src), api="nl.load")
    dma.dma_copy(dst=dst, src=src)
    return dst


def store(dst, value):
    """SBUF tile -> HBM (``nl.store``); PSUM values must be copied to SBUF first."""
    dst, value = _tile("nl.store", "dst", dst), _tile("nl.store", "value", value)
    if not dst.buffer.is_hbm:
        _fail("nl.store", "dst", "must be an HBM tensor", dst.buffer.value.upper())
    if value.buffer is not SBUF:
        _fail(
            "nl.store",
            "value",
            "must be an SBUF tile (copy PSUM to SBUF first)",
            value.buffer.value.upper(),
        )
    return dma.dma_copy(dst=dst, src=value)


def load_transpose2d(src, dtype=None):
    """HBM ``[a, b]`` -> SBUF ``[b, a]`` through a transposing DMA access pattern."""
    api = "nl.load_transpose2d"
    src = _tile(api, "src", src)
    if not src.buffer.is_hbm:
        _fail(api, "src", "must be an HBM tensor", src.buffer.value.upper())
    if src.ndim != 2:
        _fail(api, "src rank", "must be 2", src.ndim, limit=2)
    dst = _new((src.shape[1], src.shape[0]), _out_dtype(api, dtype, src), api=api)
    dma.dma_copy(dst=dst, src=src.permute((1, 0)))
    return dst


def copy(x, dtype=None):
    """A copy of an SBUF/PSUM tile into a new SBUF tile (Vector Engine: bit-exact when the
    dtype is unchanged)."""
    x = _tile("nl.copy", "x", x)
    dst = _new(x.shape, _out_dtype("nl.copy", dtype, x), api="nl.copy")
    vector.tensor_copy(dst=dst, src=x, engine=Engine.vector)
    return dst


def matmul(x, y, transpose_x=False):
    """``x.T @ y`` into a new fp32 PSUM tile; ``transpose_x=True`` is required (known issue)."""
    x, y = _tile("nl.matmul", "x", x), _tile("nl.matmul", "y", y)
    if transpose_x is not True:
        _fail(
            "nl.matmul",
            "transpose_x",
            "must be True (x laid out [K, M])",
            transpose_x,
            hint="known issue of the experimental wrapper; use nisa.nc_matmul",
        )
    dst = _new((x.elems_per_partition, y.elems_per_partition), "float32", PSUM, api="nl.matmul")
    tensor_engine.nc_matmul(dst=dst, stationary=x, moving=y)
    return dst


def transpose(x, dtype=None):
    """2-D partition/free transpose into a new PSUM tile (TensorE from SBUF, VectorE from
    PSUM); a different ``dtype`` adds a PSUM -> PSUM conversion copy."""
    x = _tile("nl.transpose", "x", x)
    out_dtype = _out_dtype("nl.transpose", dtype, x)
    shape = (x.elems_per_partition, x.partitions)
    dst = _new(shape, x.dtype, PSUM, api="nl.transpose")
    tensor_engine.nc_transpose(dst=dst, data=x)
    if out_dtype == x.dtype:
        return dst
    cast = _new(shape, out_dtype, PSUM, api="nl.transpose")
    vector.tensor_copy(dst=cast, src=dst, engine=Engine.vector)
    return cast


def broadcast_to(x, shape, dtype=None):
    """``x`` broadcast to ``shape`` (same rank, each dim equal or from 1) in a new SBUF tile.

    Free dims: one Vector Engine copy from a stride-0 view. The partition dim (1 -> P): the
    docs do not say which instructions the wrapper issues; here a float tile goes through
    the Tensor Engine (``ones[1, P].T @ x`` into PSUM, then a copy out), exact since each
    output is 1.0 * x; an integer tile, which the Tensor Engine does not take, is copied row
    by row with DMA. Equal shapes return ``x`` itself, or a cast copy for another ``dtype``.
    """
    api = "nl.broadcast_to"
    x = _tile(api, "x", x)
    if not x.on_chip:
        _fail(api, "x", "must be an SBUF or PSUM tile", x.buffer.value)
    if isinstance(shape, list):
        shape = tuple(shape)
    if not isinstance(shape, tuple) or [d for d in shape if not _positive_int(d)]:
        _fail(api, "shape", "must be a tuple of positive ints", shape)
    if len(shape) != x.ndim:
        _fail(api, "shape", f"must have the rank of x ({x.ndim})", shape, limit=x.ndim)
    for i, (have, want) in enumerate(zip(x.shape, shape)):
        if have not in (1, want):
            _fail(api, f"shape[{i}]", f"must equal x.shape[{i}] ({have}) or x's must be 1", want)
    out_dtype = _out_dtype(api, dtype, x)
    if tuple(shape) == x.shape:
        return x if out_dtype == x.dtype else copy(x, dtype=out_dtype)
    view = x
    for i in range(1, x.ndim):
        if x.shape[i] != shape[i]:
            view = view.broadcast(i, shape[i])
    grow_partitions = x.shape[0] != shape[0]
    staged = _new((x.shape[0], *shape[1:]), x.dtype if grow_partitions else out_dtype, api=api)
    vector.tensor_copy(dst=staged, src=view, engine=Engine.vector)
    if not grow_partitions:
        return staged
    out = _new(shape, out_dtype, api=api)
    n_free = math.prod(shape[1:])
    row = staged.reshape((1, n_free))
    out2d = out.reshape((shape[0], n_free))
    if not dtypes.info(x.dtype).is_float:
        for p in range(shape[0]):
            dma.dma_copy(dst=out2d[p : p + 1, :], src=row)
        return out
    ones = _new((1, shape[0]), x.dtype, api=api)
    vector.memset(dst=ones, value=1.0)
    chunk = current().target.gemm_moving_fmax
    for lo in range(0, n_free, chunk):
        hi = min(n_free, lo + chunk)
        acc = _new((shape[0], hi - lo), "float32", PSUM, api=api)
        tensor_engine.nc_matmul(dst=acc, stationary=ones, moving=row[:, lo:hi])
        vector.tensor_copy(dst=out2d[:, lo:hi], src=acc, engine=Engine.vector)
    return out


def _positive_int(d) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d >= 1


# -- element-wise wrappers, attached to the operator objects --------------------------------------


# The abs_max/abs_min docstring examples pair a (P, F) tile with a (P, 1) tile; those ops
# are also documented as tensor_scalar op0s, so that pair is one tensor_scalar with a
# column operand. Every other binary wrapper keeps the documented no-broadcasting rule.
_COLUMN_OK = ("abs_max", "abs_min")


def _is_column(col: NkiTensor, other: NkiTensor) -> bool:
    return col.shape == (other.shape[0], 1) and other.shape != col.shape


def _binary(op_name):
    op = _OP[op_name]
    api = f"nl.{op_name}"

    def wrapper(x, y, dtype=None):
        x_tile, y_tile = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
        if not (x_tile or y_tile):
            _fail(api, "x, y", "must include at least one tile", (x, y))
        ref = x if x_tile else y
        if x_tile and y_tile and op_name in _COLUMN_OK and x.shape != y.shape:
            col, ref = (y, x) if _is_column(y, x) else (x, y)
            if _is_column(col, ref):
                out = _new(ref.shape, _out_dtype(api, dtype, ref), api=api)
                vector.tensor_scalar(dst=out, data=ref, op0=op, operand0=col, reverse0=col is x)
                return out
        out = _new(ref.shape, _out_dtype(api, dtype, ref), api=api)
        if x_tile and y_tile:
            if x.shape != y.shape:
                _fail(
                    api,
                    "y shape",
                    f"must equal x shape {x.shape} (no broadcasting)",
                    y.shape,
                    limit=x.shape,
                )
            vector.tensor_tensor(dst=out, data1=x, data2=y, op=op)
            return out
        other = y if x_tile else x
        if op_name == "power":
            _fail(api, "x, y", "must both be tiles (no scalar operand for nl.power)", repr(other))
        if isinstance(other, (bool, np.bool_)) or not isinstance(other, numbers.Real):
            _fail(api, "scalar operand", "must be a number", repr(other))
        if op.is_bitvec:
            if not float(other).is_integer():
                _fail(api, "scalar operand", f"must be an int for bitvec {op!r}", other)
            value = int(other)
        else:
            value = float(other)
        vector.tensor_scalar(dst=out, data=ref, op0=op, operand0=value, reverse0=not x_tile)
        return out

    return wrapper


def _activation(op_name):
    op = _OP[op_name]

    def wrapper(x, dtype=None):
        x = _tile(f"nl.{op_name}", "x", x)
        out = _new(x.shape, _out_dtype(f"nl.{op_name}", dtype, x), api=f"nl.{op_name}")
        scalar.activation(dst=out, op=op, data=x)
        return out

    return wrapper


def _tensor_scalar_unary(op_name, op0, operand0=None, engine=Engine.unknown, **kw):
    """A wrapper issuing one tensor_scalar (unary ALU op or a fixed operand)."""
    api = f"nl.{op_name}"

    def wrapper(x, dtype=None):
        x = _tile(api, "x", x)
        out = _new(x.shape, _out_dtype(api, dtype, x), api=api)
        vector.tensor_scalar(dst=out, data=x, op0=_OP[op0], operand0=operand0, engine=engine, **kw)
        return out

    return wrapper


def _reciprocal(x, dtype=None):
    """``1 / x`` on the Vector Engine: exact fp32, no ScalarE input-range limit."""
    x = _tile("nl.reciprocal", "x", x)
    out = _new(x.shape, _out_dtype("nl.reciprocal", dtype, x), api="nl.reciprocal")
    vector.reciprocal(dst=out, data=x)
    return out


def _logical_not(x, dtype=None):
    """1 where x == 0 else 0 for 0/1 inputs: XOR with 1 (bitwise on integer tiles)."""
    x = _tile("nl.logical_not", "x", x)
    out = _new(x.shape, _out_dtype("nl.logical_not", dtype, x), api="nl.logical_not")
    if dtypes.info(x.dtype).is_integer and dtypes.info(out.dtype).is_integer:
        vector.tensor_scalar(dst=out, data=x, op0=_OP["bitwise_xor"], operand0=1)
    else:
        vector.tensor_scalar(dst=out, data=x, op0=_OP["logical_xor"], operand0=1.0)
    return out


# Cody-Waite split of 2*pi: C1 has 8 significant bits, so k*C1 is exact for |k| < 2^15.
_TWO_PI_HI = 6.28125
_TWO_PI_LO = float(np.float32(2.0 * math.pi - 6.28125))
_PI32 = float(np.float32(math.pi))


def _reduced_angle(api, x) -> NkiTensor:
    """``x - 2*pi*round(x / (2*pi))`` in fp32, clamped to ScalarE sin's [-pi, pi]."""
    k = _new(x.shape, "int32", api=api)
    vector.tensor_scalar(dst=k, data=x, op0=_OP["multiply"], operand0=1.0 / (2.0 * math.pi))
    r = _new(x.shape, "float32", api=api)
    vector.scalar_tensor_tensor(
        dst=r, data=k, op0=_OP["multiply"], operand0=-_TWO_PI_HI, op1=_OP["add"], operand1=x
    )
    vector.scalar_tensor_tensor(
        dst=r, data=k, op0=_OP["multiply"], operand0=-_TWO_PI_LO, op1=_OP["add"], operand1=r
    )
    vector.tensor_scalar(
        dst=r, data=r, op0=_OP["maximum"], operand0=-_PI32, op1=_OP["minimum"], operand1=_PI32
    )
    return r


def _sin(x, dtype=None):
    """sin with range reduction before the ScalarE activation (valid on [-pi, pi] only), as
    nki.api.shared.rst documents for ``nl.sin``."""
    x = _tile("nl.sin", "x", x)
    out = _new(x.shape, _out_dtype("nl.sin", dtype, x), api="nl.sin")
    scalar.activation(dst=out, op=_OP["sin"], data=_reduced_angle("nl.sin", x))
    return out


def _cos_into(api, x, out) -> NkiTensor:
    """cos(x) = sin(pi/2 - |r|) for the reduced angle r (|r| <= pi keeps it in range)."""
    r = _reduced_angle(api, x)
    vector.tensor_scalar(
        dst=r,
        data=r,
        op0=_OP["abs"],
        operand0=None,
        op1=_OP["subtract"],
        operand1=float(np.float32(math.pi / 2)),
        reverse1=True,
    )
    scalar.activation(dst=out, op=_OP["sin"], data=r)
    return out


def _cos(x, dtype=None):
    x = _tile("nl.cos", "x", x)
    return _cos_into("nl.cos", x, _new(x.shape, _out_dtype("nl.cos", dtype, x), api="nl.cos"))


def _tan(x, dtype=None):
    """sin(x) * (1 / cos(x)), the reciprocal on the Vector Engine."""
    x = _tile("nl.tan", "x", x)
    c = _cos_into("nl.tan", x, _new(x.shape, "float32", api="nl.tan"))
    vector.reciprocal(dst=c, data=c)
    s = _new(x.shape, "float32", api="nl.tan")
    scalar.activation(dst=s, op=_OP["sin"], data=_reduced_angle("nl.tan", x))
    out = _new(x.shape, _out_dtype("nl.tan", dtype, x), api="nl.tan")
    vector.tensor_tensor(dst=out, data1=s, data2=c, op=_OP["multiply"])
    return out


# -- reductions -------------------------------------------------------------------------------------


def _reduction(fn_name):
    op = _OP[
        {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply", "mean": "add"}[
            fn_name
        ]
    ]
    api = f"nl.{fn_name}"

    def wrapper(x, axis, dtype=None, keepdims=False):
        x = _tile(api, "x", x)
        items = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        for a in items:
            if (
                isinstance(a, (bool, np.bool_))
                or not isinstance(a, (int, np.integer))
                or not -x.ndim <= a < x.ndim
            ):
                _fail(api, "axis", f"must be ints in [-{x.ndim}, {x.ndim})", axis)
        axes = tuple(sorted(int(a) % x.ndim for a in items))
        if keepdims:
            shape = [1 if d in axes else n for d, n in enumerate(x.shape)]
        else:
            shape = [n for d, n in enumerate(x.shape) if d not in axes or d == 0]
        if len(shape) < 2:  # an on-chip tile keeps a free dim
            shape.append(1)
        out = _new(tuple(shape), _out_dtype(api, dtype, x), api=api)
        if fn_name != "mean":
            vector.tensor_reduce(dst=out, op=op, data=x, axis=axes, keepdims=bool(keepdims))
            return out
        total = _new(tuple(shape), "float32", api=api)  # fp32 intermediate, one final rounding
        vector.tensor_reduce(dst=total, op=op, data=x, axis=axes, keepdims=bool(keepdims))
        n = math.prod(x.shape[a] for a in axes if a != 0)
        vector.tensor_scalar(dst=out, data=total, op0=_OP["multiply"], operand0=1.0 / n)
        return out

    return wrapper


def _unsupported(name):
    def wrapper(*args, **kwargs):
        raise not_implemented(f"nl.{name} (not supported on hardware)")

    return wrapper


for _name in (
    "add",
    "subtract",
    "multiply",
    "maximum",
    "minimum",
    "equal",
    "not_equal",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
    "power",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "left_shift",
    "right_shift",
    "abs_max",
    "abs_min",
):
    _OP[_name].nl_impl = _binary(_name)
for _name in (
    "exp",
    "log",
    "sqrt",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "gelu_dx",
    "gelu_apprx_tanh",
    "gelu_apprx_sigmoid",
    "gelu_apprx_sigmoid_dx",
    "silu",
    "silu_dx",
    "softplus",
    "mish",
    "erf",
    "erf_dx",
    "square",
    "abs",
    "sign",
    "arctan",
):
    _OP[_name].nl_impl = _activation(_name)
# GpSimd rsqrt since NKI 0.5: higher precision, PSUM input no longer supported.
_OP["rsqrt"].nl_impl = _tensor_scalar_unary("rsqrt", "rsqrt", engine=Engine.gpsimd)
_OP["reciprocal"].nl_impl = _reciprocal
_OP["invert"].nl_impl = _tensor_scalar_unary("invert", "invert")
_OP["negative"].nl_impl = _tensor_scalar_unary("negative", "multiply", -1.0)
_OP["logical_not"].nl_impl = _logical_not
_OP["sin"].nl_impl = _sin
_OP["cos"].nl_impl = _cos
_OP["tan"].nl_impl = _tan
_OP["copy"].nl_impl = copy
for _name in ("sum", "max", "min", "prod", "mean"):
    _OP[_name].nl_impl = _reduction(_name)
for _name in ("divide", "fmod", "mod"):
    _OP[_name].nl_impl = _unsupported(_name)
