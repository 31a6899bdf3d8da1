"""The README's command sequence for tuning on a fresh Trn2 node is what the CLI accepts.

The sequence (README.md, "On a Trn2 node: ``--backend hardware``") cannot run here (no
NeuronCore), so this holds its text to the code: every ``neuron-kernels`` line parses with the
subcommand's own parser (a renamed or removed flag fails here, not on the node), the nrtpy
environment is created with the command ``doctor`` and ``autotune`` print when it is missing
(``hw_node.NRTPY_SETUP``, from neuron-runtime/nrtpy/nrtpy-getting-started.rst: ``python3 -m
venv ~/nrtpy_venv`` and ``pip install nrtpy --extra-index-url=https://pip.repos.neuron.amazonaws.com``),
and the interpreter is handed over through the variable the backend reads.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from neuron_kernels.autotune import hw_node
from neuron_kernels.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _sequence() -> list[str]:
    text = README.read_text()
    after = text[text.index("On a fresh Trn2 node (Neuron DLAMI)") :]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def _command(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def test_every_neuron_kernels_line_parses_with_its_subcommand_parser():
    lines = [_command(x) for x in _sequence() if x.startswith("neuron-kernels ")]
    assert [x[1] for x in lines] == ["doctor", "autotune", "autotune"]
    for argv in lines:
        argv = argv[: argv.index("|")] if "|" in argv else argv
        args = build_parser(argv[1]).parse_args(argv[1:])  # SystemExit on an unknown flag
        if argv[1] == "autotune":
            assert args.op == "matmul" and args.backend == "hardware"
    smoke, tune = lines[1], lines[2]
    assert smoke[smoke.index("--trials") + 1] == "1" and "--no-write" in smoke  # one trial
    assert "--trials" not in tune and "--no-write" not in tune  # the full budget, written


def test_the_nrtpy_environment_is_the_one_the_backend_asks_for():
    lines = _sequence()
    venv, pip = (part.split(", then")[0] for part in hw_node.NRTPY_SETUP.split(" && "))
    assert venv in lines and pip in lines
    (export,) = [x for x in lines if x.startswith("export NEURON_KERNELS")]
    assert _command(export)[1].startswith(f"{hw_node.NRTPY_PYTHON_ENV}=")
    assert any(x.startswith('source "$DLAMI_PYTORCH_VENV/bin/activate"') for x in lines)
    assert any(
        x.startswith("DLAMI_PYTORCH_VENV=$(ls -d /opt/aws_neuronx_venv_pytorch_") for x in lines
    )
