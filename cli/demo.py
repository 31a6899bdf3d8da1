"""``neuron-kernels demo``: run the library's NKI kernels on the interpreter and check them.

The embedded default job: every registered op, on fixed-seed inputs of a preset size and
in each of its dtypes, runs its NKI kernel (default config) on the portable interpreter,
is compared with its fp64 reference within the op's declared tolerance, and its run is
scheduled on the cost model. Prints one line per run (max error, tolerance, PASS/FAIL,
instruction count, modeled latency) and returns non-zero on a failure.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from neuron_kernels.cli._inputs import LNC_HELP
from neuron_kernels.verification import copy_args

__all__ = ["SIZES", "TOLERANCE_SCALE", "DemoRun", "add_arguments", "main", "run_checks"]

# --size presets name problems every OpSpec declares, so a new op needs nothing here.
SIZES = {"small": "probe", "large": "large"}
TOLERANCE_SCALE = 1.0  # tests set 0 to see the demo fail


@dataclass(frozen=True)
class DemoRun:
    """The outcome of one kernel run against its reference."""

    op: str
    problem: str
    dtype: str
    max_abs_err: float
    atol: float
    rtol: float
    passed: bool
    instructions: int
    modeled_us: float
    target: str
    skipped: str | None = None  # why the run could not run here (then it is no failure)
    of_bound: float = 0.0  # max of |err| / (atol + rtol * |ref|): <= 1 passes
    lnc: int = 1


def _results(spec, args, runner) -> list:
    """(kernel result, fp64 reference) pairs: the output, or for an in-place op each tensor
    it updates (kernel and reference on their own copies of the inputs)."""
    config = spec.config.default()
    if not spec.mutates:
        out = spec.run_kernels(*args, config=config, runner=runner)
        ref = spec.reference(*args, upcast=True)
        if isinstance(out, (tuple, list)):  # a multi-output op: each output against its own
            return list(zip(out, ref))
        return [(out, ref)]
    ran, ref = copy_args(args), copy_args(args, torch.float64)
    spec.run_kernels(*ran, config=config, runner=runner)
    spec.reference(*ref, upcast=True)
    return list(zip(spec.mutated_tensors(ran), spec.mutated_tensors(ref)))


def run_checks(
    target: str = "trn2", size: str = "small", seed: int = 0, lnc: int = 1
) -> list[DemoRun]:
    """Run every registered op in every dtype on the interpreter for ``target``, launched
    at LNC ``lnc``."""
    from neuron_kernels.cost_model.profiler import Profiler
    from neuron_kernels.interpreter.errors import NotImplementedByInterpreter
    from neuron_kernels.kernels import REGISTRY

    checks = []
    for name, spec in sorted(REGISTRY.items()):
        problem = spec.test_problems[SIZES[size]]
        for dtype in spec.dtypes:
            args = spec.make_inputs(problem, dtype, torch.Generator().manual_seed(seed))
            profiler = Profiler(target=target, compute=True)
            profiler.lnc = lnc  # the LNC the op's run_kernels launches at (spec.runner_lnc)
            tol = spec.tolerances[dtype]
            atol, rtol = tol.atol * TOLERANCE_SCALE, tol.rtol * TOLERANCE_SCALE
            try:
                pairs = _results(spec, args, profiler)
            except NotImplementedByInterpreter as exc:  # e.g. bf16 bits under NKI_PRECISE_FP=0
                problem_text = " ".join(f"{k}={v}" for k, v in problem.items())
                checks.append(
                    DemoRun(name, problem_text, dtype, 0.0, atol, rtol, True, 0, 0.0, target,
                            skipped=str(exc))
                )  # fmt: skip
                continue
            # NaN (unwritten memory) fails the comparison below
            diffs = [(out.double() - ref).abs() for out, ref in pairs]
            passed = all(
                bool((d <= atol + rtol * ref.abs()).all()) for d, (_, ref) in zip(diffs, pairs)
            )
            max_err = max((float(d.max()) for d in diffs if d.numel()), default=0.0)
            # the worst element against its own bound: the PASS/FAIL reads off this column
            of_bound = max(
                (float((d / (atol + rtol * ref.abs())).max()) for d, (_, ref) in zip(diffs, pairs)
                 if d.numel()),
                default=0.0,
            )  # fmt: skip
            report = profiler.report()
            checks.append(
                DemoRun(
                    name,
                    " ".join(f"{k}={v}" for k, v in problem.items()),
                    dtype,
                    max_err,
                    atol,
                    rtol,
                    passed,
                    sum(len(lp.run.trace) for lp in report.launches),
                    report.latency_ns / 1e3,
                    target,
                    of_bound=of_bound,
                    lnc=lnc,
                )
            )
    return checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=None,
        help="NeuronCore generation (default: NEURON_PLATFORM_TARGET_OVERRIDE, else trn2)",
    )
    parser.add_argument(
        "--size", choices=sorted(SIZES), default="small", help="problem size preset (default small)"
    )
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the inputs (default 0)")
    parser.add_argument("--lnc", default=None, help=LNC_HELP)


def main(args: argparse.Namespace) -> int:
    # The interpreter runs the kernels whichever NKI backend they bound at import
    # (neuron_kernels.interpreter.rebind), so the demo works on a Trn node too.
    from neuron_kernels.cli._inputs import lnc as read_lnc
    from neuron_kernels.cli._inputs import target as read_target

    tg = read_target(args.target)
    target, lnc = tg.name, read_lnc(args.lnc, tg)
    print(
        f"neuron-kernels demo: the library's NKI kernels on the portable interpreter (target {target}, "
        f"LNC {lnc}, size {args.size}, seed {args.seed}), checked against their fp64 references"
    )
    checks = run_checks(target=target, size=args.size, seed=args.seed, lnc=lnc)
    w = max([8] + [len(c.op) for c in checks])  # the longest name and problem set the widths
    wp = max([22] + [len(c.problem) for c in checks])
    print(
        f"  {'op':<{w}} {'problem':<{wp}} {'dtype':<9} {'max abs err':>11}  {'tolerance':<24} "
        f"{'of bound':>8}  {'instructions':>12}  {'latency (modeled)':>17}  result"
    )
    for c in checks:
        if c.skipped:
            print(f"  {c.op:<{w}} {c.problem:<{wp}} {c.dtype:<9} SKIP: {c.skipped}")
            continue
        print(
            f"  {c.op:<{w}} {c.problem:<{wp}} {c.dtype:<9} {c.max_abs_err:>11.3g}  "
            f"{f'atol {c.atol:g} rtol {c.rtol:g}':<24} {c.of_bound:>8.2f}  {c.instructions:>12}  "
            f"{c.modeled_us:>14.1f} us  "
            f"{'PASS' if c.passed else 'FAIL'}"
        )
    print(
        "A run passes when every element's error is within atol + rtol * |reference|: 'of bound' "
        "is the worst element's error over its own bound (<= 1 passes; the max abs err alone "
        "can exceed atol where rtol allows it)."
    )
    failed = [f"{c.op} {c.dtype}" for c in checks if not c.passed]
    ran = [c for c in checks if not c.skipped]
    skipped = f" ({len(checks) - len(ran)} skipped: see SKIP)" if len(ran) < len(checks) else ""
    print(
        "FAIL: " + ", ".join(failed)
        if failed
        else f"PASS: {len(ran)} of {len(ran)} kernel runs match{skipped}"
    )
    print(
        "Latencies are modeled by the cost model from the interpreter trace, not measured on hardware."
    )
    return 1 if failed else 0
