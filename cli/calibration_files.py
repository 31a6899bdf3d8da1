"""``neuron-kernels calibrate``'s inputs and files: the calibration kernels traced, the
measurements read and checked, the table stored. The modeling, comparison and fitting are
:mod:`neuron_kernels.cost_model.calibration`'s; this module joins them to what only the top
layer may import (the calibration kernels in ``kernels/calibration``, the data in
``perf_results/calibration``, the ops' specs, the tuner's hardware workers).

* :func:`build_table` traces every published row (``perf_results/calibration/published.json``)
  on the interpreter and models it, then checks the ±15% bound and the published orderings.
  :func:`write_table` stores it as ``table.json`` and ``table.md``.
* :func:`fit` takes measurements (milliseconds from the Neuron profiler on real hardware),
  checks and traces each row once, and fits the named parameters to them. Its output is an
  overrides file for ``profile``.
* :func:`measure_on_hardware` runs the calibration kernels on this node's NeuronCores.

Modeled numbers are labelled "modeled"; published/measured ones "published hardware".
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from neuron_kernels.cost_model import (
    allocation,
    dependencies,
    dma,
    instruction_costs,
    schedule,
    timeline,
)
from neuron_kernels.cost_model import params as params_module
from neuron_kernels.cost_model.calibration import (
    calibration_table,
    error_pct,
    fit_parameters,
    model_row,
    render_markdown,
    row_target,
)
from neuron_kernels.cost_model.params import PARAMS, params_for
from neuron_kernels.cost_model.schedule import MODEL_VERSION
from neuron_kernels.errors import LimitError
from neuron_kernels.fingerprint import code_fingerprint
from neuron_kernels.hardware import target_from_name
from neuron_kernels.interpreter import run
from neuron_kernels.interpreter.rebind import unwrap_kernel
from neuron_kernels.verification import InterpreterRunner

__all__ = [
    "load_published",
    "model_fingerprint",
    "trace_row",
    "build_table",
    "write_table",
    "fit",
    "load_measurements",
    "measure_on_hardware",
]

_NP_DTYPES = {"float32": np.float32, "bfloat16": None, "float16": np.float16}


def load_published() -> dict:
    from neuron_kernels.perf_results.calibration import PUBLISHED_PATH

    return json.loads(Path(PUBLISHED_PATH).read_text())


def model_fingerprint() -> str:
    """Hash of the model's rules and parameter tables: a stored table with another is stale."""
    h = hashlib.sha256(MODEL_VERSION.encode())
    rules = (schedule, instruction_costs, dma, dependencies, allocation, timeline)
    for module in (*rules, params_module):
        h.update(code_fingerprint(module).encode())
    for target in sorted(PARAMS):
        h.update(params_for(target).fingerprint().encode())
    return h.hexdigest()[:16]


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return _NP_DTYPES[name]


def trace_row(row: dict, shape: dict | None = None):
    """Run a published row's calibration kernel on the interpreter, trace only."""
    from neuron_kernels.kernels.calibration import tutorial_matmul

    shape = shape or load_published()["shape"]
    dt = _np_dtype(row["dtype"])
    # np.empty does not touch its pages: trace-only runs never read the values.
    lhsT = np.empty((shape["K"], shape["M"]), dtype=dt)
    rhs = np.empty((shape["K"], shape["N"]), dtype=dt)
    kernel = getattr(tutorial_matmul, row["kernel"])
    return run(
        kernel, (lhsT, rhs), dict(row.get("kwargs") or {}), target=row_target(row), compute=False
    )


def _model_published(row: dict, shape: dict) -> tuple[dict, float]:
    t0 = time.time()
    return model_row(row, trace_row(row, shape)), time.time() - t0


def build_table(row_ids=None, progress: Callable[[str], None] | None = None, jobs: int = 1) -> dict:
    """Model every published row (or those in ``row_ids``) and compare; ``jobs`` processes."""
    pub = load_published()
    selected = [r for r in pub["rows"] if not row_ids or r["id"] in row_ids]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_model_published, selected, [pub["shape"]] * len(selected)))
    else:
        results = [_model_published(r, pub["shape"]) for r in selected]
    if progress:
        for row, (m, seconds) in zip(selected, results):
            published_ms = row["published"]["latency_ms"]
            err = error_pct(m["latency_ms"], published_ms)
            progress(
                f"{row['id']}: modeled {m['latency_ms']:.2f} ms vs published hardware "
                f"{published_ms:.2f} ms ({err:+.1f}%) [{seconds:.0f} s]"
            )
    return calibration_table(pub, selected, [m for m, _ in results], model_fingerprint())


