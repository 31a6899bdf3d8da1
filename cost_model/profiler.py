"""Modeled kernel profiles: run a kernel on the interpreter, schedule its trace on the cost
model, and report latency, engine busy time, FLOP and bandwidth use, and on-chip peaks.

    from neuron_kernels.interpreter import profile
    report = profile(kernel, target="trn2")(a, b)     # a raw kernel
    print(report.text())

    profiler = Profiler(target="trn2")                # or as an OpSpec runner
    spec.run_kernels(a, b, config=config, runner=profiler)
    report = profiler.report()

Every number here is *modeled* (interpreter trace + cost model); none is a measurement.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from neuron_kernels.cost_model.params import CostParams, params_for
from neuron_kernels.cost_model.schedule import (
    ENGINE_LANES,
    ENGINE_OF_LANE,
    MODEL_VERSION,
    UNIT_LABEL,
    ModeledTimeline,
    model_trace,
)
from neuron_kernels.hardware import Target, target_from_name, usable_psum_banks
from neuron_kernels.interpreter.execution import Run, run
from neuron_kernels.interpreter.kernel import Kernel

__all__ = ["dma_floor_ns", "profile", "Profiler", "Profile", "LaunchProfile"]

MODELED = "modeled"


def dma_floor_ns(params: CostParams, nbytes: float, lnc: int = 1) -> float:
    """The DMA floor: ``nbytes`` of HBM traffic at the logical core's full DMA rate, the
    lesser of its HBM bandwidth and its DMA engines together (GB/s = bytes/ns): at LNC=1
    ``min(dma_core_gbps, dma_engine_gbps * dma_engines)``; at LNC=2 both cores' engines,
    bounded by the one HBM stack they share (``hbm_stack_gbps``). The one formula every
    floor in the project uses."""
    stack = params.dma_core_gbps if lnc == 1 else params.hbm_stack_gbps
    rate = min(float(stack), float(params.dma_engine_gbps) * params.dma_engines * lnc)
    return nbytes / rate


@dataclass
class LaunchProfile:
    """One kernel launch: its interpreter run and its modeled timeline."""

    kernel: str
    run: Run
    timeline: ModeledTimeline


@dataclass
class Profile:
    """A modeled profile of one or more launches (run back to back on one logical NeuronCore).

    Every rate, peak, floor and utilization is per *logical* core at the launches' LNC: at
    LNC=2 its two physical cores' engines and peaks add up, and they share one HBM stack."""

    target: str
    params: CostParams
    launches: list[LaunchProfile] = field(default_factory=list)

    # -- aggregate numbers (all modeled) -------------------------------------------------
    @property
    def lnc(self) -> int:
        """Physical cores of the logical core the launches were scheduled on (their LNC)."""
        return max((lp.timeline.cores for lp in self.launches), default=1)

    @property
    def unit(self) -> str:
        """What every figure is per: ``"per logical core, LNC=2"``."""
        return f"per logical core, LNC={self.lnc}"

    @property
    def latency_ns(self) -> float:
        return sum(lp.timeline.latency_ns for lp in self.launches)

    def busy_ns(self) -> dict[str, float]:
        out: Counter = Counter()
        for lp in self.launches:
            out.update(lp.timeline.busy_ns)
        return dict(out)

    def utilization(self) -> dict[str, float]:
        lat = self.latency_ns or 1.0
        cores = self.lnc
        busy = self.busy_ns()
        # busy time sums the cores' engines: divide by the logical core's engine time
        util = {u: busy.get(u, 0.0) / lat / cores for u in ENGINE_LANES}
        dma_busy = sum(sum(lp.timeline.dma_engine_busy_ns) for lp in self.launches)
        util["dma"] = dma_busy / (lat * max(1, int(self.params.dma_engines)) * cores)
        util["dma_active"] = sum(lp.timeline.dma_active_ns for lp in self.launches) / lat
        return util

    def flops(self) -> dict[str, float]:
        out: Counter = Counter()
        for lp in self.launches:
            out.update(lp.timeline.flops)
        return dict(out)

    @property
    def peak_flops_per_s(self) -> float:
        """BF16 TensorE peak of the logical core: LNC x 2 x 128 x 128 x clock (the profiler's
        HFU denominator)."""
        return self.lnc * 2.0 * 128 * 128 * float(self.params.pe_ghz) * 1e9

    def tensor_utilization(self) -> dict[str, float]:
        """HFU (raw matmul FLOPs vs BF16 peak) and the BF16-equivalent utilization (FP32 x4)."""
        f = self.flops()
        denom = self.peak_flops_per_s * self.latency_ns * 1e-9 or 1.0
        return {
            "hfu": f.get("matmul", 0.0) / denom,
            "bf16_equivalent": f.get("bf16_equivalent", 0.0) / denom,
        }

    def hbm_bytes(self) -> dict[str, int]:
        out: Counter = Counter()
        for lp in self.launches:
            out.update(lp.timeline.dma_hbm_bytes)
        return {"read": int(out.get("read", 0)), "write": int(out.get("write", 0))}

    def hbm_gbps(self) -> float:
        b = self.hbm_bytes()
        return (b["read"] + b["write"]) / self.latency_ns if self.latency_ns else 0.0

    def floors_ns(self) -> dict[str, float]:
        """Lower bounds on the latency of the logical core: TensorE at its peak, and DMA at its
        full rate (LNC=1: one core's engines or its share of the stack; LNC=2: both cores'
        engines, bounded by the one HBM stack they share)."""
        f = self.flops()
        b = self.hbm_bytes()
        return {
            "tensor": f.get("bf16_equivalent", 0.0) / self.peak_flops_per_s * 1e9,
            "dma": dma_floor_ns(self.params, b["read"] + b["write"], self.lnc),
        }

    def critical(self) -> tuple[str, dict[str, float]]:
        path: Counter = Counter()
        for lp in self.launches:
            path.update(lp.timeline.critical_path)
        real = {u: v for u, v in path.items() if u != "wait"}
        return (max(real, key=real.get) if real else "none"), dict(path)

    def memory(self) -> dict[str, int]:
        peaks = [m for lp in self.launches for m in lp.run.memory]
        return {
            "sbuf_bytes_per_partition": max((m.sbuf_bytes for m in peaks), default=0),
            "sbuf_in_flight_bytes_per_partition": max(
                (_sbuf_in_flight_peak(lp.run.trace, lp.timeline) for lp in self.launches),
                default=0,
            ),
            "psum_bytes_per_partition": max((m.psum_bytes for m in peaks), default=0),
            "psum_banks": max((m.psum_banks for m in peaks), default=0),
        }

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        by_engine: Counter = Counter()
        by_api: Counter = Counter()
        for lp in self.launches:
            by_engine.update(lp.run.trace.count_by_engine())
            by_api.update(lp.run.trace.count_by_api())
        return dict(by_engine), dict(by_api)

    # -- exports -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every number of the report, keyed by name; ``"label": "modeled"`` says what they are."""
        tgt = target_from_name(self.target)
        crit, path = self.critical()
        by_engine, by_api = self.counts()
        busy = self.busy_ns()
        return {
            "label": MODELED,
            "note": "modeled by the neuron-kernels cost model from the interpreter trace; not measured",
            "target": self.target,
            "lnc": self.lnc,
            "unit": self.unit,
            "cost_model": {
                "version": MODEL_VERSION,
                "params_fingerprint": self.params.fingerprint(),
            },
            "kernels": [lp.kernel for lp in self.launches],
            "latency_ns": self.latency_ns,
            "busy_ns": {u: busy.get(u, 0.0) for u in ENGINE_LANES},
            "dma_engine_busy_ns": [
                sum(v) for v in zip(*(lp.timeline.dma_engine_busy_ns for lp in self.launches))
            ],
            "utilization": self.utilization(),
            "critical_engine": crit,
            "critical_path_ns": path,
            "flops": self.flops(),
            "tensor_peak_flops_per_s": self.peak_flops_per_s,
            "tensor_utilization": self.tensor_utilization(),
            "hbm_bytes": self.hbm_bytes(),
            "hbm_gbps": self.hbm_gbps(),
            "floors_ns": self.floors_ns(),
            "memory": {
                **self.memory(),
                "sbuf_capacity_bytes_per_partition": tgt.sbuf_usable_bytes,
                "psum_capacity_banks": usable_psum_banks(tgt),
                # buffers the "lru" allocator emulation could not place; each is modeled
                # as if it had its own memory (0 under the default "unbounded" policy)
                "alloc_fallbacks": sum(lp.timeline.alloc_fallbacks for lp in self.launches),
                "sbuf_allocator": str(self.params.sbuf_allocator),
            },
            "instructions": {
                "total": sum(by_engine.values()),
                "by_engine": by_engine,
                "by_api": by_api,
            },
            "dma_transfers": sum(len(lp.timeline.dma_bytes) for lp in self.launches),
            "dma_triggers": dict(
                Counter(
                    q.split(":")[0] for lp in self.launches for q in lp.timeline.dma_queue.values()
                )
            ),
        }

    def to_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)

    def text(self) -> str:
        """The human-readable report; every number is labelled modeled."""
        d = self.to_dict()
        lat = d["latency_ns"]
        lines = [
            f"MODELED profile ({', '.join(d['kernels'])} on {self.target}): cost model v{MODEL_VERSION}, "
            f"params {d['cost_model']['params_fingerprint']}",
            "All numbers are modeled from the interpreter trace; none is a hardware measurement.",
            f"Figures are {self.unit}"
            + (
                " (two physical cores, each its own engines, SBUF, PSUM and 16 DMA engines, "
                "sharing one HBM stack)."
                if self.lnc > 1
                else " (one physical core)."
            ),
            "",
            f"  modeled latency                 {_ms(lat)}",
            f"  modeled critical engine         {UNIT_LABEL.get(d['critical_engine'], d['critical_engine'])}",
            f"  modeled floors ({self.unit}) TensorE {_ms(d['floors_ns']['tensor'])}, "
            f"DMA {_ms(d['floors_ns']['dma'])}",
            "",
            f"  {'engine':<16}{'modeled busy':>16}{'modeled util':>14}{'instructions':>14}"
            + (f"   (busy summed over the {self.lnc} cores)" if self.lnc > 1 else ""),
        ]
        by_engine = d["instructions"]["by_engine"]
        for u in ENGINE_LANES:
            busy = d["busy_ns"].get(u, 0.0)
            count = by_engine.get(ENGINE_OF_LANE.get(u, ""), 0)
            if busy == 0 and count == 0:
                continue
            lines.append(
                f"  {UNIT_LABEL[u]:<16}{_ms(busy):>16}{_pct(d['utilization'][u]):>14}{count:>14,}"
            )
        util = d["utilization"]
        lines.append(
            f"  {'DMA (16 engines)' if self.lnc == 1 else f'DMA ({self.lnc}x16 eng.)':<16}{_ms(max(d['dma_engine_busy_ns'], default=0.0)):>16}"
            f"{_pct(util['dma']):>14}{by_engine.get('dma', 0):>14,}"
        )
        lines.append(
            f"  {'  any DMA active':<16}{_ms(util['dma_active'] * lat):>16}{_pct(util['dma_active']):>14}"
        )
        triggers = d["dma_triggers"]
        if triggers:
            where = ", ".join(
                f"{n:,} on {UNIT_LABEL.get(k, k)}" for k, n in sorted(triggers.items())
            )
            lines.append(f"  (modeled busy time includes DMA triggers: {where})")
        tu = d["tensor_utilization"]
        fl = d["flops"]
        hb = d["hbm_bytes"]
        mem = d["memory"]
        lines += [
            "",
            f"  modeled TensorE HFU             {_pct(tu['hfu'])} of {d['tensor_peak_flops_per_s'] / 1e12:.1f} "
            f"TFLOP/s BF16 peak ({fl.get('matmul', 0) / 1e9:,.1f} GFLOP)",
            f"  modeled TensorE BF16-equivalent {_pct(tu['bf16_equivalent'])} (FP32 x4, FP8 x0.5)",
            f"  modeled HBM traffic             {(hb['read'] + hb['write']) / 1e6:,.1f} MB "
            f"(read {hb['read'] / 1e6:,.1f}, write {hb['write'] / 1e6:,.1f}) at {d['hbm_gbps']:.1f} GB/s",
            f"  modeled SBUF peak               {mem['sbuf_bytes_per_partition']:,} B/partition of "
            f"{mem['sbuf_capacity_bytes_per_partition']:,} (the kernel's live tiles"
            + (", per physical core)" if self.lnc > 1 else ")"),
            f"  modeled SBUF in flight          {mem['sbuf_in_flight_bytes_per_partition']:,} "
            f"B/partition at the schedule's peak ({_sbuf_note(mem)})",
            f"  modeled PSUM peak               {mem['psum_bytes_per_partition']:,} B/partition, "
            f"{mem['psum_banks']} of {mem['psum_capacity_banks']} banks"
            + (" (per physical core)" if self.lnc > 1 else ""),
        ]
        if mem["alloc_fallbacks"]:
            lines.append(
                f"  modeled allocator fallbacks     {mem['alloc_fallbacks']:,} buffers did not fit "
                "and were modeled without reuse"
            )
        lines += [
            "",
            "  modeled critical path           "
            + ", ".join(
                f"{UNIT_LABEL.get(u, u)} {_ms(v)}"
                for u, v in sorted(d["critical_path_ns"].items(), key=lambda kv: -kv[1])
                if v > 0
            ),
            "",
            f"  modeled run: {d['instructions']['total']:,} instructions, {d['dma_transfers']:,} DMA transfers; "
            "by API:",
        ]
        for api, count in sorted(d["instructions"]["by_api"].items(), key=lambda kv: -kv[1]):
            lines.append(f"    {api:<30}{count:>10,}")
        return "\n".join(lines)

    def to_chrome_trace(self, path, max_events: int = 400_000) -> int:
        """Write the modeled timeline as Chrome/Perfetto trace JSON; returns the event count."""
        from neuron_kernels.cost_model.timeline_export import chrome_trace

        doc = chrome_trace(self, max_events=max_events)
        with open(path, "w") as f:
            json.dump(doc, f)
        return len(doc["traceEvents"])

    def to_png(self, path, width: int = 1600) -> None:
        """Write a PNG of the modeled per-engine timeline (labelled MODELED)."""
        from neuron_kernels.cost_model.timeline_export import timeline_png

        with open(path, "wb") as f:
            f.write(timeline_png(self, width=width))


