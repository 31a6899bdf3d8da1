"""``neuron-kernels doctor``: every field in ``--json``; on a machine without the Neuron SDK
it says so plainly and every op falls back, with no traceback; the rollback switch and the
perf_results entries are reported as they are."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata

import pytest
import torch

from neuron_kernels._version import COST_MODEL_VERSION
from neuron_kernels.autotune import results
from neuron_kernels.cli import main as cli_main
from neuron_kernels.kernels import REGISTRY
from neuron_kernels.torch_ops import routing


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


NO_SDK = not any(_installed(d) for d in ("nki", "neuronx-cc", "torch-neuronx"))
needs_no_sdk = pytest.mark.skipif(not NO_SDK, reason="the Neuron SDK is installed here")


def doctor_json(capsys, *argv) -> dict:
    assert cli_main(["doctor", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_every_field(capsys, monkeypatch):
    monkeypatch.delenv(routing.DISABLE_ENV, raising=False)
    doc = doctor_json(capsys)
    assert doc["format"] == "neuron-kernels/doctor" and doc["torch"] == torch.__version__
    assert set(doc["packages"]) == {"nki", "neuronx-cc", "torch-neuronx"}
    assert doc["backend"]["name"] in ("nki", "interpreter")
    assert set(doc["device"]) >= {"torch_accelerator", "neuron_visible", "torch_neuronx_importable"}
    assert doc["target"]["name"] == "trn2" or doc["target"]["value"]
    assert doc["rollback"] == {
        "variable": "NEURON_KERNELS_DISABLE",
        "value": None,
        "on": False,
        "effect": doc["rollback"]["effect"],
        "how": doc["rollback"]["how"],
    }
    assert "NEURON_KERNELS_DISABLE=1" in doc["rollback"]["how"]
    assert {r["op"] for r in doc["ops"]} == {f"torch.ops.neuron.{n}" for n in REGISTRY}
    for row in doc["ops"]:
        assert row["neuron_device"] in ("kernel", "fallback") and row["why"]
        assert row["cpu_tensors"] and row["perf_results"]["status"]
    assert doc["problems"] == [] and doc["summary"]


@needs_no_sdk
def test_without_the_sdk_every_op_falls_back_and_says_why(capsys):
    doc = doctor_json(capsys)
    assert doc["neuron_sdk"] == {
        "installed": False,
        "missing": ["nki", "neuronx-cc", "torch-neuronx"],
    }
    assert doc["backend"]["name"] == "interpreter" and doc["device"]["neuron_visible"] is False
    assert doc["all_ops_fall_back"] is True
    for row in doc["ops"]:
        assert row["neuron_device"] == "fallback"
        assert "nki package is not installed" in row["why"] and "no neuron device" in row["why"]
    assert doc["summary"].startswith("The Neuron SDK is not installed here")


@needs_no_sdk
def test_plain_output_has_no_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "neuron_kernels.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "" and "Traceback" not in done.stdout
    assert "The Neuron SDK is not installed here" in done.stdout
    assert done.stdout.count("-> fallback") == len(REGISTRY)
    assert "Rollback switch NEURON_KERNELS_DISABLE: off" in done.stdout


def test_rollback_switch_is_reported(capsys, monkeypatch):
    monkeypatch.setenv(routing.DISABLE_ENV, "1")
    doc = doctor_json(capsys)
    assert doc["rollback"]["on"] is True and doc["rollback"]["value"] == "1"
    for row in doc["ops"]:
        assert row["neuron_device"] == "fallback" and "rollback switch" in row["why"]
        assert row["cpu_tensors"] == "reference math (rollback switch on)"


def test_a_bad_setting_is_a_problem_not_a_traceback(capsys, monkeypatch):
    monkeypatch.setenv(routing.DISABLE_ENV, "maybe")
    monkeypatch.setenv(routing.CPU_MODE_ENV, "gpu")
    doc = doctor_json(capsys)
    assert any(p.startswith("NEURON_KERNELS_DISABLE") and "maybe" in p for p in doc["problems"])
    assert any(p.startswith("NEURON_KERNELS_CPU") and "gpu" in p for p in doc["problems"])


def test_cpu_mode_is_reported(capsys, monkeypatch):
    monkeypatch.setenv(routing.CPU_MODE_ENV, "interpret")
    doc = doctor_json(capsys)
    assert doc["cpu_mode"] == "interpret"
    assert {r["cpu_tensors"] for r in doc["ops"]} == {"NKI kernel on the interpreter"}


def _entry(spec, kernel_hash: str) -> dict:
    probe = spec.test_problems["probe"]
    return {
        "shape_bucket": spec.shape_bucket(probe),
        "dtype": "bfloat16",
        "kernel_hash": kernel_hash,
        "model_version": COST_MODEL_VERSION,
        "source": "modeled",
        "config": spec.config.default().to_dict(),
        "metric": {"latency_us": 1.0},
        "trials": 1,
        "created": datetime.now(timezone.utc).isoformat(),
    }


def test_perf_results_entries_tuned_and_stale(capsys, monkeypatch, tmp_path):
    spec = REGISTRY["matmul"]
    monkeypatch.setenv(results.PERF_RESULTS_ENV, str(tmp_path))
    results.write_entry(spec, _entry(spec, results.kernel_hash(spec)), "trn2", tmp_path)
    row = next(r for r in doctor_json(capsys)["ops"] if r["op"] == "torch.ops.neuron.matmul")
    info = row["perf_results"]
    assert info["exists"] and info["status"].startswith("tuned: 1 entries (1 modeled, 0 hardware)")
    assert info["entries"] == [
        {"shape_bucket": spec.shape_bucket(spec.test_problems["probe"]), "dtype": "bfloat16",
         "source": "modeled", "fresh": True}
    ]  # fmt: skip

    results.write_entry(spec, _entry(spec, "sha256:another-kernel"), "trn2", tmp_path)
    row = next(r for r in doctor_json(capsys)["ops"] if r["op"] == "torch.ops.neuron.matmul")
    assert row["perf_results"]["entries"][0]["fresh"] is False
    assert row["perf_results"]["status"].startswith(
        "default config (1 entries, all tuned on another"
    )

    others = doctor_json(capsys, "--target", "trn3")["ops"]
    assert all(r["perf_results"]["status"].startswith("default config (no tuned") for r in others)


def test_bad_target_is_one_line(capsys):
    assert cli_main(["doctor", "--target", "trn9"]) == 2
    err = capsys.readouterr().err
    assert "--target trn9" in err and len(err.strip().splitlines()) == 1
