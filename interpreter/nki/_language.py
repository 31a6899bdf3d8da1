"""``nki.language`` on the interpreter: dtypes, buffers, tensors, tile sizes, loops, SPMD
ids, operators, and the (experimental in NKI 0.6) convenience wrappers.

Names mirror aws-neuron/aws-neuron-sdk nki/api/nki/language/__init__.py. Any other name
raises NotImplementedError naming it.
"""

from __future__ import annotations

import contextlib

import numpy as np

from neuron_kernels.hardware import default_target as _default_target
from neuron_kernels.hardware import usable_psum_banks as _usable_psum_banks
from neuron_kernels.interpreter import language_ops as _ops
from neuron_kernels.interpreter import registers as _registers
from neuron_kernels.interpreter.context import current as _current
from neuron_kernels.interpreter.context import current_or_none as _current_or_none
from neuron_kernels.interpreter.errors import NkiValidationError as _NkiValidationError
from neuron_kernels.interpreter.errors import not_implemented as _not_implemented
from neuron_kernels.interpreter.memory import allocate as _allocate
from neuron_kernels.interpreter.operators import OPERATORS as _OPERATORS
from neuron_kernels.interpreter.storage import MemoryRegion
from neuron_kernels.interpreter.tensor import DynamicSlice as _DynamicSlice
from neuron_kernels.interpreter.tensor import NKIObject, NkiTensor
from neuron_kernels.interpreter.unimplemented import UNIMPLEMENTED as _UNIMPLEMENTED
from neuron_kernels.interpreter.values import nki_int

# -- dtypes (strings, as DType = str in the API) ----------------------------------------
DType = str
bool_ = "bool_"
int8 = "int8"
int16 = "int16"
int32 = "int32"
uint8 = "uint8"
uint16 = "uint16"
uint32 = "uint32"
float16 = "float16"
float32 = "float32"
bfloat16 = "bfloat16"
tfloat32 = "tfloat32"
float8_e4m3 = "float8_e4m3"
float8_e4m3fn = "float8_e4m3fn"
float8_e5m2 = "float8_e5m2"
float8_e5m2_x4 = "float8_e5m2_x4"
float8_e4m3fn_x4 = "float8_e4m3fn_x4"
float8_e8m0fnu = "float8_e8m0fnu"
float4_e2m1fn_x4 = "float4_e2m1fn_x4"

# -- buffers ----------------------------------------------------------------------------
sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = private_hbm  # alias, as in the API
shared_hbm = MemoryRegion.shared_hbm


def is_hbm(buffer) -> bool:
    return isinstance(buffer, MemoryRegion) and buffer.is_hbm


def is_on_chip(buffer) -> bool:
    return isinstance(buffer, MemoryRegion) and buffer.on_chip


def is_psum(buffer) -> bool:
    return buffer is MemoryRegion.psum


def is_sbuf(buffer) -> bool:
    return buffer is MemoryRegion.sbuf


# -- tile sizes of the running target -----------------------------------------------------
def _target():
    sim = _current_or_none()
    return sim.target if sim is not None else _default_target()


class _TileSize(NKIObject):
    """Hardware tile size constants of the current target."""

    pmax = property(lambda self: _target().pmax)
    psum_fmax = property(lambda self: _target().psum_bank_fmax)  # deprecated alias
    psum_bank_fmax = property(lambda self: _target().psum_bank_fmax)
    psum_bank_fmax_bytes = property(lambda self: _target().psum_bank_bytes)
    gemm_stationary_fmax = property(lambda self: _target().gemm_stationary_fmax)
    gemm_moving_fmax = property(lambda self: _target().gemm_moving_fmax)
    bn_stats_fmax = property(lambda self: _target().bn_stats_fmax)
    psum_min_align = property(lambda self: _target().psum_min_align)
    sbuf_min_align = property(lambda self: _target().sbuf_min_align)
    psum_num_banks = property(lambda self: _usable_psum_banks(_target()))
    sbuf_size_bytes = property(lambda self: _target().sbuf_partition_bytes * _target().pmax)
    sbuf_fmax = property(lambda self: _target().sbuf_fmax)
    sbuf_fmax_bytes = property(lambda self: _target().sbuf_usable_bytes)
    total_available_sbuf_size = property(lambda self: _target().sbuf_usable_bytes)  # deprecated

    def __repr__(self) -> str:
        return f"nl.tile_size({_target().name})"


tile_size = _TileSize()


# -- creation -----------------------------------------------------------------------------
def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """Allocate a tensor; contents are uninitialised (NaN for floats, 4 for integers).

    ``address=(partition_offset, free_offset)`` is validated and otherwise ignored: like
    AWS's simulator, the interpreter does not model placement (capacity is checked over
    live intervals instead, see memory.py).
    """
    t = _allocate(_current(), shape, dtype, buffer, name)
    if address is not None:
        _check_address(t, address)
    return t


