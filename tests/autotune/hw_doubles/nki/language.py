"""``nki.language`` of the double: the interpreter's (kernels import it unchanged)."""

import sys

from neuron_kernels.interpreter.nki import language as _language

sys.modules[__name__] = _language
