"""The counter-based integer hash the kernels draw random bits with, and its torch mirror.

No RNG instruction: a kernel hashes a counter (an element's index) xor a per-call key with
int32 multiplies (GpSimdE's exact wrapping integer arithmetic), xors and logical shifts
(VectorE), so the interpreter, the hardware and the torch mirror (:func:`hash32`) draw the
same bits. Used by the fused AdamW step's stochastic rounding (``kernels/fused_adamw.py``,
``_step_round``: 16 bits per element) and by flash attention's dropout
(``kernels/attention_tiles.py``, ``dropout_stage``: 16 bits per score).

The mixing is ``x = x * HASH_M1; x ^= x >> 15; x = x * HASH_M2`` (mod 2^32, logical shift);
a caller takes the high bits of the result.
"""

from __future__ import annotations

import torch

__all__ = [
    "HASH_M1",
    "HASH_M2",
    "KEY_SEED",
    "KEY_STEP",
    "KEY_TENSOR",
    "MASK32",
    "as_int32",
    "hash32",
    "mul32",
    "rounding_bits",
]

HASH_M1 = 0x7FEB352D  # odd 32-bit multipliers (< 2^31: iota writes them as int32)
HASH_M2 = 0x5BD1E995
# Odd constants that spread a (seed, step or offset, position) triple over 32 bits.
KEY_SEED, KEY_STEP, KEY_TENSOR = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
MASK32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """The kernels' mixing of int64 ``x`` (its low 32 bits), as int64 in ``[0, 2^32)``:
    what ``x * HASH_M1; x ^= x >> 15; x * HASH_M2`` leaves in an int32 tile, read unsigned."""
    x = ((x & MASK32) * HASH_M1) & MASK32
    x = x ^ (x >> 15)
    return (x * HASH_M2) & MASK32


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2^32`` for int64 ``x`` in ``[0, 2^32)`` and an int ``c`` in ``[0, 2^32)``,
    without overflowing int64 (two 16-bit halves of ``c``)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def as_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 values in ``[0, 2^32)`` as the int32 tensor with the same 32 bits."""
    x = x & MASK32
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def rounding_bits(numel: int, key: int | torch.Tensor, device=None) -> torch.Tensor:
    """The AdamW kernel's 16 random bits per element (int64 in [0, 2^16)), computed in torch."""
    x = torch.arange(numel, dtype=torch.int64, device=device) ^ key
    x = (x * HASH_M1) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * HASH_M2) & 0xFFFFFFFF
    return x >> 16
