"""The results store: format, lookup by complete key, and fallbacks with one warning."""

from __future__ import annotations

import json
import warnings

import pytest

from neuron_kernels.autotune import results
from neuron_kernels.kernels import matmul

SPEC = matmul.SPEC
PROBLEM = {"m": 1000, "n": 1000, "k": 1000}
TUNED = {
    "block_m": 2,
    "block_n": 2,
    "block_k": 2,
    "stationary": "a",
    "accumulate": "psum",
    "transpose": "dma",
}


@pytest.fixture(autouse=True)
def fresh_warnings():
    results._said.clear()
    yield
    results._said.clear()


def _entry(**overrides):
    entry = {
        "shape_bucket": SPEC.shape_bucket(PROBLEM),
        "dtype": "bfloat16",
        "kernel_hash": results.kernel_hash(SPEC),
        "model_version": "test",
        "source": "modeled",
        "config": dict(TUNED),
        "metric": {"latency_us": 1.0},
    }
    entry.update(overrides)
    return entry


def _lookup(root, dtype="bfloat16"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = results.lookup(SPEC, PROBLEM, dtype, "trn2", root)
    return choice, [w for w in caught if issubclass(w.category, results.PerfResultsWarning)]


def test_written_entry_is_found_by_its_complete_key(tmp_path):
    path = results.write_entry(SPEC, _entry(), "trn2", tmp_path)
    doc = json.loads(path.read_text())
    assert path == tmp_path / "trn2" / "matmul.json"
    assert doc["format"] == results.FORMAT and doc["version"] == results.VERSION
    choice, said = _lookup(tmp_path)
    assert choice.source == "modeled" and choice.config.to_dict() == TUNED and not said
    other_dtype, said = _lookup(tmp_path, "float16")
    assert other_dtype.source == "default" and not said  # a plain miss is silent


def test_hardware_beats_modeled(tmp_path):
    results.write_entry(SPEC, _entry(), "trn2", tmp_path)
    results.write_entry(
        SPEC, _entry(source="hardware", config={**TUNED, "block_m": 4}), "trn2", tmp_path
    )
    choice, _ = _lookup(tmp_path)
    assert choice.source == "hardware" and choice.config.block_m == 4


def test_stale_kernel_hash_falls_back_with_one_warning(tmp_path):
    results.write_entry(SPEC, _entry(kernel_hash="sha256:0000"), "trn2", tmp_path)
    choice, said = _lookup(tmp_path)
    assert choice.source == "default" and choice.config == SPEC.config.default()
    assert len(said) == 1 and "another version" in str(said[0].message)
    _, said_again = _lookup(tmp_path)
    assert said_again == []


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"format": "x"}),
        json.dumps({"format": results.FORMAT, "version": 99}),
        json.dumps(
            {
                "format": results.FORMAT,
                "version": 1,
                "op": "matmul",
                "target": "trn2",
                "entries": [
                    {
                        "shape_bucket": "b",
                        "dtype": "d",
                        "kernel_hash": "h",
                        "config": {},
                        "source": "guess",
                    }
                ],
            }
        ),
    ],
    ids=["not-json", "wrong-format", "wrong-version", "bad-source"],
)
def test_corrupt_file_falls_back_with_one_warning(tmp_path, content):
    (tmp_path / "trn2").mkdir()
    (tmp_path / "trn2" / "matmul.json").write_text(content)
    choice, said = _lookup(tmp_path)
    assert choice.source == "default" and len(said) == 1 and "unreadable" in str(said[0].message)


def test_config_off_the_grid_falls_back(tmp_path):
    results.write_entry(SPEC, _entry(config={**TUNED, "block_m": 3}), "trn2", tmp_path)
    choice, said = _lookup(tmp_path)
    assert choice.source == "default" and len(said) == 1 and "not usable" in str(said[0].message)


def test_write_refuses_an_unlabelled_source(tmp_path):
    with pytest.raises(ValueError):
        results.write_entry(SPEC, _entry(source="measured"), "trn2", tmp_path)


def test_env_var_points_the_store_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv(results.PERF_RESULTS_ENV, str(tmp_path))
    assert results.perf_results_dir() == tmp_path
    monkeypatch.delenv(results.PERF_RESULTS_ENV)
    assert (results.perf_results_dir() / "__init__.py").exists()
