"""A Trn node's view: with an ``nki`` package importable and ``NEURON_KERNELS_NKI=auto``, the
kernels bind AWS's NKI at import, and the interpreter-based tools still run them.

AWS's ``nki`` is not on any registry CI reaches, so ``tests/stand_in_nki/`` plays it: a
package whose every API call is recorded and raises (see its README). Each check runs in a
fresh subprocess, since the backend is chosen once, at import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

STAND_IN = Path(__file__).parent / "stand_in_nki"


def _run(args: list[str], stand_in: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NEURON_KERNELS_NKI")}
    env["NEURON_KERNELS_NKI"] = "auto"
    if stand_in:
        env["PYTHONPATH"] = str(STAND_IN)
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=600
    )


CLI = ["-m", "neuron_kernels.cli"]


@pytest.mark.parametrize(
    "argv",
    [["profile", "matmul", "--shape", "1024x1024x1024"], ["demo"]],
    ids=["profile", "demo"],
)
def test_cli_prints_the_same_modeled_numbers_with_nki_importable(argv):
    plain = _run([*CLI, *argv], stand_in=False)
    on_node = _run([*CLI, *argv], stand_in=True)
    assert plain.returncode == 0, plain.stderr
    assert on_node.returncode == 0, on_node.stderr
    assert "modeled" in plain.stdout
    assert on_node.stdout == plain.stdout


NODE_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import torch

    import nki
    from neuron_kernels import backend
    from neuron_kernels.kernels import matmul
    from neuron_kernels.verification import run_kernel
    from neuron_kernels.cli import calibration_files

    assert backend.name == "nki" and matmul.nl is nki.language, (backend.name, matmul.nl)

    # The testing helpers: the op's kernels on the interpreter, values checked.
    spec = matmul.SPEC
    a, b = spec.make_inputs({"m": 130, "n": 520, "k": 260}, "float32", torch.Generator().manual_seed(0))
    out = run_kernel(spec, (a, b))
    torch.testing.assert_close(out, spec.reference(a, b).to(out.dtype), atol=1e-4, rtol=1e-5)

    # The calibration kernels, traced at a small shape.
    row = next(r for r in calibration_files.load_published()["rows"] if r["id"] == "A1-block-all")
    traced = calibration_files.trace_row(row, {"K": 1024, "M": 512, "N": 1024})
    assert len(traced.trace) > 0

    # Nothing reached the stand-in, and the kernels' modules are bound to it again.
    assert nki.CALLS == [], nki.CALLS
    assert matmul.nl is nki.language and matmul.nisa is nki.isa
    try:
        matmul.matmul_kernel(a, b, None)
    except nki.StandInReached:
        pass
    else:
        raise AssertionError("the stand-in is not live: calling the kernel directly did not reach it")
    print("ok")
    """
)


def test_testing_helpers_and_calibration_run_on_the_interpreter_and_restore_the_bindings():
    done = _run(["-c", NODE_SCRIPT], stand_in=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")
