"""The portable NKI interpreter: ``nki`` / ``nki.language`` / ``nki.isa`` in NumPy.

It mirrors the API of AWS's ``nki.simulate`` (the official CPU simulator) and adds what that
simulator lacks: SBUF/PSUM capacity checks and an instruction trace. Kernels reach it through
:mod:`neuron_kernels.backend`, which imports only the light part (``nki.jit`` and
``nl.NKIObject``, :mod:`.deferred`); :func:`run` gives a launch's outputs, trace and on-chip peaks,
for any kernel, whichever ``nki`` its module bound at import. The cost model that schedules
the trace lives one layer up, in :mod:`neuron_kernels.cost_model`.
"""

import importlib

from neuron_kernels.hardware import TARGETS, Target, default_target, target_from_name
from neuron_kernels.interpreter import nki
from neuron_kernels.interpreter.errors import NkiValidationError, NotImplementedByInterpreter
from neuron_kernels.interpreter.kernel import Kernel

# Loaded when first read: running a kernel needs them, importing the kernels does not.
_LAZY = {
    "run": "execution",
    "Run": "execution",
    "Access": "trace",
    "Instruction": "trace",
    "Trace": "trace",
}

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


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
