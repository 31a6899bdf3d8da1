"""``nki.isa`` of the double: the interpreter's (kernels import it unchanged)."""

import sys

from neuron_kernels.interpreter.nki import isa as _isa

sys.modules[__name__] = _isa
