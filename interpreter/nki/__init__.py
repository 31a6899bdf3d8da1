"""``nki`` on the interpreter: ``jit``, ``simulate`` and the ``language`` / ``isa`` namespaces.

Mirrors aws-neuron/aws-neuron-sdk nki/api/nki/__init__.py, so a kernel written against
``import nki`` runs here unchanged when it imports NKI from ``neuron_kernels.backend``.

Importing it loads no instruction, tensor or ml_dtypes: ``jit`` wraps a function
(:mod:`..kernel`), ``language`` and ``isa`` load their names on first use
(:mod:`..deferred`), and ``typing`` loads when read.
"""

from __future__ import annotations

import importlib

from neuron_kernels.interpreter.errors import not_implemented as _not_implemented
from neuron_kernels.interpreter.kernel import Kernel, jit, simulate
from neuron_kernels.interpreter.nki import isa, language

# ``nki.dtype``: the type of a dtype, used in annotations (``compute_dtype: nki.dtype``);
# dtypes are strings in the API (``DType = str``, nki/api/nki/language/__init__.py).
dtype = str

__all__ = ["jit", "simulate", "Kernel", "language", "isa", "typing", "dtype"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "typing":  # its annotations hold the tensor model: loaded when read
        return importlib.import_module(f"{__name__}.typing")
    raise _not_implemented(
        f"nki.{name}", known=name in {"collectives", "benchmark", "profile", "baremetal"}
    )
