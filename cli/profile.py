"""``neuron-kernels profile <op>``: a modeled profile of one registered op on a target.

    neuron-kernels profile matmul --shape 4096x4096x4096 --dtype bf16 --target trn2
    neuron-kernels profile matmul --shape 512x512x512 --config '{"block_m": 2}' --chrome t.json --png t.png

Runs the op's kernels on the interpreter (trace only: values are not computed) and schedules
the trace on the cost model. Every number printed is modeled, not measured.
"""

from __future__ import annotations

import json
import math
import sys

from neuron_kernels.cli import UsageError
from neuron_kernels.cli._inputs import (
    DTYPE_ALIASES,
    LNC_HELP,
    op_problem,
    output_path,
    read_json_file,
)
from neuron_kernels.cli._inputs import lnc as read_lnc
from neuron_kernels.cli._inputs import target as read_target

__all__ = ["add_arguments", "main", "DTYPE_ALIASES"]


def add_arguments(parser) -> None:
    parser.add_argument("op", help="registered op name, e.g. matmul")
    parser.add_argument(
        "--shape", required=True, help="problem shape in the op's syntax, e.g. 4096x4096x4096"
    )
    parser.add_argument("--dtype", default="bfloat16", help="bf16|fp32|fp16 or a torch dtype name")
    parser.add_argument(
        "--target",
        default=None,
        help="trn1|trn2|trn3 (default: NEURON_PLATFORM_TARGET_OVERRIDE, else trn2)",
    )
    parser.add_argument("--lnc", default=None, help=LNC_HELP)
    parser.add_argument(
        "--config",
        default=None,
        help="config as a JSON object, or a path to a JSON file, or 'default' for the op's "
        "default config (default: the config the op itself would run: its tuned entry, else "
        "the default)",
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


def read_overrides(args, target) -> dict:
    """Cost-model overrides from ``--params-file`` then ``--param``, each checked against the
    parameter table of ``target`` (name, type, range) and refused naming its flag."""
    from neuron_kernels.cost_model.params import params_for
    from neuron_kernels.errors import LimitError

    sources: list[tuple[str, str, dict]] = []
    if args.params_file:
        doc = read_json_file("--params-file", args.params_file)
        values = doc.get("overrides", doc)
        if not isinstance(values, dict):
            raise UsageError(
                "--params-file", args.params_file, '"overrides" must be an object of values'
            )
        fitted_for = doc.get("target") if "overrides" in doc else None
        if fitted_for is not None and fitted_for != target.name:
            raise UsageError(
                "--params-file",
                args.params_file,
                f"holds parameters fitted for {fitted_for!r}; this profile is for "
                f"{target.name!r} (pass --target {fitted_for}, or fit for {target.name})",
            )
        sources.append(("--params-file", args.params_file, values))
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError("--param", item, "must be NAME=VALUE")
        sources.append(("--param", item, {name.strip(): value.strip()}))
    out: dict = {}
    for flag, given, values in sources:
        for name, value in values.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue  # not a number: the parameter table says whether it may be
            if not math.isfinite(number):
                raise UsageError(flag, given, f"{name} must be a finite number, got {value}")
        try:
            params_for(target.name, **values)
        except LimitError as exc:
            raise UsageError(flag, given, f"{exc.arg} {exc.rule}, got {exc.value}") from None
        out.update(values)
    return out


def read_config(spec, text, problem=None, dtype=None, target=None, lnc=1):
    """``--config``: a JSON object, or the path of a file holding one, checked field by field;
    ``default`` the op's default; none given: the config the op itself runs at ``problem``
    (its tuned entry in the user's or the shipped results, else the default). Returns
    ``(config, where it came from)``."""
    from neuron_kernels.errors import LimitError

    if text is None:
        from neuron_kernels import tuned_configs

        choice = tuned_configs.lookup(spec, problem, dtype, target.name, lnc=lnc)
        return choice.config, choice.describe()
    if text.strip() == "default":
        return spec.config.default(), "the op's default config (--config default)"
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        values = read_json_file("--config", text, "a config object")  # not JSON text: a path
    try:
        return spec.config.from_dict(values), "--config"
    except LimitError as exc:
        raise UsageError("--config", text, f"{exc.arg} {exc.rule}, got {exc.value}") from None


def read_op_and_problem(args):
    """(spec, problem, dtype) from the op name, ``--shape`` and ``--dtype``."""
    from neuron_kernels.errors import LimitError
    from neuron_kernels.kernels.spec import get_spec

    try:
        spec = get_spec(args.op)
    except LimitError as exc:
        raise UsageError("op", args.op, exc.rule) from None
    dtype = DTYPE_ALIASES.get(args.dtype.lower(), args.dtype.removeprefix("torch."))
    if dtype not in spec.dtypes:
        try:
            spec.parse_shape(args.shape)
        except LimitError as exc:
            raise UsageError("--shape", args.shape, exc.rule) from None
        raise UsageError("--dtype", args.dtype, f"must be one of {', '.join(spec.dtypes)}")
    return spec, op_problem(spec, "--shape", args.shape, dtype), dtype


def main(args) -> int:

    from neuron_kernels.cost_model.profiler import Profiler
    from neuron_kernels.errors import LimitError
    from neuron_kernels.kernels.spec import measure_generator

    spec, problem, dtype = read_op_and_problem(args)
    target = read_target(args.target)
    lnc = read_lnc(args.lnc, target)
    config, config_source = read_config(spec, args.config, problem, dtype, target, lnc)
    overrides = read_overrides(args, target)
    for flag in ("chrome", "png", "json"):
        output_path(f"--{flag}", getattr(args, flag))
    try:
        spec.check(problem, dtype, config, target, lnc)
    except LimitError as exc:
        raise UsageError(
            "--config", json.dumps(config.to_dict()), f"{exc} (at --shape {args.shape})"
        ) from None
    profiler = Profiler(target=target.name, compute=False, **overrides)
    profiler.lnc = lnc  # the LNC the op's run_kernels launches at (spec.runner_lnc)
    inputs = spec.make_inputs(problem, dtype, measure_generator())
    spec.run_kernels(*inputs, config=config, runner=profiler)
    report = profiler.report()
    print(
        f"op {spec.name}  shape {args.shape}  dtype {dtype}  target {target.name}  "
        f"lnc {lnc}  config {json.dumps(config.to_dict())}"
    )
    print(f"config from: {config_source}")
    print(report.text())
    if args.json:
        doc = report.to_dict()
        doc.update(
            {
                "op": spec.name,
                "shape": args.shape,
                "dtype": dtype,
                "lnc": lnc,
                "config": config.to_dict(),
                "config_source": config_source,
            }
        )
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
    if args.chrome:
        n = report.to_chrome_trace(args.chrome)
        print(f"wrote {args.chrome} ({n:,} modeled events; open in ui.perfetto.dev)")
    if args.png:
        report.to_png(args.png)
        print(f"wrote {args.png} (modeled timeline)")
    sys.stdout.flush()
    return 0
