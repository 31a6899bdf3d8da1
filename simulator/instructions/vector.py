"""Vector Engine instructions (some may also run on GpSimd or Scalar Engine).

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py. Arithmetic converts inputs
to fp32, computes in fp32 and converts to ``dst.dtype`` on write; bitvec operators work on
integer bit patterns; all-int32/uint32 ``tensor_tensor`` defaults to GpSimd's exact integers.
Reductions accumulate in fp64 and round once to fp32 (the hardware's fp32 running sum is
within a few fp32 ulps of that).
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.simulator import dtypes
from neuron_kernels.simulator.enums import engine as Engine
from neuron_kernels.simulator.enums import reduce_cmd as ReduceCmd
from neuron_kernels.simulator.instructions._common import Check, apply_binary, apply_unary
from neuron_kernels.simulator.operators import REDUCTION_ALIASES, Operator
from neuron_kernels.simulator.tensor import MemoryRegion, NkiTensor

__all__ = [
    "tensor_copy",
    "memset",
    "tensor_tensor",
    "tensor_scalar",
    "scalar_tensor_tensor",
    "tensor_reduce",
    "tensor_scalar_reduce",
    "reciprocal",
    "bn_stats",
    "bn_aggr",
    "tensor_tensor_scan",
    "tensor_copy_predicated",
]

_INT32 = {"int32", "uint32"}


def _is_psum(t: NkiTensor) -> bool:
    return t.buffer is MemoryRegion.psum


def _int_dtype(t: NkiTensor) -> bool:
    return dtypes.info(t.dtype).is_integer


def _reduce_operator(check: Check, arg: str, op) -> Operator:
    if isinstance(op, Operator) and op.name in REDUCTION_ALIASES:
        op = REDUCTION_ALIASES[op.name]
    if not isinstance(op, Operator) or not op.reducible:
        legal = "add, subtract, multiply, maximum, minimum, logical_and/or/xor, bitwise_and/or/xor"
        check.fail(arg, f"must be a reduction operator ({legal})", repr(op))
    return op


def _reduce(op: Operator, x: np.ndarray, axis) -> np.ndarray:
    """Reduce ``x`` with ``op`` over ``axis`` (fp64 accumulation for arithmetic ops)."""
    name = op.name
    if op.is_bitvec:
        fn = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}[name]
        return fn.reduce(x, axis=axis)
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
    return r.astype(np.float32)


def _move_reduced_last(x: np.ndarray, axis) -> np.ndarray:
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    keep = [d for d in range(x.ndim) if d not in axes]
    return x.transpose(keep + list(axes)).reshape([x.shape[d] for d in keep] + [-1])


def _identity(op: Operator) -> float:
    return {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}[op.name]


def tensor_copy(dst, src, engine=Engine.unknown, name=None):
    """Copy an on-chip tile (Vector, Scalar or GpSimd Engine).

    Vector/GpSimd copy bit-exactly when dtypes match and through fp32 otherwise; Scalar
    Engine always goes through fp32.
    """
    check = Check("nisa.tensor_copy")
    dst, src = check.tensor("dst", dst), check.tensor("src", src)
    default = "vector"
    eng = check.engine(engine, ("vector", "scalar", "gpsimd"), default)
    if eng == "scalar" and check.target.nc_version <= 2:
        check.fail("engine", "must not be the Scalar Engine on NeuronCore-v2 (use nisa.activation(op=nl.copy))",
                   "nisa.engine.scalar")
    src = check.engine_operand("src", src, eng)
    dst = check.engine_operand("dst", dst, eng, write=True)
    check.same_partitions(("src", src), ("dst", dst))
    check.same_free(("src", src), ("dst", dst))
    if eng != "scalar" and src.dtype == dst.dtype:
        dst._write(src._read_raw().reshape(dst.shape), raw=True)
    else:
        dst._write(src._read_f32().reshape(dst.shape))
    return check.record(eng, [src], [dst], name)


def memset(dst, value, engine=Engine.unknown, name=None):
    """Fill ``dst`` with a compile-time constant (Vector or GpSimd Engine)."""
    check = Check("nisa.memset")
    dst = check.tensor("dst", dst)
    eng = check.engine(engine, ("vector", "gpsimd"), "vector")
    dst = check.engine_operand("dst", dst, eng, write=True)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        check.fail("value", "must be a compile-time number", repr(value))
    if _int_dtype(dst):
        if isinstance(value, (float, np.floating)):
            check.fail("value", f"must be an int literal for the integer dtype {dst.dtype}", value)
        dst._write(np.full(dst.shape, int(value), dtype=np.int64))
    else:
        dst._write(np.full(dst.shape, np.float32(value), dtype=np.float32))
    return check.record(eng, [], [dst], name)


def tensor_tensor(dst, data1, data2, op, engine=Engine.unknown, name=None):
    """``dst = data1 op data2`` element-wise (Vector Engine; GpSimd for nl.power and int32)."""
    check = Check("nisa.tensor_tensor")
    dst, data1, data2 = check.tensor("dst", dst), check.tensor("data1", data1), check.tensor("data2", data2)
    op = check.operator("op", op, kinds=("arith", "bitvec"))
    any_psum = _is_psum(dst) or _is_psum(data1) or _is_psum(data2)
    all_int32 = all(t.dtype in _INT32 for t in (dst, data1, data2))
    if op.name == "power":
        default = "gpsimd"
    elif all_int32 and not any_psum and not op.is_bitvec:
        default = "gpsimd"
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
        for arg, t in (("data1", data1), ("data2", data2), ("dst", dst)):
            if not _int_dtype(t):
                check.fail(f"{arg} dtype", f"must be an integer dtype for bitvec {op!r}", t.dtype)
        a, b = data1._read_raw(), data2._read_raw().astype(data1._np_dtype())
        out = apply_binary(op, a.reshape(dst.shape), b.reshape(dst.shape))
    elif eng == "gpsimd" and all_int32:
        a = data1._read_raw().astype(np.int64).reshape(dst.shape)
        b = data2._read_raw().astype(np.int64).reshape(dst.shape)
        with np.errstate(all="ignore"):
            out = op.fn2(a, b)
        out = out.astype(np.int64) if out.dtype.kind != "f" else out
        if out.dtype.kind == "i":
            out = out.astype(np.uint64).astype(dst._np_dtype()) if dst.dtype == "uint32" else out.astype(np.int32)
            dst._write(out, raw=True)
            return check.record(eng, [data1, data2], [dst], name, op=op.name)
    else:
        out = apply_binary(op, data1._read_f32().reshape(dst.shape), data2._read_f32().reshape(dst.shape))
    dst._write(out)
    return check.record(eng, [data1, data2], [dst], name, op=op.name)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=Engine.unknown, name=None):
    """``dst = (data op0 operand0) op1 operand1`` with scalar or ``(P, 1)`` operands."""
    check = Check("nisa.tensor_scalar")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    op0 = check.operator("op0", op0, kinds=("arith", "bitvec", "arith_unary", "bitvec_unary"))
    if op1 is None and operand1 is not None:
        check.fail("operand1", "must be None when op1 is unused", operand1)
    if op1 is not None:
        op1 = check.operator("op1", op1, kinds=("arith", "bitvec", "arith_unary", "bitvec_unary"))
        if op0.is_bitvec != op1.is_bitvec:
            check.fail("op1", f"must be of the same class as op0 ({'bitvec' if op0.is_bitvec else 'arithmetic'})",
                       repr(op1))
    for op, operand, arg in ((op0, operand0, "operand0"), (op1, operand1, "operand1")):
        if op is not None and op.is_unary_alu and operand not in (None, 0, 0.0):
            check.fail(arg, f"must be None or 0 for the unary operator {op!r}", operand)
        if op is not None and not op.is_unary_alu and operand is None:
            check.fail(arg, f"must be set for the binary operator {op!r}", None)
    check.flag("reverse0", reverse0)
    check.flag("reverse1", reverse1)
    default = "gpsimd" if op0.name == "rsqrt" and not (_is_psum(dst) or _is_psum(data)) else "vector"
    eng = check.engine(engine, ("vector", "scalar", "gpsimd"), default)
    if eng == "gpsimd" and op0.name != "rsqrt":
        check.fail("engine", "may be the GpSimd Engine only for nl.rsqrt", f"nisa.engine.gpsimd with {op0!r}")
    if op0.is_bitvec and eng != "vector":
        check.fail("engine", "must be the Vector Engine for bitvec operators", f"nisa.engine.{eng}")
    if eng == "scalar" and check.target.nc_version <= 3:
        combo = (op0.name, op1.name if op1 is not None else None)
        allowed = {("multiply", "add"), ("multiply", None), ("add", None)}
        if combo not in allowed:
            check.fail("op0/op1", f"must be one of {sorted(allowed, key=str)} on the Scalar Engine "
                       f"({check.target.name})", combo)
    data = check.engine_operand("data", data, eng)
    dst = check.engine_operand("dst", dst, eng, write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    bitvec = op0.is_bitvec
    if bitvec:
        for arg, t in (("data", data), ("dst", dst)):
            if not _int_dtype(t):
                check.fail(f"{arg} dtype", "must be an integer dtype for bitvec operators", t.dtype)

    def operand(arg, op, v):
        if op is None or op.is_unary_alu:
            return None
        return check.scalar_or_column(arg, v, p, fp32=not bitvec, integer=bitvec)

    v0, v1 = operand("operand0", op0, operand0), operand("operand1", op1, operand1)
    x = data._read_raw().reshape(p, -1) if bitvec else data._read_f32().reshape(p, -1)
    if bitvec and v0 is not None:
        v0 = np.asarray(v0).astype(x.dtype)
    x = apply_unary(op0, x) if op0.is_unary_alu else apply_binary(op0, x, v0, reverse=reverse0)
    if op1 is not None:
        if bitvec and v1 is not None:
            v1 = np.asarray(v1).astype(x.dtype)
        x = apply_unary(op1, x) if op1.is_unary_alu else apply_binary(op1, x, v1, reverse=reverse1)
    dst._write(np.asarray(x).reshape(dst.shape))
    reads = [data] + [v for v in (operand0, operand1) if isinstance(v, NkiTensor)]
    return check.record(eng, reads, [dst], name, op0=op0.name, op1=op1.name if op1 is not None else None)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """``dst = (data op0 operand0) op1 operand1`` on the Vector Engine; ``operand1`` is a tile."""
    check = Check("nisa.scalar_tensor_tensor")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    operand1 = check.tensor("operand1", operand1)
    op0 = check.operator("op0", op0, kinds=("arith",))
    op1 = check.operator("op1", op1, kinds=("arith",))
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


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce ``data`` over its last free axes (never the partition axis)."""
    check = Check("nisa.tensor_reduce")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    op = _reduce_operator(check, "op", op)
    check.flag("negate", negate)
    check.flag("keepdims", keepdims)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis) if isinstance(axis, (tuple, list)) else None
    if not axes or not all(isinstance(a, (int, np.integer)) for a in axes):
        check.fail("axis", "must be an int or a tuple of ints", axis)
    axes = tuple(sorted(int(a) % data.ndim if a < 0 else int(a) for a in axes))
    if 0 in axes:
        check.fail("axis", "must not include 0 (the partition axis cannot be reduced)", axis)
    expect = tuple(range(data.ndim - len(axes), data.ndim))
    if axes != expect or max(axes) >= data.ndim:
        check.fail("axis", f"must be the last contiguous free dims ending at dim {data.ndim - 1}", axis,
                   limit=expect)
    check.same_partitions(("data", data), ("dst", dst))
    kept = int(np.prod([data.shape[d] for d in range(1, data.ndim) if d not in axes]))
    if dst.elems_per_partition != kept:
        check.fail("dst elements per partition", f"must equal the kept free size ({kept})",
                   dst.elems_per_partition, limit=kept)
    if op.is_bitvec:
        if negate:
            check.fail("negate", "applies only to arithmetic operators", True)
        for arg, t in (("data", data), ("dst", dst)):
            if not _int_dtype(t):
                check.fail(f"{arg} dtype", f"must be an integer dtype for bitvec {op!r}", t.dtype)
        out = _reduce(op, data._read_raw(), axes)
        dst._write(out.reshape(dst.shape))
    else:
        out = _reduce(op, data._read_f32(), axes)
        if negate:
            out = -out
        dst._write(out.reshape(dst.shape))
    return check.record("vector", [data], [dst], name, op=op.name)


