"""Calibration of the cost model: its numbers beside published or measured hardware ones.

* :func:`model_row` models one published row's traced calibration kernel;
  :func:`calibration_table` sets every row beside its published latency (the ±bound, the
  published orderings via :func:`check_orderings`, the DMA size curve via :func:`dma_curve`);
  :func:`render_markdown` writes the table as ``table.md``.
* :func:`fit_parameters` searches the named parameters (Nelder-Mead in log space) to minimise
  the mean squared log error against measured milliseconds; its output is an overrides file
  for ``profile``.

Tracing the calibration kernels and reading the files (``perf_results/calibration``, a
user's measurements) is :mod:`neuron_kernels.cli.calibration_files`'s: this module sees traces and
documents only (it imports the interpreter and the hardware table, nothing above them).
Modeled numbers are labelled "modeled"; published/measured ones "published hardware".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from neuron_kernels.cost_model.params import PARAMS, CostParams, params_for
from neuron_kernels.cost_model.schedule import MODEL_VERSION, model_trace
from neuron_kernels.hardware import Target, target_from_name
from neuron_kernels.interpreter import run

__all__ = [
    "row_target",
    "model_row",
    "check_orderings",
    "error_pct",
    "calibration_table",
    "dma_curve",
    "render_markdown",
    "modeled_ms",
    "fit_parameters",
]


def row_target(row: dict):
    tgt = target_from_name(row["target"])
    over = dict(row.get("target_overrides") or {})
    for key, value in list(over.items()):
        if isinstance(value, str):  # "sbuf_partition_bytes": another field of the target
            over[key] = getattr(tgt, value)
    return dataclasses.replace(tgt, **over) if over else tgt


def model_row(row: dict, result, params: CostParams | None = None) -> dict:
    """The modeled numbers of one row (all modeled), comparable with its published ones."""
    tgt = row_target(row)
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


def error_pct(modeled: float, published: float) -> float:
    """A modeled latency's error against the published one, in percent."""
    return 100.0 * (modeled / published - 1.0)


def calibration_table(
    published: dict, selected: list[dict], modeled: list[dict], model_fingerprint: str
) -> dict:
    """The calibration table: each ``selected`` published row (of ``published``, the document
    of ``published.json``) beside its ``modeled`` numbers (:func:`model_row`), its error
    against the ±``bound_pct`` bound, the published orderings checked on the modeled rows,
    and the modeled DMA size curve. ``model_fingerprint`` says which model produced it."""
    bound = float(published["bound_pct"])
    rows, by_id = [], {}
    for row, m in zip(selected, modeled):
        by_id[row["id"]] = m
        err = error_pct(m["latency_ms"], row["published"]["latency_ms"])
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
    return {
        "label": "modeled vs published hardware",
        "model_version": MODEL_VERSION,
        "model_fingerprint": model_fingerprint,
        "params_fingerprints": {t: params_for(t).fingerprint() for t in sorted(PARAMS)},
        "bound_pct": bound,
        "bound_reason": published["bound_reason"],
        "shape": published["shape"],
        "rows": rows,
        "orderings": check_orderings(by_id, published["orderings"]),
        "dma_curve": dma_curve(published["dma_curve"]),
        "ordering_note": published["ordering_note"],
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


# -- fitting to measurements ---------------------------------------------------------------------


def modeled_ms(traced, tgt, params) -> float:
    runs = traced if isinstance(traced, list) else [traced]
    return sum(model_trace(r.trace, tgt, params=params).latency_ns for r in runs) / 1e6


def fit_parameters(
    traced: list[tuple[dict, Any, Target]],
    names: list[str],
    base: CostParams,
    target: str,
    iterations: int = 40,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fit ``names`` (numeric parameters of ``base``) to measured milliseconds; returns the
    fit report. ``traced``: (measurement row with ``measured_ms``, its traced run or runs,
    the target it was traced on) per row, each traced once.

    The search is Nelder-Mead on log(value), each value kept within 1/8x..8x of its default,
    minimising mean(log(modeled / measured)^2).
    """
    x0 = np.array([math.log(float(base.table[n].value) or 1e-3) for n in names])
    lo, hi = x0 - math.log(8.0), x0 + math.log(8.0)

    def params_at(x):
        return base.replace(**{n: math.exp(v) for n, v in zip(names, np.clip(x, lo, hi))})

    def loss(x):
        p = params_at(x)
        errs = [
            math.log(modeled_ms(tr, tgt, p) / float(row["measured_ms"])) for row, tr, tgt in traced
        ]
        return float(np.mean(np.square(errs)))

    before = {
        row.get("id", str(i)): modeled_ms(tr, tgt, base) for i, (row, tr, tgt) in enumerate(traced)
    }
    x_best, f_best = _nelder_mead(loss, x0, iterations, progress)
    fitted = params_at(x_best)
    after = {
        row.get("id", str(i)): modeled_ms(tr, tgt, fitted)
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
