"""The results store: format, lookup by complete key, and fallbacks with one warning."""

from __future__ import annotations

import json
import warnings

import pytest

from neuron_kernels import tuned_configs
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
    tuned_configs._said.clear()
    yield
    tuned_configs._said.clear()


def _entry(**overrides):
    entry = {
        "shape_bucket": SPEC.shape_bucket(PROBLEM),
        "dtype": "bfloat16",
        "kernel_hash": tuned_configs.kernel_hash(SPEC),
        "model_version": tuned_configs.COST_MODEL_VERSION,
        "source": "modeled",
        "config": dict(TUNED),
        "metric": {"latency_us": 1.0},
    }
    entry.update(overrides)
    return entry


def _lookup(root, dtype="bfloat16"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = tuned_configs.lookup(SPEC, PROBLEM, dtype, "trn2", root)
    return choice, [w for w in caught if issubclass(w.category, tuned_configs.PerfResultsWarning)]


def test_written_entry_is_found_by_its_complete_key(tmp_path):
    path = tuned_configs.write_entry(SPEC, _entry(), "trn2", tmp_path)
    doc = json.loads(path.read_text())
    assert path == tmp_path / "trn2" / "matmul.json"
    assert doc["format"] == tuned_configs.FORMAT and doc["version"] == tuned_configs.VERSION
    choice, said = _lookup(tmp_path)
    assert choice.source == "modeled" and choice.config.to_dict() == TUNED and not said
    other_dtype, said = _lookup(tmp_path, "float16")
    assert other_dtype.source == "default" and not said  # a plain miss is silent


def test_hardware_beats_modeled(tmp_path):
    tuned_configs.write_entry(SPEC, _entry(), "trn2", tmp_path)
    tuned_configs.write_entry(
        SPEC, _entry(source="hardware", config={**TUNED, "block_m": 4}), "trn2", tmp_path
    )
    choice, _ = _lookup(tmp_path)
    assert choice.source == "hardware" and choice.config.block_m == 4


def test_stale_kernel_hash_falls_back_with_one_warning(tmp_path):
    tuned_configs.write_entry(SPEC, _entry(kernel_hash="sha256:0000"), "trn2", tmp_path)
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
        json.dumps({"format": tuned_configs.FORMAT, "version": 99}),
        json.dumps(
            {
                "format": tuned_configs.FORMAT,
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
    tuned_configs.write_entry(SPEC, _entry(config={**TUNED, "block_m": 3}), "trn2", tmp_path)
    choice, said = _lookup(tmp_path)
    assert choice.source == "default" and len(said) == 1 and "not usable" in str(said[0].message)


def test_write_refuses_an_unlabelled_source(tmp_path):
    with pytest.raises(ValueError):
        tuned_configs.write_entry(SPEC, _entry(source="measured"), "trn2", tmp_path)


def test_env_var_names_the_user_folder_and_the_default_is_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(tmp_path))
    assert tuned_configs.perf_results_dir() == tuned_configs.user_dir() == tmp_path
    monkeypatch.delenv(tuned_configs.PERF_RESULTS_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert (
        tuned_configs.perf_results_dir() == tmp_path / "cache" / "neuron-kernels" / "perf_results"
    )
    assert (tuned_configs.shipped_dir() / "__init__.py").exists()


def _two_layers(tmp_path, monkeypatch):
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(user))
    monkeypatch.setattr(tuned_configs, "shipped_dir", lambda: shipped)
    return user, shipped


def _layered_lookup():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tuned_configs.PerfResultsWarning)
        return tuned_configs.lookup(SPEC, PROBLEM, "bfloat16", "trn2")


def test_user_results_add_to_the_shipped_ones(tmp_path, monkeypatch):
    """The user's folder is layered over the shipped one: a key only the shipped folder has
    is still found (the variable used to replace the shipped configs)."""
    user, shipped = _two_layers(tmp_path, monkeypatch)
    tuned_configs.write_entry(SPEC, _entry(), "trn2", shipped)
    tuned_configs.write_entry(SPEC, _entry(dtype="float16"), "trn2", user)
    choice = _layered_lookup()
    assert (choice.source, choice.layer) == ("modeled", "shipped")
    assert choice.path == shipped / "trn2" / "matmul.json"


def test_lookup_precedence_hardware_then_user_then_shipped(tmp_path, monkeypatch):
    user, shipped = _two_layers(tmp_path, monkeypatch)
    user_config = {**TUNED, "block_m": 4}
    tuned_configs.write_entry(SPEC, _entry(), "trn2", shipped)
    tuned_configs.write_entry(SPEC, _entry(config=user_config), "trn2", user)
    choice = _layered_lookup()
    assert (choice.layer, choice.config.to_dict()) == ("user", user_config)  # user beats shipped
    hardware = {**TUNED, "block_n": 4}
    tuned_configs.write_entry(
        SPEC, _entry(source="hardware", model_version=None, config=hardware), "trn2", shipped
    )
    choice = _layered_lookup()
    assert (choice.source, choice.layer) == ("hardware", "shipped")  # hardware beats modeled
    assert choice.config.to_dict() == hardware
    assert "shipped hardware entry" in choice.describe()


def test_an_unusable_user_entry_falls_through_to_the_shipped_one(tmp_path, monkeypatch):
    user, shipped = _two_layers(tmp_path, monkeypatch)
    tuned_configs.write_entry(SPEC, _entry(), "trn2", shipped)
    (user / "trn2").mkdir(parents=True)
    (user / "trn2" / "matmul.json").write_text(_file_with([_entry(config={**TUNED, "block_m": 3})]))
    choice = _layered_lookup()
    assert (choice.layer, choice.config.to_dict()) == ("shipped", TUNED)


def test_a_merge_keeps_the_faster_entry_and_says_so(tmp_path):
    """A 2-trial run must not replace a 31-trial entry with a slower one."""
    long_run = _entry(metric={"latency_us": 10.0}, trials=31)
    tuned_configs.write_entry(SPEC, long_run, "trn2", tmp_path)
    merge = tuned_configs.merge_entry(
        SPEC, _entry(metric={"latency_us": 12.0}, trials=2), "trn2", tmp_path
    )
    assert merge.kept == "existing" and "kept the stored entry" in merge.why
    assert "31 trials" in merge.why
    (stored,) = tuned_configs.load_entries(merge.path, "matmul", "trn2")
    assert stored["trials"] == 31
    merge = tuned_configs.merge_entry(
        SPEC, _entry(metric={"latency_us": 9.0}, trials=2), "trn2", tmp_path
    )
    assert merge.kept == "new" and "faster" in merge.why
    (stored,) = tuned_configs.load_entries(merge.path, "matmul", "trn2")
    assert stored["metric"]["latency_us"] == 9.0


def test_another_shape_of_the_same_bucket_is_not_compared(tmp_path):
    """Two shapes in one bucket have latencies of two problems: the faster number says
    nothing about the better config, so the stored entry stays and the message says why
    (it used to say the other shape's run was "not faster" than a smaller problem)."""
    tuned_configs.write_entry(SPEC, _entry(shape="1024x1024x1024", trials=4), "trn2", tmp_path)
    merge = tuned_configs.merge_entry(
        SPEC,
        _entry(shape="1000x1000x1000", metric={"latency_us": 0.5}),
        "trn2",
        tmp_path,
    )
    assert merge.kept == "existing" and "same bucket" in merge.why, merge.why
    assert "1024x1024x1024" in merge.why and "1000x1000x1000" in merge.why
    (stored,) = tuned_configs.load_entries(merge.path, "matmul", "trn2")
    assert stored["shape"] == "1024x1024x1024"
    merge = tuned_configs.merge_entry(
        SPEC, _entry(shape="1000x1000x1000"), "trn2", tmp_path, replace=True
    )
    assert merge.kept == "new"


def test_replace_stores_a_slower_entry_and_another_kernel_is_not_compared(tmp_path):
    tuned_configs.write_entry(SPEC, _entry(metric={"latency_us": 1.0}), "trn2", tmp_path)
    merge = tuned_configs.merge_entry(
        SPEC, _entry(metric={"latency_us": 5.0}), "trn2", tmp_path, replace=True
    )
    assert merge.kept == "new" and "--replace" in merge.why
    tuned_configs.write_entry(
        SPEC, _entry(metric={"latency_us": 0.1}, kernel_hash="sha256:old"), "trn2", tmp_path
    )
    merge = tuned_configs.merge_entry(SPEC, _entry(metric={"latency_us": 7.0}), "trn2", tmp_path)
    assert merge.kept == "new" and "another kernel" in merge.why


def _file_with(entries):
    return json.dumps(
        {
            "format": tuned_configs.FORMAT,
            "version": 1,
            "op": "matmul",
            "target": "trn2",
            "entries": entries,
        }
    )


@pytest.mark.parametrize(
    "entries",
    [
        [1],
        [None],
        [{**_entry(), "config": ["block_m"]}],
        [{**_entry(), "trials": True}],
        [{**_entry(), "model_version": None}],  # a modeled entry must say which model ranked it
    ],
    ids=["number", "null", "config-list", "trials-bool", "modeled-without-version"],
)
def test_entries_of_the_wrong_type_fall_back_with_one_warning(tmp_path, entries):
    (tmp_path / "trn2").mkdir()
    (tmp_path / "trn2" / "matmul.json").write_text(_file_with(entries))
    choice, said = _lookup(tmp_path)
    assert choice.source == "default" and len(said) == 1 and "unreadable" in str(said[0].message)
    _, said_again = _lookup(tmp_path)
    assert said_again == []


@pytest.mark.parametrize("value", [4.0, True], ids=["float", "bool"])
def test_config_values_of_the_wrong_type_fall_back(tmp_path, value):
    (tmp_path / "trn2").mkdir()
    entry = _entry(config={**TUNED, "block_m": value})
    (tmp_path / "trn2" / "matmul.json").write_text(_file_with([entry]))
    choice, said = _lookup(tmp_path)
    assert choice.source == "default" and len(said) == 1 and "not usable" in str(said[0].message)


def test_entry_ranked_by_another_cost_model_falls_back(tmp_path):
    tuned_configs.write_entry(SPEC, _entry(model_version="0"), "trn2", tmp_path)
    choice, said = _lookup(tmp_path)
    assert choice.source == "default" and len(said) == 1 and "cost model" in str(said[0].message)


def test_hardware_entries_need_no_model_version(tmp_path):
    tuned_configs.write_entry(SPEC, _entry(source="hardware", model_version=None), "trn2", tmp_path)
    choice, said = _lookup(tmp_path)
    assert choice.source == "hardware" and not said


def test_env_var_that_is_a_file_warns_once(tmp_path, monkeypatch):
    target = tmp_path / "store"
    target.write_text("{}")
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(target))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned_configs.lookup(SPEC, PROBLEM, "bfloat16", "trn2")
        tuned_configs.lookup(SPEC, PROBLEM, "bfloat16", "trn2")
    said = [w for w in caught if issubclass(w.category, tuned_configs.PerfResultsWarning)]
    assert len(said) == 1 and tuned_configs.PERF_RESULTS_ENV in str(said[0].message)


