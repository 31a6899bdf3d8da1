"""Every bad input to the CLIs is one line naming the setting and the value, exit code 2, no
traceback: a table of them, each driven through ``neuron_kernels.cli.main`` as the console
script runs it (an exception escaping ``main`` is the traceback a user would see)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neuron_kernels.cli import main

S = ["--shape", "256x256x256"]
PROFILE = ["profile", "matmul", *S]


def _files(tmp):
    """Bad files the table refers to by name, written into ``tmp``."""
    files = {
        "list.json": [1],
        "not-json.json": "xx",
        "overrides-list.json": {"overrides": [1]},
        "bad-param.json": {"overrides": {"dma_core_gbps": -2}},
        "trn3-fit.json": {"target": "trn3", "overrides": {"dma_core_gbps": 100.0}},
        "unknown-row.json": {"target": "trn2", "rows": [{"id": "nope", "measured_ms": 1}]},
        "negative-ms.json": {"rows": [{"id": "A3-v3-hoisted", "measured_ms": -1}]},
        "zero-ms.json": {"rows": [{"id": "A3-v3-hoisted", "measured_ms": 0}]},
        "bool-ms.json": {"rows": [{"id": "A3-v3-hoisted", "measured_ms": True}]},
        "no-ms.json": {"rows": [{"id": "A3-v3-hoisted"}]},
        "bad-target.json": {"target": "trn9", "rows": [{"id": "A3-v3-hoisted", "measured_ms": 1}]},
        "no-rows.json": {"target": "trn2", "rows": []},
        "row-not-object.json": {"rows": [3]},
        "bad-op-row.json": {"rows": [{"op": "matmul", "shape": "2x3", "measured_ms": 1}]},
        "bad-op-config.json": {
            "rows": [{"op": "matmul", "shape": "8x8x8", "config": {"block_m": 3}, "measured_ms": 1}]
        },
        "bad-kernel-row.json": {"rows": [{"kernel": "no.such.module:k", "measured_ms": 1}]},
        # issue 32 item 4: a non-kernel object, too few shapes, shapes the kernel refuses
        "non-kernel-row.json": {
            "rows": [
                {
                    "kernel": "neuron_kernels.kernels.matmul:SPEC",
                    "shapes": [[4, 4]],
                    "measured_ms": 1,
                }
            ]
        },
        "few-shapes-row.json": {
            "rows": [{"kernel": "add_kernel:add", "shapes": [[4, 8]], "measured_ms": 1}]
        },
        "mismatched-shapes-row.json": {
            "rows": [{"kernel": "add_kernel:add", "shapes": [[4, 8], [5, 4]], "measured_ms": 1}]
        },
        # issue 32 items 3, 7: a shape too big for host memory; H % Hkv != 0
        "huge-op-row.json": {
            "rows": [{"op": "matmul", "shape": "99999999999x4x4", "measured_ms": 1}]
        },
        "huge-kernel-row.json": {
            "rows": [
                {"kernel": "add_kernel:add", "shapes": [[99999999999, 4]] * 2, "measured_ms": 1}
            ]
        },
        "gqa-row.json": {
            "rows": [{"op": "flash_attention", "shape": "1x3x2x128x128x64", "measured_ms": 1}]
        },
        "bad-kernel-shapes.json": {
            "rows": [
                {
                    "kernel": "neuron_kernels.kernels.matmul:matmul_kernel",
                    "shapes": [[-1, 2]],
                    "measured_ms": 1,
                }
            ]
        },
    }
    for name, doc in files.items():
        (tmp / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    (tmp / "folder").mkdir()
    (tmp / "add_kernel.py").write_text(ADD_KERNEL)


ADD_KERNEL = """
from neuron_kernels.backend import nl, nisa


def add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=out, src=ta)
    return out
