"""neuron-kernels: hand-written NKI kernels for AWS Trainium.

``import neuron_kernels`` registers every op as ``torch.ops.neuron.<op>`` (through
:mod:`neuron_kernels.torch_ops`, :func:`register_ops`). Kernels get NKI from
:mod:`neuron_kernels.backend`; the cost model, the tuner and the CLIs are loaded only by
what uses them, and the interpreter (when it is the NKI) at a kernel's first launch: the
kernel modules bind only its ``nki.jit`` and ``nl.NKIObject`` when they load.

The ``neuron-kernels`` command starts without the ops: ``--version`` and ``--help`` load
neither torch nor a kernel, and a subcommand registers them (:func:`register_ops`) once its
command line parsed. A ``NEURON_KERNELS_NKI`` the backend cannot honour is then kept in
:data:`BACKEND_ERROR` instead of raised (``doctor`` reports it, every other subcommand
refuses in one line); for any other import it is an ``ImportError`` here.
"""

import os as _os
import sys as _sys

from neuron_kernels._version import __version__
from neuron_kernels.errors import LimitError

__all__ = ["BACKEND_ERROR", "LimitError", "__version__", "register_ops"]

BACKEND_ERROR = None  # the backend's ImportError when the CLI started without the ops


def _starting_the_cli() -> bool:
    """True when this process is ``neuron-kernels ...`` or ``python -m neuron_kernels.cli``."""
    argv = getattr(_sys, "orig_argv", None) or _sys.argv
    if _sys.argv and _os.path.basename(_sys.argv[0]) in ("neuron-kernels", "neuron-kernels.exe"):
        return True
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1] in ("neuron_kernels.cli", "neuron_kernels.cli.__main__")
    return False


def register_ops() -> None:
    """Register every op as ``torch.ops.neuron.<op>`` (imports torch and the kernels; once).

    Raises:
        ImportError: the NKI backend cannot be used, unless this process is the
            ``neuron-kernels`` command, which keeps it in :data:`BACKEND_ERROR`.
    """
    global BACKEND_ERROR
    try:
        from neuron_kernels import torch_ops  # noqa: F401  (registers torch.ops.neuron.*)
    except ImportError as exc:
        # neuron_kernels.backend.BackendError (that module cannot be imported again to name it)
        if not (getattr(exc, "setting", None) == "NEURON_KERNELS_NKI" and _starting_the_cli()):
            raise
        BACKEND_ERROR = exc


if not _starting_the_cli():
    register_ops()
