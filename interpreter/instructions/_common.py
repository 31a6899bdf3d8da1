"""Shared operand checks for every instruction: buffers per engine, partitions, access
patterns, free sizes, shape agreement, scalar/column operands, engine selection.

Each check raises :class:`NkiValidationError` as ``<api>: <arg> <rule>, got <value>``.
Engine/buffer rules: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py ("Memory
types" of each instruction) and nki/guides/architecture/trainium_inferentia2_arch.rst.
"""

from __future__ import annotations

import numbers
from typing import NoReturn

import numpy as np

from neuron_kernels.interpreter.context import current
from neuron_kernels.interpreter.enums import engine as Engine
from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.operators import Operator
from neuron_kernels.interpreter.storage import MemoryRegion
from neuron_kernels.interpreter.tensor import NkiTensor
from neuron_kernels.interpreter.values import nki_float, nki_int, nki_number

__all__ = ["OperandChecks", "NkiInstruction", "SBUF", "PSUM", "ON_CHIP", "HBM_OR_SBUF"]

SBUF = (MemoryRegion.sbuf,)
PSUM = (MemoryRegion.psum,)
ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)
HBM_OR_SBUF = (MemoryRegion.private_hbm, MemoryRegion.shared_hbm, MemoryRegion.sbuf)

# Instructions whose docs define indirect (.ap(vector_offset= / scalar_offset=)) operands:
# nki/api/nki/isa dma_copy ("Indirect addressing"), dma_transpose ("DMA Indirect Transpose"),
# and tensor_copy with scalar_offset (nki/migration/index.rst, the replacement of
# tensor_copy_dynamic_src/dst).
INDIRECT_OPERANDS = {
    "nisa.dma_copy": ("vector", "scalar"),
    "nisa.dma_transpose": ("vector",),
    "nisa.tensor_copy": ("scalar",),
}

ENGINE_NAME = {
    Engine.tensor: "tensor",
    Engine.vector: "vector",
    Engine.scalar: "scalar",
    Engine.gpsimd: "gpsimd",
    Engine.dma: "dma",
    Engine.sync: "sync",
}

# What each engine may read and write: the per-op "Memory types" of
# aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py.
ENGINE_READS = {"tensor": SBUF, "vector": ON_CHIP, "scalar": ON_CHIP, "gpsimd": SBUF}
ENGINE_WRITES = {"tensor": PSUM, "vector": ON_CHIP, "scalar": ON_CHIP, "gpsimd": SBUF}
ENGINE_LABEL = {
    "tensor": "Tensor Engine",
    "vector": "Vector Engine",
    "scalar": "Scalar Engine",
    "gpsimd": "GpSimd Engine",
}


class NkiInstruction:
    """Handle returned by every ISA call; ``depends_on`` adds scheduling edges."""

    def __init__(self, handle):
        self._ins = handle

    def depends_on(self, *producers: NkiInstruction) -> NkiInstruction:
        for p in producers:
            if not isinstance(p, NkiInstruction):
                raise NkiValidationError(
                    "NkiInstruction.depends_on", "producers", "must be NkiInstruction handles", p
                )
            self._ins.depends_on.append(p._ins.index)
        return self

    def __repr__(self) -> str:
        return f"NkiInstruction(#{self._ins.index} {self._ins.api})"


def _buffer_names(buffers) -> str:
    return "/".join(b.value.upper() if b.on_chip else b.value for b in buffers)