def write_table(table: dict, json_path=None, md_path=None) -> None:
    from neuron_kernels.perf_results.calibration import TABLE_JSON, TABLE_MD

    Path(json_path or TABLE_JSON).write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    Path(md_path or TABLE_MD).write_text(render_markdown(table))


# -- fitting to a user's own measurements -------------------------------------------------------


def load_measurements(path, flag: str = "--fit") -> dict:
    """A measurements file: ``{"target": "trn2", "rows": [{..., "measured_ms": x}, ...]}``,
    checked row by row before anything is traced; a bad one is refused naming ``flag``, the
    row and the field (:class:`~neuron_kernels.cli.UsageError`)."""
    from neuron_kernels.cli import UsageError
    from neuron_kernels.cli._inputs import read_json_file
    from neuron_kernels.errors import LimitError

    doc = read_json_file(flag, str(path), "a measurements object")
    target = doc.get("target", "trn2")
    try:
        target_from_name(target, setting='"target"')
    except LimitError as exc:
        raise UsageError(flag, f'{path} "target" {target!r}', exc.rule) from None
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise UsageError(flag, path, 'must hold a non-empty "rows" list')
    published = {r["id"] for r in load_published()["rows"]}
    for i, row in enumerate(rows):

        def refuse(why, i=i):
            raise UsageError(flag, f"{path} rows[{i}]", why)

        if not isinstance(row, dict):
            refuse(f"must be an object, is a {type(row).__name__}")
        ms = row.get("measured_ms")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms):
            refuse(f'"measured_ms" must be a number of milliseconds, got {ms!r}')
        if ms <= 0:
            refuse(f'"measured_ms" must be > 0, got {ms!r}')
        kinds = [k for k in ("op", "kernel") if k in row]
        if len(kinds) > 1:
            refuse('names both "op" and "kernel"; give one')
        if not kinds:
            if row.get("id") not in published:
                refuse(
                    f'"id" {row.get("id")!r} is not a published row (one of '
                    f'{", ".join(sorted(published))}); or give "op" or "kernel"'
                )
        elif kinds == ["op"]:
            _check_op_row(row, refuse)
        else:
            _check_kernel_row(row, refuse)
    return doc


def _check_op_row(row: dict, refuse) -> None:
    from neuron_kernels.cli import UsageError
    from neuron_kernels.cli._inputs import op_problem
    from neuron_kernels.errors import LimitError
    from neuron_kernels.kernels.spec import get_spec

    try:
        spec = get_spec(row["op"])
        spec.parse_shape(row.get("shape", ""))
        dtype = row.get("dtype", "bfloat16")
        if dtype not in spec.dtypes:
            refuse(f'"dtype" must be one of {", ".join(spec.dtypes)}, got {dtype!r}')
        if row.get("config"):
            spec.config.from_dict(row["config"])
    except LimitError as exc:
        refuse(f"{exc.arg} {exc.rule}, got {exc.value}")
    try:  # the op's own checks and the host memory, as profile and autotune read a shape
        op_problem(spec, "shape", str(row.get("shape", "")), dtype)
    except UsageError as exc:
        refuse(f"shape {exc.value} {exc.why}")


