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


def test_without_config_it_profiles_the_config_the_op_runs(tmp_path, monkeypatch, capsys):
    """``profile`` used to profile the default config where the op runs its tuned one; it
    now says which config it profiles and where it came from; ``--config default`` asks for
    the default."""
    from neuron_kernels import tuned_configs
    from neuron_kernels.cli import main
    from neuron_kernels.kernels.spec import get_spec

    spec = get_spec("matmul")
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(tmp_path))
    problem = {"m": 512, "n": 512, "k": 512}
    tuned = {**spec.config.default().to_dict(), "block_m": 2}
    entry = {
        "shape_bucket": spec.shape_bucket(problem),
        "dtype": "bfloat16",
        "lnc": 2,  # the launch LNC profile runs at here (--lnc 2 below)
        "kernel_hash": tuned_configs.kernel_hash(spec),
        "model_version": tuned_configs.COST_MODEL_VERSION,
        "source": "modeled",
        "config": tuned,
        "metric": {"latency_us": 1.0},
    }
    tuned_configs.write_entry(spec, entry, "trn2", tmp_path)
    assert main(["profile", "matmul", "--shape", "512x512x512", "--lnc", "2"]) == 0
    out = capsys.readouterr().out
    assert f"config {json.dumps(tuned)}" in out and "config from: the user modeled entry" in out
    assert (
        main(["profile", "matmul", "--shape", "512x512x512", "--lnc", "2", "--config", "default"])
        == 0
    )
    out = capsys.readouterr().out
    assert f"config {json.dumps(spec.config.default().to_dict())}" in out
    assert "config from: the op's default config" in out
