"""The instruction trace: what each executed instruction touched, for the cost model.

Every ``nisa.*`` call appends one :class:`Instruction`. Operands are summarised as
:class:`Access` records (buffer, dtype, shape, partitions, bytes, byte range, contiguity),
so the cost model never needs the interpreter's tensor objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Access", "Instruction", "Trace"]


@dataclass(frozen=True, slots=True)
class Access:
    """One operand of one instruction.

    On-chip (SBUF/PSUM) operands: ``partition_start``/``partitions`` give the partition
    range and ``byte_lo``/``byte_hi`` the byte range inside each partition. HBM operands:
    ``partitions`` is the row count of the outermost dim and the byte range is inside the
    whole allocation.
    """

    storage: int
    name: str
    buffer: str  # "sbuf", "psum", "private_hbm", "shared_hbm"
    dtype: str
    shape: tuple[int, ...]
    itemsize: int
    partition_start: int
    partitions: int
    elems_per_partition: int
    byte_lo: int
    byte_hi: int
    contiguous_bytes: int  # bytes in the innermost contiguous run of the access pattern
    inner_stride_bytes: int  # stride of the innermost non-trivial free dim, in bytes

    @property
    def nbytes(self) -> int:
        return self.partitions * self.elems_per_partition * self.itemsize

    @property
    def on_chip(self) -> bool:
        return self.buffer in ("sbuf", "psum")

    def overlaps(self, other: Access) -> bool:
        """Whether two accesses may touch the same bytes (bounding-box test)."""
        if self.storage != other.storage:
            return False
        if self.on_chip:
            if self.partition_start + self.partitions <= other.partition_start:
                return False
            if other.partition_start + other.partitions <= self.partition_start:
                return False
        return self.byte_lo < other.byte_hi and other.byte_lo < self.byte_hi


@dataclass(slots=True)
class Instruction:
    """One executed instruction."""

    index: int
    api: str  # e.g. "nisa.nc_matmul"
    engine: str  # "tensor", "vector", "scalar", "gpsimd", "dma"
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    program_id: tuple[int, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    depends_on: list[int] = field(default_factory=list)  # explicit scheduling edges
    name: str | None = None
    core: int = 0  # physical core of the logical core (program_id(0) of an LNC=2 launch)


@dataclass
class Trace:
    """All instructions of one launch (every program instance), in program order."""

    target: str
    instructions: list[Instruction] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self):
        return iter(self.instructions)

    def count_by_api(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ins in self.instructions:
            counts[ins.api] = counts.get(ins.api, 0) + 1
        return counts

    def count_by_engine(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ins in self.instructions:
            counts[ins.engine] = counts.get(ins.engine, 0) + 1
        return counts
