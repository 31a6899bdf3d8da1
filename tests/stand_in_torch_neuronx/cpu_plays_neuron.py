"""Let CPU tensors play the ``neuron`` device: neuron-kernels' ops then take the branch of
their ``nki_op`` body that a TorchNeuron node takes (``wrap_nki`` launches, on the LNC grid),
with the double running each kernel on the interpreter. Import after ``neuron_kernels``."""

from neuron_kernels.torch_ops import neuron_device

neuron_device.is_neuron = lambda tensor: tensor.device.type in ("cpu", "neuron")
