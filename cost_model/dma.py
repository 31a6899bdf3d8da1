"""DMA in the cost model: how a transfer splits over the DMA engines that own its partitions
(:func:`dma_pieces`), the 16 engines' timelines (:class:`DmaEngines`), and the queue and
trigger a ``dma_copy`` goes to (:func:`dma_queue`). Every time here is *modeled*."""

from __future__ import annotations

import functools

from neuron_kernels.cost_model.params import CostParams
from neuron_kernels.cost_model.timeline import Timeline
from neuron_kernels.hardware import Target
from neuron_kernels.interpreter.trace import Instruction

__all__ = ["DmaEngines", "dma_pieces", "dma_queue"]


# -- DMA shapes ----------------------------------------------------------------------------


def dma_pieces(ins: Instruction, engines: int):
    """Engine classes [(bytes, buffers, engines)], total bytes, HBM direction of a DMA."""
    src = ins.reads[0] if ins.reads else None
    dst = ins.writes[0] if ins.writes else None
    if src is None or dst is None:
        return (), 0, ""
    # The SBUF side decides the engines: engine e serves partitions [8e, 8e + 8).
    side = dst if dst.on_chip else src if src.on_chip else dst
    key = (
        src.nbytes,
        dst.nbytes,
        src.contiguous_bytes,
        dst.contiguous_bytes,
        src.on_chip,
        dst.on_chip,
        side.partition_start if side.on_chip else 0,
        side.partitions,
        side.elems_per_partition * side.itemsize,
        engines,
    )
    return _dma_shape(*key)


@functools.lru_cache(maxsize=4096)
def _dma_shape(
    src_bytes, dst_bytes, src_contig, dst_contig, src_chip, dst_chip, p0, parts, row, engines
):
    total = max(src_bytes, dst_bytes)
    per_eng = max(1, 128 // engines)
    np_ = max(1, parts if (src_chip or dst_chip) else min(128, parts))
    # A buffer is a run contiguous on both sides (at most one SBUF partition row).
    row_bytes = max(1, row) if (src_chip or dst_chip) else total
    chunk = max(1, min(src_contig, dst_contig, row_bytes))
    bytes_per_row = total / np_
    classes: dict[tuple[int, int], set] = {}
    for e in range(p0 // per_eng, (p0 + np_ - 1) // per_eng + 1):
        rows = min(p0 + np_, (e + 1) * per_eng) - max(p0, e * per_eng)
        nbytes = int(round(rows * bytes_per_row))
        buffers = max(rows, -(-nbytes // chunk))
        classes.setdefault((nbytes, buffers), set()).add(e % engines)
    pieces = tuple((nb, nbuf, frozenset(es)) for (nb, nbuf), es in classes.items())
    if not src_chip and dst_chip:
        hbm = "read"
    elif src_chip and not dst_chip:
        hbm = "write"
    elif not src_chip and not dst_chip:
        hbm = "copy"
    else:
        hbm = ""
    return pieces, total, hbm


# -- DMA engines (grouped while they share a history) ------------------------------------------


class DmaEngines:
    """The 16 DMA engines; engines with identical history share one Timeline (copy on split)."""

    def __init__(self, n: int) -> None:
        self.n = n
        tl = Timeline()
        self.group_of = [0] * n
        self.groups: dict[int, tuple[Timeline, set]] = {0: (tl, set(range(n)))}
        self.next_id = 1

    def split(self, engines: set) -> list[tuple[Timeline, set]]:
        """Groups exactly covering ``engines`` (splitting groups that straddle it)."""
        out = []
        for gid in sorted({self.group_of[e] for e in engines}):
            tl, members = self.groups[gid]
            inside = members & engines
            if inside != members:
                new_tl = tl.copy()
                nid = self.next_id
                self.next_id += 1
                self.groups[nid] = (new_tl, inside)
                self.groups[gid] = (tl, members - inside)
                for e in inside:
                    self.group_of[e] = nid
                out.append((new_tl, inside))
            else:
                out.append((tl, members))
        return out

    def busy_per_engine(self) -> list[float]:
        return [self.groups[self.group_of[e]][0].busy for e in range(self.n)]

    def timelines(self):
        return [tl for tl, _ in self.groups.values()]


# -- queues ----------------------------------------------------------------------------------


def dma_queue(ins: Instruction, p: CostParams, target: Target) -> tuple[str, str]:
    """(queue name, trigger kind) of a DMA instruction."""
    mode = ins.attrs.get("dge_mode") or "unknown"
    if mode == "unknown":
        mode = p.default_dge
    if mode == "hwdge" and not target.has_hwdge:
        mode = p.default_dge
    if mode == "none":
        mode = "static"
    trigger = ins.attrs.get("trigger")
    if mode == "hwdge":
        kind = "dge_act" if trigger == "scalar" else "dge_sp"
    elif mode == "swdge":
        kind = "pool"
    else:
        kind = "sp"
    dst = ins.writes[0] if ins.writes else None
    direction = "load" if (dst is not None and dst.on_chip) else "store"
    if not p.dma_queue_split:
        direction = "any"
    return f"{kind}:{direction}", kind
