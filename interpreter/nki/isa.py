"""``nki.isa`` on the interpreter, loaded on first use (:mod:`..deferred`): every name
comes from :mod:`._isa` (the instructions), which loads the interpreter the first time a
kernel reads one."""

from neuron_kernels.interpreter.deferred import forward_to

__getattr__, __dir__ = forward_to(globals(), "neuron_kernels.interpreter.nki._isa")
