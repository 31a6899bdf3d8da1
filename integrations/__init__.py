"""Integrations with other libraries, one module each, imported on their own (nothing here is
loaded by ``import neuron_kernels``):

- :mod:`neuron_kernels.integrations.transformers`: Hugging Face ``transformers`` models
  (``attn_implementation="neuron"`` and :func:`~neuron_kernels.integrations.transformers.apply_neuron_kernels`);
  needs the ``transformers`` extra (``pip install neuron-kernels[transformers]``).

They sit on top of the ops (:mod:`neuron_kernels.torch_ops`) and nothing below imports them.
"""
