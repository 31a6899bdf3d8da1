"""``neuron-kernels autotune <op>``: search an op's tile configs with Optuna and ship the best.

    neuron-kernels autotune matmul --shape 1024x1024x1024 --trials 40
    neuron-kernels autotune matmul --shape 4096x4096x4096 --jobs 2 --storage sqlite:///t.db
    neuron-kernels autotune rms_norm --committed --trials 30      # the shapes of autotune/shapes.py
    neuron-kernels autotune --list                                # ops, tunables, choices, reasons
    neuron-kernels autotune --table                               # perf_results/<target>/README.md
    neuron-kernels autotune matmul --shape 4096x4096x4096 --backend hardware \
        --nrtpy-python ~/nrtpy_venv/bin/python --compile-jobs 2 --jobs 4   # on a Trn2 node

Every trial: the op's own check (rejected configs are pruned, with the reason), a
correctness gate on the interpreter, then the backend's latency at the full shape
(``model``: modeled by the cost model; ``hardware``: each launch compiled to a NEFF and timed
on a NeuronCore with nrtpy, device-side, by worker processes: autotune/neff_backend.py).
The best config per shape is merged into ``<target>/<op>.json`` of the user's results
folder (``$NEURON_KERNELS_PERF_RESULTS``, else ``<user cache>/neuron-kernels/perf_results``,
created on first use), which every op layers over the shipped configs; ``--results DIR``
names another folder, and ``--write-shipped`` (contributors re-tuning the shipped configs)
the package's own ``perf_results/``. For the same key the faster of the stored and the new
entry stays unless ``--replace``, and the output says which. A killed run resumes when the
same command is run again (the study lives in ``--storage``).
"""

from __future__ import annotations

import os
import sys

from neuron_kernels.cli import UsageError
from neuron_kernels.cli._inputs import DTYPE_ALIASES, LNC_HELP, op_problem, output_path
from neuron_kernels.cli._inputs import lnc as read_lnc
from neuron_kernels.cli._inputs import target as read_target

__all__ = ["add_arguments", "main"]


