"""Where an op runs: the NKI kernel on ``neuron`` tensors, reference math elsewhere, or the
NKI kernel on the interpreter for CPU tensors when asked.

``NEURON_KERNELS_CPU=reference|interpret`` (default ``reference``) is read at each call;
``with cpu_mode("interpret"):`` does the same for a block of code and wins over the variable.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

from neuron_kernels.autotune import results
from neuron_kernels.errors import LimitError

__all__ = ["CPU_MODE_ENV", "cpu_mode", "current_cpu_mode", "interpreter_runner", "select_config"]

CPU_MODE_ENV = "NEURON_KERNELS_CPU"
CPU_MODES = ("reference", "interpret")
_OVERRIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "neuron_kernels_cpu_mode", default=None
)


def _check_mode(mode: str, source: str) -> str:
    mode = mode.strip().lower()
    if mode not in CPU_MODES:
        raise LimitError(
            "neuron_kernels.torch_ops", source, f"must be one of {'|'.join(CPU_MODES)}", mode
        )
    return mode


def current_cpu_mode() -> str:
    """The routing for CPU tensors right now: the context manager's, else the variable's."""
    override = _OVERRIDE.get()
    if override is not None:
        return override
    return _check_mode(os.environ.get(CPU_MODE_ENV, "reference") or "reference", CPU_MODE_ENV)


@contextlib.contextmanager
def cpu_mode(mode: str):
    """Route CPU tensors to ``"reference"`` math or the ``"interpret"``-ed NKI kernel in a block."""
    token = _OVERRIDE.set(_check_mode(mode, "cpu_mode"))
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def interpreter_runner(kernel, *args, **kwargs):
    """Run one NKI kernel on CPU tensors through the backend's ``nki.simulate``
    (our interpreter, or AWS's simulator where the nki package is installed)."""
    from neuron_kernels.backend import nki

    return nki.simulate(kernel)(*args, **kwargs)


def select_config(spec, args, target: str) -> results.ConfigChoice:
    """The tuned config for this call's problem, dtype and target, else the default."""
    dtype = str(args[0].dtype).removeprefix("torch.")
    return results.lookup(spec, spec.problem(*args), dtype, target)
