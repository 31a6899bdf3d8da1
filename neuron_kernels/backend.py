"""The NKI a kernel runs on: AWS's ``nki`` package when installed, else our interpreter.

Kernels import NKI only from here::

    from neuron_kernels.backend import nki, nl, nisa

``NEURON_KERNELS_NKI=auto|interpreter|nki`` forces the choice (read at import). Asking for
``nki`` where it is not installed is an error, never a silent fallback.

The choice is made at import; with the interpreter, its ``nki.language`` and ``nki.isa`` are
shells that load the interpreter at the first name a kernel reads (a launch): importing the
kernel modules binds only ``nki.jit`` and ``nl.NKIObject`` (interpreter/deferred.py).
"""

from __future__ import annotations

import importlib
import os

__all__ = ["nki", "nl", "nisa", "name", "BACKEND_ENV", "resolve"]

BACKEND_ENV = "NEURON_KERNELS_NKI"
_CHOICES = ("auto", "interpreter", "nki")


class BackendError(ImportError):
    """The requested NKI backend cannot be used.

    Attributes:
        setting: the environment variable (``NEURON_KERNELS_NKI``).
        value: its value.
        why: the rule it broke or what is missing, for a one-line CLI error.
    """

    def __init__(self, message: str, value: str = "", why: str = "") -> None:
        super().__init__(message)
        self.setting, self.value, self.why = BACKEND_ENV, value, why or message


def _official():
    try:
        nki_mod = importlib.import_module("nki")
        return nki_mod, importlib.import_module("nki.language"), importlib.import_module("nki.isa")
    except ImportError:
        return None


def _interpreter():
    from neuron_kernels.interpreter import nki as nki_mod

    return nki_mod, nki_mod.language, nki_mod.isa


def resolve(choice: str | None = None):
    """Return ``(name, nki, nl, nisa)`` for ``choice`` (default: the environment variable)."""
    choice = (
        choice if choice is not None else os.environ.get(BACKEND_ENV, "auto")
    ).strip().lower() or "auto"
    if choice not in _CHOICES:
        rule = f"must be one of {'|'.join(_CHOICES)}"
        raise BackendError(f"{BACKEND_ENV} {rule}, got {choice!r}", choice, rule)
    if choice == "interpreter":
        return ("interpreter", *_interpreter())
    official = _official()
    if official is not None:
        return ("nki", *official)
    if choice == "nki":
        raise BackendError(
            f"{BACKEND_ENV}=nki, but the 'nki' package is not installed. It comes from AWS's Neuron "
            "package repository on Trn2/Trn3 nodes: pip install 'neuron-kernels[neuron]' "
            "--extra-index-url https://pip.repos.neuron.amazonaws.com",
            choice,
            "the 'nki' package is not installed (pip install 'neuron-kernels[neuron]' "
            "--extra-index-url https://pip.repos.neuron.amazonaws.com), or use auto",
        )
    return ("interpreter", *_interpreter())


name, nki, nl, nisa = resolve()
