"""Cost-model parameters per target: one table, every value with its source and confidence.

The cost model (:mod:`neuron_kernels.cost_model.schedule`) reads nothing else.
Sources are AWS's public documents, cited by key; all are files of the repository
aws-neuron/aws-neuron-sdk:

* [arch-v2] nki/guides/architecture/trainium_inferentia2_arch.rst (NeuronCore-v2)
* [arch-v3] nki/guides/architecture/trainium2_arch.rst (NeuronCore-v3, Trn2)
* [arch-v4] nki/guides/architecture/trainium3_arch.rst (NeuronCore-v4, Trn3)
* [isa] nki/api/nki/isa/__init__.py; [isa-old] the same file at 1db4d74e (2025-10), whose
  "Estimated instruction cost" sections have since been removed
* [perf] nki/deep-dives/nki_perf_guide.rst
* [dma-bw] nki/deep-dives/nki-dma-bandwidth-guide.rst
* [dma-intro] nki/get-started/about/nki-dma-overview.rst
* [mem] nki/get-started/about/memory-hierarchy-overview.rst
* [mm-tut-old] nki/tutorials/matrix_multiplication.rst at 1db4d74e (the measured table)
* [lnc] about-neuron/arch/neuron-features/logical-neuroncore-config.rst: "Trainium2 devices
  contain four 24GB HBM banks. Each bank is shared by two physical NeuronCore-v3"; LNC=2
  makes those two one logical core
* [isa-lnc] nki/api/nki/isa/__init__.py core_barrier ("semaphore-based protocol where each
  NeuronCore writes a semaphore to each other core ... and then waits") and sendrecv ("using
  DMA engines")

"[D]" marks arithmetic on cited numbers, "[U]" a value no source states.
Confidence: "high" (stated by AWS and checked against a measurement), "medium" (stated, or
derived from one measurement), "low" (a guess or a fit; recalibrate these first).

Every duration the model derives from these numbers is *modeled*, never measured.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Param", "CostParams", "PARAMS", "params_for", "LEAST_CERTAIN", "check_param"]


@dataclass(frozen=True)
class Param:
    """One parameter: value, unit, where it comes from and how much to trust it."""

    value: Any
    unit: str
    source: str
    confidence: str  # "high" | "medium" | "low"


def _p(value, unit, source, confidence) -> Param:
    return Param(value, unit, source, confidence)


# The range of a value by its unit: rates, clocks, counts and factors are positive (a zero
# would divide by zero), durations and cycle counts are non-negative (a negative one would
# make a modeled latency negative), and the named policies are one of a few words.
_POSITIVE_UNITS = ("GB/s", "GHz", "x", "x of copy rate", "engines", "bytes")
_NON_NEGATIVE_UNITS = ("ns", "PE cycles", "ACT cycles", "POOL cycles", "engine cycles")
_CHOICES = {"mode": ("swdge", "hwdge", "static"), "policy": ("unbounded", "lru")}


def check_param(name: str, param: Param) -> None:
    """Refuse a value outside its unit's range, naming the parameter, its unit and source."""
    from neuron_kernels.errors import LimitError

    value, unit = param.value, param.unit

    def refuse(rule, limit=None):
        raise LimitError(
            "cost model",
            f"parameter {name}",
            rule,
            repr(value),
            limit=limit,
            hint=f"unit {unit}; source: {param.source}",
        )

    if unit == "bool":
        if not isinstance(value, bool):
            refuse("must be true or false")
    elif unit in _CHOICES:
        if value not in _CHOICES[unit]:
            refuse(f"must be one of {_CHOICES[unit]}", _CHOICES[unit])
    elif unit in _POSITIVE_UNITS or unit in _NON_NEGATIVE_UNITS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            refuse(f"must be a number in {unit}")
        if unit in _POSITIVE_UNITS and not value > 0:
            refuse(f"must be > 0 {unit}", 0)
        if unit in _NON_NEGATIVE_UNITS and not value >= 0:
            refuse(f"must be >= 0 {unit}", 0)
    else:
        raise AssertionError(f"cost model: parameter {name} has unit {unit!r} with no range rule")