def test_kernel_hash_ignores_tolerances_and_docstrings_but_not_code():
    import dataclasses

    before = tuned_configs.kernel_hash(SPEC)
    loose = dataclasses.replace(SPEC, tolerances={"float32": (1.0, 1.0)})
    assert tuned_configs.kernel_hash(loose) == before

    def other_run_kernels(a, b, *, config, runner):
        return runner(matmul.matmul_kernel, a, b, None)

    changed = dataclasses.replace(SPEC, run_kernels=other_run_kernels)
    assert tuned_configs.kernel_hash(changed) != before


def test_writes_merge_entries_for_other_shapes_and_dtypes(tmp_path):
    other = {"m": 4096, "n": 4096, "k": 4096}
    tuned_configs.write_entry(SPEC, _entry(), "trn2", tmp_path)
    tuned_configs.write_entry(SPEC, _entry(shape_bucket=SPEC.shape_bucket(other)), "trn2", tmp_path)
    tuned_configs.write_entry(SPEC, _entry(dtype="float16"), "trn2", tmp_path)
    tuned_configs.write_entry(
        SPEC, _entry(metric={"latency_us": 0.5}), "trn2", tmp_path
    )  # replaces
    entries = tuned_configs.load_entries(tmp_path / "trn2" / "matmul.json", "matmul", "trn2")
    keys = sorted((e["shape_bucket"], e["dtype"]) for e in entries)
    assert keys == sorted(
        [
            (SPEC.shape_bucket(PROBLEM), "bfloat16"),
            (SPEC.shape_bucket(PROBLEM), "float16"),
            (SPEC.shape_bucket(other), "bfloat16"),
        ]
    )
    replaced = [e for e in entries if e["dtype"] == "bfloat16" and e["shape_bucket"] != keys[2][0]]
    assert [e["metric"]["latency_us"] for e in replaced] == [0.5]
    assert list((tmp_path / "trn2").iterdir()) == [tmp_path / "trn2" / "matmul.json"]


