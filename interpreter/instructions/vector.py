"""Vector Engine instructions (some may also run on GpSimd or Scalar Engine).

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py. Arithmetic converts inputs
to fp32, computes in fp32 and converts to ``dst.dtype`` on write; bitvec operators work on
integer bit patterns; all-int32/uint32 ``tensor_tensor`` defaults to GpSimd's exact integers.
Reductions accumulate in fp64 and round once to fp32 (the hardware's fp32 running sum is
within a few fp32 ulps of that). ``nl.power`` exists only on GpSimd, so only
``tensor_tensor`` accepts it.

VectorE accumulator registers (``check.sim.vector_regs``) are shared by
``tensor_scalar_reduce``, ``tensor_scalar_cumulative``, ``exponential``, ``range_select``
and ``select_reduce``. The docs say an ``idle`` command may still change them, so an idle
accumulating instruction leaves them NaN: a chain must start with ``reset_reduce``.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.enums import engine as Engine
from neuron_kernels.interpreter.enums import reduce_cmd as ReduceCmd
from neuron_kernels.interpreter.instructions._common import OperandChecks, apply_binary, apply_unary
from neuron_kernels.interpreter.operators import OPERATORS, REDUCTION_ALIASES, Operator
from neuron_kernels.interpreter.storage import MemoryRegion
from neuron_kernels.interpreter.tensor import NkiTensor
from neuron_kernels.interpreter.values import nki_number

__all__ = [
    "bn_aggr",
    "bn_stats",
    "exponential",
    "max8",
    "memset",
    "range_select",
    "reciprocal",
    "scalar_tensor_tensor",
    "select_reduce",
    "tensor_copy",
    "tensor_copy_predicated",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_scalar_cumulative",
    "tensor_scalar_reduce",
    "tensor_tensor",
    "tensor_tensor_scan",
]

_INT32 = {"int32", "uint32"}
FP32_MIN = float(np.finfo(np.float32).min)  # -3.4028235e38, the only legal range_select fill
_COMPARES = ("equal", "less", "less_equal", "greater", "greater_equal")


def _is_psum(t: NkiTensor) -> bool:
    return t.buffer is MemoryRegion.psum


def _int_dtype(t: NkiTensor) -> bool:
    return dtypes.info(t.dtype).is_integer


def _alu(check: OperandChecks, arg: str, op, kinds: tuple[str, ...]) -> Operator:
    """An ALU operator of the given classes that the Vector/Scalar Engine can compute:
    ``nl.power`` runs only on GpSimd (tensor_tensor)."""
    op = check.operator(arg, op, kinds=kinds)
    if op.name == "power":
        check.fail(arg, "must not be nl.power (GpSimd only: use nisa.tensor_tensor)", repr(op))
    return op


def _integer_operands(check: OperandChecks, op: Operator, *named: tuple[str, NkiTensor]) -> None:
    for arg, t in named:
        if not _int_dtype(t):
            check.fail(f"{arg} dtype", f"must be an integer dtype for bitvec {op!r}", t.dtype)


def _reduce_operator(
    check: OperandChecks, arg: str, op, allowed: tuple[str, ...] | None = None
) -> Operator:
    """A legal reduction operator (nl.max / nl.min name maximum / minimum)."""
    if isinstance(op, Operator) and op.name in REDUCTION_ALIASES:
        op = REDUCTION_ALIASES[op.name]
    if allowed is not None:
        if not isinstance(op, Operator) or op.name not in allowed:
            check.fail(arg, "must be " + " or ".join(f"nl.{a}" for a in allowed), repr(op))
        return op
    if not isinstance(op, Operator) or not op.reducible:
        legal = "add, subtract, multiply, maximum, minimum, logical_and/or/xor, bitwise_and/or/xor"
        check.fail(arg, f"must be a reduction operator ({legal})", repr(op))
    return op


def _reduce(op: Operator, x: np.ndarray, axis) -> np.ndarray:
    """Reduce ``x`` with ``op`` over ``axis`` (fp64 accumulation for arithmetic ops)."""
    name = op.name
    if op.is_bitvec:
        return op.fn2.reduce(x, axis=axis)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "add":
            r = x64.sum(axis=axis)
        elif name == "subtract":  # left fold: x0 - x1 - x2 ...
            flat = _move_reduced_last(x64, axis)
            r = flat[..., 0] - flat[..., 1:].sum(axis=-1)
        elif name == "multiply":
            r = x64.prod(axis=axis)
        elif name == "maximum":
            r = x64.max(axis=axis)
        elif name == "minimum":
            r = x64.min(axis=axis)
        elif name == "logical_and":
            r = (x64 != 0).all(axis=axis).astype(np.float64)
        elif name == "logical_or":
            r = (x64 != 0).any(axis=axis).astype(np.float64)
        elif name == "logical_xor":
            r = ((x64 != 0).sum(axis=axis) % 2).astype(np.float64)
        else:  # pragma: no cover - guarded by _reduce_operator
            raise AssertionError(name)
        return r.astype(np.float32)  # an overflowing product or sum becomes inf


def _move_reduced_last(x: np.ndarray, axis) -> np.ndarray:
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    keep = [d for d in range(x.ndim) if d not in axes]
    return x.transpose(keep + list(axes)).reshape([x.shape[d] for d in keep] + [-1])


_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}


def _reduce_cmd(check: OperandChecks, cmd, allowed: tuple[ReduceCmd, ...]) -> ReduceCmd:
    if not isinstance(cmd, ReduceCmd):
        check.fail("reduce_cmd", "must be an nisa.reduce_cmd member", repr(cmd))
    if cmd not in allowed:
        names = ", ".join(c.name for c in allowed)
        check.fail("reduce_cmd", f"must be one of {names}", f"nisa.reduce_cmd.{cmd.name}")
    return cmd


def _reduce_res(check: OperandChecks, reduce_res, p: int, eng: str = "vector"):
    """The optional ``(P, 1)`` read-out tile of an accumulator."""
    if reduce_res is None:
        return None
    reduce_res = check.engine_operand("reduce_res", reduce_res, eng, write=True)
    if reduce_res.partitions != p or reduce_res.elems_per_partition != 1:
        check.fail("reduce_res shape", f"must be ({p}, 1)", reduce_res.shape, limit=(p, 1))
    return reduce_res


def _accumulate(
    check: OperandChecks, p: int, op: Operator, partial: np.ndarray, cmd: ReduceCmd, init=None
):
    """Update the VectorE accumulators of the first ``p`` lanes with a per-lane ``partial``."""
    regs = check.sim.vector_regs
    if cmd is ReduceCmd.idle:
        regs[:p] = np.nan  # "the accumulator state may still be modified" (state unknown)
    elif cmd is ReduceCmd.reset_reduce:
        regs[:p] = apply_binary(op, np.float32(_IDENTITY[op.name]), partial)
    elif cmd is ReduceCmd.reduce:
        regs[:p] = apply_binary(op, regs[:p], partial)
    elif cmd is ReduceCmd.load_reduce:
        start = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (p,))
        regs[:p] = apply_binary(op, start, partial)
    else:  # pragma: no cover - guarded by _reduce_cmd
        raise AssertionError(cmd)


def _read_out(check: OperandChecks, reduce_res, p: int, negate: bool = False) -> list:
    if reduce_res is None:
        return []
    out = check.sim.vector_regs[:p].reshape(p, 1).copy()
    reduce_res._write(-out if negate else out)
    return [reduce_res]


# -- copies and fills ---------------------------------------------------------------------------


def tensor_copy(dst, src, engine=Engine.unknown, name=None):
    """Copy an on-chip tile (Vector, Scalar or GpSimd Engine).

    Vector/GpSimd copy bit-exactly when dtypes match and through fp32 otherwise; Scalar
    Engine always goes through fp32 and does not run tensor_copy on NeuronCore-v2.
    """
    check = OperandChecks("nisa.tensor_copy")
    dst, src = check.tensor("dst", dst), check.tensor("src", src)
    eng = check.engine(engine, ("vector", "scalar", "gpsimd"), "vector")
    if eng == "scalar" and check.target.nc_version <= 2:
        check.fail(
            "engine",
            "must not be the Scalar Engine on NeuronCore-v2 (use nisa.activation(op=nl.copy))",
            "nisa.engine.scalar",
        )
    src = check.engine_operand("src", src, eng)
    dst = check.engine_operand("dst", dst, eng, write=True)
    check.same_partitions(("src", src), ("dst", dst))
    check.same_free(("src", src), ("dst", dst))
    if not check.compute:  # trace-only: the read's refusals and the write's state, no values
        if eng != "scalar" and src.dtype == dst.dtype:
            src._np_dtype()  # (_read_raw refuses a dtype the interpreter cannot store)
        else:
            src._check_numeric_read()  # (as _read_f32)
        dst._write(None)
    elif eng != "scalar" and src.dtype == dst.dtype:
        dst._write(src._read_raw().reshape(dst.shape), raw=True)
    else:
        dst._write(src._read_f32().reshape(dst.shape))
    return check.record(eng, [src], [dst], name)


def memset(dst, value, engine=Engine.unknown, name=None):
    """Fill ``dst`` with a compile-time constant (Vector or GpSimd Engine).

    Since NKI 0.3 a float ``value`` into an integer tile is an error.
    """
    check = OperandChecks("nisa.memset")
    dst = check.tensor("dst", dst)
    eng = check.engine(engine, ("vector", "gpsimd"), "vector")
    dst = check.engine_operand("dst", dst, eng, write=True)
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        check.fail("value", "must be a compile-time number", repr(value))
    value = nki_number("nisa.memset", "value", value)  # rounded to 32 bits, then range-checked
    if dtypes.info(dst.dtype).kind == "packed":
        # "For x4 packed types ... only value=0 is supported" (nki/api/nki/isa memset)
        if value != 0:
            check.fail("value", f"must be 0 for the packed dtype {dst.dtype}", value, limit=0)
        dst._write(np.zeros(dst.shape, dtype=dst._np_dtype()), raw=True)
        return check.record(eng, [], [dst], name)
    bounds = dtypes.value_range(dst.dtype)
    finite = not isinstance(value, (float, np.floating)) or np.isfinite(value)
    if bounds is not None and finite and not bounds[0] <= value <= bounds[1]:
        check.fail(
            "value", f"must be within {dst.dtype}'s range [{bounds[0]:g}, {bounds[1]:g}]", value
        )
    if _int_dtype(dst):
        if isinstance(value, (float, np.floating)):
            check.fail("value", f"must be an int literal for the integer dtype {dst.dtype}", value)
        dst._write(np.full(dst.shape, int(value), dtype=np.int64))
    else:
        dst._write(np.full(dst.shape, np.float32(value), dtype=np.float32))
    return check.record(eng, [], [dst], name)


# -- element-wise ---------------------------------------------------------------------------------


def tensor_tensor(dst, data1, data2, op, engine=Engine.unknown, name=None):
    """``dst = data1 op data2`` element-wise (Vector Engine; GpSimd for nl.power and int32)."""
    check = OperandChecks("nisa.tensor_tensor")
    dst, data1, data2 = (
        check.tensor("dst", dst),
        check.tensor("data1", data1),
        check.tensor("data2", data2),
    )
    op = check.operator("op", op, kinds=("arith", "bitvec"))
    any_psum = _is_psum(dst) or _is_psum(data1) or _is_psum(data2)
    all_int32 = all(t.dtype in _INT32 for t in (dst, data1, data2))
    if op.name == "power":
        default = "gpsimd"
    elif all_int32 and not any_psum and not op.is_bitvec:
        default = "gpsimd"  # exact integer arithmetic; falls back to VectorE with PSUM
    else:
        default = "vector"
    eng = check.engine(engine, ("vector", "gpsimd"), default)
    if op.name == "power" and eng != "gpsimd":
        check.fail("engine", "must be the GpSimd Engine for nl.power", f"nisa.engine.{eng}")
    data1 = check.engine_operand("data1", data1, eng)
    data2 = check.engine_operand("data2", data2, eng)
    dst = check.engine_operand("dst", dst, eng, write=True)
    check.same_partitions(("data1", data1), ("data2", data2), ("dst", dst))
    check.same_free(("data1", data1), ("data2", data2), ("dst", dst))
    check.not_both_psum(("data1", data1), ("data2", data2))
    if op.is_bitvec:
        _integer_operands(check, op, ("data1", data1), ("data2", data2), ("dst", dst))
        a, b = data1._read_raw(), data2._read_raw().astype(data1._np_dtype())
        dst._write(apply_binary(op, a.reshape(dst.shape), b.reshape(dst.shape)))
    elif eng == "gpsimd" and all_int32:
        dst._write(_int32_math(op, data1, data2, dst), raw=True)
    elif not check.compute:  # trace-only: the reads' refusals (as _read_f32), no arithmetic
        data1._check_numeric_read()
        data2._check_numeric_read()
        dst._write(None)
    else:
        a, b = data1._read_f32().reshape(dst.shape), data2._read_f32().reshape(dst.shape)
        dst._write(apply_binary(op, a, b))
    return check.record(eng, [data1, data2], [dst], name, op=op.name)


def _int32_math(op: Operator, data1: NkiTensor, data2: NkiTensor, dst: NkiTensor) -> np.ndarray:
    """GpSimd's native 32-bit integer arithmetic: exact, wrapping to 32 bits; comparisons
    and logical ops give 1/0; a power with a negative exponent truncates toward zero."""
    a = data1._read_raw().astype(np.int64).reshape(dst.shape)
    b = data2._read_raw().astype(np.int64).reshape(dst.shape)
    with np.errstate(all="ignore"):
        if op.name == "power":
            frac = np.trunc(np.power(a.astype(np.float64), np.minimum(b, 0))).astype(np.int64)
            out = np.where(b >= 0, np.power(a, np.maximum(b, 0)), frac)
        else:
            out = np.asarray(op.fn2(a, b)).astype(np.int64)
    return out.astype(np.uint64).astype(np.uint32).view(dst._np_dtype())


def tensor_scalar(
    dst,
    data,
    op0,
    operand0,
    reverse0=False,
    op1=None,
    operand1=None,
    reverse1=False,
    engine=Engine.unknown,
    name=None,
):
    """``dst = (data op0 operand0) op1 operand1`` with scalar or ``(P, 1)`` operands.

    Both ops must be of one class; bitvec runs on VectorE on integer bit patterns;
    arithmetic operand tiles must be fp32; GpSimd runs only ``nl.rsqrt``; the trn2 Scalar
    Engine only (multiply, add), (multiply, None), (add, None).
    """
    check = OperandChecks("nisa.tensor_scalar")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    kinds = ("arith", "bitvec", "arith_unary", "bitvec_unary")
    op0 = _alu(check, "op0", op0, kinds)
    if op1 is None and operand1 is not None:
        check.fail("operand1", "must be None when op1 is unused", operand1)
    if op1 is not None:
        op1 = _alu(check, "op1", op1, kinds)
        if op0.is_bitvec != op1.is_bitvec:
            check.fail(
                "op1",
                f"must be of the same class as op0 ({'bitvec' if op0.is_bitvec else 'arithmetic'})",
                repr(op1),
            )
    for op, operand, arg in ((op0, operand0, "operand0"), (op1, operand1, "operand1")):
        if op is not None and op.is_unary_alu and not _is_zero_or_none(operand):
            check.fail(arg, f"must be None or 0 for the unary operator {op!r}", operand)
        if op is not None and not op.is_unary_alu and operand is None:
            check.fail(arg, f"must be set for the binary operator {op!r}", None)
    check.flag("reverse0", reverse0)
    check.flag("reverse1", reverse1)
    rsqrt_only = op0.name == "rsqrt" and op1 is None
    default = "gpsimd" if rsqrt_only and not (_is_psum(dst) or _is_psum(data)) else "vector"
    eng = check.engine(engine, ("vector", "scalar", "gpsimd"), default)
    if eng == "gpsimd" and not rsqrt_only:
        check.fail(
            "engine",
            "may be the GpSimd Engine only for nl.rsqrt",
            f"nisa.engine.gpsimd with op0={op0!r}, op1={op1!r}",
        )
    if op0.is_bitvec and eng != "vector":
        check.fail("engine", "must be the Vector Engine for bitvec operators", f"nisa.engine.{eng}")
    if eng == "scalar" and check.target.nc_version <= 3:
        combo = (op0.name, op1.name if op1 is not None else None)
        allowed = {("multiply", "add"), ("multiply", None), ("add", None)}
        if combo not in allowed:
            check.fail(
                "op0/op1",
                f"must be one of {sorted(allowed, key=str)} on the Scalar Engine "
                f"({check.target.name})",
                combo,
            )
    data = check.engine_operand("data", data, eng)
    dst = check.engine_operand("dst", dst, eng, write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    bitvec = op0.is_bitvec
    if bitvec:
        _integer_operands(check, op0, ("data", data), ("dst", dst))
    v0 = _scalar_operand(check, "operand0", op0, operand0, p, bitvec)
    v1 = _scalar_operand(check, "operand1", op1, operand1, p, bitvec)
    x = data._read_raw().reshape(p, -1) if bitvec else data._read_f32().reshape(p, -1)
    for op, v, rev in ((op0, v0, reverse0), (op1, v1, reverse1)):
        if op is None:
            continue
        if bitvec and v is not None:
            v = np.asarray(v).astype(x.dtype)
        x = apply_unary(op, x) if op.is_unary_alu else apply_binary(op, x, v, reverse=rev)
    dst._write(np.asarray(x).reshape(dst.shape))
    reads = [data] + [v for v in (operand0, operand1) if isinstance(v, NkiTensor)]
    return check.record(
        eng, reads, [dst], name, op0=op0.name, op1=op1.name if op1 is not None else None
    )


def _is_zero_or_none(v) -> bool:
    if v is None:
        return True
    if isinstance(v, (bool, np.bool_, NkiTensor)) or not isinstance(
        v, (int, float, np.integer, np.floating)
    ):
        return False
    return v == 0


def _scalar_operand(check: OperandChecks, arg: str, op, v, p: int, bitvec: bool):
    """operand0/operand1 of tensor_scalar: None for unary ops; bitvec ones are ints or
    integer tiles (bit patterns), arithmetic ones fp32 scalars or fp32 tiles."""
    if op is None or op.is_unary_alu:
        return None
    if bitvec:
        if isinstance(v, NkiTensor):
            if not _int_dtype(v):
                check.fail(f"{arg} dtype", f"must be an integer dtype for bitvec {op!r}", v.dtype)
        elif isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            check.fail(
                arg, f"must be an int or an integer ({p}, 1) tile for bitvec {op!r}", repr(v)
            )
        return check.scalar_or_column(arg, v, p, fp32=False, integer=True)
    return check.scalar_or_column(arg, v, p, fp32=True)


def scalar_tensor_tensor(
    dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None
):
    """``dst = (data op0 operand0) op1 operand1`` on the Vector Engine; ``operand1`` is a tile."""
    check = OperandChecks("nisa.scalar_tensor_tensor")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    operand1 = check.tensor("operand1", operand1)
    op0 = _alu(check, "op0", op0, ("arith",))
    op1 = _alu(check, "op1", op1, ("arith",))
    check.flag("reverse0", reverse0)
    check.flag("reverse1", reverse1)
    data = check.engine_operand("data", data, "vector")
    operand1 = check.engine_operand("operand1", operand1, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data", data), ("operand1", operand1), ("dst", dst))
    check.same_free(("data", data), ("operand1", operand1), ("dst", dst))
    check.not_both_psum(("data", data), ("operand1", operand1))
    v0 = check.scalar_or_column("operand0", operand0, p, fp32=False)
    x = apply_binary(op0, data._read_f32().reshape(p, -1), v0, reverse=reverse0)
    x = apply_binary(op1, x, operand1._read_f32().reshape(p, -1), reverse=reverse1)
    dst._write(x.reshape(dst.shape))
    reads = [data, operand1] + ([operand0] if isinstance(operand0, NkiTensor) else [])
    return check.record("vector", reads, [dst], name, op0=op0.name, op1=op1.name)


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` in fp32 on the Vector Engine (more precise than ScalarE's)."""
    check = OperandChecks("nisa.reciprocal")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    with np.errstate(all="ignore"):
        out = (np.float32(1.0) / data._read_f32()).astype(np.float32)
    dst._write(out.reshape(dst.shape))
    return check.record("vector", [data], [dst], name)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """Copy ``src`` (tile or scalar) into ``dst`` where ``predicate`` is nonzero (Vector Engine)."""
    check = OperandChecks("nisa.tensor_copy_predicated")
    dst, predicate = check.tensor("dst", dst), check.tensor("predicate", predicate)
    predicate = check.engine_operand("predicate", predicate, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("predicate", predicate), ("dst", dst))
    check.same_free(("predicate", predicate), ("dst", dst))
    if predicate.dtype not in ("uint8", "uint16", "uint32"):
        check.fail("predicate dtype", "must be uint8, uint16 or uint32", predicate.dtype)
    mask = predicate._read_raw().reshape(dst.shape) != 0
    if check.flag("reverse_pred", reverse_pred):
        mask = ~mask
    reads = [predicate, dst]
    if isinstance(src, NkiTensor):
        src = check.engine_operand("src", src, "vector")
        check.same_partitions(("src", src), ("dst", dst))
        check.same_free(("src", src), ("dst", dst))
        check.not_both_psum(("src", src), ("predicate", predicate))
        if src.dtype != dst.dtype:
            check.fail(
                "src dtype", f"must equal dst dtype ({dst.dtype})", src.dtype, limit=dst.dtype
            )
        values = src._read_raw().reshape(dst.shape)
        reads.insert(0, src)
    else:
        scalar = check.scalar_or_column("src", src, p, fp32=False)
        values = dtypes.convert(
            np.full(dst.shape, scalar, dtype=np.float32), dst.dtype, dst._storage.precise_fp
        )
    dst._write(np.where(mask, values, dst._read_raw()), raw=True)
    return check.record("vector", reads, [dst], name)