def _check_kernel_row(row: dict, refuse) -> None:
    module, sep, name = str(row["kernel"]).partition(":")
    if not sep or not module or not name:
        refuse(f'"kernel" must be "package.module:kernel", got {row["kernel"]!r}')
    try:
        kernel = getattr(importlib.import_module(module), name, None)
    except ImportError as exc:
        refuse(f'"kernel" {row["kernel"]!r} cannot be imported ({exc})')
    if kernel is None:
        refuse(f'"kernel": {module} has no {name!r}')
    try:
        fn, _ = unwrap_kernel(kernel)
    except TypeError:
        refuse(f'"kernel" {row["kernel"]!r} is not an NKI kernel (a function or @nki.jit object)')
    shapes = row.get("shapes")
    if not isinstance(shapes, list) or not all(
        isinstance(s, list)
        and s
        and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in s)
        for s in shapes
    ):
        refuse(f'"shapes" must be a list of shapes (lists of positive ints), got {shapes!r}')
    kwargs = row.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        refuse(f'"kwargs" must be an object, got {kwargs!r}')
    positional = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in kwargs
    ]
    required = [p.name for p in positional if p.default is p.empty]
    if not len(required) <= len(shapes) <= len(positional):
        refuse(
            f'"shapes" must give one array per argument of {name} ({", ".join(required)}'
            f"{'' if len(positional) == len(required) else ', ...'}), got {len(shapes)}"
        )
    try:
        item = np.dtype(_np_dtype(row.get("dtype", "float32"))).itemsize
    except (KeyError, ValueError, TypeError):
        refuse(f'"dtype" {row.get("dtype")!r} is not a dtype name')
    from neuron_kernels.cli._inputs import HOST_MEMORY_SHARE, host_memory_bytes

    need, have = sum(math.prod(s) for s in shapes) * item, host_memory_bytes()
    if need > HOST_MEMORY_SHARE * have:
        refuse(
            f'"shapes" take {need / 2**30:.1f} GiB of host memory, more than half of the '
            f"{have / 2**30:.1f} GiB available here"
        )


def _trace_measurement(row: dict, target: str):
    """Trace one measurement row: a published row id, an op from the registry, or a kernel."""
    pub = {r["id"]: r for r in load_published()["rows"]}
    if row.get("id") in pub and "kernel" not in row and "op" not in row:
        base = dict(pub[row["id"]])
        base["target"] = target
        return trace_row(base), row_target(base)
    tgt = target_from_name(target)
    if "op" in row:
        import torch

        from neuron_kernels.kernels.spec import get_spec

        spec = get_spec(row["op"])
        problem = spec.parse_shape(row["shape"])
        inputs = spec.make_inputs(
            problem, row.get("dtype", "bfloat16"), torch.Generator().manual_seed(0)
        )
        config = (
            spec.config.from_dict(row.get("config") or {})
            if row.get("config")
            else spec.config.default()
        )
        runs = []
        spec.run_kernels(
            *inputs, config=config, runner=InterpreterRunner(tgt, compute=False, runs=runs)
        )
        return runs, tgt
    module, _, name = row["kernel"].partition(":")
    kernel = getattr(importlib.import_module(module), name)
    dt = _np_dtype(row.get("dtype", "float32"))
    arrays = tuple(np.empty(tuple(s), dtype=dt) for s in row["shapes"])
    return run(kernel, arrays, dict(row.get("kwargs") or {}), target=tgt, compute=False), tgt


