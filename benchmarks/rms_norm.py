"""RMSNorm forward and backward, modeled on trn2: latency next to the DMA floor of each
direction's minimum HBM traffic, and the engine that binds.

    python benchmarks/rms_norm.py [--target trn2] [--dtype bfloat16] [--all-configs]
        [--direction both|forward|backward] [--lnc N]

Shapes are [rows, H] = [4096, 4096] and [16384, 8192]. The floors: the forward must read
x and w once and write y once; the backward must read x, w, dy and the saved rstd (fp32)
and write dx and dw. Floor = those bytes at the core's DMA rate (the cost model's DMA
floor, ``cost_model.profiler.dma_floor_ns``, per logical core).

Every number printed is *modeled* (interpreter trace, trace-only, scheduled by the cost
model); none is a measurement. Tensors are ``torch.empty`` and never read (trace-only).
"""

from __future__ import annotations

import argparse

import torch

from neuron_kernels.cost_model.profiler import Profiler, dma_floor_ns
from neuron_kernels.hardware import launch_lnc
from neuron_kernels.kernels import rms_norm, rms_norm_bwd
from neuron_kernels.kernels.spec import ITEMSIZE

SHAPES = ((4096, 4096), (16384, 8192))


def measure(
    direction: str, rows: int, h: int, dtype: str, config, target: str, lnc: int = 1
) -> dict:
    """Modeled latency, floor and binding engine of one forward or backward launch."""
    dt, item = getattr(torch, dtype), ITEMSIZE[dtype]
    x, w = torch.empty(rows, h, dtype=dt), torch.empty(h, dtype=dt)
    profiler = Profiler(target=target, compute=False)
    profiler.lnc = lnc  # the LNC the op's run_kernels launches at (spec.runner_lnc)
    if direction == "forward":
        rms_norm.FWD_SPEC.run_kernels(x, w, config=config, runner=profiler)
        nbytes = 2 * rows * h * item + h * item
    else:
        dy, rstd = torch.empty(rows, h, dtype=dt), torch.empty(rows)
        rms_norm_bwd.SPEC.run_kernels(dy, x, w, rstd, config=config, runner=profiler)
        nbytes = 3 * rows * h * item + 2 * h * item + 4 * rows
    report = profiler.report()
    floor = dma_floor_ns(report.params, nbytes, report.lnc)
    critical, _ = report.critical()
    return {
        "latency_ns": report.latency_ns,
        "floor_ns": floor,
        "fraction": floor / report.latency_ns,
        "critical": critical,
        "busy": {u: v / report.latency_ns for u, v in report.busy_ns().items() if v > 0},
        "hbm_bytes": sum(report.hbm_bytes().values()),
        "min_bytes": nbytes,
    }


def _line(direction, rows, h, config, r) -> str:
    busy = ", ".join(f"{u} {v:.0%}" for u, v in sorted(r["busy"].items()))
    return (
        f"  {direction:<8} [{rows}, {h}]  {r['latency_ns'] / 1e3:9.1f} us  floor "
        f"{r['floor_ns'] / 1e3:8.1f} us  {r['fraction']:6.1%} of floor  binds: {r['critical']:<6}"
        f"  HBM {r['hbm_bytes'] / r['min_bytes']:.2f}x the minimum  busy: {busy}\n"
        f"           config {config.to_dict()}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    parser.add_argument("--all-configs", action="store_true", help="every valid config, best shown")
    parser.add_argument(
        "--direction",
        choices=("forward", "backward", "both"),
        default="both",
        help="which direction to model (default both)",
    )
    parser.add_argument(
        "--lnc",
        type=int,
        default=None,
        help="launch LNC (default: NEURON_LOGICAL_NC_CONFIG, else the target's: trn2 2)",
    )
    args = parser.parse_args(argv)
    lnc = args.lnc if args.lnc is not None else launch_lnc(args.target)
    print(
        f"RMSNorm {args.dtype} on {args.target} at LNC={lnc}, casting_mode llama; all numbers "
        f"modeled (cost model, trace-only), none measured; per logical core of {lnc} physical "
        "core(s)"
    )
    for direction, spec in (("forward", rms_norm.FWD_SPEC), ("backward", rms_norm_bwd.SPEC)):
        if args.direction not in ("both", direction):
            continue
        for rows, h in SHAPES:
            configs = [spec.config.default()]
            if args.all_configs:
                problem = {"rows": rows, "h": h, "casting_mode": "llama"}
                configs = [
                    c
                    for c in spec.config.all_configs()
                    if spec.is_valid(problem, args.dtype, c, args.target, lnc)
                ]
            results = [
                (c, measure(direction, rows, h, args.dtype, c, args.target, lnc)) for c in configs
            ]
            config, best = max(results, key=lambda cr: cr[1]["fraction"])
            print(_line(direction, rows, h, config, best))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
