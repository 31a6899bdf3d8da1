"""Memory and tensors: allocations (:class:`Storage`) and strided views (:class:`NkiTensor`).

A tensor is storage + view: element ``(i0, ..., in-1)`` lives at storage element
``offset + sum(strides[k] * ik)`` (nki/get-started/nki-language-guide.rst). Views never
copy. On-chip tensors (SBUF, PSUM) keep the partition dimension at dim 0; view methods
enforce the constraints the API stubs document (nki/api/nki/language/__init__.py).
"""

from __future__ import annotations

import enum
import math
from typing import Any

import numpy as np

from neuron_kernels.simulator import dtypes
from neuron_kernels.simulator.errors import NkiValidationError, not_implemented
from neuron_kernels.simulator.trace import Access

__all__ = ["MemoryRegion", "NKIObject", "NkiTensor", "DynamicSlice", "Storage", "wrap_host_array"]


class MemoryRegion(enum.Enum):
    """Memory region constants (``nl.sbuf``, ``nl.psum``, ``nl.private_hbm``, ``nl.shared_hbm``)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self) -> str:
        return f"nl.{self.value}"

    @property
    def on_chip(self) -> bool:
        return self in (MemoryRegion.sbuf, MemoryRegion.psum)

    @property
    def is_hbm(self) -> bool:
        return self in (MemoryRegion.private_hbm, MemoryRegion.shared_hbm)


class NKIObject:
    """Base class for NKI kernel dataclasses and configuration objects."""

    def __init__(self, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            setattr(self, key, value)


class DynamicSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


# PSUM per-element state for nc_matmul accumulate inference.
PSUM_UNWRITTEN, PSUM_VALUE_WRITTEN, PSUM_MATMUL_WRITTEN = 0, 1, 2


class Storage:
    """One allocation: a flat physical array plus what the interpreter tracks about it."""

    __slots__ = (
        "uid",
        "array",
        "dtype",
        "buffer",
        "shape",
        "name",
        "psum_state",
        "first_use",
        "last_use",
        "host",
        "written",
        "precise_fp",
        "compute",
    )

    def __init__(self, uid, shape, dtype, buffer, name, precise_fp, array=None, compute=True):
        self.uid = uid
        self.shape = tuple(shape)
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.precise_fp = precise_fp
        self.compute = compute
        if array is None:
            size = math.prod(self.shape)
            array = np.full(size, dtypes.sentinel(dtype), dtype=dtypes.storage_dtype(dtype, precise_fp))
        self.array = array
        self.psum_state = (
            np.zeros(self.array.size, dtype=np.uint8) if buffer is MemoryRegion.psum else None
        )
        self.first_use = -1
        self.last_use = -1
        self.host = None
        self.written = False

    @property
    def partition_elems(self) -> int:
        """Elements per partition (on-chip); the partition stride of a fresh view."""
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1

    @property
    def bytes_per_partition(self) -> int:
        return self.partition_elems * dtypes.info(self.dtype).itemsize


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


class NkiTensor(NKIObject):
    """NKI tensor: a strided view of one allocation.

    Attributes match the API: ``shape``, ``strides``, ``offset`` (elements), ``name``,
    ``dtype`` (an NKI dtype string), ``buffer`` (a :class:`MemoryRegion`), ``ndim``, ``size``.
    """

    def __init__(self, shape, dtype, storage, buffer=MemoryRegion.sbuf, name: str = ""):
        dtype = dtypes.normalize(dtype, "NkiTensor")
        if not isinstance(storage, Storage):
            raise not_implemented("NkiTensor(storage=<non-simulator storage>)")
        self._init_view(storage, tuple(shape), _contiguous_strides(tuple(shape)), 0, dtype, name)

    # -- construction --------------------------------------------------------------
    def _init_view(self, storage, shape, strides, offset, dtype, name):
        self._storage = storage
        self.shape = tuple(int(n) for n in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.dtype = dtype
        self.name = name or storage.name

    @classmethod
    def _make(cls, storage, shape, strides, offset, dtype=None, name=None) -> "NkiTensor":
        t = cls.__new__(cls)
        t._init_view(storage, shape, strides, offset, dtype or storage.dtype, name or storage.name)
        return t

    def _derive(self, api, shape, strides, offset, dtype=None) -> "NkiTensor":
        """A new view of the same storage, bounds-checked."""
        view = NkiTensor._make(self._storage, shape, strides, offset, dtype or self.dtype, self.name)
        view._check_bounds(api)
        return view

    # -- attributes ----------------------------------------------------------------
    @property
    def buffer(self) -> MemoryRegion:
        return self._storage.buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def on_chip(self) -> bool:
        return self._storage.buffer.on_chip

    @property
    def itemsize(self) -> int:
        return dtypes.info(self.dtype).itemsize

    @property
    def partitions(self) -> int:
        """Partition count of an on-chip operand (dim 0)."""
        return self.shape[0] if self.shape else 1

    @property
    def elems_per_partition(self) -> int:
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1

    @property
    def free_size(self) -> int:
        return self.elems_per_partition

    def __repr__(self) -> str:
        return (
            f"NkiTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
            f"buffer={self.buffer!r})"
        )

    def __bool__(self):
        raise TypeError(
            "NkiTensor has no truth value at trace time: tensor contents are only known on the "
            "device. Compare with None using == / != or use a predicated instruction."
        )

    # Python arithmetic on tensors is not part of the 0.6 API (nki-api-subset section 3.3).
    def _no_arith(self, *_):
        raise not_implemented("NkiTensor arithmetic operators (use nisa.tensor_tensor / tensor_scalar)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arith
    __truediv__ = __rtruediv__ = __matmul__ = __neg__ = __pow__ = _no_arith

    # -- physical access -------------------------------------------------------------
    def _np_dtype(self) -> np.dtype:
        return dtypes.storage_dtype(self.dtype, self._storage.precise_fp)

    def _flat(self) -> np.ndarray:
        """The storage reinterpreted in this view's dtype (1-D)."""
        arr = self._storage.array
        want = self._np_dtype()
        if arr.dtype != want:
            if arr.dtype.itemsize != want.itemsize and not self._storage.precise_fp:
                raise not_implemented("NkiTensor.view(dtype) with NKI_PRECISE_FP=0")
            arr = arr.view(want)
        return arr

    def _array(self) -> np.ndarray:
        """A NumPy view (no copy) with this tensor's shape and strides."""
        flat = self._flat()
        item = flat.dtype.itemsize
        return np.ndarray(
            self.shape,
            dtype=flat.dtype,
            buffer=flat,
            offset=self.offset * item,
            strides=tuple(s * item for s in self.strides),
        )

    def _read_raw(self) -> np.ndarray:
        if not self._storage.compute:
            return np.zeros(self.shape, dtype=self._np_dtype())
        return np.array(self._array())

    def _read_f32(self) -> np.ndarray:
        if not self._storage.compute:
            return np.zeros(self.shape, dtype=np.float32)
        return self._array().astype(np.float32)

    def _write(self, values: np.ndarray, *, raw: bool = False) -> None:
        """Write values (same number of elements, row-major) through this view.

        ``raw``: values are already in this tensor's storage dtype (bit-exact copies).
        """
        if self._storage.compute:
            values = np.asarray(values)
            if not raw:
                values = dtypes.convert(values, self.dtype, self._storage.precise_fp)
            dst = self._array()
            dst[...] = values.reshape(self.shape)
        self._storage.written = True
        if self._storage.psum_state is not None:
            # A non-matmul write ends any accumulation group; nc_matmul re-marks its own.
            self._psum_state()[...] = PSUM_VALUE_WRITTEN

    def _psum_state(self) -> np.ndarray:
        """Per-element PSUM state (unwritten / value-written / matmul-written) of this view."""
        scale = self.itemsize / dtypes.info(self._storage.dtype).itemsize
        if scale != 1:
            raise not_implemented("nc_matmul on a PSUM view reinterpreted to another element size")
        return np.ndarray(
            self.shape, dtype=np.uint8, buffer=self._storage.psum_state,
            offset=self.offset, strides=self.strides,
        )

    def _pf_shape(self) -> tuple[int, int]:
        return (self.partitions, self.elems_per_partition)

    # -- bounds and trace records --------------------------------------------------
    def _extent(self) -> tuple[int, int]:
        lo = hi = self.offset
        for n, s in zip(self.shape, self.strides):
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
        return lo, hi

    def _check_bounds(self, api: str) -> None:
        for n in self.shape:
            if n < 1:
                raise NkiValidationError(api, "shape", "must have positive sizes", self.shape)
        lo, hi = self._extent()
        total = self._flat().size
        if lo < 0 or hi >= total:
            raise NkiValidationError(
                api,
                "access",
                f"must stay inside the {total}-element allocation {self._storage.name!r}",
                f"elements {lo}..{hi}",
            )

    def _partition_stride(self) -> int:
        """Storage elements (in this dtype) between two partitions."""
        d = dtypes.info(self._storage.dtype).itemsize
        return self._storage.partition_elems * d // self.itemsize

    def _free_dims(self) -> list[tuple[int, int]]:
        """(count, stride) of the free dims, on-chip only."""
        return list(zip(self.shape[1:], self.strides[1:]))

    def _access(self) -> Access:
        item = self.itemsize
        if self.on_chip:
            pstride = self._partition_stride()
            pstart, inner = divmod(self.offset, pstride)
            lo = hi = inner
            for n, s in self._free_dims():
                if s >= 0:
                    hi += (n - 1) * s
                else:
                    lo += (n - 1) * s
            dims = self._free_dims()
            partitions = self.partitions
            epp = self.elems_per_partition
        else:
            pstart = 0
            lo, hi = self._extent()
            dims = list(zip(self.shape, self.strides))
            partitions = self.shape[0] if self.ndim > 1 else 1
            epp = self.size // partitions
        run, expect, inner_stride = 1, 1, 1
        found_inner = False
        for n, s in reversed(dims):
            if n == 1:
                continue
            if not found_inner:
                inner_stride, found_inner = s, True
            if s == expect:
                run *= n
                expect *= n
            else:
                break
        return Access(
            storage=self._storage.uid,
            name=self._storage.name,
            buffer=self.buffer.value,
            dtype=self.dtype,
            shape=self.shape,
            itemsize=item,
            partition_start=pstart,
            partitions=partitions,
            elems_per_partition=epp,
            byte_lo=lo * item,
            byte_hi=(hi + 1) * item,
            contiguous_bytes=run * item,
            inner_stride_bytes=abs(inner_stride) * item,
        )

    # -- indexing ------------------------------------------------------------------
    def __getitem__(self, key) -> "NkiTensor":
        api = "NkiTensor.__getitem__"
        if not isinstance(key, tuple):
            key = (key,)
        n_ellipsis = sum(1 for k in key if k is Ellipsis)
        if n_ellipsis > 1:
            raise NkiValidationError(api, "index", "may contain at most one Ellipsis", key)
        n_explicit = len(key) - n_ellipsis
        if n_explicit > self.ndim:
            raise NkiValidationError(api, "index", f"must have at most {self.ndim} entries", key)
        if n_ellipsis:
            pos = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:pos] + (slice(None),) * (self.ndim - n_explicit) + key[pos + 1 :]
        key = key + (slice(None),) * (self.ndim - len(key))

        shape, strides, offset = [], [], self.offset
        dropped: list[int] = []  # dims removed by an integer index, by original position
        kept_positions: list[int] = []
        for dim, (k, n, s) in enumerate(zip(key, self.shape, self.strides)):
            if isinstance(k, DynamicSlice):
                start, size, step = _int(api, "nl.ds start", k.start), _int(api, "nl.ds size", k.size), 1
                if start < 0 or size < 1 or start + size > n:
                    raise NkiValidationError(
                        api, f"nl.ds on dim {dim}", f"must lie in [0, {n}) with size >= 1", k
                    )
                stop = start + size
            elif isinstance(k, slice):
                start, stop, step = _resolve_slice(api, dim, k, n)
            elif _is_int(k):
                i = int(k)
                if i < -n or i >= n:
                    raise NkiValidationError(api, f"index on dim {dim}", f"must be in [-{n}, {n})", i)
                i %= n
                offset += i * s
                if self.on_chip and dim == 0:
                    shape.append(1)
                    strides.append(s)
                    kept_positions.append(dim)
                else:
                    dropped.append(dim)
                continue
            elif isinstance(k, NkiTensor):
                raise not_implemented("NkiTensor.__getitem__ with a tensor index (dynamic select)")
            else:
                raise NkiValidationError(api, f"index on dim {dim}", "must be an int, slice or nl.ds", k)
            if self.on_chip and dim == 0 and step != 1:
                raise NkiValidationError(
                    api, "partition step", "must be 1 (hardware has no partition striding)", step
                )
            offset += start * s
            shape.append(len(range(start, stop, step)))
            strides.append(s * step)
            kept_positions.append(dim)

        min_dims = 2 if self.on_chip else 1
        if len(shape) < min_dims and dropped:
            # Keep the last integer-indexed dim as size 1 (on-chip views stay >= 2-D).
            last = dropped[-1]
            insert_at = sum(1 for p in kept_positions if p < last)
            shape.insert(insert_at, 1)
            strides.insert(insert_at, self.strides[last])
        return self._derive(api, shape, strides, offset)

    def __setitem__(self, key, value) -> None:
        """``t[key] = value``: a copy into the view (older docs' assignment form).

        Tiles copy through ``nisa.tensor_copy`` (on-chip) or ``nisa.dma_copy`` (HBM
        involved); a scalar fills through ``nisa.memset``.
        """
        from neuron_kernels.simulator.instructions import dma, vector

        dst = self[key]
        if isinstance(value, NkiTensor):
            if dst.on_chip and value.on_chip:
                vector.tensor_copy(dst=dst, src=value)
            else:
                dma.dma_copy(dst=dst, src=value)
        else:
            vector.memset(dst=dst, value=value)

    # -- view methods (nki/api/nki/language/__init__.py) ------------------------------
    def _norm_dim(self, api, dim, ndim=None) -> int:
        ndim = self.ndim if ndim is None else ndim
        if not _is_int(dim) or not -ndim <= dim < ndim:
            raise NkiValidationError(api, "dim", f"must be in [-{ndim}, {ndim})", dim)
        return int(dim) % ndim

    def permute(self, dims) -> "NkiTensor":
        api = "NkiTensor.permute"
        dims = tuple(dims)
        if sorted(dims) != list(range(self.ndim)):
            raise NkiValidationError(api, "dims", f"must be a permutation of range({self.ndim})", dims)
        if self.on_chip and dims[0] != 0:
            raise NkiValidationError(api, "dims[0]", "must be 0 on-chip (partition dim stays first)", dims[0])
        return self._derive(
            api, [self.shape[d] for d in dims], [self.strides[d] for d in dims], self.offset
        )

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        api = "NkiTensor.broadcast"
        dim = self._norm_dim(api, dim)
        if self.shape[dim] != 1:
            raise NkiValidationError(api, f"shape[{dim}]", "must be 1", self.shape[dim])
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        if not _is_int(size) or size < 1:
            raise NkiValidationError(api, "size", "must be a positive int", size)
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = int(size), 0
        return self._derive(api, shape, strides, self.offset)

    def expand_dim(self, dim: int) -> "NkiTensor":
        api = "NkiTensor.expand_dim"
        dim = self._norm_dim(api, dim, self.ndim + 1)
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        shape, strides = list(self.shape), list(self.strides)
        shape.insert(dim, 1)
        strides.insert(dim, strides[dim] * shape[dim + 1] if dim < len(strides) else 1)
        return self._derive(api, shape, strides, self.offset)

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        api = "NkiTensor.squeeze_dim"
        dim = self._norm_dim(api, dim)
        if self.shape[dim] != 1:
            raise NkiValidationError(api, f"shape[{dim}]", "must be 1", self.shape[dim])
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        shape, strides = list(self.shape), list(self.strides)
        del shape[dim], strides[dim]
        return self._derive(api, shape, strides, self.offset)

    def reshape_dim(self, dim: int, shape) -> "NkiTensor":
        api = "NkiTensor.reshape_dim"
        dim = self._norm_dim(api, dim)
        parts = _infer_shape(api, tuple(shape), self.shape[dim])
        if self.on_chip and dim == 0 and len(parts) != 1:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        sub_strides, acc = [], self.strides[dim]
        for n in reversed(parts):
            sub_strides.append(acc)
            acc *= n
        new_shape = list(self.shape[:dim]) + list(parts) + list(self.shape[dim + 1 :])
        new_strides = list(self.strides[:dim]) + sub_strides[::-1] + list(self.strides[dim + 1 :])
        return self._derive(api, new_shape, new_strides, self.offset)

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        api = "NkiTensor.flatten_dims"
        start, end = self._norm_dim(api, start_dim), self._norm_dim(api, end_dim)
        if start > end:
            raise NkiValidationError(api, "start_dim", f"must be <= end_dim ({end})", start)
        if self.on_chip and start == 0:
            raise NkiValidationError(api, "start_dim", "must be > 0 on-chip", start)
        for d in range(start, end):
            if self.shape[d + 1] != 1 and self.shape[d] != 1 and self.strides[d] != self.strides[d + 1] * self.shape[d + 1]:
                raise NkiValidationError(
                    api, f"dims {start}..{end}", "must be contiguous in memory", self.strides
                )
        merged = math.prod(self.shape[start : end + 1])
        inner = next(
            (self.strides[d] for d in range(end, start - 1, -1) if self.shape[d] != 1), self.strides[end]
        )
        shape = list(self.shape[:start]) + [merged] + list(self.shape[end + 1 :])
        strides = list(self.strides[:start]) + [inner] + list(self.strides[end + 1 :])
        return self._derive(api, shape, strides, self.offset)

    def reshape(self, shape) -> "NkiTensor":
        api = "NkiTensor.reshape"
        if _is_int(shape):
            shape = (shape,)
        new_shape = _infer_shape(api, tuple(shape), self.size)
        if self.on_chip and new_shape[0] != self.shape[0]:
            raise NkiValidationError(
                api, "shape[0]", f"must equal the partition dim {self.shape[0]} on-chip", new_shape[0]
            )
        strides = _reshape_strides(self.shape, self.strides, new_shape)
        if strides is None:
            raise NkiValidationError(
                api, "shape", f"must be reachable without a copy from layout {self.shape}/{self.strides}", new_shape
            )
        return self._derive(api, new_shape, strides, self.offset)

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        api = "NkiTensor.slice"
        dim = self._norm_dim(api, dim)
        n = self.shape[dim]
        if not (_is_int(start) and _is_int(end) and 0 <= start < end <= n):
            raise NkiValidationError(api, "start/end", f"must satisfy 0 <= start < end <= {n}", (start, end))
        if not _is_int(step) or step < 1:
            raise NkiValidationError(api, "step", "must be >= 1", step)
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index) -> "NkiTensor":
        api = "NkiTensor.select"
        dim = self._norm_dim(api, dim)
        if isinstance(index, NkiTensor):
            raise not_implemented("NkiTensor.select with a tensor index (dynamic select)")
        if not _is_int(index) or not 0 <= index < self.shape[dim]:
            raise NkiValidationError(api, "index", f"must be in [0, {self.shape[dim]})", index)
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        shape, strides = list(self.shape), list(self.strides)
        offset = self.offset + int(index) * strides[dim]
        del shape[dim], strides[dim]
        if not shape:
            shape, strides = [1], [1]
        return self._derive(api, shape, strides, offset)

    def vector_select(self, dim, vector_offset):
        raise not_implemented("NkiTensor.vector_select")

    def indirect(self, index, num_elem=None):
        raise not_implemented("NkiTensor.indirect")

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
        raise not_implemented("NkiTensor.rearrange")

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """Raw access pattern on the underlying storage (not composable with the view).

        ``offset=None`` keeps this view's storage offset; an integer is added to it
        (0.6 API stub; the older language guide read it as an override).
        """
        api = "NkiTensor.ap"
        if scalar_offset is not None or vector_offset is not None:
            raise not_implemented("NkiTensor.ap with scalar_offset/vector_offset (indirect access)")
        view_dtype = dtypes.normalize(dtype, api) if dtype is not None else self.dtype
        try:
            pairs = [(int(p[0]), int(p[1])) for p in pattern]
        except (TypeError, ValueError, IndexError):
            raise NkiValidationError(api, "pattern", "must be a list of [step, num] pairs", pattern) from None
        if not pairs:
            raise NkiValidationError(api, "pattern", "must not be empty", pattern)
        scale = self.itemsize / dtypes.info(view_dtype).itemsize
        base = self.offset * scale
        if base != int(base):
            raise NkiValidationError(api, "dtype", "must keep the base offset element-aligned", view_dtype)
        new_offset = int(base) + (0 if offset is None else int(offset))
        view = NkiTensor._make(self._storage, [n for _, n in pairs], [s for s, _ in pairs], new_offset, view_dtype)
        if self.on_chip:
            pstride = view._partition_stride()
            if pairs[0][0] != pstride and pairs[0][1] != 1:
                raise NkiValidationError(
                    api,
                    "partition step (first pattern pair)",
                    f"must equal the storage's free-element count {pstride} on-chip",
                    pairs[0][0],
                )
        view._check_bounds(api)
        return view

    def view(self, dtype) -> "NkiTensor":
        api = "NkiTensor.view"
        new = dtypes.normalize(dtype, api)
        old_size, new_size = self.itemsize, dtypes.info(new).itemsize
        if new_size == old_size:
            return self._derive(api, self.shape, self.strides, self.offset, new)
        if self.strides[-1] != 1 and self.shape[-1] != 1:
            raise NkiValidationError(api, "last dim stride", "must be 1 (contiguous)", self.strides[-1])
        if new_size < old_size:
            r = old_size // new_size
            shape = list(self.shape[:-1]) + [self.shape[-1] * r]
            strides = [s * r for s in self.strides[:-1]] + [1]
            return self._derive(api, shape, strides, self.offset * r, new)
        r = new_size // old_size
        if self.shape[-1] % r or self.offset % r or any(s % r for s in self.strides[:-1]):
            raise NkiValidationError(
                api, "last dim", f"must be divisible by the dtype size ratio {r}", self.shape[-1]
            )
        shape = list(self.shape[:-1]) + [self.shape[-1] // r]
        strides = [s // r for s in self.strides[:-1]] + [1]
        return self._derive(api, shape, strides, self.offset // r, new)

    reinterpret_cast = view

    def is_contiguous(self) -> bool:
        dims = self._free_dims() if self.on_chip else list(zip(self.shape, self.strides))
        expect = 1
        for n, s in reversed(dims):
            if n == 1:
                continue
            if s != expect:
                return False
            expect *= n
        return True

    def get_pattern(self) -> list[list[int]]:
        return [[s, n] for n, s in zip(self.shape, self.strides)]

    def is_indirect(self) -> bool:
        return False


# -- helpers -----------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _int(api, what, x) -> int:
    if not _is_int(x):
        raise NkiValidationError(api, what, "must be a compile-time int", x)
    return int(x)


def _resolve_slice(api, dim, k: slice, n: int) -> tuple[int, int, int]:
    step = 1 if k.step is None else _int(api, "slice step", k.step)
    if step < 1:
        raise NkiValidationError(api, f"slice step on dim {dim}", "must be >= 1", step)
    start = 0 if k.start is None else _int(api, "slice start", k.start)
    stop = n if k.stop is None else _int(api, "slice stop", k.stop)
    if start < 0:
        start += n
    if stop < 0:
        stop += n
    # NKI does not clamp like NumPy: out-of-range bounds are errors.
    if not 0 <= start < stop <= n:
        raise NkiValidationError(
            api, f"slice on dim {dim}", f"must satisfy 0 <= start < stop <= {n}", f"{k.start}:{k.stop}"
        )
    return start, stop, step


def _infer_shape(api, shape: tuple, total: int) -> tuple[int, ...]:
    if sum(1 for n in shape if n == -1) > 1:
        raise NkiValidationError(api, "shape", "may contain at most one -1", shape)
    known = math.prod(n for n in shape if n != -1)
    if any((not _is_int(n)) or (n < 1 and n != -1) for n in shape):
        raise NkiValidationError(api, "shape", "must hold positive ints (and at most one -1)", shape)
    if -1 in shape:
        if known == 0 or total % known:
            raise NkiValidationError(api, "shape", f"must divide {total} elements", shape)
        shape = tuple(total // known if n == -1 else n for n in shape)
    if math.prod(shape) != total:
        raise NkiValidationError(api, "shape", f"must hold exactly {total} elements", shape)
    return tuple(int(n) for n in shape)


def _reshape_strides(old_shape, old_strides, new_shape):
    """Strides for a copy-free reshape, or None (NumPy's attempt_nocopy_reshape)."""
    old = [(n, s) for n, s in zip(old_shape, old_strides) if n != 1]
    new_strides = [0] * len(new_shape)
    oi, ni = 0, 0
    o_n, n_n = len(old), len(new_shape)
    while ni < n_n and oi < o_n:
        np_, op_ = new_shape[ni], old[oi][0]
        nj, oj = ni + 1, oi + 1
        while np_ != op_:
            if np_ < op_:
                if nj >= n_n:
                    return None
                np_ *= new_shape[nj]
                nj += 1
            else:
                if oj >= o_n:
                    return None
                op_ *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        new_strides[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new_shape[k]
        ni, oi = nj, oj
    last = new_strides[ni - 1] if ni > 0 else 1
    for k in range(ni, n_n):
        new_strides[k] = last
    if not old:  # all-ones source
        return _contiguous_strides(tuple(new_shape))
    return tuple(new_strides)


def wrap_host_array(sim, array: np.ndarray, dtype: str, buffer: MemoryRegion, name: str) -> NkiTensor:
    """Wrap a caller's array as an HBM tensor (copied into device storage)."""
    launch = sim.launch
    storage = Storage(
        launch.new_storage_id(),
        array.shape if array.ndim else (1,),
        dtype,
        buffer,
        name,
        launch.precise_fp,
        compute=launch.compute,
        array=np.ascontiguousarray(
            dtypes.convert(array, dtype, launch.precise_fp)
            if array.dtype != dtypes.storage_dtype(dtype, launch.precise_fp)
            else array
        ).reshape(-1).copy(),
    )
    return NkiTensor._make(storage, storage.shape, _contiguous_strides(storage.shape), 0, dtype, name)
