"""Memory and tensors: allocations (:class:`Storage`) and strided views (:class:`NkiTensor`).

A tensor is storage + view: element ``(i0, ..., in-1)`` lives at storage element
``offset + sum(strides[k] * ik)`` (nki/get-started/nki-language-guide.rst). Views never
copy. On-chip tensors (SBUF, PSUM) keep the partition dimension at dim 0; view methods
enforce the constraints the API stubs document (nki/api/nki/language/__init__.py), and a
view never addresses memory outside its allocation (on-chip: outside its partitions or
outside its bytes in a partition). Views are immutable once made.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.classes import NKIObject
from neuron_kernels.interpreter.errors import NkiValidationError, not_implemented
from neuron_kernels.interpreter.trace import Access

__all__ = [
    "MemoryRegion",
    "NKIObject",
    "NkiTensor",
    "DynamicSlice",
    "Indirection",
    "Storage",
    "wrap_host_array",
]


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
        return self is MemoryRegion.sbuf or self is MemoryRegion.psum

    @property
    def is_hbm(self) -> bool:
        return self is MemoryRegion.private_hbm or self is MemoryRegion.shared_hbm


class Indirection:
    """The dynamic part of an indirect view (``.ap(vector_offset=...)`` / ``scalar_offset``).

    ``vector``: dim 0 of the view iterates the index tensor's values, column-major
    (``indices.T.flatten()``, nki/api/nki/isa ``dma_transpose``), each scaled by ``scale``
    (the stride of ``indirect_dim`` in the tensor ``.ap()`` was called on); it replaces dim
    0's own step. ``scalar``: one value (a 1x1 SBUF tensor or a register), times ``scale``,
    added to every element. Values are read when an instruction runs.
    """

    __slots__ = ("kind", "source", "scale")

    def __init__(self, kind: str, source, scale: int) -> None:
        self.kind, self.source, self.scale = kind, source, scale

    def values(self, api: str):
        from neuron_kernels.interpreter.registers import VirtualRegister

        if isinstance(self.source, VirtualRegister):
            return self.source._read(api)
        raw = self.source._read_raw()
        if self.kind == "scalar":
            return int(raw.reshape(-1)[0])
        return raw.astype(np.int64).T.reshape(-1)


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
# Storage.psum_state of a PSUM tile whose state array is not allocated yet (never written
# through a view of part of it): empty, never written to.
_PSUM_STATE_UNALLOCATED = np.zeros(0, dtype=np.uint8)
_PSUM_STATE_UNALLOCATED.flags.writeable = False
_BUFFER_VALUE = {b: b.value for b in MemoryRegion}


class Storage:
    """One allocation: a flat physical array plus what the interpreter tracks about it.

    ``array`` is None when the launch does not compute (``run(..., compute=False)``):
    shapes, checks, liveness and PSUM state are kept, the values are not.
    """

    __slots__ = (
        "uid",
        "array",
        "dtype",
        "buffer",
        "shape",
        "name",
        "psum_state",
        "psum_fill",
        "full_strides",
        "first_use",
        "last_use",
        "host",
        "written",
        "precise_fp",
        "compute",
        "size",
        "itemsize",
        "partition_elems",
        "bytes_per_partition",
        "on_chip",
        "views",
        "geometry",
        "buffer_value",
        "accesses",
    )

    def __init__(self, uid, shape, dtype, buffer, name, precise_fp, array=None, compute=True):
        self.uid = uid
        self.shape = tuple(shape)
        self.dtype = dtype
        self.buffer = buffer
        self.on_chip = buffer.on_chip
        self.name = name
        self.precise_fp = precise_fp
        self.compute = compute
        self.size = math.prod(self.shape)
        self.itemsize = dtypes.DTYPES[dtype].itemsize
        # Elements per partition (on-chip); the partition stride of a fresh view.
        self.partition_elems = math.prod(self.shape[1:]) if len(self.shape) > 1 else 1
        self.bytes_per_partition = self.partition_elems * self.itemsize
        # Everything a view's bounds check and trace record read from the storage (besides
        # its identity): the key of the per-geometry caches of __getitem__ and _access.
        self.geometry = (self.shape, self.itemsize, self.on_chip)
        self.buffer_value = _BUFFER_VALUE[buffer]  # MemoryRegion.value: an enum property (slow)
        # (shape, strides, offset, dtype) -> Access of a view: equal views share one frozen
        # record. Released with the last view (NkiTensor.__del__).
        self.accesses = None
        if array is None and compute:
            array = np.full(
                self.size, dtypes.sentinel(dtype), dtype=dtypes.storage_dtype(dtype, precise_fp)
            )
        self.array = array if compute else None
        # PSUM: the per-element state array, allocated when first needed (an empty
        # placeholder until then); None for other buffers and once no view is left.
        self.psum_state = _PSUM_STATE_UNALLOCATED if buffer is MemoryRegion.psum else None
        # While every element of the tile has one PSUM state, that state (the array's
        # content is then stale or not allocated); None once views wrote different states
        # (the array holds them). Writes through a view of the whole tile keep it uniform
        # without touching the array (NkiTensor._psum_set).
        self.psum_fill = PSUM_UNWRITTEN if self.psum_state is not None else None
        self.full_strides = _contiguous_strides(self.shape)  # a fresh view's strides
        self.first_use = -1
        self.last_use = -1
        self.written = False
        self.views = 0  # live NkiTensor views (NkiTensor.__del__ releases psum_state at 0)


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
        storage.views += 1
        self.shape = tuple(map(int, shape))
        self.strides = tuple(map(int, strides))
        self.offset = int(offset)
        self.dtype = dtype
        self.name = name or storage.name
        self._acc = None  # cached trace Access (views are immutable)
        self._indirect: Indirection | None = None  # .ap(vector_offset= / scalar_offset=)

    def __del__(self) -> None:
        # A PSUM tile none of whose views is left can never be read or written again: its
        # per-element accumulation state (one byte per element, 64 KiB for a 2 KiB bank of
        # 128 partitions) is released, and (any storage) the Access records of its views.
        # The Storage itself stays (liveness, capacity check).
        storage = self.__dict__.get("_storage")
        if storage is not None:
            storage.views -= 1
            if storage.views == 0:
                storage.accesses = None
                if storage.on_chip:
                    storage.psum_state = None

    def __copy__(self) -> NkiTensor:
        # Through _init_view, so the copy is counted in Storage.views like any other view.
        view = NkiTensor._make(
            self._storage, self.shape, self.strides, self.offset, self.dtype, self.name
        )
        view._indirect = self._indirect
        return view

    @classmethod
    def _make(cls, storage, shape, strides, offset, dtype=None, name=None) -> NkiTensor:
        t = cls.__new__(cls)
        t._init_view(storage, shape, strides, offset, dtype or storage.dtype, name or storage.name)
        return t

    def _derive(self, api, shape, strides, offset, dtype=None) -> NkiTensor:
        """A new view of the same storage, bounds-checked."""
        if self._indirect is not None:
            raise NkiValidationError(
                api,
                "self",
                "must not be an indirect view (nki/api/nki/language NkiTensor.is_indirect: "
                "indirect views cannot be re-indexed or re-indirected)",
                repr(self),
            )
        view = NkiTensor._make(
            self._storage, shape, strides, offset, dtype or self.dtype, self.name
        )
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
        return self._storage.on_chip

    @property
    def itemsize(self) -> int:
        return dtypes.DTYPES[self.dtype].itemsize

    @property
    def partitions(self) -> int:
        """Partition count of an on-chip operand (dim 0)."""
        return self.shape[0] if self.shape else 1

    @property
    def elems_per_partition(self) -> int:
        shape = self.shape
        if len(shape) == 2:  # the common tile (no slice, no product)
            return shape[1]
        return math.prod(shape[1:]) if len(shape) > 1 else 1

    @property
    def free_size(self) -> int:
        return self.elems_per_partition

    def __repr__(self) -> str:
        return (
            f"NkiTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
            f"buffer={self.buffer!r})"
        )

    def _no_trace_time_value(self, *_):
        raise TypeError(
            "NkiTensor has no value at trace time (no truth value, no ordering, no Python "
            "number): tensor contents are only known on the device. Compare with None using "
            "== / != or use a predicated instruction (nisa.affine_select, nisa.range_select)."
        )

    # bool(t), t > 0, float(t), int(t), range(t): each would need the device's values.
    __bool__ = __lt__ = __le__ = __gt__ = __ge__ = _no_trace_time_value
    __float__ = __int__ = __index__ = __complex__ = _no_trace_time_value

    def __iter__(self):
        # Without this, Python would iterate through __getitem__(0), (1), ... until an error.
        raise TypeError("NkiTensor is not iterable; index or slice it explicitly")

    # Python arithmetic on tensors is not part of the 0.6 API (aws-neuron/aws-neuron-sdk
    # nki/get-started/nki-language-guide.rst: computation goes through nki.isa).
    def _no_arith(self, *_):
        raise not_implemented(
            "NkiTensor arithmetic operators (use nisa.tensor_tensor / tensor_scalar)"
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arith
    __truediv__ = __rtruediv__ = __matmul__ = __neg__ = __pow__ = _no_arith

    # -- physical access -------------------------------------------------------------
    def _np_dtype(self) -> np.dtype:
        return dtypes.storage_dtype(self.dtype, self._storage.precise_fp)

    def _flat(self) -> np.ndarray:
        """The storage reinterpreted in this view's dtype (1-D); compute launches only."""
        arr = self._storage.array
        want = self._np_dtype()
        return arr if arr.dtype == want else arr.view(want)

    def _array(self) -> np.ndarray:
        """A NumPy view (no copy) with this tensor's shape and strides; for an indirect view,
        a read-only gathered copy (writes go through :meth:`_scatter`)."""
        flat = self._flat()
        if self._indirect is not None:
            index, _ = self._element_index("indirect access")
            values = flat[index]
            values.flags.writeable = False
            return values
        item = flat.dtype.itemsize
        return np.ndarray(
            self.shape,
            dtype=flat.dtype,
            buffer=flat,
            offset=self.offset * item,
            strides=tuple(s * item for s in self.strides),
        )

    def _read_raw(self) -> np.ndarray:
        """A copy of the values in the storage dtype (zeros when the launch does not compute)."""
        if not self._storage.compute:
            return np.zeros(self.shape, dtype=self._np_dtype())
        return np.array(self._array())

    def _check_numeric_read(self) -> None:
        """The refusal of :meth:`_read_f32` / :meth:`_view_f32`: packed x4 values are no
        numbers (checked also when a trace-only launch reads no values)."""
        if dtypes.DTYPES[self.dtype].kind == "packed":
            dtypes.refuse_packed(self.dtype, "a numeric read")

    def _read_f32(self) -> np.ndarray:
        """A copy of the values as fp32 (zeros when the launch does not compute)."""
        self._check_numeric_read()
        if not self._storage.compute:
            return np.zeros(self.shape, dtype=np.float32)
        return self._array().astype(np.float32)

    def _view_f32(self) -> np.ndarray:
        """The values as fp32 for reading only: a view when stored as fp32, else a copy."""
        self._check_numeric_read()
        if not self._storage.compute:
            return np.zeros(self.shape, dtype=np.float32)
        arr = self._array()
        return arr if arr.dtype == np.float32 else arr.astype(np.float32)

    def _copy_raw_from(self, src: NkiTensor) -> None:
        """``self = src`` bit-exactly in row-major order (same storage dtype, same element
        count); one copy, correct when the two views overlap (NumPy buffers overlaps)."""
        if self._storage.compute:
            values = src._array()
            if values.shape != self.shape:
                values = values.reshape(self.shape)
            if self._indirect is not None:
                self._scatter(values)
            else:
                self._array()[...] = values
        self._storage.written = True
        if self._storage.psum_state is not None:
            self._psum_set(PSUM_VALUE_WRITTEN)

    def _write(self, values, *, raw: bool = False) -> None:
        """Write values (same number of elements, row-major) through this view.

        ``raw``: values are already in this tensor's storage dtype (bit-exact copies).
        Otherwise they are rounded once into this tensor's dtype.
        """
        if self._storage.compute:
            values = np.asarray(values)
            if not raw:
                values = dtypes.convert(values, self.dtype, self._storage.precise_fp)
            if self._indirect is not None:
                self._scatter(values.reshape(self.shape))
            else:
                self._array()[...] = values.reshape(self.shape)
        self._storage.written = True
        if self._storage.psum_state is not None:
            # A non-matmul write ends any accumulation group; nc_matmul re-marks its own.
            self._psum_set(PSUM_VALUE_WRITTEN)

    def _element_index(self, api: str, skip: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Storage element (in this dtype) of every element of an indirect view, and which
        rows (dim 0) stay inside the allocation. Out-of-bounds rows raise unless ``skip``
        (``oob_mode.skip``), where they are reported and their indices clipped."""
        ind = self._indirect
        shape = self.shape
        index = np.full(shape, self.offset, dtype=np.int64)
        for k, (n, step) in enumerate(zip(shape, self.strides)):
            if ind.kind == "vector" and k == 0:
                continue
            axis = [1] * len(shape)
            axis[k] = n
            index += (np.arange(n, dtype=np.int64) * step).reshape(axis)
        dynamic = ind.values(api)
        if ind.kind == "vector":
            index += (dynamic * ind.scale).reshape([shape[0]] + [1] * (len(shape) - 1))
        else:
            index += int(dynamic) * ind.scale
        total = self._total_elems()
        inside = (index >= 0) & (index < total)
        if self.on_chip:  # the dynamic offset may not move an element to another partition
            pstride = self._partition_stride()
            static = np.full(shape, self.offset, dtype=np.int64)
            if len(shape) > 0:
                axis = [shape[0]] + [1] * (len(shape) - 1)
                static += (np.arange(shape[0], dtype=np.int64) * self.strides[0]).reshape(axis)
            inside &= index // pstride == static // pstride
        rows = inside.reshape(shape[0], -1).all(axis=1)
        if not rows.all():
            bad = int(np.flatnonzero(~rows)[0])
            if not skip:
                what = f"vector_offset row {bad}" if ind.kind == "vector" else "scalar_offset"
                value = int(dynamic[bad]) if ind.kind == "vector" else int(dynamic)
                raise NkiValidationError(
                    api,
                    what,
                    f"must address elements inside {self._storage.name!r} (oob_mode=error; "
                    "oob_mode.skip skips such rows in nisa.dma_copy)",
                    value,
                )
            index = np.clip(index, 0, total - 1)
        return index, rows

    def _scatter(self, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Write ``values`` (storage dtype, this view's shape) through the indirection, only
        the ``rows`` given (all by default); later duplicates win, as NumPy assigns."""
        index, inside = self._element_index("indirect access", skip=rows is not None)
        keep = inside if rows is None else (rows & inside)
        self._flat()[index[keep]] = values[keep]
        self._storage.written = True

    def _psum_state(self) -> np.ndarray:
        """Per-element PSUM state (unwritten / value-written / matmul-written) of this view."""
        if self.itemsize != self._storage.itemsize:
            raise not_implemented(
                "PSUM writes through a view reinterpreted to another element size"
            )
        st = self._storage
        if st.psum_fill is not None:  # uniform until now: the array takes over
            if st.psum_state is _PSUM_STATE_UNALLOCATED:
                st.psum_state = np.empty(st.size, dtype=np.uint8)
            st.psum_state.fill(st.psum_fill)
            st.psum_fill = None
        return np.ndarray(
            self.shape,
            dtype=np.uint8,
            buffer=st.psum_state,
            offset=self.offset,
            strides=self.strides,
        )

    def _psum_uniform(self) -> int | None:
        """The PSUM state every element of this view has when the whole tile has one (no
        array is read), else None (read :meth:`_psum_state`)."""
        if self.itemsize != self._storage.itemsize:
            raise not_implemented(
                "PSUM writes through a view reinterpreted to another element size"
            )
        return self._storage.psum_fill

    def _psum_set(self, state: int) -> None:
        """Set the PSUM state of every element of this view to ``state``: a view of the
        whole tile (its shape and row-major strides at offset 0, same element size) makes
        the tile uniform without writing the array; any other view writes its elements."""
        st = self._storage
        if (
            st.psum_state is not None
            and self.offset == 0
            and self.shape == st.shape
            and self.strides == st.full_strides
            and self.itemsize == st.itemsize
        ):
            st.psum_fill = state
        else:
            self._psum_state()[...] = state

    # -- bounds and trace records --------------------------------------------------
    def _extent(self) -> tuple[int, int]:
        lo = hi = self.offset
        for n, s in zip(self.shape, self.strides):
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
        return lo, hi

    def _total_elems(self) -> int:
        """Storage size counted in this view's element size."""
        st = self._storage
        return st.size * st.itemsize // self.itemsize

    def _check_bounds(self, api: str) -> None:
        """Every addressed element lies inside the allocation; on-chip, inside its partitions
        and inside each partition's bytes, with dim 0 stepping whole partitions."""
        for n in self.shape:
            if n < 1:
                raise NkiValidationError(api, "shape", "must have positive sizes", self.shape)
        lo, hi = self._extent()
        total = self._total_elems()
        if lo < 0 or hi >= total:
            raise NkiValidationError(
                api,
                "access",
                f"must stay inside the {total}-element allocation {self._storage.name!r}",
                f"elements {lo}..{hi}",
            )
        if not self.on_chip or not self.shape:
            return
        pstride = self._partition_stride()
        if self.shape[0] > 1 and self.strides[0] != pstride:
            raise NkiValidationError(
                api,
                "partition step",
                f"must be one whole partition ({pstride} elements of {self.dtype}): hardware "
                "reads consecutive partitions with the same free pattern",
                self.strides[0],
                limit=pstride,
            )
        pstart, inner = divmod(self.offset, pstride)
        flo = fhi = inner
        for n, s in zip(self.shape[1:], self.strides[1:]):
            if s >= 0:
                fhi += (n - 1) * s
            else:
                flo += (n - 1) * s
        if flo < 0 or fhi >= pstride:
            raise NkiValidationError(
                api,
                "free access",
                f"must stay inside one partition's {pstride} elements of {self._storage.name!r}",
                f"elements {flo}..{fhi} of the partition",
                limit=pstride,
            )
        n_parts = self._storage.shape[0] if len(self._storage.shape) > 1 else self._storage.size
        if pstart + self.shape[0] > n_parts:
            raise NkiValidationError(
                api,
                "partition range",
                f"must stay inside the {n_parts} partitions allocated",
                f"partitions {pstart}..{pstart + self.shape[0] - 1}",
                limit=n_parts,
            )

    def _partition_stride(self) -> int:
        """Storage elements (in this dtype) between two partitions."""
        st = self._storage
        return st.partition_elems * st.itemsize // self.itemsize

    def _free_dims(self) -> list[tuple[int, int]]:
        """(count, stride) of the free dims, on-chip only."""
        return list(zip(self.shape[1:], self.strides[1:]))

    def _access(self) -> Access:
        """This operand's trace record (cached: views are immutable)."""
        acc = self._acc
        if acc is not None:
            return acc
        if self._indirect is not None:
            return self._indirect_access()
        st = self._storage
        shape = self.shape
        cache = st.accesses
        if cache is None:
            cache = st.accesses = {}
        key = (shape, self.strides, self.offset, self.dtype)
        acc = cache.get(key)
        if acc is None:
            geo_key = (*key, st.geometry)
            geo = _ACCESS_CACHE.get(geo_key)
            if geo is None:
                geo = _access_geometry(st, shape, self.strides, self.offset, self.dtype)
                if len(_ACCESS_CACHE) >= _VIEW_CACHE_MAX:
                    _ACCESS_CACHE.clear()
                _ACCESS_CACHE[geo_key] = geo
            acc = cache[key] = Access(st.uid, st.name, st.buffer_value, self.dtype, shape, *geo)
        self._acc = acc
        return acc

    def _indirect_access(self) -> Access:
        """An indirect view's trace record: its static pattern's shape and runs, with the
        byte range widened to what the dynamic offsets may reach (the whole allocation; on
        chip, each partition's bytes), since the addresses are only known on the device."""
        static = NkiTensor._make(
            self._storage, self.shape, self.strides, self.offset, self.dtype, self.name
        )
        acc = static._access()
        hi = (
            self._storage.bytes_per_partition
            if self.on_chip
            else self._storage.size * (self._storage.itemsize)
        )
        self._acc = dataclasses.replace(acc, byte_lo=0, byte_hi=hi)
        return self._acc

    # -- indexing ------------------------------------------------------------------
    def __getitem__(self, key) -> NkiTensor:
        """NumPy-style basic indexing, returning a view (nki/api/nki/language ``__getitem__``).

        Differences from NumPy, as documented: on-chip, an int on dim 0 keeps the partition
        dim with size 1, and the result keeps at least 2 dims (the last int-indexed free dim
        stays with size 1); HBM results keep at least 1 dim; out-of-range bounds are errors,
        not clamped; steps must be >= 1 and the partition dim cannot be strided.

        A kernel re-slices the same tile shapes in every loop iteration, so the resulting
        (shape, strides, offset) of an index whose parts are plain ints/slices/``nl.ds`` is
        cached by everything the indexing and its bounds check read (this view's pattern and
        dtype, the storage's geometry): a hit is an index that passed every check before
        with identical inputs. Errors are never cached (they re-run the checks).
        """
        index_key = _index_key(key) if self._indirect is None else None
        if index_key is not None:
            st = self._storage
            cache_key = (index_key, self.shape, self.strides, self.offset, self.dtype, st.geometry)
            hit = _VIEW_CACHE.get(cache_key)
            if hit is not None:
                view = NkiTensor.__new__(NkiTensor)
                view._storage = st
                st.views += 1
                view.shape, view.strides, view.offset = hit
                view.dtype = self.dtype or st.dtype
                view.name = self.name or st.name
                view._acc = None
                view._indirect = None
                return view
            view = self._index(key)
            if len(_VIEW_CACHE) >= _VIEW_CACHE_MAX:
                _VIEW_CACHE.clear()
            _VIEW_CACHE[cache_key] = (view.shape, view.strides, view.offset)
            return view
        return self._index(key)

    def _index(self, key) -> NkiTensor:
        """``__getitem__`` without the cache: every check."""
        api = "NkiTensor.__getitem__"
        if not isinstance(key, tuple):
            key = (key,)
        ndim = len(self.shape)
        n_ellipsis = 0
        for k in key:
            if k is Ellipsis:
                n_ellipsis += 1
        if n_ellipsis > 1:
            raise NkiValidationError(api, "index", "may contain at most one Ellipsis", key)
        n_explicit = len(key) - n_ellipsis
        if n_explicit > ndim:
            raise NkiValidationError(api, "index", f"must have at most {ndim} entries", key)
        if n_ellipsis:
            pos = key.index(Ellipsis)
            key = key[:pos] + (slice(None),) * (ndim - n_explicit) + key[pos + 1 :]
        elif len(key) < ndim:
            key = key + (slice(None),) * (ndim - len(key))

        on_chip = self.on_chip
        shape, strides, offset = [], [], self.offset
        dropped: list[int] = []  # dims removed by an integer index, by original position
        kept_positions: list[int] = []
        for dim in range(ndim):
            k, n, s = key[dim], self.shape[dim], self.strides[dim]
            if type(k) is slice:
                if k.start is None and k.stop is None and k.step is None:
                    shape.append(n)
                    strides.append(s)
                    kept_positions.append(dim)
                    continue
                start, stop, step = _resolve_slice(api, dim, k, n)
            elif type(k) is DynamicSlice:
                start, size = k.start, k.size
                if type(start) is not int:
                    start = _int(api, "nl.ds start", start)
                if type(size) is not int:
                    size = _int(api, "nl.ds size", size)
                if start < 0 or size < 1 or start + size > n:
                    raise NkiValidationError(
                        api,
                        f"nl.ds on dim {dim}",
                        f"must satisfy 0 <= start and 1 <= size and start + size <= {n}",
                        k,
                    )
                stop, step = start + size, 1
            elif type(k) is int or _is_int(k):
                i = int(k)
                if i < -n or i >= n:
                    raise NkiValidationError(
                        api, f"index on dim {dim}", f"must be in [-{n}, {n})", i
                    )
                i %= n
                offset += i * s
                if on_chip and dim == 0:
                    shape.append(1)
                    strides.append(s)
                    kept_positions.append(dim)
                else:
                    dropped.append(dim)
                continue
            elif isinstance(k, NkiTensor):
                raise not_implemented("NkiTensor.__getitem__ with a tensor index (dynamic select)")
            else:
                raise NkiValidationError(
                    api, f"index on dim {dim}", "must be an int, slice, Ellipsis or nl.ds", repr(k)
                )
            count = (stop - start + step - 1) // step
            if on_chip and dim == 0 and step != 1 and count > 1:
                raise NkiValidationError(
                    api,
                    "partition step",
                    "must be 1 (on-chip operands use consecutive partitions)",
                    step,
                    limit=1,
                )
            offset += start * s
            shape.append(count)
            strides.append(s * step)
            kept_positions.append(dim)

        min_dims = 2 if on_chip else 1
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
        from neuron_kernels.interpreter.instructions import dma, vector

        dst = self[key]
        if isinstance(value, NkiTensor):
            if dst.on_chip and value.on_chip:
                vector.tensor_copy(dst=dst, src=value)
            else:
                dma.dma_copy(dst=dst, src=value)
        else:
            vector.memset(dst=dst, value=value)

    # -- view methods (nki/api/nki/language/__init__.py) ------------------------------
    def _norm_dim(self, api, dim, ndim=None, arg="dim") -> int:
        ndim = self.ndim if ndim is None else ndim
        if not _is_int(dim) or not -ndim <= dim < ndim:
            raise NkiValidationError(api, arg, f"must be an int in [-{ndim}, {ndim})", dim)
        return int(dim) % ndim

    def permute(self, dims) -> NkiTensor:
        api = "NkiTensor.permute"
        try:
            dims = tuple(dims)
        except TypeError:
            raise NkiValidationError(api, "dims", "must be a tuple of ints", dims) from None
        if not all(_is_int(d) for d in dims) or sorted(dims) != list(range(self.ndim)):
            raise NkiValidationError(
                api, "dims", f"must be a permutation of range({self.ndim})", dims
            )
        if self.on_chip and dims[0] != 0:
            raise NkiValidationError(
                api, "dims[0]", "must be 0 on-chip (partition dim stays first)", dims[0], limit=0
            )
        return self._derive(
            api, [self.shape[d] for d in dims], [self.strides[d] for d in dims], self.offset
        )

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        api = "NkiTensor.broadcast"
        dim = self._norm_dim(api, dim)
        if self.shape[dim] != 1:
            raise NkiValidationError(api, f"shape[{dim}]", "must be 1", self.shape[dim], limit=1)
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        if not _is_int(size) or size < 1:
            raise NkiValidationError(api, "size", "must be a positive int", size)
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = int(size), 0
        return self._derive(api, shape, strides, self.offset)

    def expand_dim(self, dim: int) -> NkiTensor:
        api = "NkiTensor.expand_dim"
        dim = self._norm_dim(api, dim, self.ndim + 1)
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        shape, strides = list(self.shape), list(self.strides)
        # The new dim's stride keeps it contiguous with the dim it is inserted before.
        stride = strides[dim] * shape[dim] if dim < len(shape) else 1
        shape.insert(dim, 1)
        strides.insert(dim, stride)
        return self._derive(api, shape, strides, self.offset)

    def squeeze_dim(self, dim: int) -> NkiTensor:
        api = "NkiTensor.squeeze_dim"
        dim = self._norm_dim(api, dim)
        if self.shape[dim] != 1:
            raise NkiValidationError(api, f"shape[{dim}]", "must be 1", self.shape[dim], limit=1)
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        if self.ndim == 1:
            raise NkiValidationError(api, "dim", "must leave at least one dim", dim)
        shape, strides = list(self.shape), list(self.strides)
        del shape[dim], strides[dim]
        return self._derive(api, shape, strides, self.offset)

    def reshape_dim(self, dim: int, shape) -> NkiTensor:
        api = "NkiTensor.reshape_dim"
        dim = self._norm_dim(api, dim)
        try:
            parts = tuple(shape)
        except TypeError:
            raise NkiValidationError(api, "shape", "must be a tuple of ints", shape) from None
        parts = _infer_shape(api, parts, self.shape[dim])
        if self.on_chip and dim == 0 and len(parts) != 1:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        sub_strides, acc = [], self.strides[dim]
        for n in reversed(parts):
            sub_strides.append(acc)
            acc *= n
        new_shape = list(self.shape[:dim]) + list(parts) + list(self.shape[dim + 1 :])
        new_strides = list(self.strides[:dim]) + sub_strides[::-1] + list(self.strides[dim + 1 :])
        return self._derive(api, new_shape, new_strides, self.offset)

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        api = "NkiTensor.flatten_dims"
        start = self._norm_dim(api, start_dim, arg="start_dim")
        end = self._norm_dim(api, end_dim, arg="end_dim")
        if start > end:
            raise NkiValidationError(api, "start_dim", f"must be <= end_dim ({end})", start)
        if self.on_chip and start == 0:
            raise NkiValidationError(api, "start_dim", "must be > 0 on-chip", start)
        # Size-1 dims do not address anything, so their strides do not matter.
        real = [d for d in range(start, end + 1) if self.shape[d] != 1]
        for a, b in zip(real, real[1:]):
            if self.strides[a] != self.strides[b] * self.shape[b]:
                raise NkiValidationError(
                    api,
                    f"dims {start}..{end}",
                    "must be contiguous in memory",
                    f"shape {self.shape}, strides {self.strides}",
                )
        merged = math.prod(self.shape[start : end + 1])
        inner = self.strides[real[-1]] if real else self.strides[end]
        shape = list(self.shape[:start]) + [merged] + list(self.shape[end + 1 :])
        strides = list(self.strides[:start]) + [inner] + list(self.strides[end + 1 :])
        return self._derive(api, shape, strides, self.offset)

    def reshape(self, shape) -> NkiTensor:
        api = "NkiTensor.reshape"
        if _is_int(shape):
            shape = (shape,)
        try:
            shape = tuple(shape)
        except TypeError:
            raise NkiValidationError(api, "shape", "must be a tuple of ints", shape) from None
        new_shape = _infer_shape(api, shape, self.size)
        if self.on_chip and new_shape[0] != self.shape[0]:
            raise NkiValidationError(
                api,
                "shape[0]",
                f"must equal the partition dim {self.shape[0]} on-chip",
                new_shape[0],
                limit=self.shape[0],
            )
        if self.on_chip:
            # The partition dim is its own block: only the free dims are reshaped.
            free = _reshape_strides(self.shape[1:], self.strides[1:], new_shape[1:])
            strides = None if free is None else (self.strides[0],) + tuple(free)
        else:
            strides = _reshape_strides(self.shape, self.strides, new_shape)
        if strides is None:
            raise NkiValidationError(
                api,
                "shape",
                f"must be reachable without a copy from shape {self.shape} with "
                f"strides {self.strides}",
                new_shape,
            )
        return self._derive(api, new_shape, strides, self.offset)

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None) -> NkiTensor:
        """einops-style split / permute / merge, built from reshape_dim, permute and
        flatten_dims (so each step keeps that method's constraints).

        ``t.rearrange(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})`` on ``(128, 24)``
        gives ``(128, 6, 4)``. In a source group every size but one must be known from
        ``fixed_sizes``; the last unknown one is inferred.
        """
        api = "NkiTensor.rearrange"
        fixed = {} if fixed_sizes is None else dict(fixed_sizes)
        src = _parse_pattern(api, "src_pattern", src_pattern)
        dst = _parse_pattern(api, "dst_pattern", dst_pattern)
        if len(src) != self.ndim:
            raise NkiValidationError(
                api, "src_pattern", f"must name {self.ndim} dims (one per tensor dim)", src_pattern
            )
        src_names = [n for g in src for n in g]
        dst_names = [n for g in dst for n in g]
        for arg, names, pat in (
            ("src_pattern", src_names, src_pattern),
            ("dst_pattern", dst_names, dst_pattern),
        ):
            if len(set(names)) != len(names):
                raise NkiValidationError(api, arg, "must not repeat a dim name", pat)
        if sorted(src_names) != sorted(dst_names):
            raise NkiValidationError(
                api,
                "dst_pattern",
                f"must use exactly the names of src_pattern {tuple(src_names)}",
                dst_pattern,
            )
        for name, size in fixed.items():
            if name not in src_names:
                raise NkiValidationError(
                    api, "fixed_sizes", "must only name dims of src_pattern", name
                )
            if not _is_int(size) or size < 1:
                raise NkiValidationError(
                    api, f"fixed_sizes[{name!r}]", "must be a positive int", size
                )
        t, dim = self, 0
        for group, n in zip(src, self.shape):
            if len(group) > 1:
                unknown = [g for g in group if g not in fixed]
                if len(unknown) > 1:
                    raise NkiValidationError(
                        api,
                        "fixed_sizes",
                        f"must give all but one size of the group {group}",
                        fixed,
                    )
                t = t.reshape_dim(dim, tuple(fixed.get(g, -1) for g in group))
            elif group[0] in fixed and fixed[group[0]] != n:
                raise NkiValidationError(
                    api,
                    f"fixed_sizes[{group[0]!r}]",
                    f"must equal the dim size {n}",
                    fixed[group[0]],
                    limit=n,
                )
            dim += len(group)
        t = t.permute(tuple(src_names.index(name) for name in dst_names))
        dim = 0
        for group in dst:
            if len(group) > 1:
                t = t.flatten_dims(dim, dim + len(group) - 1)
            dim += 1
        return t

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        api = "NkiTensor.slice"
        dim = self._norm_dim(api, dim)
        n = self.shape[dim]
        if not (_is_int(start) and _is_int(end) and 0 <= start < end <= n):
            raise NkiValidationError(
                api, "start/end", f"must satisfy 0 <= start < end <= {n}", (start, end), limit=n
            )
        if not _is_int(step) or step < 1:
            raise NkiValidationError(api, "step", "must be an int >= 1", step, limit=1)
        key = [slice(None)] * self.ndim
        key[dim] = slice(int(start), int(end), int(step))
        return self[tuple(key)]

    def select(self, dim: int, index) -> NkiTensor:
        """``index`` along ``dim``, which is removed. An int selects statically; a 1x1 SBUF
        integer tensor or a VirtualRegister selects at run time (a scalar-offset indirect
        view, as ``.ap(scalar_offset=index, indirect_dim=dim)``)."""
        from neuron_kernels.interpreter.registers import VirtualRegister

        api = "NkiTensor.select"
        dim = self._norm_dim(api, dim)
        if isinstance(index, (NkiTensor, VirtualRegister)):
            if self.on_chip and dim == 0:
                raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
            pattern = [[s, n] for i, (n, s) in enumerate(zip(self.shape, self.strides)) if i != dim]
            return self.ap(pattern or [[1, 1]], scalar_offset=index, indirect_dim=dim)
        if not _is_int(index) or not 0 <= index < self.shape[dim]:
            raise NkiValidationError(
                api,
                "index",
                f"must be an int in [0, {self.shape[dim]})",
                index,
                limit=self.shape[dim],
            )
        if self.on_chip and dim == 0:
            raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
        shape, strides = list(self.shape), list(self.strides)
        offset = self.offset + int(index) * strides[dim]
        del shape[dim], strides[dim]
        if not shape:  # HBM 1-D: keep one dim, as indexing does
            shape, strides = [1], [1]
        return self._derive(api, shape, strides, offset)

    def vector_select(self, dim, vector_offset):
        """Per-partition rows of an HBM tensor: row ``i`` of the result is row
        ``vector_offset[i]`` of ``self`` along ``dim`` (which must be 0)."""
        api = "NkiTensor.vector_select"
        if dim != 0:
            raise NkiValidationError(api, "dim", "must be 0", dim, limit=0)
        if not self.buffer.is_hbm:
            raise NkiValidationError(api, "self", "must be an HBM tensor", self.buffer.value)
        if not isinstance(vector_offset, NkiTensor):
            raise NkiValidationError(
                api, "vector_offset", "must be an SBUF tensor", type(vector_offset).__name__
            )
        pattern = [[self.strides[0], vector_offset.shape[0]]]
        pattern += [[s, n] for n, s in zip(self.shape[1:], self.strides[1:])]
        return self.ap(pattern, vector_offset=vector_offset, indirect_dim=0)

    def indirect(self, index, num_elem=None):
        raise not_implemented("NkiTensor.indirect")

    def ap(
        self,
        pattern,
        offset=None,
        scalar_offset=None,
        vector_offset=None,
        indirect_dim=0,
        dtype=None,
    ):
        """Raw access pattern ``[[step, num], ...]`` on the underlying storage (not
        composable with the view's shape/strides).

        [CONFLICT] An integer ``offset`` is added to this view's storage offset, as the 0.6
        API stub says; nki/get-started/nki-language-guide.rst reads it as an absolute
        override. Both agree on fresh tensors (offset 0), where production code uses it.
        With ``dtype``, the base offset, pattern and ``offset`` count elements of that dtype.
        """
        api = "NkiTensor.ap"
        if self._indirect is not None:
            raise NkiValidationError(
                api, "self", "must not already be an indirect view (no re-indirection)", repr(self)
            )
        view_dtype = dtypes.normalize(dtype, api) if dtype is not None else self.dtype
        pairs = []
        try:
            for p in pattern:
                step, num = p
                if not (_is_int(step) and _is_int(num)):
                    raise TypeError
                pairs.append((int(step), int(num)))
        except (TypeError, ValueError):
            raise NkiValidationError(
                api, "pattern", "must be a list of [step, num] int pairs", pattern
            ) from None
        if not pairs:
            raise NkiValidationError(api, "pattern", "must not be empty", pattern)
        if offset is not None and not _is_int(offset):
            raise NkiValidationError(api, "offset", "must be an int or None", offset)
        self._check_reinterpret(api, view_dtype)
        byte_base = self.offset * self.itemsize
        new_item = dtypes.info(view_dtype).itemsize
        if self.on_chip and self._storage.bytes_per_partition % new_item:
            raise NkiValidationError(
                api,
                "dtype",
                f"must divide the {self._storage.bytes_per_partition} bytes of a "
                "partition into whole elements",
                view_dtype,
            )
        if byte_base % new_item:
            raise NkiValidationError(
                api,
                "dtype",
                f"must keep the base offset ({byte_base} bytes) element-aligned",
                view_dtype,
            )
        new_offset = byte_base // new_item + (0 if offset is None else int(offset))
        view = NkiTensor._make(
            self._storage, [n for _, n in pairs], [s for s, _ in pairs], new_offset, view_dtype
        )
        if scalar_offset is None and vector_offset is None:
            view._check_bounds(api)
            return view
        indirection = self._indirection(api, pairs, scalar_offset, vector_offset, indirect_dim)
        if indirection.kind == "vector":  # dim 0 is dynamic: check one row statically
            probe = NkiTensor._make(
                self._storage, [1, *view.shape[1:]], view.strides, new_offset, view_dtype
            )
            probe._check_bounds(api)
        else:
            view._check_bounds(api)
        view._indirect = indirection
        return view

    def _indirection(self, api, pairs, scalar_offset, vector_offset, indirect_dim) -> Indirection:
        """The checked dynamic offset of ``.ap()`` (nki/api/nki/isa ``dma_copy``, "Indirect
        addressing"; ``fori_loop``'s ``scalar_offset=i``)."""
        from neuron_kernels.interpreter.registers import VirtualRegister

        if scalar_offset is not None and vector_offset is not None:
            raise NkiValidationError(
                api, "vector_offset", "and scalar_offset are mutually exclusive", "both given"
            )
        if not _is_int(indirect_dim) or not 0 <= indirect_dim < self.ndim:
            raise NkiValidationError(
                api,
                "indirect_dim",
                f"must be a dim of self.shape (0..{self.ndim - 1})",
                indirect_dim,
            )
        scale = self.strides[int(indirect_dim)]
        if self.buffer is MemoryRegion.psum:
            raise NkiValidationError(
                api,
                "self",
                "must be in HBM or SBUF for indirect access (the docs define "
                "no dynamic PSUM addressing)",
                "psum",
            )
        if vector_offset is not None:
            idx = vector_offset
            if not isinstance(idx, NkiTensor) or idx.buffer is not MemoryRegion.sbuf:
                raise NkiValidationError(
                    api,
                    "vector_offset",
                    "must be an SBUF tensor of row indices",
                    getattr(idx, "buffer", type(idx).__name__),
                )
            if dtypes.info(idx.dtype).kind not in ("int", "uint") or idx.itemsize > 4:
                raise NkiValidationError(
                    api, "vector_offset dtype", "must be a 32-bit or narrower integer", idx.dtype
                )
            if idx.ndim != 2:
                raise NkiValidationError(
                    api, "vector_offset", "must be 2-D (P, 1) or (P, N)", idx.shape
                )
            if self.buffer.is_hbm is False:
                raise NkiValidationError(
                    api,
                    "self",
                    "must be in HBM for vector_offset (vector indirection)",
                    self.buffer.value,
                )
            if indirect_dim != 0:
                raise NkiValidationError(
                    api,
                    "indirect_dim",
                    "must be 0 with vector_offset (the only form the docs define)",
                    indirect_dim,
                )
            if pairs[0][1] > idx.size:
                raise NkiValidationError(
                    api,
                    "pattern[0] count",
                    f"must not exceed the {idx.size} indices of vector_offset",
                    pairs[0][1],
                    limit=idx.size,
                )
            return Indirection("vector", idx, scale)
        reg = scalar_offset
        if isinstance(reg, VirtualRegister):
            return Indirection("scalar", reg, scale)
        if isinstance(reg, NkiTensor):
            if reg.buffer is not MemoryRegion.sbuf or reg.size != 1:
                raise NkiValidationError(
                    api,
                    "scalar_offset",
                    "must be a 1x1 SBUF tensor or a VirtualRegister",
                    f"{reg.buffer.value} {reg.shape}",
                )
            if dtypes.info(reg.dtype).kind not in ("int", "uint") or reg.itemsize > 4:
                raise NkiValidationError(
                    api, "scalar_offset dtype", "must be a 32-bit or narrower integer", reg.dtype
                )
            if self.on_chip and indirect_dim == 0:
                raise NkiValidationError(
                    api,
                    "indirect_dim",
                    "must be a free dim on SBUF: the docs do not define a dynamic partition offset",
                    indirect_dim,
                )
            return Indirection("scalar", reg, scale)
        raise NkiValidationError(
            api,
            "scalar_offset",
            "must be a 1x1 SBUF tensor or a VirtualRegister",
            type(reg).__name__,
            hint="a compile-time offset is offset=<int>",
        )

    def _check_reinterpret(self, api, new_dtype) -> None:
        """Bit reinterpretation needs bit-exact storage: not available for low-precision
        floats stored widened to fp32 under NKI_PRECISE_FP=0."""
        st = self._storage
        if new_dtype == st.dtype or st.precise_fp:
            return
        if dtypes.storage_dtype(new_dtype, False) != dtypes.storage_dtype(
            new_dtype, True
        ) or dtypes.storage_dtype(st.dtype, False) != dtypes.storage_dtype(st.dtype, True):
            raise not_implemented(
                f"{api} reinterpreting {st.dtype} as {new_dtype} under NKI_PRECISE_FP=0 "
                "(low-precision floats are stored as fp32, so their bits do not exist)"
            )

    def view(self, dtype) -> NkiTensor:
        """Reinterpret the bits as ``dtype``; the last dim scales by the size ratio."""
        api = "NkiTensor.view"
        new = dtypes.normalize(dtype, api)
        self._check_reinterpret(api, new)
        old_size, new_size = self.itemsize, dtypes.info(new).itemsize
        if new_size == old_size:
            return self._derive(api, self.shape, self.strides, self.offset, new)
        if self.strides[-1] != 1 and self.shape[-1] != 1:
            raise NkiValidationError(
                api, "last dim stride", "must be 1 (contiguous)", self.strides[-1], limit=1
            )
        if new_size < old_size:
            r = old_size // new_size
            shape = list(self.shape[:-1]) + [self.shape[-1] * r]
            strides = [s * r for s in self.strides[:-1]] + [1]
            return self._derive(api, shape, strides, self.offset * r, new)
        r = new_size // old_size
        if self.shape[-1] % r:
            raise NkiValidationError(
                api,
                "last dim",
                f"must be divisible by the dtype size ratio {r}",
                self.shape[-1],
                limit=r,
            )
        if self.offset % r or any(s % r for s in self.strides[:-1]):
            raise NkiValidationError(
                api,
                "offset and strides",
                f"must be divisible by the dtype size ratio {r}",
                (self.offset, self.strides),
                limit=r,
            )
        shape = list(self.shape[:-1]) + [self.shape[-1] // r]
        strides = [s // r for s in self.strides[:-1]] + [1]
        return self._derive(api, shape, strides, self.offset // r, new)

    reinterpret_cast = view

    def is_contiguous(self) -> bool:
        """Row-major contiguity of the non-size-1 dims (on-chip: free dims only)."""
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
        """``[[stride, count], ...]`` per dim, in the order of ``shape``."""
        return [[s, n] for n, s in zip(self.shape, self.strides)]

    def is_indirect(self) -> bool:
        return self._indirect is not None


# -- helpers -----------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# NkiTensor.__getitem__'s cache: (index, shape, strides, offset, dtype, storage geometry) ->
# the view's (shape, strides, offset). Bounded: cleared when full.
_VIEW_CACHE: dict = {}
_VIEW_CACHE_MAX = 1 << 16


# NkiTensor._access's cache: (shape, strides, offset, dtype, storage geometry) -> the
# storage-independent fields of the Access (itemsize .. inner_stride_bytes).
_ACCESS_CACHE: dict = {}


def _access_geometry(st, shape, strides, offset, dtype) -> tuple:
    """Access fields ``itemsize`` .. ``inner_stride_bytes`` of a view (in field order)."""
    item = dtypes.DTYPES[dtype].itemsize
    if st.on_chip:
        pstart, lo = divmod(offset, st.partition_elems * st.itemsize // item)
        first, partitions = 1, (shape[0] if shape else 1)
        epp = math.prod(shape[1:])
    else:
        pstart, lo = 0, offset
        first, partitions = 0, (shape[0] if len(shape) > 1 else 1)
        epp = math.prod(shape) // partitions
    # One pass from the innermost dim: byte extent (size-1 dims add nothing), innermost
    # stride, and the innermost contiguous run.
    hi = lo
    run = expect = inner = 1
    found = False
    open_run = True
    for i in range(len(shape) - 1, first - 1, -1):
        n = shape[i]
        if n == 1:
            continue
        s = strides[i]
        if s >= 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
        if not found:
            inner, found = s, True
        if open_run:
            if s == expect:
                run *= n
                expect *= n
            else:
                open_run = False
    return (
        item,
        pstart,
        partitions,
        epp,
        lo * item,
        (hi + 1) * item,
        run * item,
        abs(inner) * item,
    )


def _index_key(key):
    """A hashable, type-exact form of an index made only of plain ``int`` / ``slice`` of
    ``int``/None / ``nl.ds`` of ``int`` / Ellipsis, else None (not cached: bools, NumPy
    ints, tensors and anything invalid take the checked path)."""
    if type(key) is not tuple:
        key = (key,)
    out = []
    for k in key:
        t = type(k)
        if t is slice:
            a, b, c = k.start, k.stop, k.step
            if (
                (a is None or type(a) is int)
                and (b is None or type(b) is int)
                and (c is None or type(c) is int)
            ):
                out.append((a, b, c))
            else:
                return None
        elif t is int or k is Ellipsis:
            out.append(k)
        elif t is DynamicSlice:
            a, b = k.start, k.size
            if type(a) is int and type(b) is int:
                out.append((a, b))
            else:
                return None
        else:
            return None
    return tuple(out)


def _int(api, what, x) -> int:
    if not _is_int(x):
        raise NkiValidationError(api, what, "must be a compile-time int", x)
    return int(x)


def _resolve_slice(api, dim, k: slice, n: int) -> tuple[int, int, int]:
    step, start, stop = k.step, k.start, k.stop
    step = 1 if step is None else step if type(step) is int else _int(api, "slice step", step)
    if step < 1:
        raise NkiValidationError(api, f"slice step on dim {dim}", "must be >= 1", step, limit=1)
    start = 0 if start is None else start if type(start) is int else _int(api, "slice start", start)
    stop = n if stop is None else stop if type(stop) is int else _int(api, "slice stop", stop)
    if start < 0:
        start += n
    if stop < 0:
        stop += n
    # NKI does not clamp like NumPy: out-of-range bounds are errors.
    if not 0 <= start < stop <= n:
        raise NkiValidationError(
            api,
            f"slice on dim {dim}",
            f"must satisfy 0 <= start < stop <= {n} (no clamping)",
            f"{k.start}:{k.stop}",
            limit=n,
        )
    return start, stop, step


def _infer_shape(api, shape: tuple, total: int) -> tuple[int, ...]:
    if any((not _is_int(n)) or (n < 1 and n != -1) for n in shape):
        raise NkiValidationError(
            api, "shape", "must hold positive ints (and at most one -1)", shape
        )
    if sum(1 for n in shape if n == -1) > 1:
        raise NkiValidationError(api, "shape", "may contain at most one -1", shape)
    if not shape:
        raise NkiValidationError(api, "shape", "must not be empty", shape)
    known = math.prod(n for n in shape if n != -1)
    if -1 in shape:
        if total % known:
            raise NkiValidationError(api, "shape", f"must divide {total} elements", shape)
        shape = tuple(total // known if n == -1 else n for n in shape)
    if math.prod(shape) != total:
        raise NkiValidationError(
            api, "shape", f"must hold exactly {total} elements", shape, limit=total
        )
    return tuple(int(n) for n in shape)


def _reshape_strides(old_shape, old_strides, new_shape):
    """Strides for a copy-free reshape, or None (NumPy's attempt_nocopy_reshape)."""
    old = [(n, s) for n, s in zip(old_shape, old_strides) if n != 1]
    new_strides = [0] * len(new_shape)
    if not old:  # every old dim has size 1: any new shape of ones is fine
        return _contiguous_strides(tuple(new_shape))
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
    for k in range(ni, n_n):  # trailing size-1 dims
        new_strides[k] = last
    return tuple(new_strides)


def _parse_pattern(api, arg, pattern) -> list[tuple[str, ...]]:
    """``('b', ('h', 'w'))`` -> ``[('b',), ('h', 'w')]``."""
    groups = []
    if not isinstance(pattern, (tuple, list)):
        raise NkiValidationError(api, arg, "must be a tuple of names or tuples of names", pattern)
    for item in pattern:
        if isinstance(item, str):
            groups.append((item,))
        elif isinstance(item, (tuple, list)) and item and all(isinstance(n, str) for n in item):
            groups.append(tuple(item))
        else:
            raise NkiValidationError(
                api, arg, "must be a tuple of names or non-empty tuples of names", pattern
            )
    return groups


def wrap_host_array(
    sim, array: np.ndarray, dtype: str, buffer: MemoryRegion, name: str
) -> NkiTensor:
    """Wrap a caller's array as an HBM tensor (copied into device storage)."""
    launch = sim.launch
    data = None
    if launch.compute:
        data = array
        if data.dtype != dtypes.storage_dtype(dtype, launch.precise_fp):
            data = dtypes.convert(data, dtype, launch.precise_fp)
        data = np.array(data, order="C", copy=True).reshape(-1)
    storage = Storage(
        launch.new_storage_id(),
        array.shape if array.ndim else (1,),
        dtype,
        buffer,
        name,
        launch.precise_fp,
        compute=launch.compute,
        array=data,
    )
    return NkiTensor._make(
        storage, storage.shape, _contiguous_strides(storage.shape), 0, dtype, name
    )