def add_arguments(parser) -> None:
    parser.add_argument("op", nargs="?", help="registered op name, e.g. matmul")
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        help="problem shape in the op's syntax, e.g. 4096x4096x4096 (repeatable)",
    )
    parser.add_argument(
        "--committed",
        action="store_true",
        help="tune at the op's committed shapes (its OpSpec's, else autotune/shapes.py)",
    )
    parser.add_argument("--dtype", default="bf16", help="bf16|fp32|fp16 or a torch dtype name")
    parser.add_argument(
        "--target",
        default=None,
        help="trn1|trn2|trn3 (default: NEURON_PLATFORM_TARGET_OVERRIDE, else trn2)",
    )
    parser.add_argument("--lnc", default=None, help=LNC_HELP + "; part of the tuned config's key")
    parser.add_argument("--trials", default="100", help="trial budget per shape (default 100)")
    parser.add_argument("--timeout", default=None, help="seconds per shape (default: none)")
    parser.add_argument(
        "--storage",
        default=None,
        help="study storage: an SQLAlchemy URL or journal:PATH (default: SQLite in the user "
        "cache, or $NEURON_KERNELS_STUDIES)",
    )
    parser.add_argument(
        "--backend",
        default=None,
        help="model|hardware (default: hardware where a Neuron device is present, else model)",
    )
    parser.add_argument("--jobs", default="1", help="worker processes sharing the study")
    parser.add_argument(
        "--nrtpy-python",
        default=None,
        metavar="PATH",
        help="hardware backend: the Python of the nrtpy environment that runs the measure "
        "workers (default: $NEURON_KERNELS_NRTPY_PYTHON)",
    )
    parser.add_argument(
        "--compile-jobs",
        default="1",
        help="hardware backend: NEFF compiles at once, each on a logical NeuronCore kept off "
        "the measured ones (default 1)",
    )
    parser.add_argument(
        "--trial-deadline",
        default=None,
        metavar="SECONDS",
        help="hardware backend: a trial's compile and measure workers must finish within "
        "this many seconds, else they are killed and the trial fails (default 900)",
    )
    parser.add_argument("--seed", default="0", help="sampler seed (worker i uses seed + i)")
    parser.add_argument("--sampler", default="tpe", help="tpe|random|grid|cmaes|gp|auto")
    parser.add_argument(
        "--results",
        default=None,
        metavar="DIR",
        help="an existing results folder to merge into (default: the user's, "
        "$NEURON_KERNELS_PERF_RESULTS or <user cache>/neuron-kernels/perf_results)",
    )
    parser.add_argument(
        "--write-shipped",
        action="store_true",
        help="contributors: merge into the package's own perf_results/ (the shipped "
        "configs, tracked in git) instead of the user's folder",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="store this run's best even if the stored entry for the same key is faster",
    )
    parser.add_argument("--no-write", action="store_true", help="do not write perf_results")
    parser.add_argument(
        "--no-warm-start",
        action="store_true",
        help="do not enqueue the configs already tuned at the op's nearest other shapes",
    )
    parser.add_argument(
        "--report", default=None, metavar="DIR", help="write plots (PNG and HTML) into DIR"
    )
    parser.add_argument("--list", action="store_true", help="list ops and their tunables")
    parser.add_argument(
        "--table", action="store_true", help="regenerate perf_results/<target>/README.md"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _int(flag: str, text, low: int) -> int:
    try:
        value = int(str(text))
    except ValueError:
        raise UsageError(flag, text, "must be an integer") from None
    if value < low:
        raise UsageError(flag, text, f"must be >= {low}")
    return value


def _seconds(flag: str, text) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(flag, text, "must be a number of seconds") from None
    if not value > 0:
        raise UsageError(flag, text, "must be > 0")
    return value


def _writable_folder(setting: str, path, create: str):
    """``path`` as a folder results can be merged into, checked before any trial runs: an
    existing writable folder, or one the write will create: ``create="leaf"`` only the
    folder itself (its parent must exist), ``"chain"`` any missing parents too (the user's
    folder in the user cache), ``"none"`` nothing."""
    from pathlib import Path

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(setting, str(path), "is a file, not a folder")
    if not path.exists():
        if create == "none":
            raise UsageError(setting, str(path), "no such folder")
        if create == "leaf" and not path.absolute().parent.is_dir():
            raise UsageError(setting, str(path), f"its parent {path.parent} does not exist")
        parent = next(p for p in path.absolute().parents if p.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise UsageError(setting, str(path), f"cannot be created: {parent} is not writable")
    elif not os.access(path, os.W_OK):
        raise UsageError(setting, str(path), "is not writable")
    return path


def results_folder(args):
    """Where this run merges its results, or None for the default user folder (checked)."""
    from neuron_kernels import tuned_configs

    if args.write_shipped and args.results is not None:
        raise UsageError("--write-shipped", "", "and --results name two folders; give one")
    if args.write_shipped:
        return _writable_folder("--write-shipped", tuned_configs.shipped_dir(), create="none")
    if args.results is not None:
        return _writable_folder("--results", args.results, create="leaf")
    env = os.environ.get(tuned_configs.PERF_RESULTS_ENV)
    if env:  # named by the user: checked here, before tuned_configs.user_dir() would warn about it
        _writable_folder(tuned_configs.PERF_RESULTS_ENV, env, create="chain")
    else:
        _writable_folder("the user results folder", tuned_configs.user_dir(), create="chain")
    return None


def list_ops() -> str:
    from neuron_kernels.kernels.spec import REGISTRY, get_spec

    get_spec("matmul")  # imports the registry
    lines = []
    for name in sorted(REGISTRY):
        spec = REGISTRY[name]
        default = spec.config.default().to_dict()
        space = spec.config.space()
        size = 1
        for c in space.values():
            size *= len(c)
        syntax = getattr(spec.parse_shape, "syntax", "x".join(d.upper() for d in spec.dims))
        lines.append(f"{name}  ({size} configs; shape {syntax})")
        for field, choices in space.items():
            shown = ", ".join(repr(c) for c in choices)
            lines.append(f"  {field:<14} default {default[field]!r:<8} of {shown}")
            lines.append(f"  {'':<14} {spec.config.reasons()[field]}")
    return "\n".join(lines)


def _points(args, spec, lnc: int = 1):
    import dataclasses

    from neuron_kernels.autotune.objective import make_point
    from neuron_kernels.autotune.shapes import points_for
    from neuron_kernels.errors import LimitError

    if args.committed:
        if args.shape:
            raise UsageError(
                "--committed", "", "takes no --shape (it tunes the op's committed shapes)"
            )
        return [dataclasses.replace(p, lnc=lnc) for p in points_for(spec)]
    if not args.shape:
        raise UsageError("--shape", "", f"is required (or --committed) for {spec.name}")
    dtype = DTYPE_ALIASES.get(args.dtype.lower(), args.dtype.removeprefix("torch."))
    if dtype not in spec.dtypes:
        raise UsageError("--dtype", args.dtype, f"must be one of {', '.join(spec.dtypes)}")
    points = []
    for text in args.shape:
        op_problem(spec, "--shape", text, dtype)  # the op's own checks and host memory
        try:
            points.append(make_point(spec, text, dtype, lnc))
        except LimitError as exc:
            raise UsageError("--shape", text, exc.rule) from None
    return points


def summary_table(results) -> str:
    width = max([19, *(len(r.point.shape) for r in results)]) + 1  # ':causal' shapes run long
    head = (
        f"{'shape':<{width}}{'dtype':<10}{'lnc':>4}{'default':>12}{'best':>12}{'speedup':>9}"
        f"{'of floor':>10}{'trials':>8}{'pruned':>8}{'failed':>8}"
    )
    lines = [head]
    for r in results:

        def us(v):
            return f"{v:,.1f}us" if v is not None else "-"

        lines.append(
            f"{r.point.shape:<{width}}{r.point.dtype:<10}{r.point.lnc:>4}{us(r.default_us):>12}{us(r.best_us):>12}"
            f"{(f'{r.speedup:.2f}x' if r.speedup else '-'):>9}"
            f"{(f'{100 * r.floor_fraction:.1f}%' if r.floor_fraction else '-'):>10}"
            f"{r.trials:>8}{r.pruned:>8}{r.failed:>8}"
        )
    return "\n".join(lines)


def main(args) -> int:
    import optuna

    from neuron_kernels.errors import LimitError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.list:
        print(list_ops())
        return 0
    target = read_target(args.target)
    if args.table:
        from neuron_kernels import tuned_configs
        from neuron_kernels.autotune.table import write_table

        root = (
            tuned_configs.shipped_dir()  # the table documents the shipped configs
            if args.results is None
            else _writable_folder("--results", args.results, create="none")
        )
        path = write_table(root / target.name, target.name)
        print(f"wrote {path}")
        return 0
    if args.op is None:
        raise UsageError("op", "", "is required (or --list / --table)")
    from neuron_kernels.autotune.backends import (
        BackendUnavailable,
        default_backend_name,
        make_backend,
    )
    from neuron_kernels.autotune.storage import StorageError, default_storage_url, open_storage
    from neuron_kernels.autotune.study import SamplerError, make_sampler, tune
    from neuron_kernels.kernels.spec import get_spec

    try:
        spec = get_spec(args.op)
    except LimitError as exc:
        raise UsageError("op", args.op, exc.rule) from None
    points = _points(args, spec, read_lnc(args.lnc, target))
    trials = _int("--trials", args.trials, 1)
    jobs = _int("--jobs", args.jobs, 1)
    seed = _int("--seed", args.seed, 0)
    timeout = _seconds("--timeout", args.timeout)
    backend = args.backend or default_backend_name()
    if backend not in ("model", "hardware"):
        raise UsageError("--backend", backend, "must be model or hardware")
    compile_jobs = _int("--compile-jobs", args.compile_jobs, 1)
    options = {}
    if backend == "hardware":
        from neuron_kernels.autotune.neff_backend import DEFAULT_TRIAL_DEADLINE_S

        deadline = _seconds("--trial-deadline", args.trial_deadline)
        options = dict(
            nrtpy_python=args.nrtpy_python,
            compile_jobs=compile_jobs,
            trial_deadline_s=deadline or DEFAULT_TRIAL_DEADLINE_S,
        )
    try:
        # at the points' LNC (--lnc): the hardware backend compiles, measures and stores there
        made = make_backend(backend, target.name, points[0].lnc, **options)
    except BackendUnavailable as exc:
        raise UsageError("--backend", backend, str(exc)) from None
    backend_arg = made if backend == "hardware" else backend
    try:
        make_sampler(args.sampler, spec.config.space(), seed, trials)
    except SamplerError as exc:
        raise UsageError("--sampler", args.sampler, str(exc)) from None
    storage_url = args.storage or default_storage_url()
    # Every output is checked before anything is created or run (a bad one is one line).
    results_root = None if args.no_write else results_folder(args)
    if args.storage and args.storage.startswith("sqlite:///"):
        output_path("--storage", args.storage.removeprefix("sqlite:///"))
    if args.report:
        from neuron_kernels.autotune.report import INSTALL_HINT, missing_plot_libraries

        missing = missing_plot_libraries()
        if missing:
            raise UsageError(
                "--report", args.report, f"needs {' and '.join(missing)}: {INSTALL_HINT}"
            )
        _writable_folder("--report", args.report, create="leaf")  # made when written
    try:
        open_storage(storage_url)
    except StorageError as exc:
        raise UsageError("--storage", storage_url, str(exc)) from None
    for p in points:
        try:
            spec.check(p.problem, p.dtype, spec.config.default(), target.name, p.lnc)
        except LimitError:
            pass  # the default may not fit a huge shape: it is then a pruned trial
    label = "modeled" if backend == "model" else "hardware"
    print(
        f"autotune {spec.name} on {target.name} at LNC={points[0].lnc}: {len(points)} shape(s), {trials} trials each, "
        f"backend {backend} ({label} latency), sampler {args.sampler}, jobs {jobs}, "
        f"storage {storage_url}"
    )
    if backend == "hardware":
        print(
            f"hardware: {made.node.instance_type} at LNC={made.lnc}; compiles on logical "
            f"core(s) {list(made.compile_cores)}, measurements on {list(made.measure_cores)} "
            f"(one worker per core; --jobs {jobs} trial(s) at a time); trial deadline "
            f"{made.trial_deadline_s:g} s"
        )
    try:
        found = tune(
            spec,
            points,
            target=target.name,
            trials=trials,
            timeout=timeout,
            storage_url=storage_url,
            backend=backend_arg,
            jobs=jobs,
            seed=seed,
            sampler=args.sampler,
            write=not args.no_write,
            results_root=results_root,
            progress=not args.quiet,
            warm_start=not args.no_warm_start,
            replace=args.replace,
        )
    except BackendUnavailable as exc:
        raise UsageError("--backend", backend, str(exc)) from None
    print(f"\n{label} latency per shape (best vs the default config):")
    print(summary_table(found))
    for r in found:
        if r.merge is not None:
            print(f"results for {r.point.shape} {r.point.dtype}: {r.merge.why} ({r.merge.path})")
        elif r.best_config is None:
            print(f"{r.point.shape} {r.point.dtype}: no config completed (all pruned or failed)")
    if args.report:
        from neuron_kernels.autotune.report import write_report

        for path in write_report(args.report, spec, found, storage_url):
            print(f"wrote {path}")
    sys.stdout.flush()
    return 0
