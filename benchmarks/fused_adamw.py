"""Fused AdamW step, modeled on trn2: latency next to the DMA floor of its minimum traffic.

    python benchmarks/fused_adamw.py [--target trn2] [--all-configs] [--layers 1]

The parameters are one Llama-3-8B decoder layer's attention (q, k, v, o: 4096x4096,
1024x4096, 1024x4096, 4096x4096), its MLP gate projection (14336x4096) and the layer's
two RMSNorm weights (4096 each): 100,671,488 fp32 parameters, about 10^8, in a realistic
mix of tensor sizes. One step must read p, g, m, v and write p, m, v: 28 bytes per
element, so its floor is ``28 * N / (the core's DMA rate)`` (the cost model's DMA floor).

Every number printed is *modeled* (interpreter trace, trace-only, scheduled by the cost
model); none is a measurement. Tensors are allocated with ``torch.empty`` and never
touched (a trace-only run reads no values), so the 1.6 GB of inputs cost no memory pages.
"""

from __future__ import annotations

import argparse
import time

import torch

from neuron_kernels.cost_model.profiler import Profiler, dma_floor_ns
from neuron_kernels.hardware import launch_lnc
from neuron_kernels.kernels import fused_adamw

LLAMA3_8B_LAYER = {
    "q_proj": (4096, 4096),
    "k_proj": (1024, 4096),
    "v_proj": (1024, 4096),
    "o_proj": (4096, 4096),
    "gate_proj": (14336, 4096),
    "input_layernorm": (4096,),
    "post_attention_layernorm": (4096,),
}
BYTES_PER_ELEMENT = {
    "float32": 28,
    "bfloat16": 2 + 2 + 4 + 4 + 2 + 4 + 4,
}  # read p g m v, write p m v


def _inputs(shapes, dtype, amsgrad, rounding=False):
    dt = getattr(torch, dtype)
    params = [torch.empty(s, dtype=dt) for s in shapes]
    return (
        params,
        [torch.empty(s, dtype=dt) for s in shapes],
        [torch.empty(s) for s in shapes],
        [torch.empty(s) for s in shapes],
        [torch.empty(s) for s in shapes] if amsgrad else [],
        [torch.tensor(10.0) for _ in shapes],
        1e-3, 0.9, 0.999, 0.01, 1e-8, amsgrad, False, torch.tensor(1024.0), torch.tensor(0.0),
        0 if rounding else None,
    )  # fmt: skip


def measure(
    config, shapes, dtype="float32", amsgrad=False, target="trn2", rounding=False, lnc=1
) -> dict:
    """Modeled latency, floor, binding engine and instruction counts of one step."""
    profiler = Profiler(target=target, compute=False)
    profiler.lnc = lnc  # the LNC the op's run_kernels launches at (spec.runner_lnc)
    args = _inputs(shapes, dtype, amsgrad, rounding)
    fused_adamw.SPEC.run_kernels(*args, config=config, runner=profiler)
    report = profiler.report()
    n = sum(p.numel() for p in args[0])
    per_element = BYTES_PER_ELEMENT[dtype] + (8 if amsgrad else 0)
    floor_ns = dma_floor_ns(report.params, per_element * n, report.lnc)
    by_engine, _ = report.counts()
    busy = report.busy_ns()
    critical, _ = report.critical()
    instructions = sum(len(lp.run.trace) for lp in report.launches)
    return {
        "elements": n,
        "latency_ns": report.latency_ns,
        "floor_ns": floor_ns,
        "fraction": floor_ns / report.latency_ns,
        "critical": critical,
        "busy_ns": busy,
        "instructions": instructions,
        "by_engine": by_engine,
        "launches": len(report.launches),
    }


def _line(config, r) -> str:
    per_tile = 128 * config.tile_free
    counts = ", ".join(
        f"{e} {c / (r['elements'] / per_tile):.1f}" for e, c in sorted(r["by_engine"].items())
    )
    busy = ", ".join(
        f"{u} {v / r['latency_ns']:.0%}" for u, v in sorted(r["busy_ns"].items()) if v > 0
    )
    return (
        f"  {config.tile_free:>5} {config.tensors_per_launch:>4} {config.engines:<13} "
        f"{r['latency_ns'] / 1e6:8.3f} ms  floor {r['floor_ns'] / 1e6:6.3f} ms  "
        f"{r['fraction']:6.1%} of floor  binds: {r['critical']:<5}  "
        f"instructions per {config.tile_free}-wide tile: {counts}  busy: {busy}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--dtype", default="float32", choices=fused_adamw.PARAM_DTYPES)
    parser.add_argument("--amsgrad", action="store_true")
    parser.add_argument(
        "--stochastic-rounding", action="store_true", help="bf16: seeded stochastic rounding"
    )
    parser.add_argument("--all-configs", action="store_true", help="every valid config")
    parser.add_argument("--layers", type=int, default=1, help="decoder layers' worth of tensors")
    parser.add_argument(
        "--lnc",
        type=int,
        default=None,
        help="launch LNC (default: NEURON_LOGICAL_NC_CONFIG, else the target's: trn2 2)",
    )
    args = parser.parse_args(argv)
    lnc = args.lnc if args.lnc is not None else launch_lnc(args.target)

    shapes = list(LLAMA3_8B_LAYER.values()) * args.layers
    configs = [fused_adamw.FusedAdamwConfig.default()]
    if args.all_configs:
        configs = list(fused_adamw.FusedAdamwConfig.all_configs())
    n = sum(torch.Size(s).numel() for s in shapes)
    print(
        f"fused AdamW, one step of {n:,} {args.dtype} params (Llama-3-8B layer mix), "
        f"target {args.target} at LNC={lnc} (per logical core), amsgrad {args.amsgrad}, stochastic rounding "
        f"{args.stochastic_rounding}; all numbers modeled (cost model)"
    )
    print("  tile  per  engines        latency        floor          fraction")
    best = None
    for config in configs:
        problem = {"tensors": len(shapes), "numel": max(torch.Size(s).numel() for s in shapes)}
        problem["amsgrad"] = args.amsgrad
        problem["rounding"] = args.stochastic_rounding
        if not fused_adamw.SPEC.is_valid(problem, args.dtype, config, args.target, lnc):
            continue
        t0 = time.perf_counter()
        r = measure(
            config, shapes, args.dtype, args.amsgrad, args.target, args.stochastic_rounding, lnc
        )
        print(_line(config, r) + f"  ({time.perf_counter() - t0:.0f} s to model)")
        if best is None or r["latency_ns"] < best[1]["latency_ns"]:
            best = (config, r)
    config, r = best
    print(
        f"best: {config} at {r['fraction']:.1%} of the modeled DMA floor; binding unit "
        f"{r['critical']}; {r['instructions']:,} instructions, "
        f"{r['instructions'] / r['elements'] * 1e6:.1f} per million elements (modeled)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
