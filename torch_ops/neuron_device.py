"""The one place that touches TorchNeuron (``torch_neuronx``): the ``neuron`` device.

TorchNeuron registers PyTorch's PrivateUse1 backend under the name ``neuron``
(``torch_neuronx/__init__.py``: ``rename_privateuse1_backend("neuron")``). Its contract for
NKI kernels (``torch_neuronx/nki_hop.py``; AWS's "How to work with NKI kernels from
torch-neuronx") is ``nki_op("ns::name", body, mutates_args=...)`` around a body that calls
``wrap_nki(kernel)[grid](...)``: each such call becomes one ``nki_kernel_wrapper`` node that
``torch.compile(backend="neuron")`` lowers with the rest of the graph. Where ``torch_neuronx``
has no ``nki_op`` (not installed, or an older line), the ops register their neuron kernel
through plain ``torch.library`` on that dispatch key instead.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target, default_target, launch_lnc
from neuron_kernels.kernels.spec import FunctionRunner

__all__ = [
    "call_jitted",
    "device_key",
    "device_runner",
    "device_target",
    "is_neuron",
    "nki_op_api",
    "torch_neuronx_available",
    "wrap_nki_runner",
]


def torch_neuronx_available() -> bool:
    try:
        importlib.import_module("torch_neuronx")  # registers the `neuron` device
    except ImportError:
        return False
    return True


def nki_op_api():
    """``(nki_op, wrap_nki)`` from ``torch_neuronx`` when it imports and has them, else None."""
    if not torch_neuronx_available():
        return None
    module = importlib.import_module("torch_neuronx")
    nki_op, wrap_nki = getattr(module, "nki_op", None), getattr(module, "wrap_nki", None)
    if nki_op is None or wrap_nki is None:
        return None
    return nki_op, wrap_nki


def device_key() -> str:
    """The device-type name of PrivateUse1 (``neuron`` once TorchNeuron is imported)."""
    torch_neuronx_available()
    return torch._C._get_privateuse1_backend_name()


def is_neuron(tensor: torch.Tensor) -> bool:
    """True for a tensor on the ``neuron`` device (fake and functional tensors included: they
    report the device they stand for). Called by name at each call, so a test double of
    torch-neuronx can let CPU tensors play the device."""
    return tensor.device.type == device_key()


def device_target() -> Target:
    """The Trainium generation of this node: ``NEURON_PLATFORM_TARGET_OVERRIDE``, else what
    torch-neuronx reports (``get_platform_target()``), else trn2."""
    return default_target()


def call_jitted(kernel, *args, **kwargs):
    """Run one jitted NKI kernel on ``neuron`` tensors (compiled by neuronx-cc)."""
    return kernel(*args, **kwargs)


def device_runner() -> FunctionRunner:
    """The runner for ``neuron`` tensors without ``nki_op``: the jitted kernels, called
    directly, planned for this node's target and launched at its LNC
    (:func:`~neuron_kernels.hardware.launch_lnc`: the variable, else torch-neuronx's logical
    core count, else the target's default)."""
    target = device_target()
    return FunctionRunner(call_jitted, target, launch_lnc(target))


def _check_operands(kernel, args, kwargs) -> None:
    """``wrap_nki`` carries only top-level tensors as operands; any other argument is a
    compile-time constant (``torch_neuronx/nki_hop.py`` ``get_dconfig_and_tensor_args``). A
    tensor inside a tuple or list would be baked in or dropped, never read or written on the
    device: refuse it, loudly, before the launch."""
    fn = getattr(kernel, "func", None) or getattr(kernel, "fn", None) or kernel
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    names = [params[i] if i < len(params) else f"argument {i}" for i in range(len(args))]
    named = list(zip(names, args)) + list(kwargs.items())
    for name, value in named:
        if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
            raise LimitError(
                getattr(kernel, "__name__", str(kernel)),
                name,
                "must be a tensor or a constant: torch_neuronx.wrap_nki passes only top-level "
                "tensors to a kernel",
                f"a {type(value).__name__} of {len(value)} tensors",
            )


def wrap_nki_runner(wrapped: dict) -> FunctionRunner:
    """The runner for ``neuron`` tensors under ``nki_op``: each kernel through its
    ``wrap_nki(kernel)`` (built once, at registration), launched on the LNC grid
    (``wrapped[kernel][(lnc,)](...)``), planned for this node's target."""
    target = device_target()
    lnc = launch_lnc(target)

    def base(kernel):
        """The kernel function under a jitted kernel or its ``kernel[grid]`` launch."""
        return getattr(kernel, "fn", None) or getattr(kernel, "func", None) or kernel

    by_function = {base(k): w for k, w in wrapped.items()}

    def launch(kernel, *args, **kwargs):
        # run_kernels launches ``kernel[plan.lnc]``; wrap_nki was built on the kernel itself.
        grid = getattr(kernel, "grid", None)
        if grid and tuple(grid) != (lnc,):
            raise LimitError(
                "neuron_kernels.torch_ops",
                "launch grid",
                f"must be the node's LNC ({lnc},)",
                tuple(grid),
            )
        kernel = base(kernel)
        if kernel not in by_function:
            raise LimitError(
                "neuron_kernels.torch_ops",
                "kernel",
                "must be one of the op's declared kernels (OpSpec.kernels)",
                getattr(kernel, "__name__", str(kernel)),
            )
        _check_operands(kernel, args, kwargs)
        # The grid is a sequence: torch_neuronx's caller maps int over it (nki_hop.py
        # NKIHOPCaller.__getitem__), as its own kernels launch ``[(lnc,)]`` (grouped_mm.py).
        return by_function[kernel][(lnc,)](*args, **kwargs)

    return FunctionRunner(launch, target, lnc)
