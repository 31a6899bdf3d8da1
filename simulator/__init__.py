"""The portable NKI interpreter: ``nki`` / ``nki.language`` / ``nki.isa`` in NumPy.

Use it through :mod:`neuron_kernels.backend` in kernels; use :func:`run` to get the
instruction trace and on-chip memory peaks of a launch.
"""

from neuron_kernels.simulator import nki
from neuron_kernels.simulator.errors import NkiValidationError, NotImplementedBySimulator
from neuron_kernels.simulator.launch import Kernel, Run, run
from neuron_kernels.simulator.limits import TARGETS, Target, default_target, target_from_name
from neuron_kernels.simulator.profile import profile
from neuron_kernels.simulator.trace import Access, Instruction, Trace

__all__ = [
    "nki", "run", "Run", "Kernel", "NkiValidationError", "NotImplementedBySimulator",
    "Target", "TARGETS", "default_target", "target_from_name", "Access", "Instruction", "Trace",
    "profile",
]
