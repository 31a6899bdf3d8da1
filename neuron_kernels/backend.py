"""The NKI a kernel runs on: AWS's ``nki`` package when installed, else our interpreter.

Kernels import NKI only from here::

    from neuron_kernels.backend import nki, nl, nisa

``NEURON_KERNELS_NKI=auto|interpreter|nki`` forces the choice (read at import). Asking for
``nki`` where it is not installed is an error, never a silent fallback.
"""

from __future__ import annotations

import importlib
import os

__all__ = ["nki", "nl", "nisa", "name", "BACKEND_ENV", "resolve"]

BACKEND_ENV = "NEURON_KERNELS_NKI"
_CHOICES = ("auto", "interpreter", "nki")


class BackendError(ImportError):
    """The requested NKI backend cannot be used."""


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
        raise BackendError(f"{BACKEND_ENV} must be one of {'|'.join(_CHOICES)}, got {choice!r}")
    if choice == "interpreter":
        return ("interpreter", *_interpreter())
    official = _official()
    if official is not None:
        return ("nki", *official)
    if choice == "nki":
        raise BackendError(
            f"{BACKEND_ENV}=nki, but the 'nki' package is not installed. It comes from AWS's Neuron "
            "package repository on Trn2/Trn3 nodes: pip install 'neuron-kernels[neuron]' "
            "--extra-index-url https://pip.repos.neuron.amazonaws.com"
        )
    return ("interpreter", *_interpreter())


name, nki, nl, nisa = resolve()