def test_an_unreadable_file_is_refused_not_clobbered(tmp_path):
    (tmp_path / "trn2").mkdir()
    (tmp_path / "trn2" / "matmul.json").write_text("{not json")
    with pytest.raises(ValueError):
        tuned_configs.write_entry(SPEC, _entry(), "trn2", tmp_path)
    assert (tmp_path / "trn2" / "matmul.json").read_text() == "{not json"


KILLED_WRITER = """
import os, sys, time
from pathlib import Path
from neuron_kernels import tuned_configs
from neuron_kernels.kernels import matmul

real_fdopen = os.fdopen

def fdopen_that_stalls(fd, *args, **kwargs):  # half of the new file, then the kill comes
    f = real_fdopen(fd, *args, **kwargs)
    write = f.write
    def half(text):
        write(text[: len(text) // 2]); f.flush()
        Path(sys.argv[2]).write_text("half written")
        time.sleep(600)
    f.write = half
    return f

os.fdopen = fdopen_that_stalls
entry = eval(sys.argv[3])
tuned_configs.write_entry(matmul.SPEC, entry, "trn2", Path(sys.argv[1]))
"""


def test_a_kill_mid_write_leaves_the_old_file_intact(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tuned_configs.write_entry(SPEC, _entry(), "trn2", tmp_path)
    old = path.read_text()
    marker = tmp_path / "marker"
    other = _entry(shape_bucket="m4096_n4096_k4096")
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path), str(marker), repr(other)]
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert path.read_text() == old
    assert len(tuned_configs.load_entries(path, "matmul", "trn2")) == 1
    # the torn temporary file is not a results file: lookups and the next write ignore it
    assert [p.name for p in (tmp_path / "trn2").glob("*.json")] == ["matmul.json"]
    tuned_configs.write_entry(SPEC, other, "trn2", tmp_path)
    assert len(tuned_configs.load_entries(path, "matmul", "trn2")) == 2


