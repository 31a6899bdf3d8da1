"""The double's ``neuron`` compile backend, registered by the same entry point as the real
one (``pyproject.toml`` ``[project.entry-points."torch_dynamo_backends"]``, here in
``torch_neuronx-2.14.0.dist-info/entry_points.txt``).

The real backend (``neuron_dynamo_backend/backend.py`` lines 272-305) runs AOTAutograd with
``keep_inference_input_mutations=True`` and hands each forward and backward graph to a
compiler that lowers it through torch-mlir to StableHLO (lines 122-249): ATen ops and the
``nki_kernel_wrapper`` node have lowerings, a third-party op (a bare ``neuron::*`` node) or
``auto_functionalized*`` has none, and setup fails with "Neuron backend NEFF execution setup
failed with unexpected error" (line 246). The double checks exactly that, checks every
kernel-wrapper node's LNC (EVRF066), keeps each graph in ``COMPILED_GRAPHS`` for tests, and
runs the graph as it is (kernels on the interpreter).
"""

from __future__ import annotations

import operator

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from torch_neuronx.nki_hop import check_lnc, nki_kernel_wrapper

__all__ = ["COMPILED_GRAPHS", "UnsupportedNode", "neuron_backend"]

COMPILED_GRAPHS: list[torch.fx.GraphModule] = []


class UnsupportedNode(RuntimeError):
    """A graph node with no StableHLO lowering."""


def _lowerable(target) -> bool:
    if target is operator.getitem or target is nki_kernel_wrapper:
        return True
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"


def _compile(gm: torch.fx.GraphModule, example_inputs):
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if not _lowerable(node.target):
            raise UnsupportedNode(
                "Neuron backend NEFF execution setup failed with unexpected error: no "
                f"StableHLO lowering for {node.target} (node {node.name})"
            )
        if node.target is nki_kernel_wrapper:
            check_lnc(node.kwargs["kernel_idx"], node.kwargs["grid"])
    COMPILED_GRAPHS.append(gm)
    return make_boxed_func(gm.forward)


def _create_neuron_backend():
    def neuron_backend_wrapper(gm, example_inputs, *, options=None, mode="default"):
        return aot_autograd(fw_compiler=_compile, keep_inference_input_mutations=True)(
            gm, example_inputs
        )

    return neuron_backend_wrapper


neuron_backend = _create_neuron_backend()
