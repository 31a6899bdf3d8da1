"""``nisa.quantize_mx`` and ``nisa.nc_matmul_mx``: refused, not written yet.

What the API stubs leave open (below) is fixed by AWS's MX deep dive (aws-neuron-sdk
nki/deep-dives/mxfp-matmul.rst and its golden model src/mxfp-matmul/mx_cpu_utils.py:
``quantize_mx_golden``, ``nc_matmul_mx_golden``, ``get_p_contiguous_scale``,
``pack_mx_data_into_x4``); an implementation should follow that model.

aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (snapshot 81ce03ae) fixes the group
(8 partitions x 4 elements), the block scale ``2**(floor(log2(amax)) - (Emax - 1))`` and the
dtypes, but not: where each group's scale sits in ``dst_scale`` (nc_matmul_mx defers to
quantize_mx's doc for "a special layout requirement" that depends on quadrants, and
quantize_mx does not give it), which four values share a packed x4 element, nor the
rounding and saturation of the fp8 cast. A kernel's result depends on all three; the deep
dive's golden model is the public source that settles them.
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
