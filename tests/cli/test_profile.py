"""``neuron-kernels profile``: its report, its exports and its overrides, driven as a user
runs it (through ``neuron_kernels.cli.main``). Bad input: tests/cli/test_bad_input.py."""

from __future__ import annotations

import json
import re

from neuron_kernels.cli import main


def test_prints_a_modeled_report_and_writes_its_exports(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(
        [
            "profile",
            "matmul",
            "--shape",
            "256x512x256",
            "--dtype",
            "bf16",
            "--target",
            "trn2",
            "--json",
            str(out),
            "--png",
            str(tmp_path / "t.png"),
            "--chrome",
            str(tmp_path / "t.json"),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "modeled latency" in text
    doc = json.loads(out.read_text())
    assert doc["label"] == "modeled" and doc["dtype"] == "bfloat16" and doc["latency_ns"] > 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def _latency_ns(text):
    m = re.search(r"modeled latency\s+([\d.]+) (ms|us|ns)", text)
    return float(m.group(1)) * {"ms": 1e6, "us": 1e3, "ns": 1.0}[m.group(2)]


def test_param_override_and_params_file_change_the_model(tmp_path, capsys):
    args = ["profile", "matmul", "--shape", "256x512x256", "--dtype", "fp32", "--target", "trn2"]
    assert main(args) == 0
    base = _latency_ns(capsys.readouterr().out)
    assert main(args + ["--param", "dma_engine_gbps=2.72"]) == 0
    slow = _latency_ns(capsys.readouterr().out)
    assert slow > base
    fitted = tmp_path / "fit.json"
    fitted.write_text(json.dumps({"overrides": {"dma_engine_gbps": 2.72}}))
    assert main(args + ["--params-file", str(fitted)]) == 0
    assert _latency_ns(capsys.readouterr().out) == slow


def test_config_from_a_file(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"block_m": 2}))
    assert main(["profile", "matmul", "--shape", "256x512x256", "--config", str(path)]) == 0
    assert '"block_m": 2' in capsys.readouterr().out


def test_honours_the_target_variable(monkeypatch, capsys):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    assert main(["profile", "matmul", "--shape", "256x256x256"]) == 0
    assert "target trn3" in capsys.readouterr().out
