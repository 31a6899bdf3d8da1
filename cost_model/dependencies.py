"""Dependencies through bytes: the last writers and readers of each storage region, and the
time an instruction's operands are ready (RAW, WAR, WAW) given them."""

from __future__ import annotations

from collections import defaultdict

from neuron_kernels.interpreter.trace import Access, Instruction

__all__ = ["Dependencies"]


class Dependencies:
    """Last writers and readers of each storage region, with their end times and units.

    Speed (the dependency scan is the schedule's hot loop): each Access's region bounds are
    computed once per trace (by identity: the trace holds every Access while it is
    scheduled); a read's overlapping live writes are found by a scan of the storage's write
    table once and then reused (``_read_hits``) until that table changes (a write to the
    storage or a prune), returned in the table's order, so the producer chosen on equal
    ready times is the same one; the RAW/WAR/WAW edge and the cover test are inlined.
    """

    def __init__(self) -> None:
        self.writes: dict[int, dict] = defaultdict(dict)  # storage -> {bounds: (end, unit, index)}
        self.reads: dict[int, dict] = defaultdict(
            dict
        )  # storage -> {(bounds, unit): (end, unit, index)}
        # storage -> {read bounds: [(end, unit, index) of the overlapping writes, in order]}:
        # valid while the storage's write table is unchanged (dropped on every change).
        self._read_hits: dict[int, dict] = {}
        self._bounds_of: dict[int, tuple] = {}  # id(Access) -> _bounds(Access)

    @staticmethod
    def _bounds(a: Access):
        """(p0, p1, byte_lo, byte_hi, row stride, col_lo, col_hi); stride 0 = a plain box.

        An HBM tile of a row-major matrix is rows of one contiguous run at a fixed stride;
        two such tiles with the same stride overlap only if their columns do too (tiles of
        one output side by side do not depend on each other).
        """
        if a.on_chip:
            return (
                a.partition_start,
                a.partition_start + a.partitions,
                a.byte_lo,
                a.byte_hi,
                0,
                0,
                0,
            )
        row = a.elems_per_partition * a.itemsize
        rows = a.partitions
        if rows >= 2 and a.contiguous_bytes == row and len(a.shape) == 2:
            stride, rem = divmod(a.byte_hi - a.byte_lo - row, rows - 1)
            if rem == 0 and stride >= row:
                c0 = a.byte_lo % stride
                if c0 + row <= stride:
                    return (0, 1, a.byte_lo, a.byte_hi, stride, c0, c0 + row)
        return (0, 1, a.byte_lo, a.byte_hi, 0, 0, 0)

    @staticmethod
    def _overlap(b1, b2) -> bool:
        if not (b1[0] < b2[1] and b2[0] < b1[1] and b1[2] < b2[3] and b2[2] < b1[3]):
            return False
        if b1[4] and b1[4] == b2[4]:
            return b1[5] < b2[6] and b2[5] < b1[6]
        return True

    def bounds(self, ins: Instruction):
        """(``_bounds`` of each read, of each write) of ``ins``: computed once per
        instruction for both ``ready`` and ``record`` (and once per Access of the trace)."""
        cache = self._bounds_of
        out = []
        for accs in (ins.reads, ins.writes):
            bs = []
            for a in accs:
                b = cache.get(id(a))
                if b is None:
                    b = cache[id(a)] = self._bounds(a)
                bs.append(b)
            out.append(bs)
        return out

    def ready(self, ins: Instruction, unit: str, same_unit_ok: bool, sync: float, bounds=None):
        """(ready time, binding producer index) from RAW/WAR/WAW on the operands.

        The edge of a producer: on the same engine (not DMA) a WAR/WAW needs nothing and a
        RAW waits for the result (pipeline latency, A12) except on TensorE
        (``same_unit_ok``), whose PSUM accumulation is in order; else its end plus ``sync``.
        """
        # The loops test overlap inline (``_overlap(b, other)``, byte range first).
        read_bounds, write_bounds = bounds if bounds is not None else self.bounds(ins)
        t, who = 0.0, -1
        in_order = unit != "dma"
        all_hits = self._read_hits
        for a, b in zip(ins.reads, read_bounds):
            st = a.storage
            hits_of = all_hits.get(st)
            if hits_of is None:
                hits_of = all_hits[st] = {}
            hits = hits_of.get(b)
            if hits is None:
                p0, p1, lo, hi, stride, c0, c1 = b
                hits = []
                w = self.writes.get(st)
                if w:
                    for (q0, q1, qlo, qhi, qs, d0, d1), v in w.items():
                        if lo < qhi and qlo < hi and p0 < q1 and q0 < p1:
                            if stride and stride == qs and not (c0 < d1 and d0 < c1):
                                continue
                            hits.append(v)
                hits_of[b] = hits
            for end, wunit, widx in hits:
                if wunit == unit and in_order:
                    e = 0.0 if same_unit_ok else end
                else:
                    e = end + sync
                if e > t:
                    t, who = e, widx
        for a, b in zip(ins.writes, write_bounds):
            p0, p1, lo, hi, stride, c0, c1 = b
            st = a.storage
            for (q0, q1, qlo, qhi, qs, d0, d1), (end, wunit, widx) in self.writes[st].items():
                if lo < qhi and qlo < hi and p0 < q1 and q0 < p1:
                    if stride and stride == qs and not (c0 < d1 and d0 < c1):
                        continue
                    e = 0.0 if (wunit == unit and in_order) else end + sync
                    if e > t:
                        t, who = e, widx
            for ((q0, q1, qlo, qhi, qs, d0, d1), _), (end, runit, ridx) in self.reads[st].items():
                if lo < qhi and qlo < hi and p0 < q1 and q0 < p1:
                    if stride and stride == qs and not (c0 < d1 and d0 < c1):
                        continue
                    e = 0.0 if (runit == unit and in_order) else end + sync
                    if e > t:
                        t, who = e, ridx
        return t, who

    @staticmethod
    def _edge(end, producer_unit, unit, same_unit_ok, sync, raw):
        if producer_unit == unit and unit != "dma":
            # In order on one engine: WAR/WAW need nothing more; a RAW waits for the result
            # (pipeline latency, A12) except on TensorE, whose PSUM accumulation is in order.
            if not raw or same_unit_ok:
                return 0.0
            return end
        return end + sync

    def record(self, ins: Instruction, unit: str, end: float, bounds=None) -> None:
        read_bounds, write_bounds = bounds if bounds is not None else self.bounds(ins)
        hits = self._read_hits
        for a, b in zip(ins.writes, write_bounds):
            st = a.storage
            hits.pop(st, None)  # the write table changes: cached read overlaps are stale
            w = self.writes[st]
            r = self.reads[st]
            # Drop the regions ``b`` covers (``_covers(b, region)``, inlined; plain loops,
            # no comprehension call per write).
            dead = []
            if b[4]:  # strided HBM tile: only an identical region is covered
                w.pop(b, None)
                for key in r:
                    if key[0] == b:
                        dead.append(key)
            else:
                p0, p1, lo, hi = b[0], b[1], b[2], b[3]
                for ob in w:
                    if not ob[4] and p0 <= ob[0] and ob[1] <= p1 and lo <= ob[2] and ob[3] <= hi:
                        dead.append(ob)
                for ob in dead:
                    del w[ob]
                dead = []
                for key in r:
                    q = key[0]
                    if not q[4] and p0 <= q[0] and q[1] <= p1 and lo <= q[2] and q[3] <= hi:
                        dead.append(key)
            for key in dead:
                del r[key]
            w[b] = (end, unit, ins.index)
        for a, b in zip(ins.reads, read_bounds):
            r = self.reads[a.storage]
            key = (b, unit)
            old = r.get(key)
            if old is None or old[0] < end:
                r[key] = (end, unit, ins.index)

    @staticmethod
    def _covers(outer, inner) -> bool:
        if outer[4] or inner[4]:  # strided HBM tiles: only an identical region covers
            return outer == inner
        return (
            outer[0] <= inner[0]
            and inner[1] <= outer[1]
            and outer[2] <= inner[2]
            and inner[3] <= outer[3]
        )

    def prune(self, horizon: float) -> None:
        self._read_hits.clear()
        for table in (self.writes, self.reads):
            for st in list(table):
                d = table[st]
                stale = [k for k, v in d.items() if v[0] <= horizon]
                for k in stale:
                    del d[k]
                if not d:
                    del table[st]
