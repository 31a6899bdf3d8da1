"""``nki.language`` on the interpreter, loaded on first use (:mod:`..deferred`).

``NKIObject`` is here at import, since kernel modules subclass it when they load; every
other name comes from :mod:`._language` (dtypes, buffers, tensors, tile sizes, loops, SPMD
ids, operators), which loads the interpreter the first time a kernel reads one.
"""

from neuron_kernels.interpreter.classes import NKIObject  # noqa: F401  (bound at import)
from neuron_kernels.interpreter.deferred import forward_to

__getattr__, __dir__ = forward_to(globals(), "neuron_kernels.interpreter.nki._language")