def fit(
    measurements: dict,
    names: list[str],
    iterations: int = 40,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fit ``names`` (numeric parameters) to measured milliseconds; returns the fit report
    (:func:`~neuron_kernels.cost_model.calibration.fit_parameters`). A name that is not a
    numeric parameter, or a kernel row that refuses its shapes, is a
    :class:`~neuron_kernels.cli.UsageError`. Traces are computed once per row.
    """
    target = measurements.get("target", "trn2")
    base = params_for(target)
    for n in names:
        if (
            n not in base.table
            or not isinstance(base.table[n].value, (int, float))
            or isinstance(base.table[n].value, bool)
        ):
            from neuron_kernels.cli import UsageError

            numeric = sorted(
                k
                for k, p in base.table.items()
                if isinstance(p.value, (int, float)) and not isinstance(p.value, bool)
            )
            raise UsageError("--params", n, f"must name numeric parameters of {target}: {numeric}")
    traced = []
    for i, row in enumerate(measurements["rows"]):
        try:
            tr, tgt = _trace_measurement(row, target)
        except (LimitError, TypeError, ValueError, IndexError, NotImplementedError) as exc:
            if "kernel" not in row:
                raise
            from neuron_kernels.cli import UsageError

            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UsageError(
                "--fit", f"rows[{i}]", f"kernel {row['kernel']} refused its shapes: {first}"
            ) from None
        traced.append((row, tr, tgt))
        if progress:
            progress(f"traced {row.get('id', row.get('kernel', row.get('op')))}")
    return fit_parameters(traced, names, base, target, iterations, progress)


# -- measuring the calibration kernels on this node ----------------------------------------------


def measure_on_hardware(
    backend, row_ids=None, shape: dict | None = None, progress: Callable[[str], None] | None = None
) -> tuple[dict, list[str]]:
    """Run the published rows' calibration kernels on this node's NeuronCores through the
    tuner's hardware workers (:mod:`neuron_kernels.autotune.neff_backend`): one NEFF per
    kernel, device-side latency from nrtpy, each output checked against ``lhsT.T @ rhs``.

    Returns the measurements document :func:`load_measurements` reads (``--fit``), and one
    line per row that could not be measured. At the published shape each row is written by
    its ``id``; at another ``shape`` (``{"K", "M", "N"}``) as a kernel row with its shapes.
    The tolerance is the matmul op's for the row's dtype (the same product, accumulated in
    fp32 PSUM), chosen before any measurement.
    """
    import tempfile

    import torch

    from neuron_kernels.autotune.backends import MeasurementFailure
    from neuron_kernels.autotune.neff_backend import NeffRunner
    from neuron_kernels.kernels.calibration import tutorial_matmul
    from neuron_kernels.kernels.spec import get_spec
    from neuron_kernels.verification import assert_within_tolerance

    published = load_published()
    at = dict(shape or published["shape"])
    target = backend.target.name
    tolerances = get_spec("matmul").tolerances
    code_hash = code_fingerprint(tutorial_matmul)
    rng = np.random.default_rng(0)
    rows, failures, compiler = [], [], None
    for row in published["rows"]:
        if row_ids and row["id"] not in row_ids:
            continue
        dt = _np_dtype(row["dtype"])
        lhsT = rng.standard_normal((at["K"], at["M"])).astype(dt)
        rhs = rng.standard_normal((at["K"], at["N"])).astype(dt)
        kernel = getattr(tutorial_matmul, row["kernel"])
        kwargs = dict(row.get("kwargs") or {})
        tgt = target_from_name(target)
        traced = run(kernel, (lhsT, rhs), kwargs, target=tgt, compute=False)
        outs = traced.outputs if isinstance(traced.outputs, (tuple, list)) else (traced.outputs,)
        launches = [(False, [(list(o.shape), str(o.dtype).removeprefix("torch.")) for o in outs])]
        workdir = backend.workdir / "trials"
        workdir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + backend.trial_deadline_s
        runner = NeffRunner(
            backend,
            launches,
            Path(tempfile.mkdtemp(prefix=f"calibrate-{row['id']}-", dir=workdir)),
            deadline,
            modules=(tutorial_matmul,),
            code_hash=code_hash,
        )
        try:
            got = runner(kernel, lhsT, rhs, **kwargs)
            want = torch.from_numpy(lhsT.astype(np.float64)).T @ torch.from_numpy(
                rhs.astype(np.float64)
            )
            assert_within_tolerance(got, want, tolerances[row["dtype"]], "on the NeuronCore")
        except (MeasurementFailure, AssertionError) as exc:
            failures.append(f"{row['id']}: {str(exc).splitlines()[0]}")
            if progress:
                progress(f"FAIL {failures[-1]}")
            continue
        result = runner.results[0]
        compiler = compiler or runner.compiles[0].get("compiler_version")
        ms = result["latency_us"]["p50"] / 1e3
        entry = {"measured_ms": ms, "p99_ms": result["latency_us"]["p99"] / 1e3}
        if at == published["shape"]:
            entry["id"] = row["id"]
        else:
            entry.update(
                kernel=f"{tutorial_matmul.__name__}:{row['kernel']}",
                shapes=[[at["K"], at["M"]], [at["K"], at["N"]]],
                dtype=row["dtype"],
                kwargs=kwargs,
                id=row["id"],
            )
        rows.append(entry)
        if progress:
            progress(f"measured {row['id']}: {ms:.4f} ms (device-side median)")
    doc = {
        "target": target,
        "source": "neuron-kernels calibrate --measure (nrtpy benchmark, mode='device', p50)",
        "instance_type": backend.node.instance_type,
        "lnc": backend.lnc,
        "compiler_version": compiler or "unknown",
        "rows": rows,
    }
    return doc, failures
