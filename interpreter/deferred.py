"""A namespace whose names load on first use: the interpreter's ``nki.language`` and
``nki.isa`` are such shells over their implementations (``nki/_language.py``,
``nki/_isa.py``).

Why: every kernel module binds ``nl`` and ``nisa`` at import and declares its records as
``nl.NKIObject`` subclasses ("the class must inherit from NKIObject", the NKI language
guide's "Class Support"), so ``import neuron_kernels`` must give it those names. The
instructions, the tensor model and NumPy's ml_dtypes (1.5 s of import on its own) are
needed only when a kernel first runs: the first name a kernel reads through the shell
loads the implementation, and from then on every name of it answers from the shell's own
dictionary (the same objects, so ``nl.ndarray is _language.ndarray``). A name the
implementation lacks still raises its error naming the API (the implementation's module
``__getattr__``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["forward_to"]


def forward_to(shell: dict, implementation: str) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for the module whose globals are ``shell``: a missing name
    imports ``implementation``, copies its names into ``shell`` (names the shell defines
    itself are kept) and answers from it."""

    loaded = []  # the implementation, once its names are in the shell

    def load():
        if not loaded:
            module = importlib.import_module(implementation)
            for name, value in vars(module).items():
                if not name.startswith("__"):
                    shell.setdefault(name, value)
            loaded.append(module)
        return loaded[0]

    def __getattr__(name: str):
        if name == "__all__":  # the implementation's public names
            return shell.setdefault("__all__", list(load().__all__))
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(load(), name)

    def __dir__():
        return sorted(set(shell) | set(dir(load())))

    return __getattr__, __dir__
