"""Search instructions: ``nisa.nc_find_index8`` and ``nisa.nonzero_with_count``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py. ``nc_find_index8`` runs on
the Vector Engine, like the ``max8`` it pairs with (its docstring names no engine; the cost
model gives it one Vector pass over ``data``); ``nonzero_with_count`` is a GpSimd
instruction that only touches partitions 0, 16, ..., 112 (one per GpSimd core).
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter.instructions._common import SBUF, OperandChecks

__all__ = ["nc_find_index8", "nonzero_with_count"]

_NOT_FOUND = {"uint32": 0xFFFFFFFF, "uint16": 0xFFFF}


def nc_find_index8(dst, data, vals, name=None):
    """Index of the first occurrence of each of the 8 ``vals`` of a partition in that
    partition of ``data`` (fp32 compare), all-ones where absent, into a [P, 8] uint16/uint32."""
    check = OperandChecks("nisa.nc_find_index8")
    dst, data, vals = (
        check.tensor("dst", dst),
        check.tensor("data", data),
        check.tensor("vals", vals),
    )
    data = check.engine_operand("data", data, "vector")
    vals = check.engine_operand("vals", vals, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    p = check.same_partitions(("data", data), ("vals", vals), ("dst", dst))
    for arg, t in (("data", data), ("vals", vals)):
        if t.ndim > 3:
            check.fail(f"{arg} rank", "must be at most 3", t.ndim, limit=3)
    f = data.elems_per_partition
    if not 8 <= f <= 16384:
        check.fail("data elements per partition", "must be in 8..16384", f, limit=(8, 16384))
    if vals.elems_per_partition != 8:
        check.fail("vals elements per partition", "must be 8", vals.elems_per_partition, limit=8)
    if dst.ndim != 2 or dst.shape[1] != 8:
        check.fail("dst shape", f"must be ({p}, 8)", dst.shape, limit=(p, 8))
    if dst.dtype not in _NOT_FOUND:
        check.fail("dst dtype", "must be uint16 or uint32", dst.dtype)
    if check.compute:
        x = data._read_f32().reshape(p, 1, f)
        v = vals._read_f32().reshape(p, 8, 1)
        hit = x == v
        first = hit.argmax(axis=2).astype(np.int64)
        first[~hit.any(axis=2)] = _NOT_FOUND[dst.dtype]
        dst._write(first.reshape(dst.shape), raw=False)
    else:
        dst._write(None)
    return check.record("vector", [data, vals], [dst], name)


def _int32_arg(check: OperandChecks, arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        check.fail(arg, "must be an int32", repr(value))
    if not -(2**31) <= int(value) < 2**31:
        check.fail(arg, "must fit an int32", value, limit=(-(2**31), 2**31 - 1))
    return int(value)


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Per GpSimd core's first partition (0, 16, ..., 112): the indices (+ ``index_offset``)
    of ``src``'s nonzero elements, then ``padding_val``, then the count; other partitions
    of ``dst`` are untouched (NeuronCore-v3+)."""
    check = OperandChecks("nisa.nonzero_with_count")
    dst, src = check.tensor("dst", dst), check.tensor("src", src)
    check.needs_nc_version(3)
    check.buffer("src", src, SBUF)
    check.buffer("dst", dst, SBUF)
    src = check.engine_operand("src", src, "gpsimd")
    dst = check.engine_operand("dst", dst, "gpsimd", write=True)
    p = check.same_partitions(("src", src), ("dst", dst))
    if src.dtype not in ("float32", "int32"):
        check.fail("src dtype", "must be float32 or int32", src.dtype)
    if dst.dtype != "int32":
        check.fail("dst dtype", "must be int32", dst.dtype, limit="int32")
    t = src.elems_per_partition
    if dst.elems_per_partition != t + 1:
        check.fail(
            "dst elements per partition",
            f"must be src's + 1 ({t + 1}): the last slot holds the count",
            dst.elems_per_partition,
            limit=t + 1,
        )
    offset = _int32_arg(check, "index_offset", index_offset)
    padding = _int32_arg(check, "padding_val", padding_val)
    if check.compute:
        x = src._read_raw().reshape(p, t)
        out = dst._read_raw().reshape(p, t + 1).astype(np.int64)
        for row in range(0, p, 16):  # one GpSimd core per 16 partitions, its 0-th only
            found = np.flatnonzero(x[row] != 0)
            out[row, :] = padding
            out[row, : found.size] = found + offset
            out[row, t] = found.size
        dst._write(out.reshape(dst.shape), raw=False)
    else:
        dst._write(None)
    return check.record("gpsimd", [src, dst], [dst], name)
