"""``nisa.activate2`` (NeuronCore-v4): ``op((data op0 imm0) op1 imm1)`` on the Scalar Engine
with an optional reduction into the per-lane accumulators it shares with ``activation``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (activate2: the six
``(op0, op1)`` pairs, reverse flags, ``relu_param`` for ``nl.prelu``, reduce ops and the
"Accumulator behavior" list: a reset sets the identity of ``reduce_op``).
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter.enums import reduce_cmd as ReduceCmd
from neuron_kernels.interpreter.instructions._common import OperandChecks, apply_binary
from neuron_kernels.interpreter.operators import Operator
from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = ["activate2"]

_PAIRS = {
    ("multiply", "add"),
    ("multiply", "subtract"),
    ("multiply", "bypass"),
    ("add", "bypass"),
    ("subtract", "bypass"),
    ("bypass", "bypass"),
}
_IDENTITY = {"add": 0.0, "maximum": -np.inf, "minimum": np.inf, "abs_max": 0.0, "abs_min": np.inf}


def activate2(
    dst,
    op,
    data,
    imm0,
    imm1,
    op0,
    op1,
    relu_param=0.0,
    reverse0=False,
    reverse1=False,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=ReduceCmd.idle,
    name=None,
):
    """``dst = op((data op0 imm0) op1 imm1, relu_param)`` in fp32 (NeuronCore-v4+)."""
    check = OperandChecks("nisa.activate2")
    check.needs_nc_version(4)
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    if not isinstance(op, Operator) or not op.activation:
        check.fail("op", "must be an activation function (nl.exp, nl.gelu, ...)", repr(op))
    for arg, o in (("op0", op0), ("op1", op1)):
        if not isinstance(o, Operator):
            check.fail(arg, "must be an nl operator (nl.multiply, nl.add, ..., nl.bypass)", repr(o))
    pair = (op0.name, op1.name)
    if pair not in _PAIRS:
        check.fail(
            "(op0, op1)", f"must be one of {sorted(_PAIRS)}", pair, limit=tuple(sorted(_PAIRS))
        )
    if check.flag("reverse0", reverse0) and op0.name == "bypass":
        check.fail("reverse0", "requires op0 to be set (not nl.bypass)", True)
    if check.flag("reverse1", reverse1) and op1.name == "bypass":
        check.fail("reverse1", "requires op1 to be set (not nl.bypass)", True)
    if not isinstance(reduce_cmd, ReduceCmd) or reduce_cmd is ReduceCmd.load_reduce:
        check.fail("reduce_cmd", "must be idle, reset, reduce or reset_reduce", repr(reduce_cmd))
    if reduce_op is not None and (
        not isinstance(reduce_op, Operator) or reduce_op.name not in _IDENTITY
    ):
        check.fail("reduce_op", f"must be one of nl.{', nl.'.join(_IDENTITY)}", repr(reduce_op))
    reducing = reduce_cmd in (ReduceCmd.reduce, ReduceCmd.reset_reduce, ReduceCmd.reset)
    if reduce_op is None and reducing:
        check.fail("reduce_op", f"must be set with reduce_cmd={reduce_cmd.name}", None)
    data = check.engine_operand("data", data, "scalar")
    dst = check.engine_operand("dst", dst, "scalar", write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    if isinstance(imm0, NkiTensor) and isinstance(imm1, NkiTensor) and imm0.dtype != imm1.dtype:
        check.fail(
            "imm1 dtype", f"must equal imm0's ({imm0.dtype}) when both are tiles", imm1.dtype
        )
    a = check.scalar_or_column("imm0", imm0, p)
    b = check.scalar_or_column("imm1", imm1, p)
    alpha = check.scalar_or_column("relu_param", relu_param, p)
    if reduce_res is not None:
        reduce_res = check.engine_operand("reduce_res", reduce_res, "scalar", write=True)
        if reduce_res.partitions != p or reduce_res.elems_per_partition != 1:
            check.fail("reduce_res shape", f"must be ({p}, 1)", reduce_res.shape, limit=(p, 1))

    x = data._read_f32().reshape(p, -1)
    if op0.name != "bypass":
        x = apply_binary(op0, x, a, reverse=reverse0)
    if op1.name != "bypass":
        x = apply_binary(op1, x, b, reverse=reverse1)
    with np.errstate(all="ignore"):
        y = np.where(x > 0, x, alpha * x) if op.name == "prelu" else op.activate(x)
    y = np.asarray(y, dtype=np.float32)
    regs = check.sim.scalar_regs
    if reduce_cmd in (ReduceCmd.reset, ReduceCmd.reset_reduce):
        regs[:p] = _IDENTITY[reduce_op.name]
    if reduce_cmd in (ReduceCmd.reduce, ReduceCmd.reset_reduce):
        acc = regs[:p].reshape(p, 1)
        for col in range(y.shape[1]):  # the hardware folds elements in order, in fp32
            acc = apply_binary(reduce_op, acc, y[:, col : col + 1])
        regs[:p] = acc.reshape(p)
    dst._write(y.reshape(dst.shape))
    writes = [dst]
    if reduce_res is not None:
        reduce_res._write(regs[:p].reshape(p, 1))
        writes.append(reduce_res)
    reads = [data] + [t for t in (imm0, imm1, relu_param) if isinstance(t, NkiTensor)]
    return check.record(
        "scalar",
        reads,
        writes,
        name,
        op=op.name,
        reduce_cmd=reduce_cmd.name,
        reads_out=reduce_res is not None,
    )