def _check_address(t, address) -> None:
    """[CONFLICT] The free offset counts bytes, as nki-library pins PSUM banks with
    ``(0, bank * 2048)``; the 0.2 migration text calls it an element offset."""
    api = "nl.ndarray"
    # (builtins such as all/max/sum are shadowed in this module by the nl operators)
    ok = (
        isinstance(address, tuple)
        and len(address) == 2
        and not [
            v
            for v in address
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0
        ]
    )
    if not ok:
        raise _NkiValidationError(
            api,
            "address",
            "must be a (partition_offset, free_offset) tuple of non-negative ints",
            address,
        )
    if not t.on_chip:
        raise _NkiValidationError(
            api, "address", "is only meaningful for SBUF/PSUM tensors", t.buffer.value
        )
    target = _current().target
    p_off, f_off = int(address[0]), int(address[1])
    if p_off + t.shape[0] > target.pmax:
        raise _NkiValidationError(
            api,
            "address partition_offset",
            f"must keep the {t.shape[0]} partitions within {target.pmax}",
            p_off,
            limit=target.pmax - t.shape[0],
        )
    nbytes = t._storage.bytes_per_partition
    if t.buffer is psum:
        cap = _usable_psum_banks(target) * target.psum_bank_bytes
        if f_off % target.psum_bank_bytes:
            raise _NkiValidationError(
                api,
                "address free_offset",
                f"must start a PSUM bank (a multiple of {target.psum_bank_bytes} bytes)",
                f_off,
                limit=target.psum_bank_bytes,
            )
    else:
        cap = target.sbuf_usable_bytes
    if f_off + nbytes > cap:
        raise _NkiValidationError(
            api,
            "address free_offset",
            f"must leave room for the tile's {nbytes} bytes per partition within {cap}",
            f_off,
            limit=cap - nbytes,
        )


zeros = _ops.zeros
ones = _ops.ones
full = _ops.full
zeros_like = _ops.zeros_like
empty_like = _ops.empty_like
shared_identity_matrix = _ops.shared_identity_matrix
shared_constant = _ops.shared_constant


def ds(start, size):
    """The slice ``start:start+size`` for indexing (``nl.ds``)."""
    return _DynamicSlice(start, size)


# -- loops: deprecated aliases of range() in NKI 0.6 ----------------------------------------
def affine_range(start, stop=None, step=1):
    """``range(start, stop, step)``; every bound an int32 (interpreter/values.py)."""
    api = "nl.affine_range"
    bounds = [
        nki_int(api, arg, v)
        for arg, v in (("start", start), ("stop", stop), ("step", step))
        if v is not None
    ]
    return range(*bounds) if stop is not None else range(bounds[0])


sequential_range = affine_range
static_range = affine_range


# Runtime loops over registers (registers.py): the body sees a read-only VirtualRegister.
fori_loop = _registers.fori_loop
while_loop = _registers.while_loop
dynamic_range = _registers.dynamic_range


@contextlib.contextmanager
def no_reorder():
    """Pins instruction order; the interpreter already runs in program order."""
    yield


# -- SPMD -----------------------------------------------------------------------------------
def _grid_axis(api: str, arg: str, axis, grid) -> int:
    """``axis`` checked against the launch grid; an unlaunched kernel runs as grid ``(1,)``,
    so only axis 0 exists there (a bad axis is refused with or without a grid)."""
    rank = len(grid) if grid else 1  # (the builtin max is shadowed by nl.max here)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not 0 <= axis < rank:
        raise _NkiValidationError(api, arg, f"must be an int in [0, {rank})", axis, limit=rank)
    return int(axis)


def program_id(axis=0):
    """Index of this program along ``axis`` of the launch grid; 0 with no grid."""
    sim = _current()
    axis = _grid_axis("nl.program_id", "axis", axis, sim.program_id or ())
    return sim.program_id[axis] if sim.program_id else 0


def num_programs(axes=0):
    """Programs along ``axes`` (an int or a tuple of ints; None: the whole grid); 1 with no grid.

    [CONFLICT] The stub's default is ``axes=0`` while its text says "if not provided, returns
    the total"; we follow the signature (axis 0). Both agree on 1-D (LNC) grids.
    """
    grid = tuple(_current().launch.grid or ())
    if axes is None:
        return int(np.prod(grid)) if grid else 1
    many = isinstance(axes, (tuple, list))
    picked = [_grid_axis("nl.num_programs", "axes", a, grid) for a in (axes if many else (axes,))]
    sizes = [grid[a] if grid else 1 for a in picked]
    return int(np.prod(sizes)) if many else sizes[0]


def program_ndim():
    """Dimensions of the launch grid; 0 with no grid."""
    return len(_current().launch.grid)


def device_print(print_prefix, tensor):
    """Print a tensor's values now (the interpreter runs eagerly)."""
    print(print_prefix, tensor._read_raw() if isinstance(tensor, NkiTensor) else tensor)


# -- operators and experimental wrappers -----------------------------------------------------
globals().update(_OPERATORS)
load = _ops.load
store = _ops.store
load_transpose2d = _ops.load_transpose2d
matmul = _ops.matmul
transpose = _ops.transpose
broadcast_to = _ops.broadcast_to


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _not_implemented(f"nki.language.{name}", known=f"nki.language.{name}" in _UNIMPLEMENTED)
