"""neuron-kernels: hand-written NKI kernels for AWS Trainium.

``import neuron_kernels`` registers every op as ``torch.ops.neuron.<op>`` (through
:mod:`neuron_kernels.torch_ops`). Kernels get NKI from :mod:`neuron_kernels.backend`; the
cost model and the CLIs are loaded only by what uses them.
"""

from neuron_kernels._version import __version__
from neuron_kernels.errors import LimitError

__all__ = ["LimitError", "__version__"]

from neuron_kernels import torch_ops  # noqa: E402,F401  (registers torch.ops.neuron.*)
