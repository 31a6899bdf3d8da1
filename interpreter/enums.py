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
