"""``nisa.quantize_mx`` and ``nisa.nc_matmul_mx``: refused, because the docs leave the
numbers they produce open.

aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (snapshot 81ce03ae) fixes the group
(8 partitions x 4 elements), the block scale ``2**(floor(log2(amax)) - (Emax - 1))`` and the
dtypes, but not: where each group's scale sits in ``dst_scale`` (nc_matmul_mx defers to
quantize_mx's doc for "a special layout requirement" that depends on quadrants, and
quantize_mx does not give it), which four values share a packed x4 element, nor the
rounding and saturation of the fp8 cast. A kernel's result depends on all three, so an
interpreter that guessed could pass kernels that fail on the device.
"""

from __future__ import annotations

from neuron_kernels.interpreter.errors import not_implemented

__all__ = ["quantize_mx", "nc_matmul_mx"]


def quantize_mx(dst, src, dst_scale, name=None):
    """Refused: see the module docstring."""
    raise not_implemented("nki.isa.quantize_mx")  # reason: interpreter/unimplemented.py


def nc_matmul_mx(
    dst,
    stationary,
    moving,
    stationary_scale,
    moving_scale,
    tile_position=None,
    tile_size=None,
    accumulate=None,
    name=None,
):
    """Refused: see the module docstring."""
    raise not_implemented("nki.isa.nc_matmul_mx")  # reason: interpreter/unimplemented.py
