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

from neuron_kernels import tuned_configs
from neuron_kernels._version import COST_MODEL_VERSION
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


def doctor_json(capsys, *argv, code: int = 0) -> dict:
    """The report; exit code 0 all good, 1 problems found."""
    assert cli_main(["doctor", "--json", *argv]) == code
    doc = json.loads(capsys.readouterr().out)
    assert bool(doc["problems"]) == (code == 1), doc["problems"]
    return doc


@pytest.fixture(autouse=True)
def no_user_results(tmp_path, monkeypatch):
    """The user's results folder is an empty one (never this machine's cache)."""
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(tmp_path / "user-results"))


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
    doc = doctor_json(capsys, code=1)  # problems found: exit code 1, not 0
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
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(tmp_path))
    monkeypatch.setattr(tuned_configs, "shipped_dir", lambda: tmp_path / "shipped")
    tuned_configs.write_entry(spec, _entry(spec, tuned_configs.kernel_hash(spec)), "trn2", tmp_path)
    row = next(r for r in doctor_json(capsys)["ops"] if r["op"] == "torch.ops.neuron.matmul")
    info = row["perf_results"]
    assert info["files"] and info["status"].startswith("tuned: 1 entries (1 modeled, 0 hardware)")
    assert info["entries"] == [
        {"shape_bucket": spec.shape_bucket(spec.test_problems["probe"]), "dtype": "bfloat16",
         "source": "modeled", "layer": "user", "fresh": True, "usable": True}
    ]  # fmt: skip

    tuned_configs.write_entry(spec, _entry(spec, "sha256:another-kernel"), "trn2", tmp_path)
    row = next(r for r in doctor_json(capsys)["ops"] if r["op"] == "torch.ops.neuron.matmul")
    assert row["perf_results"]["entries"][0]["fresh"] is False
    assert row["perf_results"]["status"].startswith("default config (1 entries, none usable")

    others = doctor_json(capsys, "--target", "trn3")["ops"]
    assert all(r["perf_results"]["status"].startswith("default config (no tuned") for r in others)


def test_bad_target_is_one_line(capsys):
    assert cli_main(["doctor", "--target", "trn9"]) == 2
    err = capsys.readouterr().err
    assert "--target trn9" in err and len(err.strip().splitlines()) == 1


def test_an_unusable_entry_is_a_problem_not_fresh_and_usable(capsys, monkeypatch, tmp_path):
    """An entry whose config the op refuses (``block_m: 3``) used to be reported as tuned."""
    spec = REGISTRY["matmul"]
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(tmp_path))
    monkeypatch.setattr(tuned_configs, "shipped_dir", lambda: tmp_path / "shipped")
    bad = _entry(spec, tuned_configs.kernel_hash(spec))
    bad["config"] = {**bad["config"], "block_m": 3}
    (tmp_path / "trn2").mkdir()
    (tmp_path / "trn2" / "matmul.json").write_text(
        json.dumps({"format": tuned_configs.FORMAT, "version": 1, "op": "matmul", "target": "trn2",
                    "entries": [bad]})
    )  # fmt: skip
    doc = doctor_json(capsys, code=1)
    row = next(r for r in doc["ops"] if r["op"] == "torch.ops.neuron.matmul")
    assert row["perf_results"]["entries"][0]["usable"] is False
    assert row["perf_results"]["status"].startswith("default config")
    assert any("block_m" in p and "not usable" in p for p in doc["problems"])


@pytest.mark.parametrize("value", ["bogus", "nki"])
def test_doctor_runs_and_reports_a_backend_that_cannot_load(value):
    """``NEURON_KERNELS_NKI`` is read while importing the package, before the CLI runs: the
    doctor still reports (exit 1, problems found), and other commands refuse in one line."""
    if value == "nki" and not NO_SDK:
        pytest.skip("the nki package is installed here")
    env = {**__import__("os").environ, "NEURON_KERNELS_NKI": value}

    def run(*argv):
        return subprocess.run(
            [sys.executable, "-m", "neuron_kernels.cli", *argv],
            capture_output=True, text=True, timeout=120, check=False, env=env,
        )  # fmt: skip

    done = run("doctor")
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr
    assert "NEURON_KERNELS_NKI" in done.stdout and "Problems found" in done.stdout
    doc = json.loads(run("doctor", "--json").stdout)
    assert doc["backend"]["name"] is None and value in doc["backend"]["error"] + value
    demo = run("demo")
    assert demo.returncode == 2 and demo.stderr.count("\n") == 1, demo.stderr
    assert demo.stderr.startswith(f"neuron-kernels demo: error: NEURON_KERNELS_NKI {value}")
    assert run("doctor", "--target", "trn9").returncode == 2  # a bad command line
