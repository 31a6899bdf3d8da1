"""Races between the cores of an LNC=2 launch on the same HBM bytes.

The two physical cores of a logical core share one HBM stack and address space
(about-neuron/arch/neuron-features/logical-neuroncore-config.rst) and run concurrently, so
two accesses of the same bytes from different cores are ordered only by a synchronisation
between them. ``nisa.core_barrier(data, cores)`` is that synchronisation for the shared HBM
tensor ``data``: each core signals when its writes to ``data`` are complete and waits for the
other's (nki/api/nki/isa/__init__.py, core_barrier). A barrier orders the accesses of the
tensor it names; the compiler tracks dependencies per tensor, so it does not order other
tensors' accesses.

Happens-before: on each core, count the barriers on a tensor passed before an access (its
*epoch* for that tensor). Barriers are matched one to one across the cores (the lock-step
runner refuses unmatched ones), so an access in epoch k on one core is ordered against an
access in epoch j != k on the other; two accesses in the same epoch are concurrent. A race is
two concurrent accesses of the same bytes from different cores of which at least one writes.
The check reads only the recorded trace and operand views, so it is deterministic.

Overlap is exact: bounding boxes find candidate pairs; a pair of row-structured tiles (rows
of one contiguous run at one stride) is compared by rows and columns; any other pair by the
sets of byte offsets its access patterns reach. An indirect (gather/scatter) operand's bytes
are its indices' targets when values were computed, else its whole allocation.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

import numpy as np

from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.storage import contiguous_strides
from neuron_kernels.interpreter.trace import Instruction

__all__ = ["check_hbm_races"]

_DOC = "nki/api/nki/isa/__init__.py core_barrier"


class _Touch:
    """One HBM access of one instruction on one core."""

    __slots__ = ("core", "ins", "write", "view", "lo", "hi", "rows", "dense", "box")

    def __init__(self, core, ins, write, view, lo, hi, rows, dense):
        self.core, self.ins, self.write, self.view = core, ins, write, view
        self.lo, self.hi, self.rows, self.dense = lo, hi, rows, dense
        self.box = _box(view)


def check_hbm_races(instructions: list[Instruction], views: dict, compute: bool) -> None:
    """Raise NkiValidationError naming both instructions of the first race found.

    Args:
        instructions: the launch's trace, in recorded order.
        views: ``instruction index -> (HBM read views, HBM write views)``.
        compute: whether tensor values (indirect indices) are known.
    """
    epoch: dict[tuple[int, int], int] = defaultdict(int)  # (core, storage) -> barriers passed
    groups: dict[tuple[int, int], list[_Touch]] = defaultdict(list)  # (storage, epoch)
    for ins in instructions:
        if ins.attrs.get("barrier_storage") is not None:
            epoch[(ins.core, ins.attrs["barrier_storage"])] += 1
            continue
        pair = views.get(ins.index)
        if pair is None:
            continue
        for write, ts in ((False, pair[0]), (True, pair[1])):
            for t in ts:
                st = t._storage.uid
                lo, hi, rows, dense = _extent(t)
                touch = _Touch(ins.core, ins, write, t, lo, hi, rows, dense)
                groups[(st, epoch[(ins.core, st)])].append(touch)
    found = []
    for touches in groups.values():
        if len({t.core for t in touches}) < 2 or not any(t.write for t in touches):
            continue
        race = _first_race(touches, compute)
        if race is not None:
            found.append(race)
    if found:
        a, b = min(found, key=lambda r: (r[1].ins.index, r[0].ins.index))
        raise NkiValidationError(
            "nki.jit",
            f"HBM tensor {a.view._storage.name!r}",
            "must not be accessed by both cores with no nisa.core_barrier between when one "
            f"of them writes ({_DOC}; split the work by nl.program_id)",
            f"race between core {a.core} instruction #{a.ins.index} ({a.ins.api}, "
            f"{'writes' if a.write else 'reads'} {_describe(a.view)}) and core {b.core} "
            f"instruction #{b.ins.index} ({b.ins.api}, {'writes' if b.write else 'reads'} "
            f"{_describe(b.view)})",
        )


def _describe(view) -> str:
    return f"{view._storage.name}{list(view.shape)} at element offset {view.offset}"


def _first_race(touches: list[_Touch], compute: bool):
    """The earliest conflicting pair (by the later instruction) among concurrent accesses."""
    touches = sorted(touches, key=lambda t: (t.lo, t.ins.index))
    active: list[tuple[int, int, _Touch]] = []  # heap of (hi, order, touch)
    best = None
    for order, t in enumerate(touches):
        while active and active[0][0] <= t.lo:
            heapq.heappop(active)
        for _, _, other in active:
            if other.core == t.core or not (other.write or t.write):
                continue
            if _overlap(other, t, compute):
                first, second = sorted((other, t), key=lambda x: x.ins.index)
                key = (second.ins.index, first.ins.index)
                if best is None or key < best[0]:
                    best = (key, first, second)
        heapq.heappush(active, (t.hi, order, t))
    return None if best is None else (best[1], best[2])


def _extent(view) -> tuple[int, int, tuple | None, bool]:
    """Byte range [lo, hi) in the allocation; for a row-structured tile its rows
    ``(stride, column lo, column hi)`` in bytes; and whether it covers [lo, hi) densely."""
    item = view.itemsize
    if view._indirect is not None:
        st = view._storage
        return 0, st.size * st.itemsize, None, False
    lo = hi = view.offset
    dims = [(n, s) for n, s in zip(view.shape, view.strides) if n > 1]
    for n, s in dims:
        if s >= 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    merged: list[tuple[int, int]] = []  # outermost first, contiguous neighbours merged
    for n, s in reversed(dims):
        if merged and s == merged[-1][0] * merged[-1][1]:
            merged[-1] = (merged[-1][0] * n, merged[-1][1])
        else:
            merged.append((n, s))
    merged.reverse()
    dense = not merged or (len(merged) == 1 and merged[0][1] == 1)
    rows = None
    if len(merged) == 2 and merged[1][1] == 1 and merged[0][1] > merged[1][0]:
        stride = merged[0][1] * item
        c0 = (lo * item) % stride
        width = merged[1][0] * item
        if c0 + width <= stride:
            rows = (stride, c0, c0 + width)
    return lo * item, (hi + 1) * item, rows, dense


def _box(view) -> tuple | None:
    """The view's elements as a box of its allocation's row-major array: per dimension of
    the allocation, the index range ``(first, last)`` the view spans, when every dimension
    of the view steps along one dimension of the allocation (a tile, also a transposed or
    strided-by-dimension one); else None (merged, repeated or indirect dimensions).

    Two boxes of one allocation share an element exactly when their ranges meet in every
    dimension, so the check needs no byte enumeration (a transposed HBM tile spans many
    rows, and enumerating both tiles' bytes made one LNC=2 matmul trace take minutes)."""
    st = view._storage
    if view._indirect is not None or view.itemsize != st.itemsize or not st.shape:
        return None
    shape = tuple(st.shape)
    strides = contiguous_strides(shape)
    first, rest = [0] * len(shape), view.offset
    for d in range(len(shape)):
        first[d], rest = divmod(rest, strides[d])
    if rest or not all(0 <= f < n for f, n in zip(first, shape)):
        return None
    last = list(first)
    for n, s in zip(view.shape, view.strides):
        if n <= 1:
            continue
        dims = [d for d in range(len(shape)) if shape[d] > 1 and strides[d] == s]
        if len(dims) != 1 or last[dims[0]] != first[dims[0]]:
            return None  # a merged or negative step, or a second step along one dimension
        d = dims[0]
        last[d] = first[d] + n - 1
        if last[d] >= shape[d]:
            return None
    return tuple(zip(first, last))


def _overlap(a: _Touch, b: _Touch, compute: bool) -> bool:
    if not (a.lo < b.hi and b.lo < a.hi):
        return False
    if a.box is not None and b.box is not None:
        return all(f1 <= l2 and f2 <= l1 for (f1, l1), (f2, l2) in zip(a.box, b.box))
    if a.dense and b.dense:
        return True
    if a.rows is not None and b.rows is not None and a.rows[0] == b.rows[0]:
        return a.rows[1] < b.rows[2] and b.rows[1] < a.rows[2]
    if a.dense or b.dense:
        inside, other = (a, b) if a.dense else (b, a)
        return _reaches(other, inside.lo, inside.hi, compute)
    bytes_a = _byte_offsets(a.view, compute)
    bytes_b = _byte_offsets(b.view, compute)
    if bytes_a is None or bytes_b is None:
        return True  # unknown addresses: assume they meet
    return bool(np.intersect1d(bytes_a, bytes_b, assume_unique=False).size)


def _reaches(t: _Touch, lo: int, hi: int, compute: bool) -> bool:
    """Whether any byte ``t`` accesses lies in [lo, hi)."""
    if t.rows is not None:
        stride, c0, c1 = t.rows
        first_row = t.lo - c0
        n_rows = (t.hi - first_row + stride - 1) // stride
        starts = first_row + c0 + np.arange(n_rows, dtype=np.int64) * stride
        return bool(np.any((starts < hi) & (starts + (c1 - c0) > lo)))
    offsets = _byte_offsets(t.view, compute)
    if offsets is None:
        return True
    return bool(np.any((offsets >= lo) & (offsets < hi)))


def _byte_offsets(view, compute: bool) -> np.ndarray | None:
    """Every byte offset (in the allocation) the view reaches."""
    item = view.itemsize
    if view._indirect is not None:
        if not compute:
            return None
        index, inside = view._element_index("race check", skip=True)
        elems = np.asarray(index)[np.asarray(inside)] if inside is not None else index
    else:
        elems = np.asarray(view.offset, dtype=np.int64)
        for n, s in zip(view.shape, view.strides):
            elems = np.add.outer(elems, np.arange(n, dtype=np.int64) * s)
    elems = np.unique(np.asarray(elems, dtype=np.int64).reshape(-1)) * item
    return np.add.outer(elems, np.arange(item, dtype=np.int64)).reshape(-1)
