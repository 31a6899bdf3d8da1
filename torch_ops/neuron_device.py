"""The one place that touches TorchNeuron (``torch_neuronx``): the ``neuron`` device.

TorchNeuron registers PyTorch's PrivateUse1 backend under the name ``neuron``. Its
``nki_op`` integration is only partly documented, so the ops register their neuron kernel
through plain ``torch.library`` on that dispatch key and call the ``@nki.jit`` kernel with
``neuron`` tensors, which the documented NKI PyTorch integration accepts.
"""

from __future__ import annotations

import importlib

import torch

from neuron_kernels.hardware import Target, default_target, launch_lnc
from neuron_kernels.kernels.spec import FunctionRunner

__all__ = [
    "call_jitted",
    "device_key",
    "device_runner",
    "device_target",
    "torch_neuronx_available",
]


def torch_neuronx_available() -> bool:
    try:
        importlib.import_module("torch_neuronx")  # registers the `neuron` device
    except ImportError:
        return False
    return True


def device_key() -> str:
    """The device-type name of PrivateUse1 (``neuron`` once TorchNeuron is imported)."""
    torch_neuronx_available()
    return torch._C._get_privateuse1_backend_name()


def device_target() -> Target:
    """The Trainium generation of this node (``NEURON_PLATFORM_TARGET_OVERRIDE``, else trn2)."""
    return default_target()


def call_jitted(kernel, *args, **kwargs):
    """Run one jitted NKI kernel on ``neuron`` tensors (compiled by neuronx-cc)."""
    return kernel(*args, **kwargs)


def device_runner() -> FunctionRunner:
    """The runner for ``neuron`` tensors: the jitted kernels, planned for this node's target
    and launched at its LNC (:func:`~neuron_kernels.hardware.launch_lnc`: the variable, else
    torch-neuronx's logical core count, else the target's default)."""
    target = device_target()
    return FunctionRunner(call_jitted, target, launch_lnc(target))
