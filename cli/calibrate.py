"""``neuron-kernels calibrate``: the cost model against published hardware, or fitted to yours.

    neuron-kernels calibrate                 # model every published row, print the table
    neuron-kernels calibrate --write         # ... and store perf_results/calibration/table.{json,md}
    neuron-kernels calibrate --fit mine.json --params dma_transfer_ns,dma_core_gbps --out trn2.json
    neuron-kernels profile matmul ... --params-file trn2.json   # profile with the fitted values
    neuron-kernels calibrate --measure mine.json --nrtpy-python ~/nrtpy_venv/bin/python  # on Trn2

``--measure`` runs the published rows' calibration kernels on this node's NeuronCores
through the tuner's hardware workers (one NEFF each, device-side median from nrtpy; see
``autotune/neff_backend.py``) and writes the measurements file ``--fit`` reads, so fitting
the cost model to a node is ``calibrate --measure m.json && calibrate --fit m.json``.

``mine.json``: ``{"target": "trn2", "rows": [{"id": "A3-v3-hoisted", "measured_ms": 28.1},
{"op": "matmul", "shape": "4096x4096x4096", "dtype": "bfloat16", "config": {...},
"measured_ms": 2.0}, {"kernel": "pkg.module:kernel", "shapes": [[K, M], [K, N]],
"dtype": "float32", "measured_ms": 1.2}]}`` with milliseconds from the Neuron profiler.
"""

from __future__ import annotations

import json
import sys

from neuron_kernels.cli import UsageError
from neuron_kernels.cli._inputs import output_path
from neuron_kernels.cli._inputs import target as read_target

__all__ = ["add_arguments", "main"]


def add_arguments(parser) -> None:
    parser.add_argument(
        "--rows", default="", help="comma-separated published row ids (default: all)"
    )
    parser.add_argument(
        "--write", action="store_true", help="store table.json and table.md in perf_results"
    )
    parser.add_argument(
        "--fit", metavar="MEASUREMENTS.json", help="fit parameters to your hardware numbers"
    )
    parser.add_argument(
        "--params",
        default="dma_transfer_ns,dma_core_gbps",
        help="parameters to fit (comma-separated; default: %(default)s)",
    )
    parser.add_argument(
        "--iterations", type=int, default=40, help="Nelder-Mead iterations (default 40)"
    )
    parser.add_argument(
        "--out", metavar="OVERRIDES.json", help="where --fit writes the fitted overrides"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="processes for the published rows (default 1)"
    )
    parser.add_argument(
        "--measure",
        metavar="MEASUREMENTS.json",
        help="measure the calibration kernels on this Trn node's NeuronCores and write the "
        "measurements file --fit reads",
    )
    parser.add_argument(
        "--shape",
        default=None,
        metavar="KxMxN",
        help="--measure: the calibration matmul's shape (default: the published one)",
    )
    parser.add_argument(
        "--nrtpy-python",
        default=None,
        metavar="PATH",
        help="--measure: the nrtpy environment's python (default: $NEURON_KERNELS_NRTPY_PYTHON)",
    )
    parser.add_argument(
        "--compile-jobs", type=int, default=1, help="--measure: NEFF compiles at once (default 1)"
    )
    parser.add_argument(
        "--trial-deadline",
        type=float,
        default=None,
        metavar="SECONDS",
        help="--measure: each kernel's workers must finish within this (default 900)",
    )


def _positive(flag: str, value: int) -> int:
    if value < 1:
        raise UsageError(flag, str(value), "must be >= 1")
    return value


