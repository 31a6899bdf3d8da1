"""The compiler's on-chip allocator, emulated: which tile reuses which earlier tile's SBUF or
PSUM bytes (least-recently-freed fit with the interpreter's program-order liveness), so the
scheduler can order a tile after the tiles whose bytes it takes over."""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict

from neuron_kernels.hardware import Target, usable_psum_bytes
from neuron_kernels.interpreter.trace import Trace

__all__ = ["emulate_allocation"]


def emulate_allocation(trace: Trace, target: Target, policies: dict[str, str]):
    """Map first-use instruction -> storages whose bytes it reuses (least-recently-freed fit).

    ``policies`` maps "sbuf"/"psum" to "lru" or "unbounded". Returns (reuse: dict[instr index
    -> set of predecessor storage ids], number of tiles that found no place).
    """
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    size: dict[int, int] = {}
    kind: dict[int, str] = {}
    # Only the buffers emulated here ("lru") need their tiles' lifetimes and sizes.
    emulated = {buf for buf in ("sbuf", "psum") if policies.get(buf, "unbounded") == "lru"}
    if not emulated:
        return defaultdict(set), 0
    for ins in trace.instructions:
        for a in (*ins.reads, *ins.writes):
            if a.buffer not in emulated:
                continue
            u = a.storage
            if u not in first:
                first[u] = ins.index
                kind[u] = a.buffer
                size[u] = a.byte_hi
            else:
                if a.byte_hi > size[u]:
                    size[u] = a.byte_hi
            last[u] = ins.index
    reuse: dict[int, set] = defaultdict(set)
    fallbacks = 0
    for buf, capacity, align in (
        ("sbuf", target.sbuf_usable_bytes, 64),
        ("psum", usable_psum_bytes(target), target.psum_bank_bytes),
    ):
        if policies.get(buf, "unbounded") != "lru":
            continue
        uids = sorted((u for u in first if kind[u] == buf), key=lambda u: first[u])
        live_addr: list[int] = []  # sorted start addresses of live blocks
        live_blocks: dict[int, tuple[int, int]] = {}  # start -> (end, uid)
        expiry: list[tuple[int, int]] = []  # heap of (last use, start addr)
        owners: list[tuple[int, int, int]] = []  # (start, end, uid): last occupant of bytes
        for u in uids:
            need = -(-max(1, size[u]) // align) * align
            while expiry and expiry[0][0] < first[u]:
                _, addr = heapq.heappop(expiry)
                live_blocks.pop(addr, None)
                i = bisect.bisect_left(live_addr, addr)
                if i < len(live_addr) and live_addr[i] == addr:
                    live_addr.pop(i)
            addr = _least_recent_fit(live_addr, live_blocks, owners, last, need, capacity)
            if addr is None:
                fallbacks += 1
                continue
            bisect.insort(live_addr, addr)
            live_blocks[addr] = (addr + need, u)
            heapq.heappush(expiry, (last[u], addr))
            preds = _claim(owners, addr, addr + need, u)
            if preds:
                reuse[first[u]].update(preds)
    return reuse, fallbacks


def _least_recent_fit(live_addr, live_blocks, owners, last, need, capacity):
    """The free position whose previous occupants died longest ago (maximal reuse distance).

    Candidates are the edges of every free gap and of every dead tile inside it; the score
    of a position is the latest last-use among the tiles whose bytes it would reuse.
    """
    # Inlined hot loop: the same candidates, added to the set in the same order and scored
    # in the set's order (a position's score: the latest last use among the tiles it
    # overlaps in ``owners``, -1 if none), so the same pick, also on ties.
    best, best_score = None, None
    gap_lo = 0
    bounds = [(a, live_blocks[a][0]) for a in live_addr] + [(capacity, capacity)]
    n_owners = len(owners)
    bisect_left = bisect.bisect_left
    for blk_lo, blk_hi in bounds:
        gap_hi = blk_lo
        if gap_hi - gap_lo >= need:
            cands = {gap_lo, gap_hi - need}
            add = cands.add
            top = gap_hi - need  # a candidate c fits when gap_lo <= c <= top
            i = bisect_left(owners, (gap_lo, -1, -1))
            if i > 0:
                i -= 1
            while i < n_owners:
                s, e, _ = owners[i]
                if s >= gap_hi:
                    break
                if gap_lo <= s <= top:
                    add(s)
                if gap_lo <= e <= top:
                    add(e)
                if gap_lo <= e - need <= top:
                    add(e - need)
                if gap_lo <= s - need <= top:
                    add(s - need)
                i += 1
            for c in cands:
                hi = c + need
                j = bisect_left(owners, (c, -1, -1))
                if j > 0 and owners[j - 1][1] > c:
                    j -= 1
                score = -1
                while j < n_owners:
                    o = owners[j]
                    if o[0] >= hi:
                        break
                    lu = last[o[2]]
                    if lu > score:
                        score = lu
                    j += 1
                if best_score is None or score < best_score or (score == best_score and c < best):
                    best, best_score = c, score
                    if score < 0:
                        return best
        gap_lo = max(gap_lo, blk_hi)
    return best


def _claim(owners: list, lo: int, hi: int, uid: int) -> set:
    """Record ``uid`` as the occupant of [lo, hi); return the previous occupants."""
    preds = set()
    i = bisect.bisect_left(owners, (lo, -1, -1))
    if i > 0 and owners[i - 1][1] > lo:
        i -= 1
    j = i
    pieces = []
    while j < len(owners) and owners[j][0] < hi:
        s, e, o = owners[j]
        preds.add(o)
        if s < lo:
            pieces.append((s, lo, o))
        if e > hi:
            pieces.append((hi, e, o))
        j += 1
    pieces.append((lo, hi, uid))
    pieces.sort()
    owners[i:j] = pieces
    return preds
