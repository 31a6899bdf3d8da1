"""The engine-level cost model: the interpreter's instruction trace -> a modeled timeline.

Structure: an event-driven list scheduler over the engines and DMA queues that AWS's
architecture guides describe (sources cited by key as in :mod:`neuron_kernels.cost_model.params`):

* One timeline per resource: TensorE (``pe``), VectorE (``dve``), ScalarE (``act``), GpSimdE
  (``pool``), the Sync engine (``sp``), the two hardware DGEs, the 16 DMA engines and one
  shared per-core DMA channel. Compute engines run their instructions in program order; an
  instruction starts when its engine can issue it (previous start + initiation interval) and
  its inputs are ready. Pipelined engines overlap: the engine is busy for the initiation
  interval (II) while consumers see the result only after II + pipeline latency.
* Dependencies come from overlapping byte ranges of the recorded ``Access`` operands (RAW,
  WAR, WAW), plus ``Instruction.depends_on``, plus *buffer reuse*: the compiler places tiles in
  a finite SBUF and 8 PSUM banks, so a tile that reuses another's bytes must wait until the
  earlier tile is dead. The allocator is emulated (least-recently-freed fit with
  the interpreter's program-order liveness). PSUM's 8 banks are always emulated; SBUF is by
  default unbounded (the compiler multi-buffers and spills; see ``sbuf_allocator``).
* A ``dma_copy`` is triggered on its queue (software DGE on GpSimd, hardware DGE, or the Sync
  engine for static descriptors), starts after the DMA latency, is split over the DMA engines
  that own its partitions (8 partitions each), and each engine processes one transfer at a
  time, in order within a queue: ``transfer overhead + (bytes + buffers * descriptor bytes) /
  engine rate``. Engines round-robin between queues, so a transfer's work fills the gaps
  around other queues' transfers. All engines share the core's DMA channel
  (``dma_core_gbps``). Loads and stores use separate queues.
* Dependencies on HBM use the tile's row structure, so side-by-side tiles of one matrix do
  not order each other; other HBM accesses use their byte bounding box (conservative).
* Scope: one logical NeuronCore. At LNC=1 one physical core. An LNC=2 trace (instructions
  of cores 0 and 1) runs on two physical cores, each with its own engines, SBUF, PSUM, DMA
  engines and dependency table, sharing the one HBM stack's channel (``dma_core_gbps``,
  logical-neuroncore-config.rst); ``nisa.core_barrier`` and ``nisa.sendrecv`` synchronise
  them (``core_barrier_ns``; sendrecv as DMA transfers). The launch overhead is ``launch_ns``.

Every time this module produces is *modeled*.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace

from neuron_kernels._version import COST_MODEL_VERSION
from neuron_kernels.cost_model.params import CostParams, params_for
from neuron_kernels.hardware import Target, target_from_name, usable_psum_bytes
from neuron_kernels.interpreter.trace import Access, Instruction, Trace

__all__ = [
    "ModeledTimeline",
    "model_trace",
    "ENGINE_LANES",
    "UNITS",
    "COMPUTE_UNITS",
    "ENGINE_OF_LANE",
    "MODEL_VERSION",
]

# Bumped in neuron_kernels/_version.py when the scheduling rules change (the calibration table
# and modeled perf_results entries store it).
MODEL_VERSION = COST_MODEL_VERSION

# Every instruction the interpreter traces and the rule that prices it. A new instruction is
# added here with its rule (tests/cost_model/test_cost_branches.py walks nki.isa and fails on
# a missing entry), so nothing falls back to a default cost unnoticed. "one pass": the
# operand's free size in cycles, the one-input rule ([arch-v2]; [isa-old]; [arch-v3]) [U].
COST_RULES = {
    **dict.fromkeys(("dma_copy", "dma_transpose"), "DMA: bytes over queues and engines"),
    **dict.fromkeys(("nc_matmul", "nc_transpose"), "TensorE: _tensor_cost"),
    # MX: the nc_matmul cycle rule with K = 4 x partitions, so 4x the bf16 FLOP rate
    # (aws-neuron-sdk nki/deep-dives/mxfp-matmul.rst: "4x throughput compared to BF16/FP16").
    "nc_matmul_mx": "TensorE: _tensor_cost, contraction 4x the partitions",
    # VectorE, one pass over the src free size: the deep dive's "Matmul-MX produces data at
    # double the rate that Quantize-MX can consume it" with TensorE at twice VectorE's clock
    # puts it at one element per partition per VectorE cycle [estimate].
    "quantize_mx": "one pass over the src free size (estimate)",
    **dict.fromkeys(
        ("tensor_copy", "tensor_scalar", "iota", "memset", "activation"),
        "free size; 2x/4x DVE perf mode for 2-byte copies and tensor_scalar",
    ),
    "tensor_tensor": "2N, N with a PSUM input or the 2-byte perf mode",
    "tensor_reduce": "source free size, half for 2-byte add/max",
    "tensor_scalar_reduce": "N + MIN_II",
    **dict.fromkeys(("scalar_tensor_tensor", "tensor_tensor_scan"), "2N"),
    "reciprocal": "8N",
    "bn_stats": "source free size",
    "bn_aggr": "13/3 of the source free size",
    "tensor_copy_predicated": "2N with two SBUF inputs, else N",
    "exponential": "N/4 (NC-v4)",
    "activation_reduce": "ScalarE: free size + reduce cycles, table switches",
    "activate2": "ScalarE: as activation (free size, reduce cycles, table switches)",
    **dict.fromkeys(
        (
            "range_select",
            "max8",
            "select_reduce",
            "tensor_scalar_cumulative",
            "affine_select",
            "tensor_partition_reduce",
            "nc_find_index8",
            "nonzero_with_count",
            # a VectorE copy across partitions within quadrants: one pass over the free size,
            # as tensor_copy; the docs give it no 2-byte performance mode
            "nc_stream_shuffle",
        ),
        "one pass",
    ),
    **dict.fromkeys(("register_load", "register_store"), "sync engine: one minimal instruction"),
    "core_barrier": "both cores wait for the later, then core_barrier_ns (LNC=2)",
    "sendrecv": "after both arrive: DMA latency + per-engine transfers, SBUF to SBUF (LNC=2)",
}

# The one list of modeled lanes: compute engines and the DGE queues they drive, then DMA.
COMPUTE_UNITS = {"tensor": "pe", "vector": "dve", "scalar": "act", "gpsimd": "pool", "sync": "sp"}
ENGINE_OF_LANE = {lane: engine for engine, lane in COMPUTE_UNITS.items()}
ENGINE_LANES = ("pe", "dve", "act", "pool", "sp", "dge_sp", "dge_act")
UNITS = (*ENGINE_LANES, "dma")
UNIT_LABEL = {
    "pe": "TensorE",
    "dve": "VectorE",
    "act": "ScalarE",
    "pool": "GpSimdE",
    "sp": "SyncE",
    "dge_sp": "DGE (SyncE)",
    "dge_act": "DGE (ScalarE)",
    "dma": "DMA engines",
}
_FP32 = {"float32"}
_TWO_BYTE_FLOAT = {"bfloat16", "float16"}
_ON_CHIP = ("sbuf", "psum")
_FP8 = {"float8_e4m3", "float8_e5m2", "float8_e4m3fn"}

# Activation functions grouped into table sets; "copy"-like ops need no table. Which function
# shares a table with which is unpublished [U]; these groups follow the set names in the
# runtime docs (natural_log_exp_and_others, gelu_and_others, ...).
_NO_TABLE = {"copy", "identity", "bypass"}
_TABLE_SET = {
    "exp": "exp_log",
    "log": "exp_log",
    "softplus": "exp_log",
    "mish": "exp_log",
    "gelu": "gelu",
    "gelu_dx": "gelu",
    "gelu_apprx_tanh": "gelu",
    "gelu_apprx_sigmoid": "gelu",
    "gelu_apprx_sigmoid_dx": "gelu",
    "erf": "gelu",
    "erf_dx": "gelu",
    "sigmoid": "sigmoid",
    "silu": "sigmoid",
    "silu_dx": "sigmoid",
    "tanh": "sigmoid",
}


# -- timelines -----------------------------------------------------------------------------


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


# -- the result --------------------------------------------------------------------------


@dataclass
class ModeledTimeline:
    """The modeled schedule of one trace (all times in ns, all *modeled*)."""

    target: str
    params: CostParams
    latency_ns: float
    start: list[float]
    end: list[float]
    unit: list[str]  # per instruction: pe/dve/act/pool/sp/dma
    occupancy: list[float]  # per instruction: time its unit is held (II, or the DMA span)
    busy_ns: dict[str, float]
    dma_engine_busy_ns: list[float]
    dma_active_ns: float
    dma_queue: dict[int, str]  # instruction index -> queue name
    dma_bytes: dict[int, int]  # instruction index -> bytes moved
    dma_hbm_bytes: dict[str, int]  # "read"/"write" (HBM side)
    flops: dict[str, float]  # "matmul" raw FLOPs, "bf16_equivalent", "transpose"
    critical_path: dict[str, float]  # unit -> ns on the critical path ("wait" = latencies)
    critical_unit: str
    alloc_fallbacks: int = 0  # buffers the "lru" allocator could not place (modeled as unbounded)
    # instruction index -> (trigger lane, start, end) of each DMA's trigger on its engine
    dma_trigger: dict[int, tuple[str, float, float]] = field(default_factory=dict)
    # physical cores scheduled (the launch's LNC); busy_ns sums them, dma_engine_busy_ns
    # lists 16 engines per core
    cores: int = 1


# -- per-instruction costs ---------------------------------------------------------------


def _stride_factor(p: CostParams, accesses) -> float:
    threshold = p.stride_threshold_bytes
    for a in accesses:
        if a.inner_stride_bytes > threshold and a.buffer in _ON_CHIP:  # (Access.on_chip)
            return p.stride_penalty
    return 1.0


def _n_free(accesses) -> int:
    """The largest free size of ``accesses`` (1 for none)."""
    n = 0
    for a in accesses:
        e = a.elems_per_partition
        if e > n:
            n = e
    return n if accesses else 1


def _data_operands(ops, n: int) -> list:
    """Data operands only: a [P, 1] scalar-operand tile does not decide the performance
    mode (the operands of the largest free size ``n``; all of them if none is)."""
    return [a for a in ops if a.elems_per_partition == n] or list(ops)


def _all_two_byte(data) -> bool:
    """Every operand is BF16/FP16 (and there is one)."""
    for a in data:
        if a.dtype not in _TWO_BYTE_FLOAT:
            return False
    return bool(data)


def _vector_cycles(api: str, ins: Instruction, p: CostParams, perf_mode: bool) -> float:
    """VectorE (or GpSimd, perf_mode=False) cycles excluding MIN_II ([arch-v2]; [isa-old]; [arch-v3])."""
    ops = (*ins.reads, *ins.writes)
    n = _n_free(ops)
    if api in ("tensor_copy", "tensor_scalar", "activation", "iota", "memset"):
        cycles = float(n)
        if perf_mode and api in ("tensor_copy", "tensor_scalar"):
            data = _data_operands(ops, n)
            if _all_two_byte(data):
                any_psum, unit_stride = False, True
                for a in data:
                    if a.buffer == "psum":
                        any_psum = True
                    if a.inner_stride_bytes > a.itemsize:  # not a unit-stride operand
                        unit_stride = False
                cycles /= 4.0 if (not any_psum and unit_stride) else 2.0
        return cycles
    if api == "tensor_tensor":
        for a in ins.reads:
            if a.buffer == "psum":
                return float(n)  # one input streams from PSUM: N, not 2N ([isa-old])
        if perf_mode and _all_two_byte(_data_operands(ops, n)):
            return float(n)  # NC-v3: both SBUF, all BF16/FP16 -> 2x
        return 2.0 * n
    if api == "tensor_reduce":
        src = _n_free(ins.reads)
        op = ins.attrs.get("op")
        fast = {a.dtype for a in ins.reads} <= _TWO_BYTE_FLOAT and op in ("add", "maximum")
        return src / 2.0 if fast else float(src)
    if api == "tensor_scalar_reduce":
        return float(n) + p.min_ii_cycles
    if api in ("scalar_tensor_tensor", "tensor_tensor_scan"):
        return 2.0 * n
    if api == "reciprocal":
        return 8.0 * n
    if api == "bn_stats":
        return float(_n_free(ins.reads))
    if api == "bn_aggr":
        return 13.0 * _n_free(ins.reads) / 3.0
    if api == "tensor_copy_predicated":
        in_sbuf = sum(1 for a in ins.reads if a.buffer == "sbuf")
        return 2.0 * n if in_sbuf >= 2 else float(n)
    if api == "exponential":  # NC-v4: 4x ScalarE exp throughput ([arch-v2]; [isa-old]; [arch-v3])
        return n / 4.0
    # nc_transpose (32x32 blocks), range_select, max8, select_reduce, tensor_scalar_cumulative
    # and anything newer: one pass over the operand, the one-input rule ([arch-v2]; [isa-old]; [arch-v3]) [U].
    return float(n)


def _tensor_cost(ins: Instruction, p: CostParams) -> tuple[float, float, float, float]:
    """(II ns, latency ns, raw FLOPs, bf16-equivalent FLOPs) of a TensorE instruction."""
    a = ins.attrs
    k = int(a.get("K", ins.reads[0].partitions if ins.reads else 128))
    m = int(a.get("M", 128))
    n = int(a.get("N", 128))
    dt = {a.get("stationary_dtype"), a.get("moving_dtype")}
    transpose = bool(a.get("is_transpose")) or ins.api.endswith("nc_transpose")
    mm = max(min(p.mm_min_cycles, m), n)  # isa-old: max(min(64, N_stationary), N_moving)
    ls = m / p.ls_speedup  # background LoadStationary of this matmul's stationary
    cycles = max(mm, ls)
    if dt & _FP32:
        cycles *= p.fp32_transpose_factor if transpose else p.fp32_mm_factor
    tiling = a.get("tiling")
    if tiling:  # PE tiling: a row x column quadrant; several tiles share the array [U]
        rows, cols = tiling[0], tiling[1]
        cycles *= (rows * cols) / (128.0 * 128.0)
    ii = cycles / p.pe_ghz
    raw = 2.0 * k * m * n
    if a.get("mx"):  # nc_matmul_mx: 4x bf16's rate (deep dives/mxfp-matmul.rst)
        equiv = raw * 0.25
    elif dt & _FP32:
        equiv = raw * 4.0
    elif dt <= _FP8 and len(dt) > 0:
        equiv = raw * 0.5
    else:
        equiv = raw
    return ii, ii + p.pe_fill_cycles / p.pe_ghz, raw, equiv


def compute_cost(ins: Instruction, p: CostParams, act_state: dict) -> tuple[float, float]:
    """(II ns, end latency ns) of a compute-engine instruction."""
    api = ins.api.rsplit(".", 1)[-1]
    eng = ins.engine
    ops = (*ins.reads, *ins.writes)
    if eng == "vector":
        cycles = _vector_cycles(api, ins, p, bool(p.dve_perf_mode))
        cycles = max(p.min_ii_cycles, cycles) * _stride_factor(p, ops)
        ii = cycles / p.dve_ghz
        return ii, ii + p.engine_latency_cycles / p.dve_ghz
    if eng == "scalar":
        n = _n_free(ops)
        cycles = float(n)
        if api == "tensor_copy" or (api == "activation" and ins.attrs.get("op") == "copy"):
            dtypes = {a.dtype for a in ops}
            if p.act_fast_bf16 and dtypes and dtypes <= _TWO_BYTE_FLOAT:
                cycles /= 2.0
        cycles = max(p.min_ii_cycles, cycles)
        reduce_cmd = ins.attrs.get("reduce_cmd")
        if (
            api == "activation_reduce"
            or reduce_cmd in ("reduce", "reset_reduce")
            or ins.attrs.get("reads_out")
        ):
            cycles += p.act_reduce_cycles
        cycles *= _stride_factor(p, ops)
        ii = cycles / p.act_ghz
        op = ins.attrs.get("op")
        if op is not None and op not in _NO_TABLE:
            table = _TABLE_SET.get(op, op)
            if act_state.get("table") not in (None, table):
                ii += p.act_table_switch_ns
            act_state["table"] = table
        return ii, ii + p.engine_latency_cycles / p.act_ghz
    if eng == "gpsimd":
        cycles = p.pool_start_cycles + _vector_cycles(api, ins, p, False)
        cycles *= _stride_factor(p, ops)
        ii = cycles / p.pool_ghz
        return ii, ii + p.engine_latency_cycles / p.pool_ghz
    # sync or an engine this model does not know: one minimal instruction
    ii = p.min_ii_cycles / p.act_ghz
    return ii, ii


# -- DMA shapes ----------------------------------------------------------------------------


def _dma_pieces(ins: Instruction, engines: int):
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


# -- the compiler's allocator, emulated ----------------------------------------------------


def _emulate_allocation(trace: Trace, target: Target, policies: dict[str, str]):
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


# -- dependencies through bytes ---------------------------------------------------------


class _Deps:
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


# -- DMA engines (grouped while they share a history) ------------------------------------------


class _DmaEngines:
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


# -- the scheduler -----------------------------------------------------------------------


def _dma_queue(ins: Instruction, p: CostParams, target: Target) -> tuple[str, str]:
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


class _Core:
    """One physical core's resources: its engines, DGE queues, 16 DMA engines, dependency
    table and in-order issue state. An LNC=2 launch has two; they share the HBM stack."""

    def __init__(self, n_dma: int) -> None:
        self.tl = {u: Timeline() for u in ("pe", "dve", "act", "pool", "sp", "dge_sp", "dge_act")}
        self.dma = _DmaEngines(n_dma)
        self.deps = _Deps()
        self.issue_ready: dict[str, float] = defaultdict(float)  # in-order: next issue per unit
        self.last_on_unit: dict[str, int] = {}
        self.queue_trigger: dict[str, float] = defaultdict(float)
        self.queue_last: dict[str, int] = {}
        self.queue_engine_end: dict[str, list[float]] = {}
        self.act_state: dict = {}
        self.remaining: dict[str, int] = defaultdict(int)


def model_trace(
    trace: Trace, target=None, params: CostParams | None = None, **overrides
) -> ModeledTimeline:
    """Schedule ``trace`` on ``target`` and return the modeled timeline.

    An LNC=2 trace (instructions of cores 0 and 1, ``Instruction.core``) is scheduled on two
    physical cores, each with its own engines, SBUF, PSUM and DMA engines, sharing one HBM
    stack's bandwidth (``dma_core_gbps``); ``nisa.core_barrier`` releases both cores when the
    later arrives (plus ``core_barrier_ns``) and ``nisa.sendrecv`` moves each core's tile over
    its DMA engines once both arrived. The latency is the logical core's: until both finish.

    Args:
        trace: the interpreter's trace (``Run.trace``).
        target: ``trn1``/``trn2``/``trn3`` or a :class:`Target`; default the trace's target.
        params: a :class:`CostParams`; default the target's table (``overrides`` applied).
    """
    tgt = target_from_name(target if target is not None else trace.target)
    full = params if params is not None else params_for(tgt.name, **overrides)
    p = SimpleNamespace(**full.values())  # plain attributes: read ~10 times per instruction
    instrs = trace.instructions
    n = len(instrs)
    sync = float(p.sync_ns)
    core_ids = sorted({ins.core for ins in instrs}) or [0]
    policies = {"sbuf": str(p.sbuf_allocator), "psum": str(p.psum_allocator)}
    if len(core_ids) == 1:
        reuse, fallbacks = _emulate_allocation(trace, tgt, policies)
    else:  # each core allocates in its own SBUF and PSUM
        reuse, fallbacks = {}, 0
        for c in core_ids:
            sub = Trace(trace.target, [ins for ins in instrs if ins.core == c])
            r, f = _emulate_allocation(sub, tgt, policies)
            reuse.update(r)
            fallbacks += f

    n_dma = int(p.dma_engines)
    cores = {c: _Core(n_dma) for c in core_ids}
    # Pre-pass: units, queues and remaining work per in-order stream (for pruning).
    units: list[str] = []
    queues: dict[int, str] = {}
    for idx, ins in enumerate(instrs):
        remaining = cores[ins.core].remaining
        if ins.engine == "dma":
            units.append("dma")
            if ins.attrs.get("sendrecv"):
                continue
            q, kind = _dma_queue(ins, p, tgt)
            queues[idx] = (q, kind)
            remaining["q:" + q] += 1
        else:
            u = COMPUTE_UNITS.get(ins.engine, "sp")
            units.append(u)
            remaining[u] += 1

    channel = Timeline()  # the HBM stack: shared by the cores of a logical core
    storage_end: dict[int, float] = {}

    start = [0.0] * n
    end = [0.0] * n
    occ = [0.0] * n
    pred = [-1] * n
    dma_bytes: dict[int, int] = {}
    hbm = {"read": 0, "write": 0}
    flops = {"matmul": 0.0, "bf16_equivalent": 0.0, "transpose": 0.0}
    dma_spans: list[tuple[float, float]] = []
    dma_trigger: dict[int, tuple[str, float, float]] = {}
    bw_eng = float(p.dma_engine_gbps)  # GB/s = bytes/ns
    # One core alone gets dma_core_gbps of its stack; the two cores of an LNC=2 logical core
    # share the whole stack (hbm_stack_gbps) through one channel.
    bw_core = float(p.dma_core_gbps) if len(cores) == 1 else float(p.hbm_stack_gbps)
    desc = float(p.dma_descriptor_bytes)
    t_xfer = float(p.dma_transfer_ns)
    prune_every = 8192
    # _tensor_cost by everything it reads (the API and attributes, the first read's partition
    # count when K is not given): a kernel repeats a few matmul shapes thousands of times.
    pe_costs: dict[tuple, tuple[float, float, float, float]] = {}
    pending: dict[int, tuple[int, float, int]] = {}  # core -> (index, arrival, producer)

    for idx, ins in enumerate(instrs):
        unit = units[idx]
        core = cores[ins.core]
        deps, tl, dma = core.deps, core.tl, core.dma
        bounds = deps.bounds(ins)
        ready, who = deps.ready(ins, unit, (unit == "pe"), sync, bounds)
        for d in ins.depends_on:
            if 0 <= d < idx and end[d] + sync > ready:
                ready, who = end[d] + sync, d
        for u in reuse.get(ins.index, ()):
            e = storage_end.get(u, 0.0) + sync
            if e > ready:
                ready, who = e, -2

        if ins.attrs.get("lnc_sync"):
            # core_barrier / sendrecv: wait here until every core arrived at its match.
            arrival = max(ready, core.issue_ready[unit]) if unit != "dma" else ready
            pending[ins.core] = (idx, arrival, who)
            if len(pending) == len(cores):
                _complete_sync(
                    pending, instrs, units, cores, p, start, end, occ, pred, dma_spans, storage_end
                )
                pending.clear()
            continue

        if unit != "dma":
            if unit == "pe":
                a = ins.attrs
                key = (
                    ins.api,
                    a.get("K"),
                    a.get("M"),
                    a.get("N"),
                    a.get("stationary_dtype"),
                    a.get("moving_dtype"),
                    a.get("is_transpose"),
                    a.get("tiling"),
                    a.get("mx"),
                    None if "K" in a or not ins.reads else ins.reads[0].partitions,
                )
                cost = pe_costs.get(key)
                if cost is None:
                    cost = pe_costs[key] = _tensor_cost(ins, p)
                ii, lat, raw, equiv = cost
                is_t = bool(ins.attrs.get("is_transpose")) or ins.api.endswith("nc_transpose")
                flops["transpose" if is_t else "matmul"] += raw
                if not is_t:
                    flops["bf16_equivalent"] += equiv
            else:
                ii, lat = compute_cost(ins, p, core.act_state)
            t_in = core.issue_ready[unit]
            s = tl[unit].place(max(ready, t_in), ii)
            start[idx], end[idx], occ[idx] = s, s + lat, ii
            core.issue_ready[unit] = s + ii
            pred[idx] = who if (ready >= t_in and who != -2) else core.last_on_unit.get(unit, -1)
            core.last_on_unit[unit] = idx
            core.remaining[unit] -= 1
        else:
            q, kind = queues[idx]
            pieces, total, direction = _dma_pieces(ins, n_dma)
            dma_bytes[idx] = total
            if direction in ("read", "write"):
                hbm[direction] += total
            elif direction == "copy":
                hbm["read"] += total
                hbm["write"] += total
            # Trigger: in order on its queue, on the trigger resource.
            t_q = core.queue_trigger[q]
            t_ready = max(ready, t_q)
            if kind == "pool":
                cost = p.swdge_issue_cycles / p.pool_ghz
            elif kind in ("dge_sp", "dge_act"):
                cost = float(p.hwdge_issue_ns)
            else:
                cost = float(p.static_issue_ns)
            t_trig = tl[kind].place(t_ready, cost) if cost > 0 else t_ready
            if cost > 0:
                dma_trigger[idx] = (kind, t_trig, t_trig + cost)
            core.queue_trigger[q] = t_trig
            data_ready = t_trig + cost + float(p.dma_latency_ns)
            transpose = bool(ins.attrs.get("transpose"))
            eff = 1.0
            if transpose:
                on_chip_src = ins.reads and ins.reads[0].on_chip
                eff = float(p.dma_transpose_sbuf_eff if on_chip_src else p.dma_transpose_hbm_eff)
            t_end = data_ready
            t_start = float("inf")
            qe = core.queue_engine_end.get(q)
            if qe is None:
                qe = core.queue_engine_end[q] = [0.0] * n_dma
            for nb, nbuf, engines in pieces:
                dur = t_xfer + (nb + nbuf * desc) / (bw_eng * eff)
                for etl, members in dma.split(engines):
                    r = max(data_ready, max(qe[e] for e in members))
                    s, fin = etl.fill(r, dur)
                    if direction:
                        _, c_end = channel.fill(s, nb * len(members) / bw_core)
                        if c_end > fin:
                            fin = c_end
                    for e in members:
                        qe[e] = fin
                    if s < t_start:
                        t_start = s
                    if fin > t_end:
                        t_end = fin
            if t_start == float("inf"):
                t_start = data_ready
            start[idx], end[idx], occ[idx] = t_start, t_end, t_end - t_start
            dma_spans.append((t_start, t_end))
            if ready >= t_q and who != -2:
                pred[idx] = who
            else:
                pred[idx] = core.queue_last.get(q, -1)
            core.queue_last[q] = idx
            core.remaining["q:" + q] -= 1

        deps.record(ins, unit, end[idx], bounds)
        done = end[idx]
        for a in (*ins.reads, *ins.writes):
            if a.buffer in _ON_CHIP and storage_end.get(a.storage, 0.0) < done:  # (on_chip)
                storage_end[a.storage] = done

        if idx % prune_every == prune_every - 1:
            horizons = [
                _horizon(c.remaining, c.issue_ready, c.queue_trigger) for c in cores.values()
            ]
            horizon = min(horizons)
            if horizon > 0:
                for c in cores.values():
                    c.deps.prune(horizon - sync)
                    for t in (*c.tl.values(), *c.dma.timelines()):
                        t.prune(horizon)
                channel.prune(horizon)

    latency = (max(end) if n else 0.0) + float(p.launch_ns)
    busy: dict[str, float] = defaultdict(float)
    eng_busy: list[float] = []
    for c in cores.values():  # summed over the cores: utilization divides by their count
        for u, t in c.tl.items():
            busy[u] += t.busy
        eng_busy += c.dma.busy_per_engine()
    busy["dma"] = max(eng_busy) if eng_busy else 0.0
    crit, crit_unit = _critical_path(start, end, units, pred, occ)
    return ModeledTimeline(
        target=tgt.name,
        params=full,
        latency_ns=latency,
        start=start,
        end=end,
        unit=units,
        occupancy=occ,
        busy_ns=dict(busy),
        dma_engine_busy_ns=eng_busy,
        dma_active_ns=_union(dma_spans),
        dma_queue={i: q for i, (q, _) in queues.items()},
        dma_bytes=dma_bytes,
        dma_hbm_bytes=hbm,
        flops=flops,
        critical_path=crit,
        critical_unit=crit_unit,
        alloc_fallbacks=fallbacks,
        dma_trigger=dma_trigger,
        cores=len(cores),
    )


def _complete_sync(
    pending, instrs, units, cores, p, start, end, occ, pred, dma_spans, storage_end
) -> None:
    """Release the cores from one matched ``core_barrier`` or ``sendrecv`` group.

    Barrier: each core's engine is blocked from its arrival until the later core's arrival
    plus ``core_barrier_ns`` (the remote semaphore update and local wait; isa core_barrier).
    Sendrecv: once both arrived, each core's DMA engines move its ``src`` to the peer's SBUF
    (DMA latency, then per-engine transfers as a dma_copy's; SBUF to SBUF, so not through the
    HBM stack); the group completes when both transfers did.
    """
    latest = max(arrival for _, arrival, _ in pending.values())
    first_idx = min(idx for idx, _, _ in pending.values())
    release = latest
    if instrs[first_idx].attrs.get("sendrecv"):
        n_dma = int(p.dma_engines)
        begin = latest + float(p.dma_latency_ns)
        bw_eng = float(p.dma_engine_gbps)
        desc = float(p.dma_descriptor_bytes)
        for c, (idx, _, _) in pending.items():
            pieces, _, _ = _dma_pieces(instrs[idx], n_dma)
            for nb, nbuf, engines in pieces:
                dur = float(p.dma_transfer_ns) + (nb + nbuf * desc) / bw_eng
                for etl, _ in cores[c].dma.split(engines):
                    _, fin = etl.fill(begin, dur)
                    release = max(release, fin)
    else:
        release = latest + float(p.core_barrier_ns)
    for c, (idx, arrival, who) in pending.items():
        core, ins, unit = cores[c], instrs[idx], units[idx]
        start[idx], end[idx], occ[idx] = arrival, release, release - arrival
        # the producer that made this core wait: its own input, else the other core
        pred[idx] = (
            who
            if arrival >= latest
            else max((j for j, a, _ in pending.values() if a == latest), default=-1)
        )
        if unit == "dma":
            dma_spans.append((arrival, release))
        else:
            core.tl[unit].reserve(arrival, release - arrival)
            core.issue_ready[unit] = release
            core.last_on_unit[unit] = idx
            core.remaining[unit] -= 1
        core.deps.record(ins, unit, release)
        for a in (*ins.reads, *ins.writes):
            if a.on_chip and storage_end.get(a.storage, 0.0) < release:
                storage_end[a.storage] = release


def _horizon(remaining, issue_ready, queue_trigger) -> float:
    """No future instruction can start before this time (min over streams with work left)."""
    h = float("inf")
    for key, left in remaining.items():
        if left <= 0:
            continue
        t = queue_trigger[key[2:]] if key.startswith("q:") else issue_ready[key]
        h = min(h, t)
    return 0.0 if h == float("inf") else h


def _union(spans) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _critical_path(start, end, units, pred, occ) -> tuple[dict[str, float], str]:
    """Walk back from the last instruction to finish; time per unit on that path."""
    path: dict[str, float] = defaultdict(float)
    if not end:
        return {}, "none"
    i = max(range(len(end)), key=end.__getitem__)
    seen = 0
    while i >= 0 and seen < len(end):
        seen += 1
        j = pred[i]
        lo = end[j] if j >= 0 else 0.0
        work = end[i] - start[i]
        path[units[i]] += work
        gap = start[i] - lo
        if gap > 0:
            path["wait"] += gap
        elif gap < 0:  # overlapped with its predecessor (pipelined): count only the new part
            path[units[i]] += gap
        if j < 0:
            break
        i = j
    real = {u: v for u, v in path.items() if u != "wait"}
    crit = max(real, key=real.get) if real else "none"
    return dict(path), crit