def _accumulate(check: Check, regs: np.ndarray, p: int, op: Operator, partial: np.ndarray, cmd, init):
    if cmd is ReduceCmd.reset_reduce:
        regs[:p] = partial
    elif cmd is ReduceCmd.reduce:
        regs[:p] = apply_binary(op, regs[:p], partial)
    elif cmd is ReduceCmd.load_reduce:
        regs[:p] = apply_binary(op, np.broadcast_to(init, (p, 1)).reshape(p).astype(np.float32), partial)
    else:
        check.fail("reduce_cmd", "must be reset_reduce, reduce or load_reduce", f"nisa.reduce_cmd.{cmd.name}")


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=ReduceCmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    """``dst = data op0 operand0`` and a reduction of it over the free dims (Vector Engine)."""
    check = Check("nisa.tensor_scalar_reduce")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    op0 = check.operator("op0", op0, kinds=("arith", "arith_unary"))
    rop = _reduce_operator(check, "reduce_op", reduce_op)
    if rop.name not in ("add", "multiply", "maximum", "minimum"):
        check.fail("reduce_op", "must be nl.add, nl.multiply, nl.max or nl.min", repr(reduce_op))
    if check.flag("reverse0", reverse0):
        check.fail("reverse0", "is not supported yet (API doc)", True)
    check.flag("reduce_res_negate", reduce_res_negate)
    if not isinstance(reduce_cmd, ReduceCmd):
        check.fail("reduce_cmd", "must be an nisa.reduce_cmd member", repr(reduce_cmd))
    if reduce_cmd not in (ReduceCmd.reset_reduce, ReduceCmd.reduce, ReduceCmd.load_reduce):
        check.fail("reduce_cmd", "must be reset_reduce, reduce or load_reduce", f"nisa.reduce_cmd.{reduce_cmd.name}")
    if (reduce_init is not None) != (reduce_cmd is ReduceCmd.load_reduce):
        check.fail("reduce_init", "must be set exactly when reduce_cmd is load_reduce", reduce_init)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    if reduce_res is not None:
        reduce_res = check.engine_operand("reduce_res", reduce_res, "vector", write=True)
        if reduce_res.partitions != p or reduce_res.elems_per_partition != 1:
            check.fail("reduce_res shape", f"must be ({p}, 1)", reduce_res.shape)
    init = check.scalar_or_column("reduce_init", reduce_init, p) if reduce_init is not None else None
    x = data._read_f32().reshape(p, -1)
    if op0.is_unary_alu:
        if operand0 not in (None, 0, 0.0):
            check.fail("operand0", f"must be None or 0 for the unary operator {op0!r}", operand0)
        y = apply_unary(op0, x)
    else:
        y = apply_binary(op0, x, check.scalar_or_column("operand0", operand0, p))
    partial = _reduce(rop, y, 1)
    regs = check.sim.vector_regs
    _accumulate(check, regs, p, rop, partial, reduce_cmd, init)
    dst._write(y.reshape(dst.shape))
    writes = [dst]
    if reduce_res is not None:
        out = regs[:p].reshape(p, 1)
        reduce_res._write(-out if reduce_res_negate else out)
        writes.append(reduce_res)
    reads = [data] + ([operand0] if isinstance(operand0, NkiTensor) else [])
    return check.record("vector", reads, writes, name, op0=op0.name, reduce_op=rop.name)


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` in fp32 on the Vector Engine (more precise than ScalarE's)."""
    check = Check("nisa.reciprocal")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    with np.errstate(all="ignore"):
        out = (np.float32(1.0) / data._read_f32()).astype(np.float32)
    dst._write(out.reshape(dst.shape))
    return check.record("vector", [data], [dst], name)


def bn_stats(dst, data, name=None):
    """Per partition: (count, mean, var*count) of the even- and the odd-indexed elements."""
    check = Check("nisa.bn_stats")
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
    check = Check("nisa.bn_aggr")
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    data = check.engine_operand("data", data, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    f = data.elems_per_partition
    if f % 3:
        check.fail("data elements per partition", "must be a multiple of 3 (count, mean, var*count)", f)
    if dst.elems_per_partition != 2:
        check.fail("dst elements per partition", "must be 2 (mean, variance)", dst.elems_per_partition, limit=2)
    t = data._read_f32().reshape(p, f // 3, 3).astype(np.float64)
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = count.sum(axis=1)
    with np.errstate(all="ignore"):
        mu = (count * mean).sum(axis=1) / total
        var = (m2.sum(axis=1) + (count * (mean - mu[:, None]) ** 2).sum(axis=1)) / total
    dst._write(np.stack([mu, var], axis=1).astype(np.float32).reshape(dst.shape))
    return check.record("vector", [data], [dst], name)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Per-partition scan: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])``, ``r[-1] = initial``."""
    check = Check("nisa.tensor_tensor_scan")
    dst = check.tensor("dst", dst)
    data0, data1 = check.tensor("data0", data0), check.tensor("data1", data1)
    op0 = check.operator("op0", op0, kinds=("arith",))
    op1 = check.operator("op1", op1, kinds=("arith",))
    check.flag("reverse0", reverse0)
    check.flag("reverse1", reverse1)
    data0 = check.engine_operand("data0", data0, "vector")
    data1 = check.engine_operand("data1", data1, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data0", data0), ("data1", data1), ("dst", dst))
    f = check.same_free(("data0", data0), ("data1", data1), ("dst", dst))
    check.not_both_psum(("data0", data0), ("data1", data1))
    init = check.scalar_or_column("initial", initial, p)
    a, b = data0._read_f32().reshape(p, f), data1._read_f32().reshape(p, f)
    out = np.empty((p, f), dtype=np.float32)
    prev = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (p,)).copy()
    for i in range(f):
        t = apply_binary(op0, a[:, i], prev, reverse=reverse0)
        prev = apply_binary(op1, t, b[:, i], reverse=reverse1)
        out[:, i] = prev
    dst._write(out.reshape(dst.shape))
    reads = [data0, data1] + ([initial] if isinstance(initial, NkiTensor) else [])
    return check.record("vector", reads, [dst], name, op0=op0.name, op1=op1.name)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """Copy ``src`` (tile or scalar) into ``dst`` where ``predicate`` is nonzero (Vector Engine)."""
    check = Check("nisa.tensor_copy_predicated")
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
    current = dst._read_raw()
    reads = [predicate, dst]
    if isinstance(src, NkiTensor):
        src = check.engine_operand("src", src, "vector")
        check.same_partitions(("src", src), ("dst", dst))
        check.same_free(("src", src), ("dst", dst))
        check.not_both_psum(("src", src), ("predicate", predicate))
        if src.dtype != dst.dtype:
            check.fail("src dtype", f"must equal dst dtype ({dst.dtype})", src.dtype)
        values = src._read_raw().reshape(dst.shape)
        reads.insert(0, src)
    else:
        scalar = check.scalar_or_column("src", src, p, fp32=False)
        values = dtypes.convert(np.full(dst.shape, scalar, dtype=np.float32), dst.dtype, dst._storage.precise_fp)
    dst._write(np.where(mask, values, current), raw=True)
    return check.record("vector", reads, [dst], name)
