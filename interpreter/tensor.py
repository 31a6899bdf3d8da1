"""Tensors: strided views (:class:`NkiTensor`) of one allocation (:class:`Storage`).

A tensor is storage + view: element ``(i0, ..., in-1)`` lives at storage element
``offset + sum(strides[k] * ik)`` (nki/get-started/nki-language-guide.rst). Views never
copy. On-chip tensors (SBUF, PSUM) keep the partition dimension at dim 0; view methods
enforce the constraints the API stubs document (nki/api/nki/language/__init__.py), and a
view never addresses memory outside its allocation (on-chip: outside its partitions or
outside its bytes in a partition). Views are immutable once made.

This module holds the class (construction, attributes, indexing) and ``nl.ds``; its other
facets are mixins beside it: :mod:`.tensor_views` (the view methods: permute, reshape, ``.ap()``
...), :mod:`.tensor_values` (values read and written through a view, PSUM state) and
:mod:`.tensor_records` (bounds checks, the trace record). :mod:`.storage` is the allocation.
"""

from __future__ import annotations

import math

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.classes import NKIObject
from neuron_kernels.interpreter.errors import NkiValidationError, not_implemented
from neuron_kernels.interpreter.storage import MemoryRegion, Storage, contiguous_strides
from neuron_kernels.interpreter.tensor_records import TensorRecords
from neuron_kernels.interpreter.tensor_values import TensorValues
from neuron_kernels.interpreter.tensor_views import Indirection, TensorViews
from neuron_kernels.interpreter.values import is_int

__all__ = [
    "NKIObject",
    "NkiTensor",
    "DynamicSlice",
    "wrap_host_array",
]


class DynamicSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


class NkiTensor(TensorViews, TensorRecords, TensorValues, NKIObject):
    """NKI tensor: a strided view of one allocation.

    Attributes match the API: ``shape``, ``strides``, ``offset`` (elements), ``name``,
    ``dtype`` (an NKI dtype string), ``buffer`` (a :class:`MemoryRegion`), ``ndim``, ``size``.
    """

    def __init__(self, shape, dtype, storage, buffer=MemoryRegion.sbuf, name: str = ""):
        dtype = dtypes.normalize(dtype, "NkiTensor")
        if not isinstance(storage, Storage):
            raise not_implemented("NkiTensor(storage=<non-simulator storage>)")
        self._init_view(storage, tuple(shape), contiguous_strides(tuple(shape)), 0, dtype, name)

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
            elif type(k) is int or is_int(k):
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


# -- helpers -----------------------------------------------------------------------

# NkiTensor.__getitem__'s cache: (index, shape, strides, offset, dtype, storage geometry) ->
# the view's (shape, strides, offset). Bounded: cleared when full.
_VIEW_CACHE: dict = {}
_VIEW_CACHE_MAX = 1 << 16


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
    if not is_int(x):
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
        storage, storage.shape, contiguous_strides(storage.shape), 0, dtype, name
    )
