"""A test double of TorchNeuron's ``torch_neuronx`` 2.14, written from its published surface
(public copy ``parmoham-aws/test-repo-parmoham``; AWS's "How to work with NKI kernels from
torch-neuronx"). Not AWS's package: see ``../README.md`` for what it plays and what it does not.

Importing it names PyTorch's PrivateUse1 backend ``neuron`` (``torch_neuronx/__init__.py``
line 119), registers its device module (line 122) and exposes ``nki_op`` and ``wrap_nki`` (``torch_neuronx/nki_hop.py``).
"""

from __future__ import annotations

import torch

__version__ = "2.14.0"

from torch_neuronx import neuron  # noqa: E402

if torch._C._get_privateuse1_backend_name() != "neuron":
    torch.utils.rename_privateuse1_backend("neuron")  # __init__.py:119
    torch._register_device_module("neuron", neuron)  # __init__.py:122

from torch_neuronx.nki_hop import nki_op, wrap_nki  # noqa: E402

__all__ = ["nki_op", "wrap_nki", "__version__"]
