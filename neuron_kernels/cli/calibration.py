"""Calibration of the cost model: modeled vs published hardware latency, and fitting the
least certain parameters to a user's own profiler numbers.

* :func:`build_table` runs every published row (``perf_results/calibration/published.json``)
  through the interpreter (trace only) and the cost model, and checks the ±15% bound and the
  published orderings. :func:`write_table` stores it as ``table.json`` and ``table.md``.
* :func:`fit` takes measurements (milliseconds from the Neuron profiler on real hardware),
  traces each kernel once, and searches the named parameters (Nelder-Mead in log space) to
  minimise the mean squared log error. Its output is an overrides file for ``profile``.

Modeled numbers are labelled "modeled"; published/measured ones "published hardware".
"""

from __future__ import annotations

import dataclasses
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
from neuron_kernels.cost_model.params import PARAMS, CostParams, params_for
from neuron_kernels.cost_model.schedule import MODEL_VERSION, model_trace
from neuron_kernels.errors import LimitError
from neuron_kernels.fingerprint import code_fingerprint
from neuron_kernels.hardware import target_from_name
from neuron_kernels.interpreter import run
from neuron_kernels.interpreter.rebind import unwrap_kernel
from neuron_kernels.testing import InterpreterRunner

__all__ = [
    "load_published",
    "model_fingerprint",
    "trace_row",
    "model_row",
    "build_table",
    "write_table",
    "render_markdown",
    "check_orderings",
    "fit",
    "load_measurements",
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


def _row_target(row: dict):
    tgt = target_from_name(row["target"])
    over = dict(row.get("target_overrides") or {})
    for key, value in list(over.items()):
        if isinstance(value, str):  # "sbuf_partition_bytes": another field of the target
            over[key] = getattr(tgt, value)
    return dataclasses.replace(tgt, **over) if over else tgt


def trace_row(row: dict, shape: dict | None = None):
    """Run a published row's calibration kernel on the interpreter, trace only."""
    from neuron_kernels.perf_results.calibration import tutorial_matmul

    shape = shape or load_published()["shape"]
    dt = _np_dtype(row["dtype"])
    # np.empty does not touch its pages: trace-only runs never read the values.
    lhsT = np.empty((shape["K"], shape["M"]), dtype=dt)
    rhs = np.empty((shape["K"], shape["N"]), dtype=dt)
    kernel = getattr(tutorial_matmul, row["kernel"])
    return run(
        kernel, (lhsT, rhs), dict(row.get("kwargs") or {}), target=_row_target(row), compute=False
    )


def model_row(row: dict, result, params: CostParams | None = None) -> dict:
    """The modeled numbers of one row (all modeled), comparable with its published ones."""
    tgt = _row_target(row)
    params = params or params_for(tgt.name)
    tl = model_trace(result.trace, tgt, params=params)
    lat = tl.latency_ns
    peak = 2.0 * 128 * 128 * float(params.pe_ghz)  # FLOP per ns
    hbm = tl.dma_hbm_bytes["read"] + tl.dma_hbm_bytes["write"]
    out = {
        "latency_ms": lat / 1e6,
        "tensor_active_ms": tl.busy_ns["pe"] / 1e6,
        "dma_active_ms": tl.dma_active_ns / 1e6,
        "vector_active_ms": tl.busy_ns["dve"] / 1e6,
        "hfu_pct": 100.0 * tl.flops["matmul"] / (peak * lat) if lat else 0.0,
        "hbm_gb": hbm / 1e9,
        "hbm_gbps": hbm / lat if lat else 0.0,
        "critical_engine": tl.critical_unit,
        "instructions": len(result.trace),
    }
    if (
        tgt.name == "trn2"
    ):  # the profiler's MBU divides by one HBM stack, 725 GB/s ([mm-tut-old]; [perf])
        out["mbu_pct"] = 100.0 * hbm / (725.0 * lat) if lat else 0.0
    return out


def check_orderings(modeled: dict[str, dict], orderings: list[dict]) -> list[dict]:
    """Evaluate each published ordering on the modeled rows."""
    results = []
    for o in orderings:
        ids = o["rows"]
        if not all(i in modeled for i in ids):
            continue
        lat = [modeled[i]["latency_ms"] for i in ids]
        if o["kind"] == "decreasing":
            holds = all(a > b for a, b in zip(lat, lat[1:]))
            detail = " > ".join(f"{x:.2f}" for x in lat) + " ms (modeled)"
        elif o["kind"] == "close":
            diff = 100.0 * (lat[0] / lat[1] - 1.0)
            holds = abs(diff) <= o["tolerance_pct"]
            detail = f"{lat[0]:.2f} vs {lat[1]:.2f} ms (modeled), {diff:+.2f}%"
        elif o["kind"] == "dma_active_drop":
            a, b = (modeled[i]["dma_active_ms"] / modeled[i]["latency_ms"] for i in ids)
            holds = a < o["max_ratio"] * b
            detail = f"modeled DMA active {100 * a:.1f}% vs {100 * b:.1f}% of latency"
        else:
            raise ValueError(
                f"calibration: ordering kind must be decreasing|close|dma_active_drop, got {o['kind']}"
            )
        results.append(
            {
                "id": o["id"],
                "kind": o["kind"],
                "rows": ids,
                "holds": bool(holds),
                "modeled": detail,
                "published": o["published"],
            }
        )
    return results


def _model_published(row: dict, shape: dict) -> tuple[dict, float]:
    t0 = time.time()
    return model_row(row, trace_row(row, shape)), time.time() - t0


def build_table(row_ids=None, progress: Callable[[str], None] | None = None, jobs: int = 1) -> dict:
    """Model every published row (or those in ``row_ids``) and compare; ``jobs`` processes."""
    pub = load_published()
    bound = float(pub["bound_pct"])
    selected = [r for r in pub["rows"] if not row_ids or r["id"] in row_ids]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_model_published, selected, [pub["shape"]] * len(selected)))
    else:
        results = [_model_published(r, pub["shape"]) for r in selected]
    rows, modeled = [], {}
    for row, (m, seconds) in zip(selected, results):
        modeled[row["id"]] = m
        published_ms = row["published"]["latency_ms"]
        err = 100.0 * (m["latency_ms"] / published_ms - 1.0)
        rows.append(
            {
                "id": row["id"],
                "target": row["target"],
                "dtype": row["dtype"],
                "kernel": row["kernel"],
                "kwargs": row.get("kwargs") or {},
                "published_hardware": row["published"],
                "modeled": m,
                "error_pct": err,
                "within_bound": abs(err) <= bound,
                "source": row["source"],
                "assumption": row.get("assumption", ""),
            }
        )
        if progress:
            progress(
                f"{row['id']}: modeled {m['latency_ms']:.2f} ms vs published hardware "
                f"{published_ms:.2f} ms ({err:+.1f}%) [{seconds:.0f} s]"
            )
    return {
        "label": "modeled vs published hardware",
        "model_version": MODEL_VERSION,
        "model_fingerprint": model_fingerprint(),
        "params_fingerprints": {t: params_for(t).fingerprint() for t in sorted(PARAMS)},
        "bound_pct": bound,
        "bound_reason": pub["bound_reason"],
        "shape": pub["shape"],
        "rows": rows,
        "orderings": check_orderings(modeled, pub["orderings"]),
        "dma_curve": dma_curve(pub["dma_curve"]),
        "ordering_note": pub["ordering_note"],
        "generated_by": "neuron-kernels calibrate --write",
    }


