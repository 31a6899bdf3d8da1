"""``nisa.nc_stream_shuffle``: cross-partition moves within 32-partition quadrants.

Semantics from the stub's docstring (aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py,
snapshot 81ce03ae): "shuffle_mask[i] indicates which input partition the output partition [i]
copies from within each 32-partition quadrant. The special value shuffle_mask[i]=255 means the
output tensor in partition [i] will be unmodified", the same mask for every quadrant, Vector
Engine, SBUF or PSUM operands, in place allowed, and three constraints: same dtype, same
elements per partition, and start partitions by ``num_active_partitions``.

Left open by the docstring, and decided here: mask elements are ints (the docstring also
allows "affine expression", which NKI 0.6 has no value for, so other values are refused);
a mask entry must name a partition ``src`` has (``q * 32 + shuffle_mask[i] <
src partitions``); the move is a bit copy (same dtype, no conversion).
"""

from __future__ import annotations

import math

import numpy as np

from neuron_kernels.interpreter.instructions._common import OperandChecks

__all__ = ["nc_stream_shuffle", "shuffled"]

QUADRANT = 32
KEEP = 255  # shuffle_mask[i] == 255: output partition i unmodified


def shuffled(src: np.ndarray, dst: np.ndarray, mask) -> np.ndarray:
    """The NumPy reference of the docstring: ``out[q*32 + i] = src[q*32 + mask[i]]`` for
    every quadrant ``q`` of ``dst``'s partitions, ``dst``'s value where ``mask[i] == 255``."""
    out = np.array(dst)
    for p in range(dst.shape[0]):
        q, i = divmod(p, QUADRANT)
        if mask[i] != KEEP:
            out[p] = src[q * QUADRANT + mask[i]]
    return out


def _mask(check: OperandChecks, shuffle_mask) -> list[int]:
    if not isinstance(shuffle_mask, (list, tuple)) or len(shuffle_mask) != QUADRANT:
        check.fail("shuffle_mask", "must be a 32-element list", repr(shuffle_mask), limit=32)
    out = []
    for i, m in enumerate(shuffle_mask):
        if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, np.integer)):
            check.fail(f"shuffle_mask[{i}]", "must be an int", repr(m))
        if not (0 <= m < QUADRANT or m == KEEP):
            check.fail(f"shuffle_mask[{i}]", "must be a partition 0..31 of the quadrant or 255", m)
        out.append(int(m))
    return out


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Copy partitions within each quadrant of 32 by ``shuffle_mask`` (Vector Engine)."""
    check = OperandChecks("nisa.nc_stream_shuffle")
    dst, src = check.tensor("dst", dst), check.tensor("src", src)
    src = check.engine_operand("src", src, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    mask = _mask(check, shuffle_mask)
    if dst.dtype != src.dtype:
        check.fail("dst dtype", f"must be src's ({src.dtype})", dst.dtype, limit=src.dtype)
    if dst.elems_per_partition != src.elems_per_partition:
        check.fail(
            "dst elements per partition",
            f"must be src's ({src.elems_per_partition})",
            dst.elems_per_partition,
            limit=src.elems_per_partition,
        )
    active = math.ceil(max(src.partitions, dst.partitions) / QUADRANT) * QUADRANT
    allowed = (0,) if active > 64 else (0, 64) if active > 32 else (0, 32, 64, 96)
    for arg, t in (("src", src), ("dst", dst)):
        start = t._access().partition_start
        if start not in allowed:
            check.fail(
                f"{arg} start partition",
                f"must be one of {allowed} for num_active_partitions={active}",
                start,
                limit=allowed,
            )
    for p in range(dst.partitions):
        q, i = divmod(p, QUADRANT)
        if mask[i] != KEEP and q * QUADRANT + mask[i] >= src.partitions:
            check.fail(
                f"shuffle_mask[{i}]",
                f"must name one of src's {src.partitions} partitions (quadrant {q})",
                mask[i],
            )
    rows = dst.partitions
    source = src._read_raw().reshape(src.partitions, -1)
    current = dst._read_raw().reshape(rows, -1)
    dst._write(shuffled(source, current, mask).reshape(dst.shape), raw=True)
    return check.record("vector", [src], [dst], name)
