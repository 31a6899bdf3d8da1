"""Where an op runs: the NKI kernel on ``neuron`` tensors, reference math elsewhere, or the
NKI kernel on the interpreter for CPU tensors when asked.

``NEURON_KERNELS_CPU=reference|interpret`` (default ``reference``) is read at each call;
``with cpu_mode("interpret"):`` does the same for a block of code and wins over the variable.

The rollback switch ``NEURON_KERNELS_DISABLE=1`` (read at each call) makes every op run its
reference math on every device, the ``neuron`` device included, and wins over both: the
way back to the pre-kernel path without a code change.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

from neuron_kernels import tuned_configs
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import default_target, launch_lnc, target_from_name
from neuron_kernels.kernels.spec import FunctionRunner, dtype_name

__all__ = [
    "CPU_MODE_ENV",
    "DISABLE_ENV",
    "cpu_mode",
    "cpu_runner",
    "current_cpu_mode",
    "interpreter_runner",
    "kernels_disabled",
    "select_config",
]

CPU_MODE_ENV = "NEURON_KERNELS_CPU"
CPU_MODES = ("reference", "interpret")
DISABLE_ENV = "NEURON_KERNELS_DISABLE"
_DISABLE_ON, _DISABLE_OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
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


def kernels_disabled() -> bool:
    """True when the rollback switch ``NEURON_KERNELS_DISABLE`` is on (1/true/yes/on): every
    op then runs its reference math on every device. Unset, empty or 0/false/no/off: off."""
    value = os.environ.get(DISABLE_ENV, "").strip().lower()
    if value in _DISABLE_ON:
        return True
    if value in _DISABLE_OFF:
        return False
    raise LimitError(
        "neuron_kernels.torch_ops",
        DISABLE_ENV,
        f"must be one of {'|'.join(_DISABLE_ON)} (on) or {'|'.join(_DISABLE_OFF[1:])} (off)",
        value,
    )


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


def cpu_runner() -> FunctionRunner:
    """The runner for CPU tensors in ``interpret`` mode, for the interpreter's default target
    (``NEURON_PLATFORM_TARGET_OVERRIDE``, else trn2) at the LNC a launch there would use
    (:func:`~neuron_kernels.hardware.launch_lnc`: trn2's default is 2). It calls
    :func:`interpreter_runner` by name at each call, so tests can count the kernels it runs."""
    target = default_target()
    return FunctionRunner(
        lambda kernel, *a, **kw: interpreter_runner(kernel, *a, **kw), target, launch_lnc(target)
    )


def select_config(spec, args, target, lnc: int = 1) -> tuned_configs.ConfigChoice:
    """The tuned config for this call's problem, dtype, target and launch LNC, else the
    default (the dtype is the first argument's, or its first tensor's for a tensor-list
    argument)."""
    first = args[0]
    if isinstance(first, (list, tuple)) and first:
        first = first[0]
    return tuned_configs.lookup(
        spec, spec.problem(*args), dtype_name(first), target_from_name(target).name, lnc=lnc
    )
