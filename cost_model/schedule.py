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

Every time this module produces is *modeled*. The parts it schedules with live beside it:
:mod:`.instruction_costs` (what a compute instruction costs), :mod:`.dma` (how a transfer
splits over the DMA engines, its queue), :mod:`.dependencies` (RAW/WAR/WAW through bytes),
:mod:`.allocation` (the compiler's allocator, emulated) and :mod:`.timeline` (one resource's
busy intervals); this module is the list scheduler over them and its result.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace

from neuron_kernels._version import COST_MODEL_VERSION
from neuron_kernels.cost_model.allocation import emulate_allocation
from neuron_kernels.cost_model.dependencies import Dependencies
from neuron_kernels.cost_model.dma import DmaEngines, dma_pieces, dma_queue
from neuron_kernels.cost_model.instruction_costs import ON_CHIP, compute_cost, tensor_cost
from neuron_kernels.cost_model.params import CostParams, params_for
from neuron_kernels.cost_model.timeline import Timeline
from neuron_kernels.hardware import target_from_name
from neuron_kernels.interpreter.trace import Trace

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


# -- the scheduler -----------------------------------------------------------------------


class _Core:
    """One physical core's resources: its engines, DGE queues, 16 DMA engines, dependency
    table and in-order issue state. An LNC=2 launch has two; they share the HBM stack."""

    def __init__(self, n_dma: int) -> None:
        self.tl = {u: Timeline() for u in ("pe", "dve", "act", "pool", "sp", "dge_sp", "dge_act")}
        self.dma = DmaEngines(n_dma)
        self.deps = Dependencies()
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
        reuse, fallbacks = emulate_allocation(trace, tgt, policies)
    else:  # each core allocates in its own SBUF and PSUM
        reuse, fallbacks = {}, 0
        for c in core_ids:
            sub = Trace(trace.target, [ins for ins in instrs if ins.core == c])
            r, f = emulate_allocation(sub, tgt, policies)
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
            q, kind = dma_queue(ins, p, tgt)
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
    # tensor_cost by everything it reads (the API and attributes, the first read's partition
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
                    cost = pe_costs[key] = tensor_cost(ins, p)
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
            pieces, total, direction = dma_pieces(ins, n_dma)
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
            if a.buffer in ON_CHIP and storage_end.get(a.storage, 0.0) < done:  # (on_chip)
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
            pieces, _, _ = dma_pieces(instrs[idx], n_dma)
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
