"""Every script in examples/ runs as a new user would run it and reports PASS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# trn2_smoke.py checks a Trn2 node (it FAILs anywhere else, as it should); it is run on the
# test doubles of nki and nrtpy in tests/autotune/test_hardware_backend.py.
ON_TRN2_ONLY = {"trn2_smoke.py"}
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if p.name not in ON_TRN2_ONLY)

# Extra runs beyond the defaults: other shapes (edge sizes, more programs) and dtypes.
VARIANTS = {
    "tiled_matmul.py": [
        ["--dtype", "bfloat16"],
        ["--m", "1", "--k", "1", "--n", "1"],
        ["--m", "128", "--k", "384", "--n", "512"],
    ],
    "spmd_tensor_add.py": [["--grid", "1"], ["--grid", "2", "--rows", "520", "--cols", "33"]],
}


def _run(script: Path, args: list[str], tmp_path: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        check=False,
        cwd=tmp_path,  # a user's own folder, not the repo
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_examples_exist():
    assert {s.name for s in SCRIPTS} >= {"tiled_matmul.py", "spmd_tensor_add.py"}


@pytest.mark.parametrize(
    "script, args",
    [(s, []) for s in SCRIPTS] + [(EXAMPLES / n, a) for n, runs in VARIANTS.items() for a in runs],
    ids=lambda v: v.name if isinstance(v, Path) else " ".join(v) or "defaults",
)
def test_example_passes(script, args, tmp_path):
    result = _run(script, args, tmp_path)
    assert result.returncode == 0, f"{script.name} {args}:\n{result.stdout}\n{result.stderr}"
    assert "-> PASS" in result.stdout
    assert "FAIL" not in result.stdout


@pytest.mark.parametrize("target", ["trn1", "trn3"])
def test_examples_run_on_other_targets(target, tmp_path):
    for script in SCRIPTS:
        result = _run(script, [], tmp_path, NEURON_PLATFORM_TARGET_OVERRIDE=target)
        assert result.returncode == 0, f"{script.name} on {target}:\n{result.stderr}"
        assert "-> PASS" in result.stdout


# A planted bug per example (text to replace, replacement): the script must catch it.
MUTANTS = {
    "tiled_matmul.py": ("accumulate=(k > 0)", "accumulate=False"),  # keeps only the last K tile
    "spmd_tensor_add.py": ("nl.num_programs(0))", "nl.num_programs(0) + 1)"),  # skips row tiles
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_example_fails_on_a_wrong_result(name, tmp_path):
    old, new = MUTANTS[name]
    source = (EXAMPLES / name).read_text()
    assert source.count(old) == 1, f"{name} no longer contains {old!r}; update MUTANTS"
    mutant = tmp_path / name
    mutant.write_text(source.replace(old, new))
    result = _run(mutant, [], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "-> FAIL" in result.stdout


@pytest.mark.parametrize(
    "name,args",
    [
        ("spmd_tensor_add.py", ["--grid", "0"]),
        ("spmd_tensor_add.py", ["--grid", "3"]),  # NKI 0.6: kernel[1] or kernel[2] (lnc.rst)
        ("spmd_tensor_add.py", ["--rows", "-1"]),
        ("tiled_matmul.py", ["--m", "0"]),
        ("tiled_matmul.py", ["--k", "x"]),
    ],
)
def test_example_refuses_a_bad_size_in_one_line(name, args, tmp_path):
    result = _run(EXAMPLES / name, args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and args[0] in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
