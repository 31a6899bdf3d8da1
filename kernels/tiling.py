"""Tiling helpers every kernel shares: a tiled range with its remainder, and the share of a
list of work items each physical core of a logical NeuronCore takes.

Both are plain NKI-language functions (loops, lists and tuples of ints: no generators,
closures or ``try``/``with``), called at trace time from inside the kernels, the tile
plans and the tests alike (nki/get-started/about/lnc.rst: a kernel launched as
``kernel[lnc]`` runs once per physical core, and each instance picks its work from
``nl.program_id(0)`` and ``nl.num_programs(0)``).
"""

from __future__ import annotations

__all__ = ["core_share", "split_work", "tile_size", "tiled"]


def tiled(n, tile, start=0):
    """``(offset, size)`` of each tile of ``tile`` elements covering ``[start, n)``; the last
    tile is the remainder (``size = min(tile, n - offset)``). Empty when ``start >= n``."""
    out = []
    for t0 in range(start, n, tile):
        out.append((t0, min(tile, n - t0)))
    return out


def tile_size(n, tile, t0):
    """Elements of the tile at offset ``t0`` of a range of ``n`` tiled by ``tile``: ``tile``,
    or the remainder for the last one (the sizes :func:`tiled` gives)."""
    return min(tile, n - t0)


def split_work(costs, cores):
    """The indices of ``costs`` each of ``cores`` takes: the largest item first goes to the
    least loaded core (ties: the lower item index, then the lower core), so the cores'
    totals differ by at most the largest item; each core's list is in the original order.

    With one core every index, in order: an LNC=1 launch runs exactly what it ran before.
    Deterministic (a trace-time decision on ints), so every core computes the same split.
    """
    shares = []
    loads = []
    for _ in range(cores):
        shares.append([])
        loads.append(0)
    if cores == 1:
        for i in range(len(costs)):
            shares[0].append(i)
        return shares
    keyed = []
    for i in range(len(costs)):
        keyed.append((-costs[i], i))
    for _, i in sorted(keyed):
        best = 0
        for c in range(1, cores):
            if loads[c] < loads[best]:
                best = c
        shares[best].append(i)
        loads[best] += costs[i]
    for c in range(cores):
        shares[c] = sorted(shares[c])
    return shares


def core_share(items, costs, core, cores):
    """The items (``items[i]`` for the indices :func:`split_work` gives ``core``) this core
    runs, in their original order."""
    out = []
    for i in split_work(costs, cores)[core]:
        out.append(items[i])
    return out
