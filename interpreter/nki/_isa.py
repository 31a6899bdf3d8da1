"""``nki.isa`` on the interpreter: every instruction checks its documented limits, computes
in NumPy (fp32 engines, fp32 PSUM accumulation), writes its destination and records one
trace entry. Names and signatures mirror aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py.
Any other name raises NotImplementedError naming it.
"""

from __future__ import annotations

from neuron_kernels.hardware import default_target as _default_target
from neuron_kernels.interpreter.context import current_or_none as _current_or_none
from neuron_kernels.interpreter.enums import (
    dge_mode,
    dma_engine,
    engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
)
from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.errors import not_implemented as _not_implemented
from neuron_kernels.interpreter.instructions._common import NkiInstruction
from neuron_kernels.interpreter.instructions.activate2 import activate2
from neuron_kernels.interpreter.instructions.collective import core_barrier, sendrecv
from neuron_kernels.interpreter.instructions.dma import dma_copy, dma_transpose
from neuron_kernels.interpreter.instructions.gpsimd import (
    affine_select,
    iota,
    tensor_partition_reduce,
)
from neuron_kernels.interpreter.instructions.mx import nc_matmul_mx, quantize_mx
from neuron_kernels.interpreter.instructions.scalar import activation, activation_reduce
from neuron_kernels.interpreter.instructions.search import nc_find_index8, nonzero_with_count
from neuron_kernels.interpreter.instructions.stream_shuffle import nc_stream_shuffle
from neuron_kernels.interpreter.instructions.tensor_engine import nc_matmul, nc_transpose
from neuron_kernels.interpreter.instructions.vector import (
    bn_aggr,
    bn_stats,
    exponential,
    max8,
    memset,
    range_select,
    reciprocal,
    scalar_tensor_tensor,
    select_reduce,
    tensor_copy,
    tensor_copy_predicated,
    tensor_reduce,
    tensor_scalar,
    tensor_scalar_cumulative,
    tensor_scalar_reduce,
    tensor_tensor,
    tensor_tensor_scan,
)
from neuron_kernels.interpreter.registers import (
    VirtualRegister,
    register_alloc,
    register_load,
    register_move,
    register_store,
)
from neuron_kernels.interpreter.unimplemented import UNIMPLEMENTED as _UNIMPLEMENTED

# Deprecated engine constants, still used by older kernels.
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


def get_nc_version() -> nc_version:
    """The NeuronCore version of the current target (``nc_version.gen3`` for trn2)."""
    sim = _current_or_none()
    target = sim.target if sim is not None else _default_target()
    return nc_version(target.nc_version)


def get_nc_sub_version() -> int:
    return 0


__all__ = [
    "NkiInstruction",
    "NkiValidationError",
    "dge_mode",
    "dma_engine",
    "engine",
    "matmul_perf_mode",
    "nc_version",
    "oob_mode",
    "reduce_cmd",
    "get_nc_version",
    "get_nc_sub_version",
    "dma_copy",
    "dma_transpose",
    "tensor_copy",
    "memset",
    "nc_matmul",
    "nc_transpose",
    "tensor_tensor",
    "tensor_scalar",
    "scalar_tensor_tensor",
    "tensor_reduce",
    "tensor_scalar_reduce",
    "activation",
    "activation_reduce",
    "reciprocal",
    "iota",
    "affine_select",
    "bn_stats",
    "bn_aggr",
    "tensor_tensor_scan",
    "tensor_copy_predicated",
    "tensor_partition_reduce",
    "tensor_scalar_cumulative",
    "exponential",
    "max8",
    "range_select",
    "select_reduce",
    "activate2",
    "quantize_mx",
    "nc_matmul_mx",
    "nc_find_index8",
    "nonzero_with_count",
    "nc_stream_shuffle",
    "core_barrier",
    "sendrecv",
    "VirtualRegister",
    "register_alloc",
    "register_move",
    "register_load",
    "register_store",
]

# Other names raise NotImplementedError; interpreter/unimplemented.py lists the NKI 0.6 ones and why.


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _not_implemented(f"nki.isa.{name}", known=f"nki.isa.{name}" in _UNIMPLEMENTED)
