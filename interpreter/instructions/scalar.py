"""Scalar Engine instructions: ``nisa.activation`` and ``nisa.activation_reduce``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (activation,
activation_reduce) and nki/api/nki.api.shared.rst (activation functions and their valid
input ranges). ``out = op(data * scale + bias)`` in fp32; inputs outside an activation's
documented valid range give NaN, since the hardware's output is invalid there.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter.enums import reduce_cmd as ReduceCmd
from neuron_kernels.interpreter.errors import not_implemented
from neuron_kernels.interpreter.instructions._common import OperandChecks
from neuron_kernels.interpreter.operators import Operator
from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = ["activation", "activation_reduce"]


def _activation(api, dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd, name):
    check = OperandChecks(api)
    tg = check.target
    dst, data = check.tensor("dst", dst), check.tensor("data", data)
    if not isinstance(op, Operator) or not op.activation:
        check.fail(
            "op", "must be an activation function (nl.exp, nl.copy, nl.rsqrt, ...)", repr(op)
        )
    if op.name == "prelu":
        raise not_implemented(f"{api}(op=nl.prelu)")  # no relu_param: see unimplemented.py
    if not isinstance(reduce_cmd, ReduceCmd):
        check.fail("reduce_cmd", "must be an nisa.reduce_cmd member", repr(reduce_cmd))
    if reduce_cmd is ReduceCmd.load_reduce:
        check.fail(
            "reduce_cmd",
            "must be idle, reset, reduce or reset_reduce for the Scalar Engine",
            "load_reduce",
        )
    if reduce_op is not None and (not isinstance(reduce_op, Operator) or reduce_op.name != "add"):
        check.fail("reduce_op", "must be nl.add", repr(reduce_op))
    if reduce_op is None and reduce_cmd in (ReduceCmd.reduce, ReduceCmd.reset_reduce):
        check.fail("reduce_op", f"must be nl.add to reduce (reduce_cmd={reduce_cmd.name})", None)
    data = check.engine_operand("data", data, "scalar")
    dst = check.engine_operand("dst", dst, "scalar", write=True)
    p = check.same_partitions(("data", data), ("dst", dst))
    check.same_free(("data", data), ("dst", dst))
    if op.name == "reciprocal" and bias is not None and tg.nc_version <= 2:
        check.fail(
            "bias",
            "must be None for nl.reciprocal on NeuronCore-v2 (nki.api.shared.rst, "
            "Engine Selection)",
            f"a bias on {tg.name}",
        )
    if isinstance(bias, NkiTensor):
        if bias.dtype == "tfloat32":
            check.fail("bias dtype", "must not be tfloat32", bias.dtype)
        b = check.scalar_or_column("bias", bias, p, fp32=False)
    elif bias is None:
        b = np.float32(0.0)
    else:
        if not tg.has_scalar_bias:
            check.fail(
                "bias",
                f"must be a ({p}, 1) tile on {tg.name} (scalar bias needs NeuronCore-v3)",
                bias,
            )
        b = check.scalar_or_column("bias", bias, p, fp32=False)
    s = check.scalar_or_column("scale", scale, p, fp32=True)
    if reduce_res is not None:
        reduce_res = check.engine_operand("reduce_res", reduce_res, "scalar", write=True)
        if reduce_res.partitions != p or reduce_res.elems_per_partition != 1:
            check.fail("reduce_res shape", f"must be ({p}, 1)", reduce_res.shape, limit=(p, 1))

    x = data._read_f32().reshape(p, -1)
    with np.errstate(all="ignore"):
        pre = (x * s + b).astype(np.float32)
    y = op.activate(pre)
    regs = check.sim.scalar_regs
    if reduce_cmd in (ReduceCmd.reset, ReduceCmd.reset_reduce):
        regs[:p] = 0.0
    if reduce_cmd in (ReduceCmd.reduce, ReduceCmd.reset_reduce):
        regs[:p] = (regs[:p].astype(np.float64) + y.astype(np.float64).sum(axis=1)).astype(
            np.float32
        )
    dst._write(y.reshape(dst.shape))
    writes = [dst]
    if reduce_res is not None:
        reduce_res._write(regs[:p].reshape(p, 1))
        writes.append(reduce_res)
    reads = [data] + [t for t in (bias, scale) if isinstance(t, NkiTensor)]
    return check.record(
        "scalar",
        reads,
        writes,
        name,
        op=op.name,
        reduce_cmd=reduce_cmd.name,
        reads_out=reduce_res is not None,
    )


def activation(
    dst,
    op,
    data,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=ReduceCmd.idle,
    name=None,
):
    """``dst = op(data * scale + bias)`` on the Scalar Engine, with an optional add-reduction
    into the engine's per-lane registers (``reduce_cmd``) read out into ``reduce_res``."""
    return _activation(
        "nisa.activation", dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd, name
    )


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` with ``reduce_cmd=reset_reduce``: also sums the result over the free
    dims into ``reduce_res`` (kept for backward compatibility by the API)."""
    if reduce_op is None:
        OperandChecks("nisa.activation_reduce").fail("reduce_op", "must be nl.add", None)
    return _activation(
        "nisa.activation_reduce",
        dst,
        op,
        data,
        bias,
        scale,
        reduce_op,
        reduce_res,
        ReduceCmd.reset_reduce,
        name,
    )
