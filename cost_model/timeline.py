"""One modeled resource's busy time: a :class:`Timeline` of merged busy intervals, new work
placed in the earliest gap that fits (an instruction) or spread over the gaps (a DMA
transfer's divisible work). Every time here is *modeled*."""

from __future__ import annotations

import bisect

__all__ = ["Timeline"]


class Timeline:
    """Busy intervals of one resource; new work goes into the earliest gap that fits."""

    __slots__ = ("starts", "ends", "busy", "last_end")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.busy = 0.0
        self.last_end = 0.0

    def copy(self) -> Timeline:
        t = Timeline()
        t.starts, t.ends, t.busy, t.last_end = (
            list(self.starts),
            list(self.ends),
            self.busy,
            self.last_end,
        )
        return t

    def earliest(self, ready: float, dur: float) -> float:
        """Earliest start >= ready with [start, start + dur) free."""
        ends, starts = self.ends, self.starts
        i = bisect.bisect_right(ends, ready)
        t = ready
        n = len(starts)
        while i < n:
            if starts[i] >= t + dur:
                break
            if ends[i] > t:
                t = ends[i]
            i += 1
        return t

    def reserve(self, start: float, dur: float) -> None:
        """Mark [start, start + dur) busy (merged with touching or overlapping intervals)."""
        if dur <= 0:
            return
        end = start + dur
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(ends, start)  # first interval ending at/after start
        j = i
        new_s, new_e = start, end
        covered = 0.0
        while j < len(starts) and starts[j] <= end:
            covered += max(0.0, min(ends[j], end) - max(starts[j], start))
            new_s = min(new_s, starts[j])
            new_e = max(new_e, ends[j])
            j += 1
        starts[i:j] = [new_s]
        ends[i:j] = [new_e]
        self.busy += dur - covered
        if end > self.last_end:
            self.last_end = end

    def place(self, ready: float, dur: float) -> float:
        ends = self.ends
        if ends and ready < ends[-1]:
            start = self.earliest(ready, dur)
            self.reserve(start, dur)
            return start
        # At or after the last busy interval (an in-order engine's usual case): what
        # earliest + reserve give there, without their searches. ends[-1] is the latest end.
        if dur <= 0:
            return ready
        end = ready + dur
        if ends and ready == ends[-1]:
            ends[-1] = end  # touching: merged into the last interval
        else:
            self.starts.append(ready)
            ends.append(end)
        self.busy += dur
        if end > self.last_end:
            self.last_end = end
        return ready

    def fill(self, ready: float, dur: float) -> tuple[float, float]:
        """Divisible work: take free time from ``ready`` on, across gaps, until ``dur`` is done.

        Returns (first start, end). DMA engines round-robin between queues at descriptor
        granularity ([dma-bw]; [dma-intro]; [arch-v2]), so a transfer fills the gaps around others.
        """
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, ready)
        t, left, n = ready, dur, len(starts)
        pieces = []
        while left > 1e-9:
            if i < n and starts[i] <= t:
                if ends[i] > t:
                    t = ends[i]
                i += 1
                continue
            gap_end = starts[i] if i < n else float("inf")
            take = min(left, gap_end - t)
            if take > 0:
                pieces.append((t, take))
                left -= take
                t += take
        if not pieces:
            return ready, ready
        for s, d in pieces:
            self.reserve(s, d)
        return pieces[0][0], pieces[-1][0] + pieces[-1][1]

    def prune(self, horizon: float) -> None:
        """Forget intervals that end before ``horizon`` (no future work can start earlier)."""
        k = bisect.bisect_left(self.ends, horizon)
        if k > 1:
            del self.starts[: k - 1]
            del self.ends[: k - 1]