# Per-target rows. Shared rows are written once in _COMMON and overridden per target.
_COMMON: dict[str, Param] = {
    # TensorE ------------------------------------------------------------------------------
    "mm_min_cycles": _p(
        64,
        "PE cycles",
        "[arch-v2]; [isa-old]: MM_INIT_LATENCY 64 cycles ([arch-v2]); "
        "isa-old max(min(64, N_stat), N_mov); assumed for v3/v4 [U]",
        "medium",
    ),
    "fp32_mm_factor": _p(
        4.0,
        "x",
        "[arch-v2]; [isa-old] 'FP32 ~4x'; A2-A5 TensorE 2,063 vs 4x512 cycles per tile (<1%)",
        "high",
    ),
    "fp32_transpose_factor": _p(
        2.0,
        "x",
        "[arch-v2]; [isa-old]: NC-v3 transpose mode 2x faster for FP32 than the 4x matmul rate",
        "medium",
    ),
    "ls_speedup": _p(
        4.0,
        "x",
        "[arch-v2]; [isa-old] 'Fast LoadStationary up to 4x faster than MM'; LS of "
        "the next matmul hides behind the current MM",
        "medium",
    ),
    "pe_fill_cycles": _p(
        128,
        "PE cycles",
        "NC-v2 arch guide mm_pipeline figure: one cycle per "
        "pipeline stage x 128 stages; latency seen only by dependents [U]",
        "low",
    ),
    # VectorE / ScalarE / GpSimdE ---------------------------------------------------------
    "min_ii_cycles": _p(
        64,
        "engine cycles",
        "[arch-v2]; [isa-old]; [arch-v3]: MIN_II ~64 cycles ([isa-old])",
        "medium",
    ),
    "engine_latency_cycles": _p(
        200,
        "engine cycles",
        "[D] A12: dependent 1-element ScalarE chain "
        "issues every 264 cycles = MIN_II 64 + 200 pipeline latency "
        "(NC-v2); assumed for DVE/POOL and v3/v4 [U]",
        "low",
    ),
    "stride_penalty": _p(
        2.0,
        "x",
        "[arch-v2]: innermost stride > 16 B halves SBUF/PSUM "
        "bandwidth (NC-v2); assumed for v3/v4 [U]",
        "medium",
    ),
    "stride_threshold_bytes": _p(16, "bytes", "[arch-v2] ([arch-v2])", "medium"),
    "dve_perf_mode": _p(
        False,
        "bool",
        "[arch-v2]; [isa-old]; [arch-v3]: NC-v3 VectorE performance mode (4x/2x for BF16/FP16); none on NC-v2",
        "high",
    ),
    "act_fast_bf16": _p(
        False,
        "bool",
        "[perf]; [arch-v2]; [isa-old]: NC-v4 2x BF16/FP16 tensor_copy/tensor_scalar on ScalarE; none before",
        "medium",
    ),
    "act_reduce_cycles": _p(
        64,
        "ACT cycles",
        "[perf]; [arch-v2]; [isa-old]: ActReadAccumulator ~64 cycles (activation_reduce = activate + MIN_II)",
        "medium",
    ),
    "act_table_switch_ns": _p(
        1300.0,
        "ns",
        "[U] unpublished; activation tables are loaded by DMA "
        "([perf]; [arch-v2]; [isa-old]), so one DMA latency (~1.3 us, [arch-v2]; [dma-bw]) is assumed",
        "low",
    ),
    "pool_start_cycles": _p(
        150,
        "POOL cycles",
        "[arch-v2]; [isa-old]: GPSIMD_START ~150 cycles (isa-old iota/affine_select 150 + N)",
        "medium",
    ),
    # DMA ---------------------------------------------------------------------------------
    "dma_engines": _p(
        16,
        "engines",
        "[dma-bw]; [dma-intro]; [arch-v2]: 16 DMA engines per core; 8 partitions each",
        "high",
    ),
    "dma_descriptor_bytes": _p(
        64,
        "bytes",
        "[U] per contiguous buffer (DMA descriptor) the engine "
        "also moves about one 64 B descriptor/burst; checks against A2-A3 "
        "(v2 - 2*v3 leaves ~2.6 ns per buffer = 70 B at 27.2 B/ns)",
        "low",
    ),
    "dma_latency_ns": _p(
        1300.0,
        "ns",
        "[dma-bw]; [arch-v3]; [arch-v2]: semaphore-to-start latency ~1,300 ns "
        "(DMA bandwidth guide); a latency, hidden when transfers are queued early",
        "medium",
    ),
    "dma_transpose_hbm_eff": _p(
        0.9,
        "x of copy rate",
        "[dma-bw]; [arch-v3]: HBM->SBUF DMA transpose up to 90% of copy throughput ([arch-v3])",
        "medium",
    ),
    "dma_transpose_sbuf_eff": _p(
        0.5,
        "x of copy rate",
        "[dma-bw]; [arch-v3]: SBUF->SBUF DMA transpose up to 50% ([arch-v3])",
        "medium",
    ),
    "swdge_issue_cycles": _p(
        150,
        "POOL cycles",
        "[U] software DGE builds descriptors on GpSimd "
        "([arch-v2]; [isa-old]); one GpSimd instruction start (~150 cycles) per DMA "
        "assumed; the profiles of A2/A3 show short GpSimd ticks per DMA",
        "low",
    ),
    "static_issue_ns": _p(
        50.0,
        "ns",
        "[U] static (host-built) descriptors: one Sync-engine trigger instruction per DMA",
        "low",
    ),
    "hwdge_issue_ns": _p(
        600.0,
        "ns",
        "[dma-bw]; [arch-v3]: each hardware-DGE DMA instruction takes ~600 ns "
        "on NC-v3 ([arch-v3]); runs beside the trigger engine's datapath",
        "medium",
    ),
    "dma_queue_split": _p(
        True,
        "bool",
        "[U] loads and stores sit in different DMA queues (the compiler "
        "does not block input prefetch behind an output store); in order within a "
        "queue ([dma-bw]; [dma-intro]; [arch-v2])",
        "low",
    ),
    # Synchronisation and fixed costs -----------------------------------------------------
    "sync_ns": _p(
        64.0, "ns", "[U] cross-engine semaphore latency, unpublished ([arch-v2]; [dma-bw])", "low"
    ),
    "core_barrier_ns": _p(
        1300.0,
        "ns",
        "[U] nisa.core_barrier: a remote semaphore write to the other core, then a local "
        "wait ([isa-lnc]); no published latency, estimated as one DMA semaphore-to-start "
        "latency (dma_latency_ns, [dma-bw]), added after the later core arrives",
        "low",
    ),
    "launch_ns": _p(
        0.0,
        "ns",
        "[U] kernel launch overhead, unpublished and harness-dependent "
        "([U]); cancels when ranking configs of one kernel",
        "low",
    ),
    "sbuf_allocator": _p(
        "unbounded",
        "policy",
        "[U] SBUF placement: 'unbounded' = every tile its own "
        "buffer, i.e. the compiler multi-buffers (and spills when SBUF is tight) "
        "instead of serialising on reused bytes. Evidence: A1 opt3 overlaps DMA and "
        "TensorE fully, and A5 runs at the TensorE floor with its SBUF 100% full and "
        "~0.3 GB of spill traffic. 'lru' = emulate a least-recently-freed allocator "
        "over usable SBUF (reuse adds WAR edges)",
        "low",
    ),
    "psum_allocator": _p(
        "lru",
        "policy",
        "PSUM has 8 banks of 2 KiB and no spill path ([arch-v2]; [mem], "
        "[arch-v2]; [perf]): tiles are placed in the least recently freed bank(s), so a matmul into a "
        "reused bank waits until the bank's previous tile was evacuated",
        "medium",
    ),
}

