"""DMA instructions: ``nisa.dma_copy`` and ``nisa.dma_transpose``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (dma_copy, dma_transpose).
DMA moves data between HBM and SBUF; it cannot touch PSUM (since NKI 0.3.0).
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.enums import dge_mode as DgeMode
from neuron_kernels.interpreter.enums import engine as Engine
from neuron_kernels.interpreter.enums import enum_member
from neuron_kernels.interpreter.enums import oob_mode as OobMode
from neuron_kernels.interpreter.instructions._common import HBM_OR_SBUF, SBUF, OperandChecks

__all__ = ["dma_copy", "dma_transpose"]

_NO_PSUM = "DMA cannot access PSUM; evacuate it with nisa.tensor_copy first"


def _dge(check: OperandChecks, dge_mode) -> str:
    member = enum_member(DgeMode, dge_mode)
    if member is None:
        check.fail(
            "dge_mode",
            "must be an nisa.dge_mode member or its int value (as nki-library's qkv_tkg passes)",
            repr(dge_mode),
        )
    dge_mode = member
    if dge_mode is DgeMode.hwdge and not check.target.has_hwdge:
        check.fail(
            "dge_mode", "hwdge needs NeuronCore-v3 or newer", f"hwdge on {check.target.name}"
        )
    return dge_mode.name


def _priority(check: OperandChecks, priority) -> None:
    if priority is None:
        return
    if not check.target.has_dma_priority:
        check.fail("priority", "needs NeuronCore-v4 or newer", f"{priority} on {check.target.name}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 3:
        check.fail("priority", "must be an int in 0..3", priority, limit=(0, 3))


def dma_copy(
    dst,
    src,
    priority=None,
    oob_mode=OobMode.error,
    dge_mode=DgeMode.unknown,
    engine=Engine.unknown,
    name=None,
):
    """Copy ``src`` to ``dst`` (HBM or SBUF) with a DMA engine: ``dst = src`` in row-major order.

    Different dtypes convert through fp32 (not allowed with hwdge).
    """
    check = OperandChecks("nisa.dma_copy")
    dst = check.tensor("dst", dst)
    src = check.tensor("src", src)
    check.buffer("dst", dst, HBM_OR_SBUF, _NO_PSUM)
    check.buffer("src", src, HBM_OR_SBUF, _NO_PSUM)
    mode = _dge(check, dge_mode)
    _priority(check, priority)
    if not isinstance(oob_mode, OobMode):
        check.fail("oob_mode", "must be an nisa.oob_mode member", repr(oob_mode))
    indirect = src.is_indirect() or dst.is_indirect()
    if oob_mode is OobMode.skip and not indirect:
        check.fail(
            "oob_mode", "skip is only valid with indirect (vector/scalar offset) access", "skip"
        )
    if (
        indirect
        and mode == "hwdge"
        and (
            src.is_indirect()
            and src._indirect.kind == "vector"
            or dst.is_indirect()
            and dst._indirect.kind == "vector"
        )
    ):
        check.fail("dge_mode", "must not be hwdge for a gather/scatter (swdge performs them)", mode)
    if not isinstance(engine, Engine):
        check.fail("engine", "must be an nisa.engine member", repr(engine))
    if engine is not Engine.unknown:
        if mode != "hwdge":
            check.fail(
                "engine",
                "may only be set with dge_mode=nisa.dge_mode.hwdge",
                f"nisa.engine.{engine.name}",
            )
        if engine not in (Engine.sync, Engine.scalar):
            check.fail(
                "engine",
                "must be nisa.engine.sync or nisa.engine.scalar",
                f"nisa.engine.{engine.name}",
            )
    if dst.size != src.size:
        check.fail("dst element count", f"must equal src's ({src.size})", dst.size, limit=src.size)
    if mode == "hwdge" and dst.dtype != src.dtype:
        check.fail(
            "dst dtype", f"must equal src dtype ({src.dtype}) with hwdge (no casting)", dst.dtype
        )
    for arg, t in (("dst", dst), ("src", src)):
        if t.on_chip:
            check.partitions(arg, t)
    if indirect and check.compute:
        _indirect_copy(check, dst, src, oob_mode is OobMode.skip)
    elif dst.dtype == src.dtype:
        dst._copy_raw_from(src)
    else:  # src -> fp32 -> dst, one rounding into dst.dtype
        dst._write(src._read_f32() if check.compute else None)
    return check.record(
        "dma",
        [src],
        [dst],
        name,
        dge_mode=mode,
        cast=dst.dtype != src.dtype,
        trigger=engine.name if engine is not Engine.unknown else None,
    )


def _indirect_copy(check: OperandChecks, dst, src, skip: bool) -> None:
    """A gather and/or scatter: out-of-bounds rows raise, or with ``skip`` leave their
    destination rows untouched (rows pair up along dim 0 of both sides)."""
    api = check.api
    keep = None
    if skip:
        if src.shape[0] != dst.shape[0]:
            check.fail(
                "dst.shape[0]",
                f"must equal src.shape[0] ({src.shape[0]}) with oob_mode.skip (rows pair up)",
                dst.shape[0],
            )
        keep = np.ones(src.shape[0], dtype=bool)
        for t in (src, dst):
            if t.is_indirect():
                keep &= t._element_index(api, skip=True)[1]
    else:  # raise naming this instruction before anything is written
        for t in (src, dst):
            if t.is_indirect():
                t._element_index(api)
    if src.is_indirect():  # clipped indices on skipped rows: read, then not written
        values = src._flat()[src._element_index(api, skip=skip)[0]]
    else:
        values = src._array()
    if dst.dtype != src.dtype:
        values = dtypes.convert(values.astype(np.float32), dst.dtype, dst._storage.precise_fp)
    values = values.reshape(dst.shape)
    if dst.is_indirect():
        dst._scatter(values, keep)
    elif keep is None:
        dst._write(values, raw=True)
    else:
        rows = dst._array()
        rows[keep] = values[keep]
        dst._storage.written = True


_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def _check_gather_transpose(check: OperandChecks, src, mode: str) -> None:
    """The "DMA Indirect Transpose Constraints" of nki/api/nki/isa ``dma_transpose``."""
    idx = src._indirect.source
    if mode not in ("unknown", "swdge"):
        check.fail("dge_mode", "must be unknown or swdge for a gather-transpose", mode)
    if not check.target.has_dma_transpose:
        check.fail("target", "must be NeuronCore-v3 or newer (gather-transpose)", check.target.name)
    if src.ndim == 4 and 1 not in (src.shape[1], src.shape[2]):
        check.fail("src.shape[1:3]", "must have a 1 for a 4-D gather-transpose", src.shape[1:3])
    if idx.dtype != "uint32":
        check.fail("vector_offset dtype", "must be uint32 for a gather-transpose", idx.dtype)
    if idx.shape[0] % 16 or not 16 <= idx.shape[0] <= 128:
        check.fail(
            "vector_offset.shape[0]", "must be in [16, 128] and divisible by 16", idx.shape[0]
        )
    if idx.shape[1] > 1 and idx.shape[0] != 128:
        check.fail(
            "vector_offset.shape[0]",
            "must be 128 when vector_offset has several columns",
            idx.shape[0],
            limit=128,
        )
    if src.shape[0] % 16:
        check.fail("src.shape[0]", "must be divisible by 16 for a gather-transpose", src.shape[0])
    if src.itemsize != 2:
        check.fail("src dtype", "must be a 2-byte dtype for a gather-transpose", src.dtype)


def dma_transpose(
    dst, src, axes=None, priority=None, dge_mode=DgeMode.unknown, oob_mode=OobMode.error, name=None
):
    """Transpose ``src`` (HBM or SBUF) into ``dst`` (SBUF) with the DMA engines (v3+).

    Permutations: 2-D ``(1, 0)``, 3-D ``(2, 1, 0)``, 4-D ``(3, 1, 2, 0)``.
    """
    check = OperandChecks("nisa.dma_transpose")
    dst = check.tensor("dst", dst)
    src = check.tensor("src", src)
    if not check.target.has_dma_transpose:
        check.fail("target", "must be NeuronCore-v3 or newer (DMA transpose)", check.target.name)
    check.buffer("dst", dst, SBUF)
    check.buffer("src", src, HBM_OR_SBUF, _NO_PSUM)
    mode = _dge(check, dge_mode)
    gather = src.is_indirect()
    if gather:
        _check_gather_transpose(check, src, mode)
    elif mode not in ("unknown", "hwdge"):
        check.fail("dge_mode", "must be unknown or hwdge for a direct transpose", mode)
    _priority(check, priority)
    if not isinstance(oob_mode, OobMode):
        check.fail("oob_mode", "must be an nisa.oob_mode member", repr(oob_mode))
    if oob_mode is OobMode.skip and gather:
        check.fail(
            "oob_mode",
            "skip with a gather-transpose: the docs do not say what the skipped rows hold",
            "skip",
        )
    if oob_mode is OobMode.skip:
        check.fail(
            "oob_mode",
            "skip is only valid with indirect (vector/scalar offset) source access",
            "skip",
        )
    if src.ndim not in _TRANSPOSE_AXES:
        check.fail("src rank", "must be 2, 3 or 4", src.ndim, limit=(2, 3, 4))
    perm = _TRANSPOSE_AXES[src.ndim]
    if axes is not None and tuple(axes) != perm:
        check.fail("axes", f"must be {perm} for a {src.ndim}-D source", tuple(axes), limit=perm)
    if dst.ndim != src.ndim:
        check.fail("dst rank", f"must equal src rank ({src.ndim})", dst.ndim)
    want = tuple(src.shape[p] for p in perm)
    if dst.shape != want:
        check.fail("dst shape", f"must be the permuted src shape {want}", dst.shape)
    if dst.dtype != src.dtype:
        check.fail("dst dtype", f"must equal src dtype ({src.dtype})", dst.dtype, limit=src.dtype)
    # [CONFLICT] The API lists "src.dtype is 2 bytes" under the hwdge restrictions; the Trn2
    # guide says DMA transpose is bit-accurate for 2- and 4-byte types. We require 2 bytes
    # with hwdge and 2 or 4 bytes otherwise.
    sizes = (2,) if mode == "hwdge" else (2, 4)
    if src.itemsize not in sizes:
        what = "2-byte" if mode == "hwdge" else "2- or 4-byte"
        check.fail(
            "src dtype", f"must be a {what} dtype ({mode} DMA transpose)", src.dtype, limit=sizes
        )
    if src.shape[-1] > 128:
        check.fail("src.shape[-1]", "must be <= 128", src.shape[-1], limit=128)
    if mode == "hwdge":
        lead = src.shape[0]
        if src.ndim == 2 and lead != 16:
            check.fail("src.shape[0]", "must be 16 for a 2-D hwdge transpose", lead, limit=16)
        if src.ndim > 2 and lead not in (1, 2, 4, 8, 16):
            check.fail(
                "src.shape[0]",
                "must be one of (1, 2, 4, 8, 16) for a 3-D/4-D hwdge transpose",
                lead,
                limit=(1, 2, 4, 8, 16),
            )
        if src.ndim > 2 and (lead * src.shape[-2]) % 16:
            check.fail(
                "src.shape[0] * src.shape[-2]",
                "must be a multiple of 16 for a 3-D/4-D hwdge transpose",
                lead * src.shape[-2],
                limit=16,
            )
    check.partitions("dst", dst)
    if src.on_chip:
        check.partitions("src", src)
    dst._write(np.transpose(src._read_raw(), perm) if check.compute else None, raw=True)
    return check.record("dma", [src], [dst], name, dge_mode=mode, transpose=True)
