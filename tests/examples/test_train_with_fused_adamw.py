"""The FusedAdamW training example: the fused kernel (interpreted) and the op's reference
math both follow torch.optim.AdamW through GradScaler skips and an LR schedule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_with_fused_adamw.py"


def _run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("args", [[], ["--reference", "--steps", "8"]], ids=["kernel", "reference"])
def test_example_matches_adamw(args):
    result = _run(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "-> PASS" in result.stdout and "FAIL" not in result.stdout
    assert result.stderr == "", result.stderr  # no warnings for a new user to puzzle over


def test_the_loop_does_not_name_an_optimizer():
    """The switch is the optimizer class passed in: train() mentions neither class."""
    source = SCRIPT.read_text()
    body = source[source.index("def train(") : source.index("class OneLineErrors")]
    assert "optimizer_cls(groups" in body
    assert "AdamW" not in body.replace("optimizer_cls", "")


def test_bad_steps_is_one_line():
    result = _run("--steps", "2")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--steps" in result.stderr
