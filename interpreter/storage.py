"""Memory: the regions (:class:`MemoryRegion`) and one allocation in them (:class:`Storage`),
the flat array a tensor's views address, with what the interpreter tracks about it (liveness,
PSUM accumulation state, the Access records of its views)."""

from __future__ import annotations

import enum
import math

import numpy as np

from neuron_kernels.interpreter import dtypes

__all__ = [
    "MemoryRegion",
    "Storage",
    "contiguous_strides",
    "PSUM_UNWRITTEN",
    "PSUM_VALUE_WRITTEN",
    "PSUM_MATMUL_WRITTEN",
    "PSUM_STATE_UNALLOCATED",
]


class MemoryRegion(enum.Enum):
    """Memory region constants (``nl.sbuf``, ``nl.psum``, ``nl.private_hbm``, ``nl.shared_hbm``)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self) -> str:
        return f"nl.{self.value}"

    @property
    def on_chip(self) -> bool:
        return self is MemoryRegion.sbuf or self is MemoryRegion.psum

    @property
    def is_hbm(self) -> bool:
        return self is MemoryRegion.private_hbm or self is MemoryRegion.shared_hbm


# PSUM per-element state for nc_matmul accumulate inference.
PSUM_UNWRITTEN, PSUM_VALUE_WRITTEN, PSUM_MATMUL_WRITTEN = 0, 1, 2
# Storage.psum_state of a PSUM tile whose state array is not allocated yet (never written
# through a view of part of it): empty, never written to.
PSUM_STATE_UNALLOCATED = np.zeros(0, dtype=np.uint8)
PSUM_STATE_UNALLOCATED.flags.writeable = False
_BUFFER_VALUE = {b: b.value for b in MemoryRegion}


class Storage:
    """One allocation: a flat physical array plus what the interpreter tracks about it.

    ``array`` is None when the launch does not compute (``run(..., compute=False)``):
    shapes, checks, liveness and PSUM state are kept, the values are not.
    """

    __slots__ = (
        "uid",
        "array",
        "dtype",
        "buffer",
        "shape",
        "name",
        "psum_state",
        "psum_fill",
        "full_strides",
        "first_use",
        "last_use",
        "host",
        "written",
        "precise_fp",
        "compute",
        "size",
        "itemsize",
        "partition_elems",
        "bytes_per_partition",
        "on_chip",
        "views",
        "geometry",
        "buffer_value",
        "accesses",
    )

    def __init__(self, uid, shape, dtype, buffer, name, precise_fp, array=None, compute=True):
        self.uid = uid
        self.shape = tuple(shape)
        self.dtype = dtype
        self.buffer = buffer
        self.on_chip = buffer.on_chip
        self.name = name
        self.precise_fp = precise_fp
        self.compute = compute
        self.size = math.prod(self.shape)
        self.itemsize = dtypes.DTYPES[dtype].itemsize
        # Elements per partition (on-chip); the partition stride of a fresh view.
        self.partition_elems = math.prod(self.shape[1:]) if len(self.shape) > 1 else 1
        self.bytes_per_partition = self.partition_elems * self.itemsize
        # Everything a view's bounds check and trace record read from the storage (besides
        # its identity): the key of the per-geometry caches of __getitem__ and _access.
        self.geometry = (self.shape, self.itemsize, self.on_chip)
        self.buffer_value = _BUFFER_VALUE[buffer]  # MemoryRegion.value: an enum property (slow)
        # (shape, strides, offset, dtype) -> Access of a view: equal views share one frozen
        # record. Released with the last view (NkiTensor.__del__).
        self.accesses = None
        if array is None and compute:
            array = np.full(
                self.size, dtypes.sentinel(dtype), dtype=dtypes.storage_dtype(dtype, precise_fp)
            )
        self.array = array if compute else None
        # PSUM: the per-element state array, allocated when first needed (an empty
        # placeholder until then); None for other buffers and once no view is left.
        self.psum_state = PSUM_STATE_UNALLOCATED if buffer is MemoryRegion.psum else None
        # While every element of the tile has one PSUM state, that state (the array's
        # content is then stale or not allocated); None once views wrote different states
        # (the array holds them). Writes through a view of the whole tile keep it uniform
        # without touching the array (NkiTensor._psum_set).
        self.psum_fill = PSUM_UNWRITTEN if self.psum_state is not None else None
        self.full_strides = contiguous_strides(self.shape)  # a fresh view's strides
        self.first_use = -1
        self.last_use = -1
        self.written = False
        self.views = 0  # live NkiTensor views (NkiTensor.__del__ releases psum_state at 0)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))
