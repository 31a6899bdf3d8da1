"""PyTorch ops for every kernel: ``torch.ops.neuron.<op>`` with fake impls, autograd and
device routing (NKI kernel on ``neuron`` tensors, reference math elsewhere, the kernel on
the interpreter for CPU tensors under ``NEURON_KERNELS_CPU=interpret`` or
``cpu_mode("interpret")``). Importing this package registers every op in the registry.
"""

from neuron_kernels.kernels import REGISTRY
from neuron_kernels.torch_ops.library import register_op
from neuron_kernels.torch_ops.routing import CPU_MODE_ENV, cpu_mode, current_cpu_mode

__all__ = ["CPU_MODE_ENV", "cpu_mode", "current_cpu_mode", "register_op", "OPS"]

OPS = {name: register_op(spec) for name, spec in REGISTRY.items()}
