"""``nki.isa`` on the interpreter, loaded on first use (:mod:`..deferred`): every name
comes from :mod:`._isa` (the instructions), which loads the interpreter the first time a
kernel reads one."""

from neuron_kernels.interpreter.deferred import forward_to

__all__: list[str] = []  # once loaded, every name of ._isa

__getattr__, __dir__ = forward_to(globals(), "neuron_kernels.interpreter.nki._isa")
