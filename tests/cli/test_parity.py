"""``neuron-kernels parity``: the kernel path matches the reference on the Llama example; a
perturbed kernel fails with a growing gap at the step it starts; a constant offset is
reported as flat; bad input is one line, exit 2.

Tolerances, chosen before any run: 2e-3 (absolute loss, nats) for the kernel path, the
issue's acceptance bound: fp32 kernels differ from torch only by summation order, ~1e-6
relative per op, far inside it. The perturbation (1e-2 added to every matmul output from
step PERTURB_FROM on, as a stale accumulator would) moves that step's loss by ~5e-3 at
once, and its biased weight gradients push every update the same way, so the gap must
cross 2e-3 at that step and keep rising. (A scale bug would not do: Adam normalises a scaled gradient away.)
"""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest

from neuron_kernels.cli import main as cli_main
from neuron_kernels.cli import parity
from neuron_kernels.kernels import REGISTRY
from neuron_kernels.torch_ops import routing

TOLERANCE = 2e-3
PERTURB_FROM = 4  # the step the perturbed kernel variant takes over
STEPS = 7
COMMON = dict(seed=0, device="cpu", batch_size=2, seq_len=64)


def run_cli(capsys, *argv):
    code = cli_main(["parity", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the verdict on two curves --------------------------------------------------------------


def test_constant_offset_is_flat_and_fails_at_step_one():
    ref = [5.0 - 0.1 * i for i in range(10)]
    report = parity.compare(ref, [r + 0.01 for r in ref], TOLERANCE, [5, 10])
    assert not report["passed"] and report["first_divergent_step"] == 1
    assert report["trend"]["verdict"] == "flat"
    assert abs(report["trend"]["slope"]) < 1e-12


def test_growing_gap_is_growing_from_the_first_divergent_step():
    ref = [5.0] * 12
    kernel = [5.0] * 5 + [5.0 + 3e-3 * (i + 1) for i in range(7)]  # parts at step 6
    report = parity.compare(ref, kernel, TOLERANCE, [12])
    assert report["first_divergent_step"] == 6
    trend = report["trend"]
    assert trend["verdict"] == "growing" and trend["from_step"] == 6
    assert trend["slope"] == pytest.approx(3e-3)


def test_noise_below_tolerance_passes_flat():
    ref = [4.0 + 0.01 * math.sin(i) for i in range(20)]
    kernel = [r + (1e-6 if i % 2 else -1e-6) for i, r in enumerate(ref)]
    report = parity.compare(ref, kernel, TOLERANCE, [5, 10, 20])
    assert report["passed"] and report["first_divergent_step"] is None
    assert report["trend"]["verdict"] == "flat"


def test_a_nan_loss_is_a_divergence():
    report = parity.compare([1.0, 1.0, 1.0], [1.0, float("nan"), 1.0], TOLERANCE, [3])
    assert report["first_divergent_step"] == 2 and report["trend"]["verdict"] == "growing"
    assert report["passed"]  # step 3, the only compared step, is within tolerance


def test_relative_tolerance():
    report = parity.compare([100.0], [100.1], TOLERANCE, relative=True)
    assert report["passed"] and report["gaps"][0] == pytest.approx(1e-3)


# -- the kernel path on the Llama example ---------------------------------------------------


def test_kernel_path_passes_with_table_and_json(capsys, tmp_path):
    out_json = tmp_path / "parity.json"
    code, out, err = run_cli(
        capsys,
        *("--steps", "4", "--compare", "2,4", "--tolerance", str(TOLERANCE)),
        *("--json", str(out_json)),
    )
    assert code == 0, out + err
    assert "PASS" in out and "first divergent step: none" in out
    assert "gap trend: flat (fitted slope" in out
    for step in range(1, 5):
        assert any(line.split()[:1] == [str(step)] for line in out.splitlines())
    doc = json.loads(out_json.read_text())
    assert doc["format"] == parity.FORMAT and doc["passed"] is True
    assert doc["compare"] == [2, 4] and len(doc["reference"]["losses"]) == 4
    assert doc["trend"]["verdict"] == "flat" and doc["first_divergent_step"] is None
    # The pieces the kernel run claims as kernels launched kernels of their op.
    pieces = doc["kernel"]["pieces"]
    assert pieces["projections"]["kernel"] is True
    assert doc["kernel"]["launches"].get("matmul.matmul_kernel", 0) > 0
    if "flash_attention" in REGISTRY:
        assert pieces["attention"]["kernel"] is True
    assert all(doc["reference"]["pieces"][p]["kernel"] is False for p in pieces)


def test_perturbed_kernel_fails_growing_at_the_right_step(monkeypatch):
    """A test-only variant of the matmul kernel, every output off by +1e-2 (a stale
    accumulator), takes over from step PERTURB_FROM: the gap must start there and grow."""
    real = routing.interpreter_runner
    active = {"on": False}
    # run_kernels launches ``kernel[lnc]``: match the kernel function under the launch
    matmul_kernels = {getattr(k, "fn", k) for k in REGISTRY["matmul"].kernels}

    def perturbed_matmul(kernel, *args, **kwargs):
        out = real(kernel, *args, **kwargs)
        if active["on"] and getattr(kernel, "fn", kernel) in matmul_kernels:
            return out + 1e-2
        return out

    def switch(step):
        active["on"] = step >= PERTURB_FROM

    reference = parity.run_example(kernels=False, steps=STEPS, **COMMON)
    monkeypatch.setattr(routing, "interpreter_runner", perturbed_matmul)
    kernel = parity.run_example(kernels=True, steps=STEPS, on_step=switch, **COMMON)
    report = parity.compare(reference.losses, kernel.losses, TOLERANCE, [2, STEPS])
    assert not report["passed"]
    assert report["checks"][0]["within"], "before the variant takes over the curves agree"
    assert report["first_divergent_step"] == PERTURB_FROM
    assert report["trend"]["verdict"] == "growing" and report["trend"]["slope"] > 0
    assert report["trend"]["from_step"] == PERTURB_FROM


# -- --script: the classic two-run harness --------------------------------------------------

OFFSET_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    run = os.environ["NEURON_KERNELS_PARITY_RUN"]
    assert os.environ["NEURON_KERNELS_DISABLE"] == ("1" if run == "reference" else "0")
    offset = float(sys.argv[1]) if run == "kernel" else 0.0
    losses = [5.0 - 0.2 * i + offset for i in range(10)]
    with open(sys.argv[2], "w") as f:
        json.dump({"losses": losses}, f)
    """
)


def test_script_with_a_constant_offset_is_reported_flat(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(OFFSET_SCRIPT)
    code, out, err = run_cli(
        capsys, "--compare", "5,10", "--tolerance", "2e-3", "--script", str(script), "--",
        "0.01", "{losses}",
    )  # fmt: skip
    assert code == 1, out + err
    assert "FAIL: 2 of 2 compared steps" in out
    assert "first divergent step: 1" in out and "gap trend: flat" in out


def test_script_within_tolerance_passes(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(OFFSET_SCRIPT)
    code, out, _ = run_cli(
        capsys, "--tolerance", "2e-3", "--script", str(script), "--", "1e-4", "{losses}"
    )
    assert code == 0 and "PASS: all 10 compared steps" in out


def test_script_that_fails_is_one_message(capsys, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('no data here')\n")
    code, _, err = run_cli(capsys, "--tolerance", "1e-3", "--script", str(script))
    assert code == 2 and "reference run exited with 1" in err and "no data here" in err


def test_script_that_writes_no_losses(capsys, tmp_path):
    script = tmp_path / "silent.py"
    script.write_text("print('trained')\n")
    code, _, err = run_cli(capsys, "--tolerance", "1e-3", "--script", str(script))
    assert code == 2 and "wrote no losses" in err


# -- bad input and the optional PNG ---------------------------------------------------------


def test_tolerance_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["parity", "--steps", "5"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--tolerance" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--tolerance", "nan"], "--tolerance"),
        (["--tolerance", "-1"], "--tolerance"),
        (["--tolerance", "1e-3", "--steps", "0"], "--steps"),
        (["--tolerance", "1e-3", "--steps", "5", "--compare", "3,9"], "--compare"),
        (["--tolerance", "1e-3", "--compare", "a"], "--compare"),
        (["--tolerance", "1e-3", "--script", "no_such_script.py"], "--script"),
        (["--tolerance", "1e-3", "--json", "/no/such/folder/p.json"], "--json"),
        (["--tolerance", "1e-3", "--", "--epochs", "1"], "only for --script"),
        (["--tolerance", "1e-3", "--device", "quantum"], "--device quantum"),
    ],
)
def test_bad_input_is_one_line(argv, names, capsys):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert names in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_png_without_matplotlib_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    monkeypatch.setattr(parity.importlib.util, "find_spec", lambda name: None)
    code, _, err = run_cli(capsys, "--tolerance", "1e-3", "--png", str(tmp_path / "p.png"))
    assert code == 2 and "needs matplotlib" in err and "neuron-kernels[plot]" in err


def test_png_is_written_when_matplotlib_is_installed(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    script = tmp_path / "train.py"
    script.write_text(OFFSET_SCRIPT)
    png = tmp_path / "p.png"
    code, out, _ = run_cli(
        capsys, "--tolerance", "2e-3", "--png", str(png), "--script", str(script), "--",
        "0.01", "{losses}",
    )  # fmt: skip
    assert code == 1 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "written",
    ["[]", '["0.5", "0.4"]', "[[0.5], [0.4]]", '{"losses": []}', '"0.5"'],
    ids=["empty", "strings", "nested", "empty-dict", "string"],
)
def test_script_losses_that_are_not_a_list_of_numbers_are_one_line(capsys, tmp_path, written):
    """Issue 32 item 6: ``[]`` used to crash the trend fit; every bad losses file is one line
    naming the script and the run."""
    script = tmp_path / "odd.py"
    script.write_text(
        "import os\nopen(os.environ['NEURON_KERNELS_PARITY_LOSSES'], 'w').write("
        + repr(written)
        + ")\n"
    )
    code, _, err = run_cli(capsys, "--tolerance", "1e-3", "--script", str(script))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--script {script}" in err and "reference run" in err


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--seq-len", "100000000", "--steps", "1"], "--seq-len 100000000"),
        (["--device", "meta", "--steps", "1"], "--device meta: holds no data"),
    ],
)
def test_example_inputs_refused_before_training(capsys, argv, says):
    code, _, err = run_cli(capsys, "--tolerance", "1", *argv)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert says in err
