"""The README says torch.func transforms over our custom ops are a PyTorch limit; this test
holds that sentence to the installed PyTorch (it fails, asking for a README update, the day
PyTorch lifts the limit)."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, jacrev

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)


@pytest.mark.parametrize("transform", [grad, jacrev], ids=["grad", "jacrev"])
def test_functorch_transforms_over_a_custom_op_are_refused_by_pytorch(transform):
    b = torch.ones(3, 2)

    def f(a):
        return torch.ops.neuron.matmul(a, b).sum()

    with pytest.raises(RuntimeError, match="functorch transforms"):
        transform(f)(torch.ones(2, 3))
    # ...while plain autograd gives the gradient
    a = torch.ones(2, 3, requires_grad=True)
    f(a).backward()
    torch.testing.assert_close(a.grad, torch.full((2, 3), 2.0))
