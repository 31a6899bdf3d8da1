"""neuron-kernels: hand-written NKI kernels for AWS Trainium.

``import neuron_kernels`` registers every op as ``torch.ops.neuron.<op>`` (through
:mod:`neuron_kernels.torch_ops`). Kernels get NKI from :mod:`neuron_kernels.backend`; the
cost model and the CLIs are loaded only by what uses them.

A ``NEURON_KERNELS_NKI`` the backend cannot honour is an ``ImportError`` here, except when
this import is the ``neuron-kernels`` command starting: the command must still run (so
``doctor`` can report it, and every other subcommand refuses in one line), so the error is
kept in :data:`BACKEND_ERROR` and the ops are not registered.
"""

import os as _os
import sys as _sys

from neuron_kernels._version import __version__
from neuron_kernels.errors import LimitError

__all__ = ["BACKEND_ERROR", "LimitError", "__version__"]

BACKEND_ERROR = None  # the backend's ImportError when the CLI started without the ops


def _starting_the_cli() -> bool:
    """True when this process is ``neuron-kernels ...`` or ``python -m neuron_kernels.cli``."""
    argv = getattr(_sys, "orig_argv", None) or _sys.argv
    if _sys.argv and _os.path.basename(_sys.argv[0]) in ("neuron-kernels", "neuron-kernels.exe"):
        return True
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1] in ("neuron_kernels.cli", "neuron_kernels.cli.__main__")
    return False


try:
    from neuron_kernels import torch_ops  # noqa: E402,F401  (registers torch.ops.neuron.*)
except ImportError as _exc:
    # neuron_kernels.backend.BackendError (that module cannot be imported again to name it)
    if not (getattr(_exc, "setting", None) == "NEURON_KERNELS_NKI" and _starting_the_cli()):
        raise
    BACKEND_ERROR = _exc
