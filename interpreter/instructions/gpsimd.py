"""GpSimd Engine instructions: ``nisa.iota``, ``nisa.affine_select`` and
``nisa.tensor_partition_reduce``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py. iota and affine_select
evaluate ``offset + partition * channel_multiplier + sum(index_i * step_i)`` in int32 over
an up-to-4-D ``[[step, num], ...]`` pattern. GpSimd cannot access PSUM.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.instructions._common import OperandChecks
from neuron_kernels.interpreter.operators import OPERATORS, Operator
from neuron_kernels.interpreter.values import INT32_MAX, INT32_MIN, nki_float, nki_int

__all__ = ["affine_select", "iota", "tensor_partition_reduce"]

_COMPARISONS = ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal")


def _affine(
    check: OperandChecks, pattern, offset, channel_multiplier, partitions: int, free: int
) -> np.ndarray:
    """The int32 affine value for each (partition, flattened free index).

    Every step and num is an NKI int (interpreter/values.py): the stub's pattern is "a list
    of [step, num]" evaluated in int32, and the guide's integers are "32-bit integer values"
    (nki-language-guide.rst 'NKI Values'), so a non-int or out-of-int32 entry is refused
    naming it instead of being truncated or wrapped."""
    try:
        levels = [tuple(level) for level in pattern]
    except TypeError:
        check.fail("pattern", "must be a list of [step, num] pairs", repr(pattern))
    if any(len(level) != 2 for level in levels):
        check.fail("pattern", "must be a list of [step, num] pairs", repr(pattern))
    pairs = [
        (
            nki_int(check.api, f"pattern[{k}] step", step),
            nki_int(check.api, f"pattern[{k}] num", num),
        )
        for k, (step, num) in enumerate(levels)
    ]
    if not 1 <= len(pairs) <= 4:
        check.fail("pattern", "must have 1 to 4 [step, num] levels", len(pairs), limit=4)
    if any(num < 1 for _, num in pairs):
        check.fail("pattern", "must have positive nums", pattern)
    total = int(np.prod([num for _, num in pairs]))
    if total != free:
        check.fail("pattern", f"must cover the elements per partition ({free})", total, limit=free)
    for arg, v in (("offset", offset), ("channel_multiplier", channel_multiplier)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            check.fail(arg, "must be a compile-time int32", repr(v))
        if not INT32_MIN <= v <= INT32_MAX:
            check.fail(arg, "must fit an int32", v, limit=(INT32_MIN, INT32_MAX))
    value = np.full((partitions, 1), int(offset), dtype=np.int64)
    value = value + np.arange(partitions, dtype=np.int64).reshape(-1, 1) * int(channel_multiplier)
    grid = np.zeros(1, dtype=np.int64)
    for step, num in pairs:
        grid = (grid[:, None] + np.arange(num, dtype=np.int64)[None, :] * step).reshape(-1)
    value = value + grid[None, :]
    # int32 arithmetic on the engine: wrap to 32 bits.
    return value.astype(np.int32)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """Fill ``dst`` (SBUF) with ``offset + p * channel_multiplier + sum(i_k * step_k)``."""
    check = OperandChecks("nisa.iota")
    dst = check.engine_operand("dst", dst, "gpsimd", write=True)
    values = _affine(
        check, pattern, offset, channel_multiplier, dst.partitions, dst.elems_per_partition
    )
    if dtypes.info(dst.dtype).is_float:
        dst._write(values.astype(np.float32).reshape(dst.shape))
    else:
        dst._write(values.astype(np.int64).reshape(dst.shape))
    return check.record("gpsimd", [], [dst], name)


def affine_select(
    dst,
    pattern,
    channel_multiplier,
    on_true_tile,
    on_false_value,
    cmp_op=OPERATORS["equal"],
    offset=0,
    name=None,
):
    """``dst = on_true_tile`` where ``cmp_op(affine, 0)``, else ``on_false_value`` (GpSimd)."""
    check = OperandChecks("nisa.affine_select")
    if not isinstance(cmp_op, Operator) or cmp_op.name not in _COMPARISONS:
        check.fail(
            "cmp_op",
            f"must be a comparison operator ({', '.join('nl.' + c for c in _COMPARISONS)})",
            repr(cmp_op),
        )
    if isinstance(on_false_value, bool) or not isinstance(
        on_false_value, (int, float, np.integer, np.floating)
    ):
        check.fail("on_false_value", "must be a compile-time fp32 scalar", repr(on_false_value))
    on_false_value = nki_float(check.api, "on_false_value", on_false_value)  # rounded, checked
    on_true = check.engine_operand("on_true_tile", on_true_tile, "gpsimd")
    dst = check.engine_operand("dst", dst, "gpsimd", write=True)
    p = check.same_partitions(("on_true_tile", on_true), ("dst", dst))
    f = check.same_free(("on_true_tile", on_true), ("dst", dst))
    affine = _affine(check, pattern, offset, channel_multiplier, p, f).astype(np.float32)
    keep = cmp_op.fn2(affine, np.float32(0.0)) != 0
    false_fill = dtypes.convert(
        np.full((p, f), np.float32(on_false_value)), dst.dtype, dst._storage.precise_fp
    )
    if on_true.dtype == dst.dtype:
        chosen = on_true._read_raw().reshape(p, f)
    else:
        chosen = dtypes.convert(
            on_true._read_f32().reshape(p, f), dst.dtype, dst._storage.precise_fp
        )
    dst._write(np.where(keep, chosen, false_fill).reshape(dst.shape), raw=True)
    return check.record("gpsimd", [on_true], [dst], name, cmp_op=cmp_op.name)


_PARTITION_REDUCE = ("add", "average", "maximum", "bitwise_or", "bitwise_and")


def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce ``data`` across its partitions into a 1-partition ``dst`` with the same free
    size (GpSimd): add, average, max in fp32; bitwise_or/and on integer bit patterns."""
    check = OperandChecks("nisa.tensor_partition_reduce")
    if isinstance(op, Operator) and op.name == "max":  # nl.max names the maximum reduction
        op = OPERATORS["maximum"]
    if not isinstance(op, Operator) or op.name not in _PARTITION_REDUCE:
        check.fail(
            "op", "must be one of " + ", ".join(f"nl.{n}" for n in _PARTITION_REDUCE), repr(op)
        )
    data = check.engine_operand("data", data, "gpsimd")
    dst = check.engine_operand("dst", dst, "gpsimd", write=True)
    if dst.partitions != 1:
        check.fail(
            "dst partition dimension", "must be 1 (one reduced partition)", dst.partitions, limit=1
        )
    check.same_free(("data", data), ("dst", dst))
    p, f = data.partitions, data.elems_per_partition
    if op.is_bitvec:
        for arg, t in (("data", data), ("dst", dst)):
            if not dtypes.info(t.dtype).is_integer:
                check.fail(f"{arg} dtype", f"must be an integer dtype for bitvec {op!r}", t.dtype)
        out = op.fn2.reduce(data._read_raw().reshape(p, f), axis=0)
    else:
        x = data._read_f32().reshape(p, f).astype(np.float64)
        with np.errstate(all="ignore"):
            out = {"add": x.sum(axis=0), "average": x.mean(axis=0), "maximum": x.max(axis=0)}[
                op.name
            ]
        out = out.astype(np.float32)
    dst._write(out.reshape(dst.shape))
    return check.record("gpsimd", [data], [dst], name, op=op.name)