"""
HUGE = "99999999999x4x4"
GQA = "1x3x2x128x128x64"  # B H Hkv Sq Sk D with H % Hkv != 0


# (argv, environment, the text the one line must contain: the setting and the value)
CASES = [
    # profile --config: not an object, off the grid, wrongly typed, unknown field, no file
    (PROFILE + ["--config", "3"], {}, "--config 3"),
    (PROFILE + ["--config", "null"], {}, "--config null"),
    (PROFILE + ["--config", "[1]"], {}, "--config [1]"),
    (PROFILE + ["--config", '{"block_m": 3}'], {}, "block_m must be one of"),
    (PROFILE + ["--config", '{"block_m": "2"}'], {}, "block_m must be one of"),
    (PROFILE + ["--config", '{"block_m": true}'], {}, "block_m must be one of"),
    (PROFILE + ["--config", '{"block_m": 4.0}'], {}, "block_m must be one of"),
    (PROFILE + ["--config", '{"nope": 1}'], {}, "must only name the fields"),
    (PROFILE + ["--config", "missing.json"], {}, "--config missing.json: no such file"),
    (PROFILE + ["--config", "list.json"], {}, "--config list.json"),
    # profile --param / --params-file
    (PROFILE + ["--param", "dma_core_gbps=0"], {}, "dma_core_gbps must be > 0 GB/s"),
    (PROFILE + ["--param", "dma_core_gbps=-1"], {}, "dma_core_gbps must be > 0 GB/s"),
    (PROFILE + ["--param", "sync_ns=-5"], {}, "sync_ns must be >= 0 ns"),
    (PROFILE + ["--param", "bogus=1"], {}, "--param bogus=1"),
    (PROFILE + ["--param", "dma_core_gbps=inf"], {}, "dma_core_gbps must be a finite number"),
    (PROFILE + ["--param", "sync_ns=nan"], {}, "sync_ns must be a finite number"),
    (PROFILE + ["--params-file", "trn3-fit.json"], {}, "fitted for 'trn3'"),
    (PROFILE + ["--param", "dma_core_gbps"], {}, "--param dma_core_gbps: must be NAME=VALUE"),
    (PROFILE + ["--param", "dve_perf_mode=maybe"], {}, "dve_perf_mode must be true or false"),
    (PROFILE + ["--params-file", "missing.json"], {}, "--params-file missing.json: no such file"),
    (PROFILE + ["--params-file", "list.json"], {}, "--params-file list.json"),
    (PROFILE + ["--params-file", "not-json.json"], {}, "is not JSON"),
    (PROFILE + ["--params-file", "overrides-list.json"], {}, '"overrides" must be an object'),
    (PROFILE + ["--params-file", "bad-param.json"], {}, "dma_core_gbps must be > 0"),
    (PROFILE + ["--params-file", "folder"], {}, "is a folder"),
    # profile outputs into a missing folder, checked before the run
    (PROFILE + ["--chrome", "no/such/t.json"], {}, "--chrome no/such/t.json"),
    (PROFILE + ["--png", "no/such/t.png"], {}, "--png no/such/t.png"),
    (PROFILE + ["--json", "no/such/t.json"], {}, "--json no/such/t.json"),
    (PROFILE + ["--json", "folder"], {}, "--json folder: is a folder"),
    # profile --shape / --dtype / --target / op
    (["profile", "matmul", "--shape", "-1x2x3"], {}, "--shape -1x2x3: must be MxNxK"),
    (["profile", "matmul", "--shape", "2x3"], {}, "--shape 2x3"),
    (["profile", "matmul", "--shape", "0x8x8"], {}, "--shape 0x8x8"),
    (["profile", "matmul", "--shape", "1000000x1000000x1000000"], {}, "GiB of host memory"),
    (PROFILE + ["--dtype", "int7"], {}, "--dtype int7"),
    (PROFILE + ["--target", "trn9"], {}, "--target trn9"),
    (PROFILE, {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn9"}, "NEURON_PLATFORM_TARGET_OVERRIDE trn9"),
    (["profile", "bogus", *S], {}, "op bogus"),
    (["profile", "matmul"], {}, "--shape"),
    # demo
    (["demo", "--target", "trn9"], {}, "--target trn9"),
    (["demo"], {"NEURON_PLATFORM_TARGET_OVERRIDE": "gen9"}, "NEURON_PLATFORM_TARGET_OVERRIDE gen9"),
    (["demo", "--seed", "x"], {}, "--seed"),
    (["demo", "--size", "huge"], {}, "--size"),
    # --lnc: an LNC the target lacks, not a number; the variable when it decides
    (["demo", "--lnc", "3"], {}, "--lnc 3"),
    (["demo", "--target", "trn1", "--lnc", "2"], {}, "--lnc 2"),
    (PROFILE + ["--lnc", "two"], {}, "--lnc two"),
    (["autotune", "matmul", *S, "--lnc", "0"], {}, "--lnc 0"),
    (PROFILE, {"NEURON_LOGICAL_NC_CONFIG": "4"}, "NEURON_LOGICAL_NC_CONFIG 4"),
    # calibrate
    (["calibrate", "--rows", "bogus"], {}, "--rows bogus"),
    (["calibrate", "--rows", "A1-tiled", "--write"], {}, "--rows A1-tiled"),
    (["calibrate", "--jobs", "0"], {}, "--jobs 0"),
    (["calibrate", "--fit", "missing.json"], {}, "--fit missing.json: no such file"),
    (["calibrate", "--fit", "not-json.json"], {}, "--fit not-json.json: is not JSON"),
    (["calibrate", "--fit", "list.json"], {}, "--fit list.json"),
    (["calibrate", "--fit", "unknown-row.json"], {}, "rows[0]: \"id\" 'nope'"),
    (["calibrate", "--fit", "negative-ms.json"], {}, '"measured_ms" must be > 0'),
    (["calibrate", "--fit", "zero-ms.json"], {}, '"measured_ms" must be > 0'),
    (["calibrate", "--fit", "bool-ms.json"], {}, '"measured_ms" must be a number'),
    (["calibrate", "--fit", "no-ms.json"], {}, '"measured_ms" must be a number'),
    (["calibrate", "--fit", "bad-target.json"], {}, "\"target\" 'trn9'"),
    (["calibrate", "--fit", "no-rows.json"], {}, 'non-empty "rows"'),
    (["calibrate", "--fit", "row-not-object.json"], {}, "rows[0]: must be an object"),
    (["calibrate", "--fit", "bad-op-row.json"], {}, "rows[0]: shape must be MxNxK"),
    (["calibrate", "--fit", "bad-op-config.json"], {}, "rows[0]: config block_m"),
    (["calibrate", "--fit", "bad-kernel-row.json"], {}, "cannot be imported"),
    (["calibrate", "--fit", "bad-kernel-shapes.json"], {}, '"shapes" must be'),
    (["calibrate", "--fit", "zero-ms.json", "--iterations", "-3"], {}, "--iterations -3"),
    (["calibrate", "--fit", "unknown-row.json", "--out", "no/such/o.json"], {}, "--out no/such"),
    (["bogus-command"], {}, "bogus-command"),
    # issue 32 item 5: every output checked before any work, no parent folder made
    (["autotune", "matmul", *S, "--storage", "sqlite:///no/such/s.db"], {}, "--storage no/such"),
    (["autotune", "matmul", *S, "--results", "list.json"], {}, "--results list.json: is a file"),
    (["autotune", "matmul", *S, "--results", "no/such/dir"], {}, "--results no/such/dir"),
    (["autotune", "matmul", *S, "--report", "no/such/dir"], {}, "--report no/such/dir"),
    (
        ["autotune", "matmul", *S],
        {"NEURON_KERNELS_PERF_RESULTS": "list.json"},
        "NEURON_KERNELS_PERF_RESULTS list.json: is a file",
    ),
    (["parity", "--tolerance", "1", "--json", "no/such/p.json"], {}, "--json no/such/p.json"),
    (["parity", "--tolerance", "1", "--png", "no/such/p.png"], {}, "--png no/such/p.png"),
    # issue 32 item 2: NKI_PRECISE_FP read before any kernel runs
    (["demo"], {"NKI_PRECISE_FP": "maybe"}, "NKI_PRECISE_FP maybe: must be one of"),
    (PROFILE, {"NKI_PRECISE_FP": "maybe"}, "NKI_PRECISE_FP maybe: must be one of"),
    # issue 32 item 3: refused before allocating, in every command that builds inputs
    (["autotune", "matmul", "--shape", HUGE, "--no-write"], {}, "GiB of host memory"),
    (["calibrate", "--fit", "huge-op-row.json"], {}, "GiB of host memory"),
    (["calibrate", "--fit", "huge-kernel-row.json"], {}, "GiB of host memory"),
    # issue 32 item 4: calibrate --fit kernel rows
    (["calibrate", "--fit", "non-kernel-row.json"], {}, "is not an NKI kernel"),
    (["calibrate", "--fit", "few-shapes-row.json"], {}, "one array per argument of add (a, b)"),
    (["calibrate", "--fit", "mismatched-shapes-row.json"], {}, "refused its shapes"),
    # issue 32 item 7: every CLI path uses the op's own checks (H % Hkv == 0)
    (["profile", "flash_attention", "--shape", GQA], {}, "H % Hkv == 0"),
    (["autotune", "flash_attention", "--shape", GQA, "--no-write"], {}, "H % Hkv == 0"),
    (["calibrate", "--fit", "gqa-row.json"], {}, "H % Hkv == 0"),
]


@pytest.mark.parametrize(
    "argv,env,expected", CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES]
)
def test_bad_input_is_one_line_exit_2(argv, env, expected, tmp_path, monkeypatch, capsys):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # add_kernel.py
    monkeypatch.setenv("NEURON_KERNELS_STUDIES", f"sqlite:///{tmp_path / 'studies.db'}")
    monkeypatch.setenv("NEURON_KERNELS_PERF_RESULTS", str(tmp_path / "user-results"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err + out
    assert expected in lines[0], lines[0]
    assert lines[0].startswith("neuron-kernels"), lines[0]
    assert not (tmp_path / "user-results").exists()  # nothing written
    assert not (tmp_path / "no").exists()  # no missing parent folder was made


def _console(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "neuron_kernels.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        **kwargs,
    )


def test_version():
    from neuron_kernels._version import __version__

    result = _console("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"neuron-kernels {__version__}"


def test_a_closed_pipe_ends_quietly():
    """``neuron-kernels profile ... | head -1``: no BrokenPipeError, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_kernels.cli", "profile", "matmul", "--shape", "512x512x512"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before the first write, as `head` may be
    err = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode in (0, 141), proc.returncode


def test_a_bad_input_as_a_user_sees_it(tmp_path):
    """The console script end to end: one line on stderr, exit 2."""
    result = _console("profile", "matmul", "--shape", "256x256x256", "--param", "sync_ns=-1")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_demo_under_nki_precise_fp_0_runs_and_says_what_it_skipped(monkeypatch, capsys):
    """Issue 32 item 2: bf16 fused_adamw_ with found_inf views bf16 bits as int16, which fp32
    storage (NKI_PRECISE_FP=0) does not have: the demo used to crash; it now runs every other
    kernel and names the one it skipped and why."""
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    assert main(["demo"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (skip,) = [line for line in out.splitlines() if "SKIP: " in line]
    assert "fused_adamw_" in skip and "bfloat16" in skip and "NKI_PRECISE_FP=0" in skip
    assert "1 skipped" in out
    assert "of bound" in out  # issue 32 item 14: the column PASS/FAIL reads off
