"""``neuron-kernels profile <op>``: a modeled profile of one registered op on a target.

    neuron-kernels profile matmul --shape 4096x4096x4096 --dtype bf16 --target trn2
    neuron-kernels profile matmul --shape 512x512x512 --config '{"block_m": 2}' --chrome t.json --png t.png

Runs the op's kernels on the interpreter (trace only: values are not computed) and schedules
the trace on the cost model. Every number printed is modeled, not measured.
"""

from __future__ import annotations

import json
import os
import sys

__all__ = ["add_arguments", "main", "DTYPE_ALIASES"]

DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp32": "float32",
    "f32": "float32",
    "fp16": "float16",
    "f16": "float16",
}


def add_arguments(parser) -> None:
    parser.add_argument("op", help="registered op name, e.g. matmul")
    parser.add_argument(
        "--shape", required=True, help="problem shape in the op's syntax, e.g. 4096x4096x4096"
    )
    parser.add_argument("--dtype", default="bfloat16", help="bf16|fp32|fp16 or a torch dtype name")
    parser.add_argument("--target", default="trn2", help="trn1|trn2|trn3 (default trn2)")
    parser.add_argument(
        "--config", default=None, help="config as JSON text or a path to a JSON file"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a cost-model parameter (repeatable)",
    )
    parser.add_argument(
        "--params-file", default=None, help="overrides written by 'calibrate --fit --out'"
    )
    parser.add_argument(
        "--chrome", default=None, metavar="PATH", help="write a Chrome/Perfetto trace JSON"
    )
    parser.add_argument("--png", default=None, metavar="PATH", help="write a PNG timeline")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")


def _overrides(args) -> dict:
    out: dict = {}
    if args.params_file:
        with open(args.params_file) as f:
            doc = json.load(f)
        out.update(doc.get("overrides", doc))
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"profile: --param must be NAME=VALUE, got {item!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            out[name.strip()] = value.strip()
    return out


def _config(spec, text):
    if text is None:
        return spec.config.default()
    if os.path.exists(text):
        with open(text) as f:
            values = json.load(f)
    else:
        values = json.loads(text)
    return spec.config.from_dict(values)


def main(args) -> int:
    import torch

    from neuron_kernels.cost_model.profiler import Profiler
    from neuron_kernels.errors import LimitError
    from neuron_kernels.kernels.spec import get_spec

    dtype = DTYPE_ALIASES.get(args.dtype.lower(), args.dtype.removeprefix("torch."))
    try:
        spec = get_spec(args.op)
        problem = spec.parse_shape(args.shape)
        config = _config(spec, args.config)
        spec.check(problem, dtype, config, args.target)
        profiler = Profiler(target=args.target, compute=False, **_overrides(args))
    except (LimitError, KeyError, ValueError) as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 2
    inputs = spec.make_inputs(problem, dtype, torch.Generator().manual_seed(0))
    spec.run_kernels(*inputs, config=config, runner=profiler)
    report = profiler.report()
    print(
        f"op {spec.name}  shape {args.shape}  dtype {dtype}  config {json.dumps(config.to_dict())}"
    )
    print(report.text())
    if args.json:
        doc = report.to_dict()
        doc.update(
            {"op": spec.name, "shape": args.shape, "dtype": dtype, "config": config.to_dict()}
        )
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
    if args.chrome:
        n = report.to_chrome_trace(args.chrome)
        print(f"wrote {args.chrome} ({n:,} modeled events; open in ui.perfetto.dev)")
    if args.png:
        report.to_png(args.png)
        print(f"wrote {args.png} (modeled timeline)")
    return 0
