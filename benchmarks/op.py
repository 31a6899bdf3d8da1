"""Any op's benchmark (modeled), fed by its OpSpec alone: latency of the default and the
shipped tuned config next to the modeled floor, the engine that binds, at the op's
committed shapes (or ``--shape``); ``--readme-row`` prints the op's README ops-table row.

    python benchmarks/op.py swiglu                       # its committed shapes, bf16
    python benchmarks/op.py swiglu_bwd --shape 4096x14336 --dtype fp32
    python benchmarks/op.py swiglu --config '{"tile_free": 2048}'
    python benchmarks/op.py swiglu --readme-row

The floor is the larger of the DMA floor (``OpSpec.min_traffic_bytes``: inputs read once,
outputs and in-place updates written once, at the core's DMA rate) and the TensorE floor
(the op's matmul FLOPs at BF16 peak). Every number is modeled (interpreter trace, trace-only,
scheduled by the cost model), none measured. The tuned config is the one the op would read
from ``perf_results/<target>/<op>.json`` at that shape.
"""

from __future__ import annotations

import argparse
import json
import sys

from neuron_kernels import tuned_configs
from neuron_kernels.autotune.backends import ModelBackend
from neuron_kernels.autotune.shapes import points_for
from neuron_kernels.hardware import launch_lnc
from neuron_kernels.kernels.spec import dtype_name, get_spec

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def readme_row(spec) -> str:
    """The op's row of the README ops table: name, signature (``run_kernels``' type hints,
    the op's schema) with its description, and dtypes."""
    from neuron_kernels.torch_ops.library import op_signature

    sig = op_signature(spec)
    params = ", ".join(
        p.name if p.default is p.empty else f"{p.name}={p.default!r}"
        for p in sig.parameters.values()
    )
    ret = sig.return_annotation
    ret = "None" if spec.mutates else ret if isinstance(ret, str) else getattr(ret, "__name__", ret)
    ret = str(ret).replace("torch.Tensor", "Tensor")
    return (
        f"| `{spec.name}` | `{spec.name}({params}) -> {ret}`: {spec.description} | "
        f"{', '.join(spec.dtypes)} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("op", help="a registered op, e.g. swiglu")
    parser.add_argument("--shape", action="append", default=[], help="in the op's syntax")
    parser.add_argument("--dtype", default=None, help="with --shape (default bf16)")
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--config", default=None, help="JSON of a config to run beside")
    parser.add_argument("--readme-row", action="store_true", help="print the README row only")
    parser.add_argument(
        "--lnc",
        type=int,
        default=None,
        help="launch LNC (default: NEURON_LOGICAL_NC_CONFIG, else the target's: trn2 2)",
    )
    args = parser.parse_args(argv)
    spec = get_spec(args.op)
    if args.readme_row:
        print(readme_row(spec))
        return 0
    dtype = DTYPE_ALIASES.get(args.dtype, args.dtype) or "bfloat16"
    points = [(s, spec.parse_shape(s), dtype) for s in args.shape] or [
        (p.shape, p.problem, p.dtype) for p in points_for(spec)
    ]
    lnc = args.lnc if args.lnc is not None else launch_lnc(args.target)
    backend = ModelBackend(args.target, lnc=lnc)
    print(
        f"{spec.name} on {args.target} at LNC={lnc}: MODELED (cost model, trace-only), not "
        f"measured; per logical core of {lnc} physical core(s)"
    )
    print(
        f"{'shape':<22}{'dtype':<10}{'config':<9}{'latency':>12}{'floor':>12}"
        f"{'of floor':>10}  binds (floor)"
    )
    for shape, problem, dt in points:
        dt = dtype_name(DTYPE_ALIASES.get(dt, dt))
        rows = [("default", spec.config.default())]
        tuned = tuned_configs.lookup(spec, problem, dt, args.target, lnc=lnc)
        if tuned.source != "default":
            rows.append((tuned.source, tuned.config))
        if args.config:
            rows.append(("--config", spec.config.from_dict(json.loads(args.config))))
        for label, config in rows:
            m = backend.measure(spec, problem, dt, config)
            print(
                f"{shape:<22}{dt:<10}{label:<9}{m.latency_us:>10,.1f}us{m.floor_us:>10,.1f}us"
                f"{100 * m.floor_us / m.latency_us:>9.1f}%  {m.binding_engine} ({m.floor_engine})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
