"""The double's ``torch.compile(backend="neuron")`` (``torch_neuronx/neuron_dynamo_backend``)."""

from torch_neuronx.neuron_dynamo_backend.backend import (
    COMPILED_GRAPHS,
    UnsupportedNode,
    neuron_backend,
)

__all__ = ["COMPILED_GRAPHS", "UnsupportedNode", "neuron_backend"]