def _ms(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


class Profiler:
    """A runner (``runner(kernel, *args, **kwargs)``) that profiles every launch it executes.

    Args:
        target: trn1/trn2/trn3 or a :class:`Target`; default the interpreter's default.
        params: a :class:`CostParams`; default the target's table, with ``overrides`` applied.
        compute: run the arithmetic too (False: trace only, fast; outputs are meaningless).
    """

    def __init__(
        self,
        target: str | Target | None = None,
        params: CostParams | None = None,
        compute: bool = False,
        **overrides,
    ) -> None:
        from neuron_kernels.hardware import default_target

        self.target = target_from_name(target) if target is not None else default_target()
        self.params = params if params is not None else params_for(self.target.name, **overrides)
        self.compute = compute
        self.launches: list[LaunchProfile] = []

    def __call__(self, kernel, *args, **kwargs):
        result = run(kernel, args, kwargs, target=self.target, compute=self.compute)
        timeline = model_trace(result.trace, self.target, params=self.params)
        fn = kernel.fn if isinstance(kernel, Kernel) else kernel
        self.launches.append(LaunchProfile(getattr(fn, "__name__", str(fn)), result, timeline))
        return result.outputs

    def report(self) -> Profile:
        return Profile(self.target.name, self.params, list(self.launches))


def profile(
    kernel,
    *,
    target: str | Target | None = None,
    params: CostParams | None = None,
    compute: bool = False,
    **overrides,
):
    """``profile(kernel)(*args, **kwargs)`` runs ``kernel`` once and returns its modeled :class:`Profile`."""

    def profiled(*args, **kwargs) -> Profile:
        profiler = Profiler(target=target, params=params, compute=compute, **overrides)
        profiler(kernel, *args, **kwargs)
        return profiler.report()

    return profiled


def _sbuf_in_flight_peak(trace, timeline) -> int:
    """Peak SBUF bytes per partition the modeled schedule holds at once on one physical core
    (the largest over an LNC=2 launch's cores, each with its own SBUF): each tile from the
    start of its first access to the end of its last. Under ``sbuf_allocator=unbounded``
    loads may run ahead of their use, so this can exceed capacity (the compiler's
    multi-buffering and spilling is assumed to make room); under ``lru`` it cannot."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    size: dict[int, int] = {}
    core_of: dict[int, int] = {}
    for ins in trace.instructions:
        for a in (*ins.reads, *ins.writes):
            if a.buffer != "sbuf":
                continue
            u = a.storage
            s, e = timeline.start[ins.index], timeline.end[ins.index]
            first[u] = min(first.get(u, s), s)
            last[u] = max(last.get(u, e), e)
            size[u] = max(size.get(u, 0), a.byte_hi)
            core_of[u] = ins.core
    peak = 0
    for core in set(core_of.values()) or {0}:
        mine = [u for u in first if core_of[u] == core]
        events = sorted(
            [(first[u], size[u]) for u in mine] + [(last[u], -size[u]) for u in mine],
            key=lambda ev: (ev[0], ev[1]),  # a tile freed at t makes room before one taken at t
        )
        live = 0
        for _, delta in events:
            live += delta
            peak = max(peak, live)
    return peak


def _sbuf_note(mem: dict) -> str:
    cap = mem["sbuf_capacity_bytes_per_partition"]
    ratio = mem["sbuf_in_flight_bytes_per_partition"] / cap if cap else 0.0
    if mem["sbuf_allocator"] == "unbounded":
        return (
            f"{ratio:.1f}x capacity; sbuf_allocator=unbounded assumes the compiler multi-buffers "
            "and spills; --param sbuf_allocator=lru models reuse within capacity"
        )
    return f"{ratio:.2f}x capacity; sbuf_allocator={mem['sbuf_allocator']}"