# -- reductions -----------------------------------------------------------------------------------


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce ``data`` over its last free axes (never the partition axis)."""
    check = OperandChecks("nisa.tensor_reduce")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    op = _reduce_operator(check, "op", op)
    check.flag("negate", negate)
    check.flag("keepdims", keepdims)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)):
        axes = (axis,)
    elif isinstance(axis, (tuple, list)):
        axes = tuple(axis)
    else:
        axes = ()
    if not axes or not all(
        isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes
    ):
        check.fail("axis", "must be an int or a non-empty tuple of ints", axis)
    axes = tuple(sorted(int(a) + data.ndim if a < 0 else int(a) for a in axes))
    if 0 in axes:
        check.fail("axis", "must not include 0 (the partition axis cannot be reduced)", axis)
    expect = tuple(range(data.ndim - len(axes), data.ndim))
    if axes != expect:
        check.fail(
            "axis",
            f"must be the last contiguous free dims ending at dim {data.ndim - 1}",
            axis,
            limit=expect,
        )
    check.same_partitions(("data", data), ("dst", dst))
    kept = int(np.prod([data.shape[d] for d in range(1, data.ndim) if d not in axes]))
    if dst.elems_per_partition != kept:
        check.fail(
            "dst elements per partition",
            f"must equal the kept free size ({kept})",
            dst.elems_per_partition,
            limit=kept,
        )
    if op.is_bitvec:
        if negate:
            check.fail("negate", "applies only to arithmetic operators", True)
        _integer_operands(check, op, ("data", data), ("dst", dst))
        out = _reduce(op, data._read_raw(), axes)
    else:
        out = _reduce(op, data._read_f32(), axes)
        if negate:
            out = -out
    dst._write(out.reshape(dst.shape))
    return check.record("vector", [data], [dst], name, op=op.name)


def tensor_scalar_reduce(
    dst,
    data,
    op0,
    operand0,
    reduce_op,
    reduce_res=None,
    reverse0=False,
    reduce_cmd=ReduceCmd.reset_reduce,
    reduce_init=None,
    reduce_res_negate=False,
    name=None,
):
    """``dst = data op0 operand0`` plus its reduction over all free dims into the VectorE
    accumulators (``reduce_cmd``), optionally read out (negated) into ``reduce_res``."""
    check = OperandChecks("nisa.tensor_scalar_reduce")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    op0 = _alu(check, "op0", op0, ("arith", "arith_unary"))
    rop = _reduce_operator(check, "reduce_op", reduce_op, ("add", "multiply", "maximum", "minimum"))
    if check.flag("reverse0", reverse0):
        check.fail("reverse0", "is not supported yet (API doc)", True)
    check.flag("reduce_res_negate", reduce_res_negate)
    cmd = _reduce_cmd(
        check, reduce_cmd, (ReduceCmd.reset_reduce, ReduceCmd.reduce, ReduceCmd.load_reduce)
    )
    if (reduce_init is not None) != (cmd is ReduceCmd.load_reduce):
        check.fail("reduce_init", "must be set exactly when reduce_cmd is load_reduce", reduce_init)
    if op0.is_unary_alu and not _is_zero_or_none(operand0):
        check.fail("operand0", f"must be None or 0 for the unary operator {op0!r}", operand0)
    if not op0.is_unary_alu and operand0 is None:
        check.fail("operand0", f"must be set for the binary operator {op0!r}", None)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    reduce_res = _reduce_res(check, reduce_res, p)
    init = (
        check.scalar_or_column("reduce_init", reduce_init, p) if reduce_init is not None else None
    )
    x = data._read_f32().reshape(p, -1)
    if op0.is_unary_alu:
        y = apply_unary(op0, x)
    else:
        y = apply_binary(op0, x, check.scalar_or_column("operand0", operand0, p))
    _accumulate(check, p, rop, _reduce(rop, y, 1), cmd, init)
    dst._write(y.reshape(dst.shape))
    writes = [dst] + _read_out(check, reduce_res, p, reduce_res_negate)
    reads = [data] + [t for t in (operand0, reduce_init) if isinstance(t, NkiTensor)]
    return check.record(
        "vector", reads, writes, name, op0=op0.name, reduce_op=rop.name, reduce_cmd=cmd.name
    )


_CUMULATIVE_DTYPES = (
    "bfloat16",
    "float16",
    "float32",
    "float8_e4m3",
    "float8_e5m2",
    "float8_e4m3fn",
    "uint8",
    "uint16",
    "int8",
    "int16",
)


def tensor_scalar_cumulative(
    dst, src, op0, op1, imm0, imm1=None, reduce_cmd=ReduceCmd.reset_reduce, name=None
):
    """Per lane, over the flattened free elements: ``reg = op1(src[i] op0 imm0, reg)``,
    ``dst[i] = reg`` (Vector Engine); ``reg`` starts from the identity of ``op1``
    (reset_reduce), the accumulator (reduce) or ``imm1`` (load_reduce)."""
    check = OperandChecks("nisa.tensor_scalar_cumulative")
    dst, src = check.tensor("dst", dst), check.tensor("src", src)
    op0 = _alu(check, "op0", op0, ("arith",))
    op1 = _reduce_operator(check, "op1", op1, ("add", "subtract", "multiply", "maximum", "minimum"))
    cmd = _reduce_cmd(
        check, reduce_cmd, (ReduceCmd.reset_reduce, ReduceCmd.reduce, ReduceCmd.load_reduce)
    )
    if cmd is ReduceCmd.load_reduce and imm1 is None:
        check.fail("imm1", "must be set when reduce_cmd is load_reduce", None)
    src = check.engine_operand("src", src, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("src", src), ("dst", dst))
    f = check.same_free(("src", src), ("dst", dst))
    for arg, t in (("src", src), ("dst", dst)):
        if t.dtype not in _CUMULATIVE_DTYPES:
            check.fail(
                f"{arg} dtype",
                "must be bf16, fp16, fp32, fp8, uint8, uint16, int8 or int16 (no 32-bit integers)",
                t.dtype,
            )
    v0 = check.scalar_or_column("imm0", imm0, p)
    v1 = check.scalar_or_column("imm1", imm1, p) if imm1 is not None else None
    regs = check.sim.vector_regs
    if cmd is ReduceCmd.reset_reduce:
        reg = np.full(p, _IDENTITY[op1.name], dtype=np.float32)
    elif cmd is ReduceCmd.reduce:
        reg = regs[:p].copy()
    else:
        reg = np.broadcast_to(np.asarray(v1, dtype=np.float32).reshape(-1), (p,)).copy()
    t = apply_binary(op0, src._read_f32().reshape(p, f), v0)
    out = np.empty((p, f), dtype=np.float32)
    if check.compute:
        if op1.name == "subtract":  # reg = t[i] - reg: not an associative scan, one step at a time
            for i in range(f):
                reg = apply_binary(op1, t[:, i], reg)
                out[:, i] = reg
        else:  # fp32 ufunc.accumulate runs sequentially, rounding each step like the engine
            with np.errstate(all="ignore"):
                out = op1.fn2.accumulate(np.concatenate([reg[:, None], t], axis=1), axis=1)[:, 1:]
    regs[:p] = out[:, -1]
    dst._write(out.reshape(dst.shape))
    reads = [src] + [v for v in (imm0, imm1) if isinstance(v, NkiTensor)]
    return check.record(
        "vector", reads, [dst], name, op0=op0.name, op1=op1.name, reduce_cmd=cmd.name
    )


def bn_stats(dst, data, name=None):
    """Per partition: (count, mean, var*count) of the even- and the odd-indexed elements."""
    check = OperandChecks("nisa.bn_stats")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    f, fmax = data.elems_per_partition, check.target.bn_stats_fmax
    if f > fmax:
        check.fail("data free size", f"must be <= {fmax} (bn_stats_fmax)", f, limit=fmax)
    if dst.elems_per_partition != 6:
        check.fail("dst elements per partition", "must be 6", dst.elems_per_partition, limit=6)
    x = data._read_f32().reshape(p, f).astype(np.float64)
    out = np.zeros((p, 6), dtype=np.float64)
    for slot, part in ((0, x[:, 0::2]), (3, x[:, 1::2])):
        n = part.shape[1]
        if n:
            mean = part.mean(axis=1)
            out[:, slot] = n
            out[:, slot + 1] = mean
            out[:, slot + 2] = ((part - mean[:, None]) ** 2).sum(axis=1)
    dst._write(out.astype(np.float32).reshape(dst.shape))
    return check.record("vector", [data], [dst], name)


def bn_aggr(dst, data, name=None):
    """Combine ``bn_stats`` (count, mean, var*count) triples into mean and variance."""
    check = OperandChecks("nisa.bn_aggr")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    f = data.elems_per_partition
    if f % 3:
        check.fail(
            "data elements per partition",
            "must be a multiple of 3 (count, mean, var*count)",
            f,
            limit=3,
        )
    if dst.elems_per_partition != 2:
        check.fail(
            "dst elements per partition",
            "must be 2 (mean, variance)",
            dst.elems_per_partition,
            limit=2,
        )
    t = data._read_f32().reshape(p, f // 3, 3).astype(np.float64)
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = count.sum(axis=1)
    with np.errstate(all="ignore"):
        mu = (count * mean).sum(axis=1) / total
        var = (m2.sum(axis=1) + (count * (mean - mu[:, None]) ** 2).sum(axis=1)) / total
    dst._write(np.stack([mu, var], axis=1).astype(np.float32).reshape(dst.shape))
    return check.record("vector", [data], [dst], name)


def tensor_tensor_scan(
    dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None
):
    """Per-partition scan: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])``, ``r[-1] = initial``."""
    check = OperandChecks("nisa.tensor_tensor_scan")
    dst = check.tensor("dst", dst)
    data0, data1 = check.tensor("data0", data0), check.tensor("data1", data1)
    op0 = _alu(check, "op0", op0, ("arith",))
    op1 = _alu(check, "op1", op1, ("arith",))
    check.flag("reverse0", reverse0)
    check.flag("reverse1", reverse1)
    data0 = check.engine_operand("data0", data0, "vector")
    data1 = check.engine_operand("data1", data1, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data0", data0), ("data1", data1), ("dst", dst))
    f = check.same_free(("data0", data0), ("data1", data1), ("dst", dst))
    check.not_both_psum(("data0", data0), ("data1", data1))
    # A compile-time initial is fp32; the docs give no dtype rule for a (P, 1) tile.
    init = check.scalar_or_column("initial", initial, p, fp32=False)
    out = np.empty((p, f), dtype=np.float32)
    if check.compute:
        a, b = data0._read_f32().reshape(p, f), data1._read_f32().reshape(p, f)
        prev = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (p,)).copy()
        for i in range(f):
            t = apply_binary(op0, a[:, i], prev, reverse=reverse0)
            prev = apply_binary(op1, t, b[:, i], reverse=reverse1)
            out[:, i] = prev
    dst._write(out.reshape(dst.shape))
    reads = [data0, data1] + ([initial] if isinstance(initial, NkiTensor) else [])
    return check.record("vector", reads, [dst], name, op0=op0.name, op1=op1.name)


# -- selection and exponentials with accumulators ------------------------------------------------


def exponential(
    dst, src, max_value=0.0, reduce_res=None, reduce_cmd=ReduceCmd.idle, reduce_init=0.0, name=None
):
    """``dst = exp(src - max_value)`` on the Vector Engine (NeuronCore-v4), with an optional
    running sum in the VectorE accumulators (``reduce_cmd``) read out into ``reduce_res``."""
    check = OperandChecks("nisa.exponential")
    check.needs_nc_version(4)
    dst, src = check.tensor("dst", dst), check.tensor("src", src)
    cmd = _reduce_cmd(
        check,
        reduce_cmd,
        (ReduceCmd.idle, ReduceCmd.reset_reduce, ReduceCmd.reduce, ReduceCmd.load_reduce),
    )
    src = check.engine_operand("src", src, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("src", src), ("dst", dst))
    check.same_free(("src", src), ("dst", dst))
    for arg, t in (("src", src), ("dst", dst)):
        if t.ndim > 4:
            check.fail(f"{arg} rank", "must be at most 4 (up to 4D tensors)", t.ndim, limit=4)
    if src.dtype not in _EXP_SRC:
        check.fail("src dtype", f"must be one of {', '.join(_EXP_SRC)}", src.dtype)
    if dst.dtype not in _EXP_DST:
        check.fail("dst dtype", f"must be one of {', '.join(_EXP_DST)}", dst.dtype)
    reduce_res = _reduce_res(check, reduce_res, p)
    if reduce_res is not None and reduce_res.dtype not in _EXP_RES:
        check.fail("reduce_res dtype", f"must be one of {', '.join(_EXP_RES)}", reduce_res.dtype)
    if cmd is not ReduceCmd.load_reduce and not _is_zero_or_none(reduce_init):
        check.fail(
            "reduce_init", "must be unset or 0.0 unless reduce_cmd is load_reduce", reduce_init
        )
    m = check.scalar_or_column("max_value", max_value, p)
    init = check.scalar_or_column("reduce_init", reduce_init, p)
    with np.errstate(all="ignore"):
        y = np.exp((src._read_f32().reshape(p, -1) - m).astype(np.float32).astype(np.float64))
    y = y.astype(np.float32)
    _accumulate(check, p, OPERATORS["add"], _reduce(OPERATORS["add"], y, 1), cmd, init)
    dst._write(y.reshape(dst.shape))
    writes = [dst] + _read_out(check, reduce_res, p)
    reads = [src] + [t for t in (max_value, reduce_init) if isinstance(t, NkiTensor)]
    return check.record("vector", reads, writes, name, reduce_cmd=cmd.name)


_EXP_SRC = (
    "float8_e4m3",
    "float8_e5m2",
    "float16",
    "bfloat16",
    "float32",
    "int8",
    "int16",
    "int32",
    "uint8",
    "uint16",
    "uint32",
)
_EXP_DST = (
    "float8_e4m3",
    "float8_e5m2",
    "float16",
    "bfloat16",
    "float32",
    "tfloat32",
    "int8",
    "int16",
    "int32",
    "uint8",
    "uint16",
)
_EXP_RES = ("float8_e4m3", "float8_e5m2", "float16", "bfloat16", "float32", "tfloat32")


def range_select(
    dst,
    on_true_tile,
    comp_op0,
    comp_op1,
    bound0,
    bound1,
    reduce_cmd=ReduceCmd.reset_reduce,
    reduce_res=None,
    reduce_op=OPERATORS["maximum"],
    range_start=0,
    on_false_value=FP32_MIN,
    name=None,
):
    """Keep ``on_true_tile`` where ``comp_op0(i, bound0) and comp_op1(i, bound1)`` for the
    fp32 index ``i = range_start + free index``, else FP32_MIN; max-reduce the result into
    the VectorE accumulators (NeuronCore-v3+)."""
    check = OperandChecks("nisa.range_select")
    check.needs_nc_version(3)
    dst, on_true = check.tensor("dst", dst), check.tensor("on_true_tile", on_true_tile)
    ops = []
    for arg, op in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        if not isinstance(op, Operator) or op.name not in _COMPARES:
            check.fail(arg, "must be one of " + ", ".join(f"nl.{c}" for c in _COMPARES), repr(op))
        ops.append(op)
    rop = _reduce_operator(check, "reduce_op", reduce_op, ("maximum",))
    cmd = _reduce_cmd(check, reduce_cmd, (ReduceCmd.idle, ReduceCmd.reset_reduce, ReduceCmd.reduce))
    if isinstance(range_start, (bool, np.bool_)) or not isinstance(range_start, (int, np.integer)):
        check.fail("range_start", "must be a compile-time int", repr(range_start))
    if (
        isinstance(on_false_value, (bool, np.bool_, NkiTensor))
        or not isinstance(on_false_value, (int, float, np.integer, np.floating))
        or np.float32(on_false_value) != np.float32(FP32_MIN)
    ):
        check.fail(
            "on_false_value",
            f"must be FP32_MIN ({FP32_MIN!r}), a hardware constraint",
            repr(on_false_value),
            limit=FP32_MIN,
        )
    on_true = check.engine_operand("on_true_tile", on_true, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("on_true_tile", on_true), ("dst", dst))
    f = check.same_free(("on_true_tile", on_true), ("dst", dst))
    if not dtypes.info(on_true.dtype).is_float:
        check.fail("on_true_tile dtype", "must be a floating-point dtype", on_true.dtype)
    lo, hi = int(range_start), int(range_start) + f - 1
    if not (-(2**24) <= lo and hi <= 2**24):
        check.fail(
            "range_start",
            "must keep range_start + free index within 2^24 (exact in fp32)",
            (lo, hi),
            limit=2**24,
        )
    b0 = check.scalar_or_column("bound0", bound0, p, allow_scalar=False)
    b1 = check.scalar_or_column("bound1", bound1, p, allow_scalar=False)
    reduce_res = _reduce_res(check, reduce_res, p)
    idx = (np.float32(range_start) + np.arange(f, dtype=np.float32))[None, :]
    keep = (ops[0].fn2(idx, b0) != 0) & (ops[1].fn2(idx, b1) != 0)
    y = np.where(keep, on_true._read_f32().reshape(p, f), np.float32(FP32_MIN)).astype(np.float32)
    _accumulate(check, p, rop, _reduce(rop, y, 1), cmd)
    dst._write(y.reshape(dst.shape))
    writes = [dst] + _read_out(check, reduce_res, p)
    return check.record("vector", [on_true, bound0, bound1], writes, name, reduce_cmd=cmd.name)


def select_reduce(
    dst,
    predicate,
    on_true,
    on_false,
    reduce_res=None,
    reduce_cmd=ReduceCmd.idle,
    reduce_op=OPERATORS["maximum"],
    reverse_pred=False,
    name=None,
):
    """``dst = where(predicate, on_true, on_false)`` (Vector Engine) with an optional max
    reduction into the VectorE accumulators; ``on_false`` is an fp32 scalar or ``(P, 1)``."""
    check = OperandChecks("nisa.select_reduce")
    dst, predicate = check.tensor("dst", dst), check.tensor("predicate", predicate)
    on_true = check.tensor("on_true", on_true)
    rop = _reduce_operator(check, "reduce_op", reduce_op, ("maximum",))
    cmd = _reduce_cmd(check, reduce_cmd, (ReduceCmd.idle, ReduceCmd.reset_reduce, ReduceCmd.reduce))
    reverse = check.flag("reverse_pred", reverse_pred)
    predicate = check.engine_operand("predicate", predicate, "vector")
    on_true = check.engine_operand("on_true", on_true, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("on_true", on_true), ("predicate", predicate), ("dst", dst))
    f = check.same_free(("on_true", on_true), ("predicate", predicate), ("dst", dst))
    check.not_both_psum(("on_true", on_true), ("predicate", predicate))
    if on_true.dtype in ("tfloat32", "int32", "uint32"):
        check.fail("on_true dtype", "must not be tfloat32, int32 or uint32", on_true.dtype)
    if predicate.dtype not in ("int8", "uint8", "int16", "uint16"):
        check.fail("predicate dtype", "must be int8, uint8, int16 or uint16", predicate.dtype)
    reduce_res = _reduce_res(check, reduce_res, p)
    if reduce_res is not None and not dtypes.info(reduce_res.dtype).is_float:
        check.fail("reduce_res dtype", "must be a floating-point dtype", reduce_res.dtype)
    off = check.scalar_or_column("on_false", on_false, p, fp32=False)
    mask = predicate._read_raw().reshape(p, f) != 0
    if reverse:
        mask = ~mask
    y = np.where(mask, on_true._read_f32().reshape(p, f), off).astype(np.float32)
    _accumulate(check, p, rop, _reduce(rop, y, 1), cmd)
    dst._write(y.reshape(dst.shape))
    writes = [dst] + _read_out(check, reduce_res, p)
    reads = [predicate, on_true] + ([on_false] if isinstance(on_false, NkiTensor) else [])
    return check.record("vector", reads, writes, name, reduce_cmd=cmd.name)


def max8(dst, src, name=None):
    """The 8 largest values of each partition of ``src`` (8..16384 elements, up to 3-D),
    in descending order, into a 2-D ``[P, 8]`` ``dst`` (Vector Engine, fp32 compare)."""
    check = OperandChecks("nisa.max8")
    dst, src = check.tensor("dst", dst), check.tensor("src", src)
    src = check.engine_operand("src", src, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("src", src), ("dst", dst))
    if src.ndim > 3:
        check.fail("src rank", "must be at most 3", src.ndim, limit=3)
    f = src.elems_per_partition
    if not 8 <= f <= 16384:
        check.fail("src elements per partition", "must be in 8..16384", f, limit=(8, 16384))
    if dst.ndim != 2 or dst.shape[1] != 8:
        check.fail("dst shape", f"must be ({p}, 8)", dst.shape, limit=(p, 8))
    x = src._read_f32().reshape(p, f)
    top = -np.sort(-x, axis=1)[:, :8]
    dst._write(top.reshape(dst.shape))
    return check.record("vector", [src], [dst], name)