class OperandChecks:
    """Operand checks for one instruction call."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.sim = current()
        self.target = self.sim.target

    @property
    def compute(self) -> bool:
        """False when the launch only traces (skip heavy arithmetic; values are unused)."""
        return self.sim.launch.compute

    def fail(self, arg: str, rule: str, value, *, limit=None, hint=None) -> NoReturn:
        raise NkiValidationError(self.api, arg, rule, value, limit=limit, hint=hint)

    # -- operands ------------------------------------------------------------------
    def tensor(self, arg: str, t) -> NkiTensor:
        if not isinstance(t, NkiTensor):
            self.fail(arg, "must be an NkiTensor", type(t).__name__)
        if t._indirect is not None:
            kinds = INDIRECT_OPERANDS.get(self.api, ())
            if t._indirect.kind not in kinds:
                self.fail(
                    arg,
                    "must not be an indirect view here: the docs define .ap(vector_offset=) "
                    "operands for nisa.dma_copy / nisa.dma_transpose and .ap(scalar_offset=) "
                    "for those and nisa.tensor_copy",
                    f"{t._indirect.kind}_offset view",
                )
        return t

    def buffer(self, arg: str, t: NkiTensor, allowed, why: str = "") -> None:
        if t.buffer not in allowed:
            rule = f"must be in {_buffer_names(allowed)}"
            if why:
                rule += f" ({why})"
            self.fail(arg, rule, t.buffer.value.upper() if t.on_chip else t.buffer.value)

    def engine_operand(self, arg: str, t, eng: str, *, write: bool = False) -> NkiTensor:
        """An SBUF/PSUM operand of a compute engine: buffer, partitions, access pattern.

        The checks after ``tensor`` read only the view's shape and strides, its buffer, the
        engine and the direction (and the launch's target): a combination that passed them
        in this launch passes again, so it is remembered per launch and not re-checked.
        Failures are never remembered; the NeuronCore-v2 start-partition rule, which also
        reads the view's offset, is always checked."""
        t = self.tensor(arg, t)
        passed = self.sim.launch.operands_passed
        key = (t.shape, t.strides, t._storage.buffer_value, eng, write)
        if key in passed and not self.target.start_partition_rule:
            return t
        allowed = (ENGINE_WRITES if write else ENGINE_READS)[eng]
        if t._storage.buffer not in allowed:  # message built only on failure (hot path)
            self.buffer(
                arg,
                t,
                allowed,
                f"{ENGINE_LABEL[eng]} {'writes' if write else 'reads'} {_buffer_names(allowed)}",
            )
        self.partitions(arg, t)
        if self.target.start_partition_rule:
            self.start_partition(arg, t)
        self.access_pattern(arg, t)
        if eng != "tensor":
            self.engine_free_size(arg, t)
        passed.add(key)
        return t

    def partitions(self, arg: str, t: NkiTensor) -> None:
        pmax = self.target.pmax
        if t.partitions > pmax:
            self.fail(f"{arg} partition dimension", f"must be <= {pmax}", t.partitions, limit=pmax)

    def start_partition(self, arg: str, t: NkiTensor) -> None:
        """NeuronCore-v2 start-partition rule (trainium_inferentia2_arch.rst, "Data streaming")."""
        if not self.target.start_partition_rule:
            return
        acc = t._access()
        n, start = acc.partitions, acc.partition_start
        allowed = (0,) if n > 64 else (0, 64) if n > 32 else (0, 32, 64, 96)
        if start not in allowed:
            self.fail(
                f"{arg} start partition",
                f"must be one of {allowed} for {n} partitions on {self.target.name}",
                start,
                limit=allowed,
            )

    def access_pattern(self, arg: str, t: NkiTensor) -> None:
        """At most 4 free dims per partition, int16 element strides (v2 arch guide)."""
        dims = _canonical_free_dims(t)
        tg = self.target
        if len(dims) > tg.ap_max_free_dims:
            self.fail(
                f"{arg} access pattern",
                f"must have at most {tg.ap_max_free_dims} free dims after merging contiguous dims",
                len(dims),
                limit=tg.ap_max_free_dims,
            )
        for _n, s in dims:
            if not tg.ap_min_stride <= s <= tg.ap_max_stride:
                self.fail(
                    f"{arg} free-dim stride",
                    f"must fit an int16 ({tg.ap_min_stride}..{tg.ap_max_stride} elements)",
                    s,
                    limit=tg.ap_max_stride,
                )

    def engine_free_size(self, arg: str, t: NkiTensor) -> None:
        tg = self.target
        if t.buffer is MemoryRegion.psum:
            limit, where = tg.engine_psum_fmax, "PSUM"
        else:
            limit, where = tg.engine_sbuf_fmax, "SBUF"
        if t.elems_per_partition > limit:
            self.fail(
                f"{arg} free size",
                f"must be <= {limit} elements per partition from {where}",
                t.elems_per_partition,
                limit=limit,
            )

    def same_partitions(self, *named: tuple[str, NkiTensor]) -> int:
        first_name, first = named[0]
        for name, t in named[1:]:
            if t.partitions != first.partitions:
                self.fail(
                    f"{name} partition dimension",
                    f"must equal {first_name}'s ({first.partitions})",
                    t.partitions,
                    limit=first.partitions,
                )
        return first.partitions

    def same_free(self, *named: tuple[str, NkiTensor]) -> int:
        first_name, first = named[0]
        for name, t in named[1:]:
            if t.elems_per_partition != first.elems_per_partition:
                self.fail(
                    f"{name} elements per partition",
                    f"must equal {first_name}'s ({first.elems_per_partition})",
                    t.elems_per_partition,
                    limit=first.elems_per_partition,
                )
        return first.elems_per_partition

    def not_both_psum(self, a: tuple[str, NkiTensor], b: tuple[str, NkiTensor]) -> None:
        if a[1].buffer is MemoryRegion.psum and b[1].buffer is MemoryRegion.psum:
            self.fail(f"{a[0]} and {b[0]}", "must not both be in PSUM", "both in PSUM")

    def scalar_or_column(
        self,
        arg: str,
        v,
        partitions: int,
        *,
        fp32: bool = True,
        allow_scalar: bool = True,
        integer: bool = False,
    ):
        """A compile-time scalar or a ``(partitions, 1)`` SBUF/PSUM tile, as an fp32
        value or ``(P, 1)`` array ready to broadcast along the free dims."""
        if isinstance(v, NkiTensor):
            self.buffer(arg, v, ON_CHIP)
            self.partitions(arg, v)
            self.start_partition(arg, v)
            self.access_pattern(arg, v)
            if v.partitions != partitions or v.elems_per_partition != 1:
                self.fail(f"{arg} shape", f"must be ({partitions}, 1)", v.shape)
            if fp32 and v.dtype != "float32":
                self.fail(f"{arg} dtype", "must be float32", v.dtype, limit="float32")
            if integer:
                return v._read_raw().reshape(partitions, 1)
            return v._read_f32().reshape(partitions, 1)
        if not allow_scalar:
            self.fail(arg, f"must be a ({partitions}, 1) tile", type(v).__name__)
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            self.fail(arg, f"must be a compile-time number or a ({partitions}, 1) tile", repr(v))
        if integer:
            return np.int64(nki_int(self.api, arg, int(v)))
        return nki_float(self.api, arg, nki_number(self.api, arg, v))

    def operator(self, arg: str, op, *, kinds: tuple[str, ...]) -> Operator:
        if not isinstance(op, Operator):
            self.fail(arg, "must be an nl operator (nl.add, nl.multiply, ...)", repr(op))
        if op.alu not in kinds:
            names = {
                "arith": "an arithmetic binary ALU operator",
                "bitvec": "a bitvec binary ALU operator",
                "arith_unary": "an arithmetic unary ALU operator",
                "bitvec_unary": "a bitvec unary ALU operator",
            }
            self.fail(arg, "must be " + " or ".join(names[k] for k in kinds), repr(op))
        if op.alu_min_version > self.target.nc_version:
            self.fail(
                arg,
                f"is only available from NeuronCore-v{op.alu_min_version}",
                f"{op!r} on {self.target.name}",
            )
        return op

    def engine(self, arg_value, allowed: tuple[str, ...], default: str) -> str:
        if not isinstance(arg_value, Engine):
            self.fail("engine", "must be an nisa.engine member", repr(arg_value))
        if arg_value is Engine.unknown:
            return default
        name = ENGINE_NAME.get(arg_value)
        if name not in allowed:
            self.fail(
                "engine",
                f"must be one of {', '.join('nisa.engine.' + a for a in allowed)} or unknown",
                f"nisa.engine.{arg_value.name}",
            )
        return name

    def needs_nc_version(self, version: int, arg: str = "target") -> None:
        """Generation gate: the instruction (or ``arg``) exists from NeuronCore-v``version``."""
        tg = self.target
        if tg.nc_version < version:
            self.fail(
                arg,
                f"needs NeuronCore-v{version} or newer",
                f"{tg.name} (NeuronCore-v{tg.nc_version})",
                limit=version,
            )

    def flag(self, arg: str, v) -> bool:
        if not isinstance(v, (bool, np.bool_)):
            self.fail(arg, "must be a bool", repr(v))
        return bool(v)

    def record(self, engine: str, reads, writes, name=None, **attrs) -> NkiInstruction:
        for t in (*reads, *writes):
            if t._indirect is not None:
                break
        else:  # no indirect operand (the common case): no index tensors to add
            return NkiInstruction(
                self.sim.record_attrs(self.api, engine, reads, writes, name, attrs)
            )
        indexes = [
            t._indirect.source
            for t in (*reads, *writes)
            if t._indirect is not None and isinstance(t._indirect.source, NkiTensor)
        ]
        if indexes:  # the instruction reads its index tensors too (a dependency)
            reads = [*reads, *indexes]
            attrs["indirect"] = True
        return NkiInstruction(self.sim.record_attrs(self.api, engine, reads, writes, name, attrs))


def _canonical_free_dims(t: NkiTensor) -> tuple[tuple[int, int], ...]:
    """Free dims with size-1 dims dropped and contiguous neighbours merged.

    A function of the view's (shape, strides) only, so it is cached by them (a kernel
    checks the same few tile patterns on every instruction); the checks that read it
    still run on every call."""
    key = (t.shape, t.strides)
    dims = _FREE_DIMS.get(key)
    if dims is None:
        if len(_FREE_DIMS) >= 4096:
            _FREE_DIMS.clear()
        dims = _FREE_DIMS[key] = tuple(_merge_free_dims(*key))
    return dims


_FREE_DIMS: dict[tuple, tuple[tuple[int, int], ...]] = {}


def _merge_free_dims(shape, strides) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for i in range(1, len(shape)):
        n = shape[i]
        if n == 1:
            continue
        s = strides[i]
        if merged and merged[-1][1] == n * s:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    return merged


def apply_binary(op: Operator, a, b, *, reverse: bool = False):
    """``a op b`` in fp32 (or on bit patterns for bitvec ops); ``reverse`` swaps sides."""
    lhs, rhs = (b, a) if reverse else (a, b)
    with np.errstate(all="ignore"):
        if op.is_bitvec:
            return op.fn2(lhs, rhs)
        return np.asarray(
            op.fn2(
                np.float32(lhs) if np.isscalar(lhs) else lhs,
                np.float32(rhs) if np.isscalar(rhs) else rhs,
            ),
            dtype=np.float32,
        )


def apply_unary(op: Operator, a):
    with np.errstate(all="ignore"):
        if op.is_bitvec:
            return op.fn1(a)
        return np.asarray(op.fn1(a), dtype=np.float32)