_TRN1: dict[str, Param] = {
    "pe_ghz": _p(2.8, "GHz", "([arch-v2]); A1 opt3 near the 5.99 ms floor", "high"),
    "dve_ghz": _p(1.12, "GHz", "([arch-v2])", "high"),
    "act_ghz": _p(1.4, "GHz", "([arch-v2])", "high"),
    "pool_ghz": _p(1.4, "GHz", "([arch-v2])", "high"),
    "fp32_transpose_factor": _p(
        4.0, "x", "[arch-v2]; [isa-old]: NC-v2 transposes as an FP32 matmul (4x)", "medium"
    ),
    "dma_engine_gbps": _p(
        29.0,
        "GB/s",
        "[dma-bw]; [dma-intro]; [arch-v2]: 27 GiB/s per engine ([arch-v2]); the "
        "DMA guide's 17 B/ns disagrees [U]",
        "medium",
    ),
    "dma_transfer_ns": _p(
        211.0,
        "ns",
        "[U] per-transfer overhead on each engine, assumed equal to NC-v3's (derived from A10)",
        "low",
    ),
    "dma_core_gbps": _p(
        104.0,
        "GB/s",
        "[D] sustained HBM<->SBUF rate of one Trn1 core in the only "
        "published Trn1 NKI measurement: A1 bytes moved / latency = 104.9, 103.1, 103.4, "
        "105.9 GB/s for the four variants (256 B to 4 KiB rows; mean 104.3). The "
        "theoretical 272-464 GB/s ([dma-bw]; [dma-intro]; [arch-v2]) is not reached; cause unpublished. "
        "Taken from the A1 rows, so A1 checks the model's structure, not this value",
        "low",
    ),
    "hbm_stack_gbps": _p(
        104.0,
        "GB/s",
        "n/a: Trn1 has no LNC=2 ([lnc]); equal to dma_core_gbps",
        "low",
    ),
    "default_dge": _p(
        "static",
        "mode",
        "[arch-v2]: NC-v2 has no hardware DGE; descriptors are built on the host (static DMA)",
        "medium",
    ),
    "hwdge_issue_ns": _p(0.0, "ns", "n/a on NC-v2 (no hardware DGE)", "high"),
}

