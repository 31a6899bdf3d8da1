"""Enums of ``nki.isa`` (members, not ints, are what kernels must pass)."""

from __future__ import annotations

import enum

__all__ = [
    "engine",
    "reduce_cmd",
    "dge_mode",
    "oob_mode",
    "matmul_perf_mode",
    "nc_version",
    "dma_engine",
]


class engine(enum.Enum):
    """Neuron Device engines."""

    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


class reduce_cmd(enum.Enum):
    """Engine accumulator-register commands."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    """Descriptor Generation Engine mode."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    """Out-of-bounds access mode for indirect DMA."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    """Tensor Engine performance mode."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):
    """NeuronCore version; ordered, so ``get_nc_version() >= nc_version.gen3`` works."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    """DMA transfer engine."""

    dma = 1
    gpsimd_dma = 2


# Plain values AWS's own kernels pass for an enum parameter, which the compiler therefore
# accepts: aws-neuron/nki-library (snapshot d2ad3a5) core/qkv/qkv_tkg.py passes
# ``dge_mode=_DGE_MODE_NONE`` with ``_DGE_MODE_NONE = 3`` (also core/subkernels/
# norm_tkg_utils.py, core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py), and
# core/qkv/qkv_cte.py passes ``perf_mode="double_row"`` (core/mlp/mlp_cte/
# mlp_cte_projection.py ``'double_row' if ... else 'none'``). Every other enum parameter
# is given members only, in those kernels and in the stubs' docs.
PLAIN_VALUES_ACCEPTED = {
    dge_mode: (int, "nki-library core/qkv/qkv_tkg.py: dge_mode=_DGE_MODE_NONE (3)"),
    matmul_perf_mode: (str, 'nki-library core/qkv/qkv_cte.py: perf_mode="double_row"'),
}


def enum_member(enum_cls: type[enum.Enum], value):
    """``value`` as a member of ``enum_cls``: a member, or for the enums in
    :data:`PLAIN_VALUES_ACCEPTED` the plain value of one; None for anything else."""
    if isinstance(value, enum_cls):
        return value
    plain = PLAIN_VALUES_ACCEPTED.get(enum_cls)
    if plain is None or isinstance(value, bool) or type(value) is not plain[0]:
        return None
    try:
        return enum_cls(value)
    except ValueError:
        return None
