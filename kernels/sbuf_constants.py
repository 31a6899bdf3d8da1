"""Constant tiles a kernel writes once in SBUF and reads for the whole launch.

Plain NKI-language functions (called at trace time inside the kernels): GpSimd builds each
tile once, so no per-tile instruction pays for it.
"""

from __future__ import annotations

from neuron_kernels.backend import nisa, nl

__all__ = ["identity"]


def identity(n: int, name: str = "identity"):
    """``[n, n]`` bf16 identity in SBUF (ones where the partition equals the column): the
    stationary of a matmul that adds (or copies) a ``[n, k]`` moving tile into PSUM."""
    ones = nl.ndarray((n, n), dtype=nl.bfloat16, buffer=nl.sbuf, name=name + "_ones")
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((n, n), dtype=nl.bfloat16, buffer=nl.sbuf, name=name)
    nisa.affine_select(
        dst=ident,
        pattern=[[-1, n]],
        channel_multiplier=1,
        on_true_tile=ones,
        on_false_value=0.0,
        cmp_op=nl.equal,
        offset=0,
    )
    return ident