_TRN2: dict[str, Param] = {
    "pe_ghz": _p(2.4, "GHz", "([arch-v3]); A2-A5 TensorE time fits to <1%", "high"),
    "dve_ghz": _p(0.96, "GHz", "([arch-v3])", "high"),
    "act_ghz": _p(1.2, "GHz", "([arch-v3])", "high"),
    "pool_ghz": _p(1.2, "GHz", "([arch-v3])", "high"),
    "dve_perf_mode": _p(
        True, "bool", "[arch-v2]; [isa-old]; [arch-v3]: NC-v3 VectorE performance mode", "high"
    ),
    "dma_engine_gbps": _p(
        27.2,
        "GB/s",
        "[dma-bw]; [dma-intro]; [arch-v2]: 27.2 GB/s theoretical per engine (DMA intro)",
        "medium",
    ),
    "dma_transfer_ns": _p(
        211.0,
        "ns",
        "[D] A10: 32 KiB on one engine took 1,416 ns = 32 KiB / 27.2 GB/s "
        "(1,205 ns) + 211 ns; checks A2/A3 (predicts 273/314 GB/s there)",
        "medium",
    ),
    "dma_core_gbps": _p(
        725.0,
        "GB/s",
        "[dma-bw]; [arch-v3]; [arch-v2]: one HBM stack (~725 GB/s) serves the core "
        "when its sibling is idle (the profiler's MBU denominator); the 16 engines "
        "(435 GB/s) bind first",
        "medium",
    ),
    "hbm_stack_gbps": _p(
        725.0,
        "GB/s",
        "[D] [lnc]; [arch-v3]: 2.9 TB/s of HBM in four stacks, each shared by two physical "
        "cores = 725 GB/s per stack; at LNC=2 both cores of the logical core share it (the "
        "profiler's MBU denominator for LNC 1 and 2, trainium-performance-model.md 1.6)",
        "medium",
    ),
    "default_dge": _p(
        "swdge",
        "mode",
        "DMA intro profile: the default dma_copy is triggered from "
        "qGpSimdDynamic (software DGE); A2-A5 profiles show GpSimd ticks per DMA",
        "medium",
    ),
}