def dma_curve(published: dict, target: str = "trn2") -> dict:
    """Modeled throughput of one [128, b] HBM->SBUF transfer vs b, relative to b = 32 KiB."""
    from neuron_kernels.interpreter import nki

    nl, nisa = nki.language, nki.isa

    def load(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)

    rates = {}
    for b in published["relative_pct"]:
        r = run(load, (np.empty((128, int(b) // 4), np.float32),), target=target, compute=False)
        tl = model_trace(r.trace, target)
        rates[b] = 128 * int(b) / (tl.end[0] - tl.start[0])
    top = rates[max(rates, key=int)]
    return {
        "source": published["source"],
        "note": published["note"],
        "rows": [
            {
                "bytes_per_partition": int(b),
                "published_plot_pct": published["relative_pct"][b],
                "modeled_pct": 100.0 * rates[b] / top,
            }
            for b in sorted(rates, key=int)
        ],
    }


def render_markdown(table: dict, stored: bool = True) -> str:
    """The table as Markdown: ``stored`` for the committed ``table.md``, else a printout that
    says it is not that file."""
    s = table["shape"]
    provenance = (
        f"Generated by `{table['generated_by']}` (cost model v{table['model_version']}, "
        f"fingerprint `{table['model_fingerprint']}`). Do not edit by hand."
        if stored
        else f"Printed by `neuron-kernels calibrate` (cost model v{table['model_version']}, "
        f"fingerprint `{table['model_fingerprint']}`); not stored: `--write` stores all rows "
        "in perf_results/calibration/table.md."
    )
    lines = [
        "# Cost-model calibration: modeled vs published hardware",
        "",
        provenance,
        "",
        f"Matmul `[{s['M']},{s['K']}] @ [{s['K']},{s['N']}]` (lhsT `[{s['K']},{s['M']}]`), the AWS tutorial "
        "variants in `tutorial_matmul.py`. *Published hardware* numbers are AWS measurements; "
        "*modeled* numbers come from the interpreter trace and the cost model.",
        f"Bound: every row within ±{table['bound_pct']:.0f}% ({table['bound_reason']})",
        "",
        "| Row | Target, dtype | Published hardware (ms) | Modeled (ms) | Error | Within ±"
        f"{table['bound_pct']:.0f}% | Modeled critical engine |",
        "|---|---|---:|---:|---:|:-:|---|",
    ]
    for r in table["rows"]:
        lines.append(
            f"| {r['id']} | {r['target']}, {r['dtype']} | {r['published_hardware']['latency_ms']:.2f} | "
            f"{r['modeled']['latency_ms']:.2f} | {r['error_pct']:+.1f}% | {'yes' if r['within_bound'] else 'NO'} | "
            f"{r['modeled']['critical_engine']} |"
        )
    lines += [
        "",
        "## Orderings",
        "",
        "| Check | Published hardware | Modeled | Holds |",
        "|---|---|---|:-:|",
    ]
    for o in table["orderings"]:
        lines.append(
            f"| {o['id']} | {o['published']} | {o['modeled']} | {'yes' if o['holds'] else 'NO'} |"
        )
    lines += [
        "",
        table["ordering_note"],
        "",
        "## Secondary metrics (informational, not bounded)",
        "",
        "| Row | Metric | Published hardware | Modeled |",
        "|---|---|---:|---:|",
    ]
    for r in table["rows"]:
        for key, value in sorted(r["published_hardware"].items()):
            if key == "latency_ms" or key not in r["modeled"]:
                continue
            lines.append(f"| {r['id']} | {key} | {value:.2f} | {r['modeled'][key]:.2f} |")
    curve = table.get("dma_curve")
    if curve:
        lines += [
            "",
            "## DMA size curve, A11 (informational, not bounded)",
            "",
            curve["note"],
            "",
            "| Bytes per partition | Published plot (% of 32 KiB) | Modeled (% of 32 KiB) |",
            "|---:|---:|---:|",
        ]
        for c in curve["rows"]:
            lines.append(
                f"| {c['bytes_per_partition']} | {c['published_plot_pct']:g} | {c['modeled_pct']:.1f} |"
            )
        lines += ["", f"Source: {curve['source']}"]
    lines += ["", "## Sources and assumptions", ""]
    for r in table["rows"]:
        extra = f" Assumption: {r['assumption']}." if r["assumption"] else ""
        lines.append(f"- **{r['id']}**: {r['source']}.{extra}")
    lines += _recalibration_note()
    return "\n".join(lines) + "\n"


def _recalibration_note() -> list[str]:
    from neuron_kernels.cost_model.params import LEAST_CERTAIN

    lines = [
        "",
        "## Least certain parameters (recalibrate these first)",
        "",
        "| Parameter | trn1 | trn2 | trn3 | Unit | Source (least certain target) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name in LEAST_CERTAIN:
        vals = [PARAMS[t][name].value for t in ("trn1", "trn2", "trn3")]
        rank = {"low": 0, "medium": 1, "high": 2}
        worst = min(("trn1", "trn2", "trn3"), key=lambda t: rank.get(PARAMS[t][name].confidence, 0))
        p = PARAMS[worst][name]
        lines.append(
            f"| `{name}` | {vals[0]} | {vals[1]} | {vals[2]} | {p.unit} | {worst}: {p.source} |"
        )
    lines += [
        "",
        "The A1 rows cannot check `dma_core_gbps` on trn1: that value is derived from them. No Trn2 "
        "BF16 matmul and no Trn3 measurement was available; trn3 values are documented figures only.",
        "",
        "To recalibrate on a Trn2 node: profile kernels with the Neuron profiler (for example the "
        "calibration kernels here and your own ops at your shapes), write their latencies to a file "
        '`{"target": "trn2", "rows": [{"id": "A3-v3-hoisted", "measured_ms": ...}, '
        '{"op": "matmul", "shape": "4096x4096x4096", "dtype": "bfloat16", '
        '"measured_ms": ...}]}`, then run '
        "`neuron-kernels calibrate --fit mine.json --params dma_transfer_ns,dma_core_gbps,sync_ns "
        "--out trn2-fitted.json` and profile with `neuron-kernels profile ... --params-file "
        "trn2-fitted.json`. Choose rows that stress the parameter being fitted (small DMAs for "
        "`dma_transfer_ns`, dependent chains for `engine_latency_cycles` and `sync_ns`).",
    ]
    return lines


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
        return trace_row(base), _row_target(base)
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


def _modeled_ms(traced, tgt, params) -> float:
    runs = traced if isinstance(traced, list) else [traced]
    return sum(model_trace(r.trace, tgt, params=params).latency_ns for r in runs) / 1e6


def fit(
    measurements: dict,
    names: list[str],
    iterations: int = 40,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fit ``names`` (numeric parameters) to measured milliseconds; returns the fit report.

    The search is Nelder-Mead on log(value), each value kept within 1/8x..8x of its default,
    minimising mean(log(modeled / measured)^2). Traces are computed once per row.
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
    x0 = np.array([math.log(float(base.table[n].value) or 1e-3) for n in names])
    lo, hi = x0 - math.log(8.0), x0 + math.log(8.0)

    def params_at(x):
        return base.replace(**{n: math.exp(v) for n, v in zip(names, np.clip(x, lo, hi))})

    def loss(x):
        p = params_at(x)
        errs = [
            math.log(_modeled_ms(tr, tgt, p) / float(row["measured_ms"])) for row, tr, tgt in traced
        ]
        return float(np.mean(np.square(errs)))

    before = {
        row.get("id", str(i)): _modeled_ms(tr, tgt, base) for i, (row, tr, tgt) in enumerate(traced)
    }
    x_best, f_best = _nelder_mead(loss, x0, iterations, progress)
    fitted = params_at(x_best)
    after = {
        row.get("id", str(i)): _modeled_ms(tr, tgt, fitted)
        for i, (row, tr, tgt) in enumerate(traced)
    }
    return {
        "target": target,
        "label": "parameters fitted to hardware measurements (modeled results below)",
        "overrides": {n: float(fitted.table[n].value) for n in names},
        "defaults": {n: float(base.table[n].value) for n in names},
        "rms_log_error": {"before": math.sqrt(loss(x0)), "after": math.sqrt(f_best)},
        "rows": [
            {
                "id": k,
                "measured_ms_hardware": float(row["measured_ms"]),
                "modeled_ms_before": before[k],
                "modeled_ms_after": after[k],
            }
            for (row, _, _), k in zip(traced, before)
        ],
    }


def _nelder_mead(f, x0: np.ndarray, iterations: int, progress=None):
    n = len(x0)
    simplex = [x0] + [x0 + np.eye(n)[i] * 0.3 for i in range(n)]
    values = [f(x) for x in simplex]
    for it in range(iterations):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if progress:
            progress(f"iteration {it}: rms log error {math.sqrt(values[0]):.4f}")
        if values[-1] - values[0] < 1e-7:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    i = int(np.argmin(values))
    return simplex[i], values[i]


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
    from neuron_kernels.kernels.spec import get_spec
    from neuron_kernels.perf_results.calibration import tutorial_matmul
    from neuron_kernels.testing import assert_within_tolerance

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
