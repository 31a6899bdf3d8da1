"""The stored calibration table (perf_results/calibration/table.json) stays within its bound.

The bound (±15% per row) and the orderings are fixed in published.json before any run. The
full table takes minutes to regenerate (``neuron-kernels calibrate --write``), so these tests
read it, fail when it is stale (the model or its parameters changed since it was written),
and re-derive one row to show the stored numbers are what the current model produces.
"""

from __future__ import annotations

import json

import pytest

from neuron_kernels.cli import calibration_files
from neuron_kernels.cost_model.calibration import check_orderings, model_row, modeled_ms
from neuron_kernels.cost_model.params import params_for
from neuron_kernels.perf_results.calibration import TABLE_JSON


@pytest.fixture(scope="module")
def table() -> dict:
    return json.loads(TABLE_JSON.read_text())


def rows_outside_bound(table: dict) -> list[str]:
    bound = table["bound_pct"]
    out = []
    for r in table["rows"]:
        err = 100.0 * (r["modeled"]["latency_ms"] / r["published_hardware"]["latency_ms"] - 1.0)
        if abs(err) > bound:
            out.append(
                f"{r['id']}: modeled {r['modeled']['latency_ms']:.2f} ms vs published hardware "
                f"{r['published_hardware']['latency_ms']:.2f} ms ({err:+.1f}%)"
            )
    return out


def test_table_covers_every_published_row_with_the_fixed_bound(table):
    published = calibration_files.load_published()
    assert table["bound_pct"] == published["bound_pct"] == 15
    assert [r["id"] for r in table["rows"]] == [r["id"] for r in published["rows"]]
    for stored, pub in zip(table["rows"], published["rows"]):
        assert stored["published_hardware"] == pub["published"], stored["id"]


def test_every_row_is_within_the_bound(table):
    assert rows_outside_bound(table) == []


def test_the_bound_check_fails_on_a_row_outside_it(table):
    bad = json.loads(json.dumps(table))
    bad["rows"][0]["modeled"]["latency_ms"] = (
        bad["rows"][0]["published_hardware"]["latency_ms"] * 1.16
    )
    assert len(rows_outside_bound(bad)) == 1


def test_published_orderings_hold(table):
    published = calibration_files.load_published()
    assert {o["id"] for o in table["orderings"]} == {o["id"] for o in published["orderings"]}
    modeled = {r["id"]: r["modeled"] for r in table["rows"]}
    rechecked = check_orderings(modeled, published["orderings"])
    assert all(o["holds"] for o in rechecked), [o for o in rechecked if not o["holds"]]
    assert [o["holds"] for o in rechecked] == [o["holds"] for o in table["orderings"]]


def test_table_is_not_stale(table):
    assert table["model_fingerprint"] == calibration_files.model_fingerprint(), (
        "the cost model or its parameters changed since the table was written: "
        "run `neuron-kernels calibrate --write` and review perf_results/calibration/table.md"
    )


def test_one_row_rederived_matches_the_table(table):
    """Re-run the cheapest full-size row (trace only) and compare with the stored numbers."""
    row = next(
        r for r in calibration_files.load_published()["rows"] if r["id"] == "A5-v5-block-all"
    )
    fresh = model_row(row, calibration_files.trace_row(row))
    stored = next(r for r in table["rows"] if r["id"] == row["id"])["modeled"]
    assert fresh["latency_ms"] == pytest.approx(stored["latency_ms"], rel=1e-9)
    assert fresh["instructions"] == stored["instructions"]


def test_fit_recovers_a_known_parameter(tmp_path):
    """Measurements made by the model itself with dma_transfer_ns = 400 (default 211): the fit
    must find ~400 again. 5% covers the Nelder-Mead stopping tolerance, not model error."""
    kernel = "neuron_kernels.kernels.calibration.tutorial_matmul:matmul_tiled"
    rows = [
        {"id": f"tiled-{k}", "kernel": kernel, "shapes": [[k, 128], [k, 512]], "dtype": "float32"}
        for k in (256, 1024)
    ]
    truth = params_for("trn2").replace(dma_transfer_ns=400.0)
    for row in rows:
        traced, tgt = calibration_files._trace_measurement(row, "trn2")
        row["measured_ms"] = modeled_ms(traced, tgt, truth)
    report = calibration_files.fit(
        {"target": "trn2", "rows": rows}, ["dma_transfer_ns"], iterations=60
    )
    assert report["overrides"]["dma_transfer_ns"] == pytest.approx(400.0, rel=0.05)
    assert report["rms_log_error"]["after"] < 0.1 * report["rms_log_error"]["before"]
