"""NKI's scalar values: 32-bit integers and 32-bit floats (the value model).

aws-neuron/aws-neuron-sdk nki/get-started/nki-language-guide.rst (snapshot 81ce03ae),
"NKI Values" (lines 141-146): "The NKI language supports six types of values: [...]
32-bit integer values, 32-bit IEEE floating-point values". The interpreter runs kernels as
Python, whose ints are unbounded and whose floats are 64-bit, so a number that reaches an
instruction (an operand, a fill value, an offset, an ``nl.affine_range`` or
``dynamic_range`` loop bound) is first made an NKI value:

- a float is rounded to float32 (round to nearest even, as an IEEE float32 literal is), and
  range checks apply to the rounded value: ``-3.4028235e+38``, float32's lowest value as
  Python prints it, is above float32's range as a 64-bit float but rounds to exactly it;
  a finite float that rounds to infinity is refused;
- an int outside int32 is refused, naming the value.

Plain ``range()`` loops, the guide's loop form ("for-loops over ranges", 'Control Flow',
line 458), are not checked: "All ``for`` loops (except ``dynamic_range``) are **unrolled** at
specialization time" (line 88), so their bounds are Python ints the trace consumes and never
an instruction's operand. What a loop hands on, its index, is checked where it reaches an
instruction (an operand, a fill value, an ``nl.affine_range``/``dynamic_range`` bound or a
register is held to int32 here; a tensor index to the tensor's shape). ``nl.affine_range``
and its aliases are API calls, so their bounds are checked as every API argument is. Left
open by the guide: whether the specializer itself refuses a ``range()`` bound outside int32
that no instruction sees (``for i in range(2**32): break``); the interpreter accepts it.

Left open by the guide, and chosen here: whether the 32-bit integers are signed. Registers
are ("Signed integers are supported, so negative values (e.g., ``count=-5``) are valid",
'Dynamic Control Flow'), so every integer value is held to int32, also one bound for a
uint32 tile (write its int32 bit pattern instead); when Python arithmetic on compile-time
values overflows int32 the guide does not say, and the interpreter checks values only where
they reach an instruction.
"""

from __future__ import annotations

import numbers

import numpy as np

from neuron_kernels.interpreter.errors import NkiValidationError

__all__ = ["INT32_MIN", "INT32_MAX", "is_int", "nki_number", "nki_int", "nki_float"]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
GUIDE_VALUES = "nki/get-started/nki-language-guide.rst 'NKI Values': 32-bit integer values"


def is_int(x) -> bool:
    """``x`` is a compile-time int: a Python or NumPy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def nki_int(api: str, arg: str, value) -> int:
    """``value`` as an NKI int: refused unless an int within int32."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise NkiValidationError(api, arg, "must be a compile-time int", repr(value))
    v = int(value)
    if not INT32_MIN <= v <= INT32_MAX:
        raise NkiValidationError(
            api,
            arg,
            f"must be within int32's range [{INT32_MIN}, {INT32_MAX}] ({GUIDE_VALUES})",
            v,
            limit=(INT32_MIN, INT32_MAX),
        )
    return v


def nki_float(api: str, arg: str, value) -> np.float32:
    """``value`` rounded to float32, as NKI holds it: refused when a finite value rounds
    to infinity."""
    with np.errstate(over="ignore"):
        f = np.float32(value)
    if np.isinf(f) and np.isfinite(value):
        raise NkiValidationError(
            api,
            arg,
            "must be within float32's range: it rounds to infinity as a 32-bit IEEE float "
            "(nki/get-started/nki-language-guide.rst 'NKI Values')",
            value,
        )
    return f


def nki_number(api: str, arg: str, value):
    """An int or float constant as NKI holds it (see the module docstring); other values
    pass through unchanged."""
    if isinstance(value, (bool, np.bool_)):
        return value
    if isinstance(value, numbers.Integral):
        return nki_int(api, arg, value)
    if isinstance(value, numbers.Real):
        return nki_float(api, arg, value)
    return value
