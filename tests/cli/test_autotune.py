"""``neuron-kernels autotune``: a small run end to end, --list, --table, and every bad
input as one line naming the flag and value (exit 2, no traceback)."""

from __future__ import annotations

import json

import pytest

from neuron_kernels.cli import main


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Studies and results in tmp_path, never the user's cache or the shipped perf_results."""
    monkeypatch.setenv("NEURON_KERNELS_STUDIES", f"sqlite:///{tmp_path / 'studies.db'}")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)  # trn2: LNC=2 by default
    return tmp_path


def test_a_small_run_prints_the_summary_and_merges_the_result(isolated, capsys):
    args = ["autotune", "matmul", "--shape", "200x600x300", "--trials", "4", "--quiet"]
    report = isolated / "report"
    assert main([*args, "--results", str(isolated / "perf"), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "modeled latency per shape" in out
    (row,) = [line for line in out.splitlines() if line.startswith("200x600x300")]
    assert "bfloat16" in row and "us" in row
    doc = json.loads((isolated / "perf" / "trn2" / "matmul.json").read_text())
    (entry,) = doc["entries"]
    assert entry["source"] == "modeled" and entry["shape"] == "200x600x300"
    assert (
        entry["trials"] == 4
        and entry["metric"]["latency_us"] <= entry["metric"]["default_latency_us"]
    )

    for name in ("0_history", "0_importances", "0_parallel", "best_vs_default"):
        assert (report / f"{name}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (report / "report.html").read_text()
    # Four plotly charts on one page, plotly.js inline once (no network to view it).
    assert page.count('class="plotly-graph-div"') == 4 and "modeled latencies" in page
    assert page.count("<script src=") == 0

    assert main(["autotune", "--table", "--results", str(isolated / "perf")]) == 0
    table = (isolated / "perf" / "trn2" / "README.md").read_text()
    assert "| matmul | 200x600x300 | bfloat16 | 2 | modeled |" in table  # trn2 launches at LNC=2


def test_list_shows_every_tunable_with_its_choices_and_reason(capsys):
    assert main(["autotune", "--list"]) == 0
    out = capsys.readouterr().out
    assert "matmul  (720 configs; shape MxNxK)" in out
    assert "block_m        default 4        of 1, 2, 4, 8, 16" in out
    assert "modeled: 512-row A^T blocks" in out
    syntax = "BxHKVxGROUPSxSQxSKxD[:causal][:window=L,R][:softcap=X][:sinks]"
    assert f"flash_attention_bwd  (1080 configs; shape {syntax})" in out
    assert "fused_adamw_  (144 configs; shape TENSORSxNUMEL[:amsgrad])" in out


def test_report_without_the_plot_extra_is_one_line(isolated, monkeypatch, capsys):
    from neuron_kernels.autotune import report

    monkeypatch.setattr(report, "missing_plot_libraries", lambda: ["plotly"])
    argv = ["autotune", "matmul", "--shape", "200x600x300", "--trials", "2"]
    assert main([*argv, "--report", str(isolated / "r")]) == 2
    err = capsys.readouterr().err
    assert "--report" in err and "neuron-kernels[plot]" in err and "Traceback" not in err
    assert not (isolated / "r" / "report.html").exists()


@pytest.mark.parametrize(
    "argv,says",
    [
        (["nosuchop", "--shape", "8x8x8"], "op nosuchop: must be one of"),
        (["matmul", "--shape", "8x8"], "--shape 8x8: must be MxNxK"),
        (["matmul"], "--shape : is required"),
        (["matmul", "--shape", "8x8x8", "--trials", "0"], "--trials 0: must be >= 1"),
        (["matmul", "--shape", "8x8x8", "--jobs", "two"], "--jobs two: must be an integer"),
        (["matmul", "--shape", "8x8x8", "--timeout", "-1"], "--timeout -1: must be > 0"),
        (["matmul", "--shape", "8x8x8", "--dtype", "int8"], "--dtype int8: must be one of"),
        (["matmul", "--shape", "8x8x8", "--sampler", "cmaes"], "categorical"),
        (["matmul", "--shape", "8x8x8", "--sampler", "sa"], "--sampler sa: must be one of"),
        (["matmul", "--shape", "8x8x8", "--backend", "gpu"], "--backend gpu: must be"),
        (["matmul", "--shape", "8x8x8", "--backend", "hardware"], "hardware: no NeuronCore: no"),
        (["matmul", "--shape", "8x8x8", "--compile-jobs", "0"], "--compile-jobs 0: must be >= 1"),
        (
            ["matmul", "--shape", "8x8x8", "--backend", "hardware", "--trial-deadline", "0"],
            "--trial-deadline 0: must be > 0",
        ),
        (["matmul", "--shape", "8x8x8", "--storage", "nowhere"], "--storage nowhere: must be"),
        (
            ["matmul", "--shape", "8x8x8", "--storage", "postgresql://u@127.0.0.1:1/db"],
            "--storage postgresql://u@127.0.0.1:1/db: cannot open it",
        ),
        (
            ["matmul", "--shape", "8x8x8", "--storage", "journal:/no/such/dir/j.log"],
            "does not exist",
        ),
        (["matmul", "--committed", "--shape", "8x8x8"], "--committed"),
    ],
)
def test_bad_input_is_one_line(isolated, capsys, argv, says):
    assert main(["autotune", *argv, "--results", str(isolated / "perf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("neuron-kernels autotune: error: ") and says in err, err
    assert not (isolated / "perf").exists()


def test_a_short_run_keeps_the_stored_faster_entry_and_says_so(isolated, capsys):
    """A 1-trial run at a shape whose stored entry is faster keeps the stored entry (it used
    to replace it and say "merged"); ``--replace`` stores the new one."""
    from neuron_kernels import tuned_configs
    from neuron_kernels.kernels.spec import get_spec

    spec = get_spec("matmul")
    perf = isolated / "perf"
    argv = ["autotune", "matmul", "--shape", "200x600x300", "--trials", "1", "--quiet"]
    assert main([*argv, "--results", str(perf)]) == 0
    path = perf / "trn2" / "matmul.json"
    (entry,) = tuned_configs.load_entries(path, "matmul", "trn2")
    faster = {**entry, "metric": {"latency_us": entry["metric"]["latency_us"] / 2}, "trials": 31}
    tuned_configs.write_entry(spec, faster, "trn2", perf, replace=True)
    capsys.readouterr()
    assert main([*argv, "--results", str(perf), "--no-warm-start"]) == 0
    out = capsys.readouterr().out
    assert "kept the stored entry" in out and "31 trials" in out and "merged" not in out
    (kept,) = tuned_configs.load_entries(path, "matmul", "trn2")
    assert kept["trials"] == 31
    assert main([*argv, "--results", str(perf), "--no-warm-start", "--replace"]) == 0
    assert "--replace" in capsys.readouterr().out
    (stored,) = tuned_configs.load_entries(path, "matmul", "trn2")
    assert stored["trials"] == 1


def test_results_go_to_the_user_folder_unless_write_shipped(isolated, monkeypatch, capsys):
    """Tuning never edits the package's perf_results/ (a tracked file in a clone) unless the
    contributor flag says so."""
    from neuron_kernels import tuned_configs

    shipped = isolated / "shipped"
    (shipped / "trn2").mkdir(parents=True)
    monkeypatch.setattr(tuned_configs, "shipped_dir", lambda: shipped)
    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated / "cache"))
    monkeypatch.delenv(tuned_configs.PERF_RESULTS_ENV, raising=False)
    argv = ["autotune", "matmul", "--shape", "200x600x300", "--trials", "1", "--quiet"]
    assert main(argv) == 0
    user_file = isolated / "cache" / "neuron-kernels" / "perf_results" / "trn2" / "matmul.json"
    assert user_file.is_file() and not (shipped / "trn2" / "matmul.json").exists()
    assert main([*argv, "--write-shipped"]) == 0
    assert (shipped / "trn2" / "matmul.json").is_file()
    assert main([*argv, "--write-shipped", "--results", str(isolated)]) == 2
