"""Matmul benchmark (modeled): latency of the default and the shipped tuned config next to
the modeled TensorE floor, with the engine that binds.

    python benchmarks/matmul.py                      # the shapes of autotune/shapes.py
    python benchmarks/matmul.py --shape 1024x1024x1024 --dtype float32

Every number is modeled (interpreter trace + cost model), none measured. The tuned config
is the one the op would read from perf_results/<target>/matmul.json at this shape.
"""

from __future__ import annotations

import argparse
import sys

from neuron_kernels.autotune import results
from neuron_kernels.autotune.backends import ModelBackend
from neuron_kernels.autotune.shapes import points_for
from neuron_kernels.hardware import launch_lnc
from neuron_kernels.kernels.spec import get_spec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--target", default="trn2")
    parser.add_argument(
        "--lnc",
        type=int,
        default=None,
        help="launch LNC (default: NEURON_LOGICAL_NC_CONFIG, else the target's: trn2 2)",
    )
    args = parser.parse_args(argv)
    spec = get_spec("matmul")
    shapes = [(s, spec.parse_shape(s), args.dtype) for s in args.shape] or [
        (p.shape, p.problem, p.dtype) for p in points_for(spec)
    ]
    lnc = args.lnc if args.lnc is not None else launch_lnc(args.target)
    backend = ModelBackend(args.target, lnc=lnc)
    print(
        f"matmul on {args.target} at LNC={lnc}: MODELED latency (cost model), not measured; "
        f"per logical core of {lnc} physical core(s)"
    )
    print(
        f"{'shape':<18}{'dtype':<10}{'config':<8}{'latency':>12}{'TensorE floor':>15}"
        f"{'of floor':>10}  binds"
    )
    for shape, problem, dtype in shapes:
        tuned = results.lookup(spec, problem, dtype, args.target, lnc=lnc)
        rows = [("default", spec.config.default())]
        if tuned.source != "default":
            rows.append((tuned.source, tuned.config))
        for label, config in rows:
            m = backend.measure(spec, problem, dtype, config)
            print(
                f"{shape:<18}{dtype:<10}{label:<8}{m.latency_us:>10,.1f}us{m.floor_us:>13,.1f}us"
                f"{100 * m.floor_us / m.latency_us:>9.1f}%  {m.binding_engine} "
                f"(floor: {m.floor_engine})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
