"""``nki`` on the interpreter: ``jit``, ``simulate`` and the ``language`` / ``isa`` namespaces.

Mirrors aws-neuron/aws-neuron-sdk nki/api/nki/__init__.py, so a kernel written against
``import nki`` runs here unchanged when it imports NKI from ``neuron_kernels.backend``.
"""

from __future__ import annotations

from neuron_kernels.interpreter.errors import not_implemented as _not_implemented
from neuron_kernels.interpreter.execution import Kernel, jit, simulate
from neuron_kernels.interpreter.nki import isa, language, typing

# ``nki.dtype``: the type of a dtype, used in annotations (``compute_dtype: nki.dtype``);
# dtypes are strings in the API (``DType = str``, nki/api/nki/language/__init__.py).
dtype = language.DType

__all__ = ["jit", "simulate", "Kernel", "language", "isa", "typing", "dtype"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _not_implemented(
        f"nki.{name}", known=name in {"collectives", "benchmark", "profile", "baremetal"}
    )