_TRN3: dict[str, Param] = {
    "pe_ghz": _p(2.4, "GHz", "([arch-v4])", "high"),
    "dve_ghz": _p(1.2, "GHz", "([arch-v4])", "high"),
    "act_ghz": _p(1.2, "GHz", "([arch-v4])", "high"),
    "pool_ghz": _p(1.2, "GHz", "([arch-v4])", "high"),
    "dve_perf_mode": _p(
        True,
        "bool",
        "[arch-v2]; [isa-old]; [arch-v3]: NC-v4 keeps the NC-v3 performance mode [U]",
        "medium",
    ),
    "act_fast_bf16": _p(
        True, "bool", "[perf]; [arch-v2]; [isa-old]: NC-v4 2x BF16 mode on ScalarE", "medium"
    ),
    "dma_engine_gbps": _p(
        38.4,
        "GB/s",
        "[dma-bw]; [dma-intro]; [arch-v2]: 38.4 GB/s theoretical per engine (DMA intro)",
        "medium",
    ),
    "dma_transfer_ns": _p(
        140.0,
        "ns",
        "[D] by the A10 method on the DMA guide's 33 B/ns: 32 KiB/33 - "
        "32 KiB/38.4 = 140 ns; no Trn3 measurement [U]",
        "low",
    ),
    "dma_core_gbps": _p(
        612.0, "GB/s", "[D] [dma-bw]; [dma-intro]; [arch-v2]: 4.9 TB/s HBM / 8 cores", "low"
    ),
    "hbm_stack_gbps": _p(
        1225.0,
        "GB/s",
        "[D] [arch-v4]: 4.9 TB/s over four stacks, assuming Trn2's two cores per stack [U]",
        "low",
    ),
    "default_dge": _p("swdge", "mode", "as NC-v3 [U]", "low"),
}

PARAMS: dict[str, dict[str, Param]] = {
    "trn1": {**_COMMON, **_TRN1},
    "trn2": {**_COMMON, **_TRN2},
    "trn3": {**_COMMON, **_TRN3},
}
for _table in PARAMS.values():  # a table entry out of range is a bug here, not at use
    for _name, _param in _table.items():
        check_param(_name, _param)

# The parameters the closing note names as least certain, most influential first.
LEAST_CERTAIN = (
    "dma_core_gbps",
    "dma_transfer_ns",
    "dma_descriptor_bytes",
    "engine_latency_cycles",
    "pe_fill_cycles",
    "sync_ns",
    "swdge_issue_cycles",
    "act_table_switch_ns",
    "sbuf_allocator",
)


@dataclass(frozen=True)
class CostParams:
    """The parameter values the model uses for one target (plus any overrides)."""

    target: str
    table: Mapping[str, Param] = field(repr=False)

    def __getattr__(self, name: str):
        table = object.__getattribute__(self, "table")
        if name in table:
            return table[name].value
        raise AttributeError(name)

    def replace(self, **values) -> CostParams:
        """A copy with some values overridden (source marked 'override'), each range-checked.

        Text values (from a command line) are read by the parameter's type: numbers as
        floats, booleans as true/false/1/0/on/off/yes/no."""
        from neuron_kernels.errors import LimitError

        table = dict(self.table)
        for name, value in values.items():
            if name not in table:
                raise LimitError(
                    "cost model",
                    "parameter",
                    f"must be one of {sorted(table)}",
                    repr(name),
                    limit=sorted(table),
                )
            old = table[name]
            value = _coerce(name, old, value)
            new = Param(value, old.unit, f"override (was {old.value!r}: {old.source})", "override")
            check_param(name, new)
            table[name] = new
        return CostParams(self.target, table)

    def values(self) -> dict[str, Any]:
        return {k: p.value for k, p in sorted(self.table.items())}

    def fingerprint(self) -> str:
        """Short hash of the values, stored beside modeled results so stale ones are detected."""
        blob = json.dumps({"target": self.target, **self.values()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


_BOOL_WORDS = {
    "true": True,
    "1": True,
    "on": True,
    "yes": True,
    "false": False,
    "0": False,
    "off": False,
    "no": False,
}


def _coerce(name: str, old: Param, value):
    """An override in the type of the value it replaces; text is parsed, never guessed."""
    if isinstance(old.value, bool):
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
        return value  # check_param refuses anything that is not a bool
    if isinstance(old.value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except (TypeError, ValueError):
            return value  # check_param names it
    return value


def params_for(target, **overrides) -> CostParams:
    """The parameter table of ``target`` (name or :class:`Target`), with optional overrides."""
    name = getattr(target, "name", target)
    name = str(name).strip().lower()
    if name not in PARAMS:
        from neuron_kernels.hardware import target_from_name

        name = target_from_name(name).name
    params = CostParams(name, PARAMS[name])
    return params.replace(**overrides) if overrides else params
