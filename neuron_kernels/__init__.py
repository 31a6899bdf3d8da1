"""neuron-kernels: hand-written NKI kernels for AWS Trainium.

The root stays light: importing it does not import torch or the interpreter. Kernels get
NKI from :mod:`neuron_kernels.backend`; PyTorch ops live in :mod:`neuron_kernels.torch_ops`.
"""

from neuron_kernels._version import __version__
from neuron_kernels.errors import LimitError

__all__ = ["LimitError", "__version__"]