def test_the_launch_lnc_is_part_of_the_key_and_old_entries_read_as_lnc1(tmp_path):
    """An entry without ``lnc`` (every entry shipped before the kernels split) applies at
    LNC=1 only; an LNC=2 entry applies at LNC=2 only; both live side by side in one file."""
    tuned_configs.write_entry(SPEC, _entry(), "trn2", tmp_path)  # no "lnc": tuned at LNC=1
    tuned_configs.write_entry(SPEC, _entry(lnc=2, config={**TUNED, "block_m": 4}), "trn2", tmp_path)
    doc = json.loads((tmp_path / "trn2" / "matmul.json").read_text())
    assert sorted(tuned_configs.entry_lnc(e) for e in doc["entries"]) == [1, 2]
    at1 = tuned_configs.lookup(SPEC, PROBLEM, "bfloat16", "trn2", tmp_path, lnc=1)
    at2 = tuned_configs.lookup(SPEC, PROBLEM, "bfloat16", "trn2", tmp_path, lnc=2)
    assert at1.config.to_dict() == TUNED and at2.config.block_m == 4
    assert (
        tuned_configs.lookup(SPEC, PROBLEM, "bfloat16", "trn1", tmp_path, lnc=2).source == "default"
    )


def test_an_entry_with_a_bad_lnc_makes_the_file_unreadable(tmp_path):
    with pytest.raises(ValueError, match="'lnc' must be >= 1"):
        tuned_configs.write_entry(SPEC, _entry(lnc=0), "trn2", tmp_path)
