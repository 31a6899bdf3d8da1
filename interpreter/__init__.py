"""The portable NKI interpreter: ``nki`` / ``nki.language`` / ``nki.isa`` in NumPy.

It mirrors the API of AWS's ``nki.simulate`` (the official CPU simulator) and adds what that
simulator lacks: SBUF/PSUM capacity checks and an instruction trace. Kernels reach it through
:mod:`neuron_kernels.backend`; :func:`run` gives a launch's outputs, trace and on-chip peaks,
for any kernel, whichever ``nki`` its module bound at import. The cost model that schedules
the trace lives one layer up, in :mod:`neuron_kernels.cost_model`.
"""

from neuron_kernels.hardware import TARGETS, Target, default_target, target_from_name
from neuron_kernels.interpreter import nki
from neuron_kernels.interpreter.errors import NkiValidationError, NotImplementedByInterpreter
from neuron_kernels.interpreter.execution import Kernel, Run, run
from neuron_kernels.interpreter.trace import Access, Instruction, Trace

__all__ = [
    "nki",
    "run",
    "Run",
    "Kernel",
    "NkiValidationError",
    "NotImplementedByInterpreter",
    "Target",
    "TARGETS",
    "default_target",
    "target_from_name",
    "Access",
    "Instruction",
    "Trace",
]