def main(args) -> int:
    from neuron_kernels.cli import calibration_files
    from neuron_kernels.cost_model.calibration import render_markdown

    def say(msg):
        print(msg, file=sys.stderr, flush=True)

    _positive("--iterations", args.iterations)
    _positive("--jobs", args.jobs)
    if args.measure:
        return _measure(args, say)
    if args.fit:
        output_path("--out", args.out)
        measurements = calibration_files.load_measurements(args.fit)
        names = [n.strip() for n in args.params.split(",") if n.strip()]
        if not names:
            raise UsageError("--params", repr(args.params), "must name at least one parameter")
        report = calibration_files.fit(
            measurements, names, iterations=args.iterations, progress=say
        )
        print(f"Fitted on {report['target']} to {len(report['rows'])} hardware measurement(s):")
        for n, v in report["overrides"].items():
            d = report["defaults"][n]
            edge = d and (v >= 7.99 * d or v <= d / 7.99)
            note = "  (at the 8x search bound: these rows do not pin it down)" if edge else ""
            print(f"  {n}: {d:g} -> {v:.4g}{note}")
        print(
            f"  rms log error (modeled vs hardware): {report['rms_log_error']['before']:.3f} -> "
            f"{report['rms_log_error']['after']:.3f}"
        )
        for r in report["rows"]:
            print(
                f"  {r['id']}: hardware {r['measured_ms_hardware']:.3f} ms, modeled "
                f"{r['modeled_ms_before']:.3f} -> {r['modeled_ms_after']:.3f} ms"
            )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)
            print(f"wrote {args.out} (use: neuron-kernels profile ... --params-file {args.out})")
        return 0

    row_ids = _row_ids(args)
    if row_ids:
        if args.write:
            raise UsageError("--rows", args.rows, "--write stores every row; drop --rows")
    table = calibration_files.build_table(row_ids, progress=say, jobs=args.jobs)
    if args.write:
        calibration_files.write_table(table)
        print(render_markdown(table, stored=True))
        print("wrote perf_results/calibration/table.json and table.md", file=sys.stderr)
    else:
        print(render_markdown(table, stored=False))
    ok = all(r["within_bound"] for r in table["rows"]) and all(
        o["holds"] for o in table["orderings"]
    )
    return 0 if ok else 1


def _row_ids(args) -> set | None:
    """The ``--rows`` asked for (None: all), refused unless every one is published."""
    from neuron_kernels.cli import calibration_files

    row_ids = {r.strip() for r in args.rows.split(",") if r.strip()} or None
    if row_ids:
        published = [r["id"] for r in calibration_files.load_published()["rows"]]
        unknown = sorted(row_ids - set(published))
        if unknown:
            raise UsageError(
                "--rows", ",".join(unknown), f"must name published rows: {', '.join(published)}"
            )
    return row_ids


def _measure(args, say) -> int:
    """``--measure``: the calibration kernels on this node's NeuronCores -> the file ``--fit`` reads."""
    from neuron_kernels.autotune.backends import BackendUnavailable
    from neuron_kernels.autotune.neff_backend import DEFAULT_TRIAL_DEADLINE_S, HardwareBackend
    from neuron_kernels.cli import calibration_files

    output_path("--measure", args.measure)
    row_ids = _row_ids(args)
    shape = None
    if args.shape is not None:
        parts = args.shape.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise UsageError("--shape", args.shape, "must be KxMxN (three positive ints)")
        shape = dict(zip("KMN", (int(p) for p in parts)))
    if args.trial_deadline is not None and not args.trial_deadline > 0:
        raise UsageError("--trial-deadline", str(args.trial_deadline), "must be > 0")
    _positive("--compile-jobs", args.compile_jobs)
    try:
        backend = HardwareBackend(
            read_target(None).name,
            nrtpy_python=args.nrtpy_python,
            compile_jobs=args.compile_jobs,
            trial_deadline_s=args.trial_deadline or DEFAULT_TRIAL_DEADLINE_S,
        )
    except BackendUnavailable as exc:
        raise UsageError("--measure", args.measure, str(exc)) from None
    if backend.lnc != 1:  # the published tutorial kernels do not split by nl.program_id
        raise UsageError(
            "--measure",
            args.measure,
            "the calibration kernels run on one physical core: launch at LNC=1 "
            f"(NEURON_LOGICAL_NC_CONFIG=1; this node launches at LNC={backend.lnc})",
        )
    doc, failures = calibration_files.measure_on_hardware(backend, row_ids, shape, progress=say)
    if doc["rows"]:
        with open(args.measure, "w") as f:
            json.dump(doc, f, indent=2)
        print(
            f"wrote {args.measure}: {len(doc['rows'])} row(s) measured on {doc['instance_type']} "
            f"(hardware, device-side median, LNC={doc['lnc']}); next: neuron-kernels calibrate "
            f"--fit {args.measure} --out fitted.json"
        )
    for line in failures:
        print(f"not measured: {line}")
    return 1 if failures or not doc["rows"] else 0
