"""A tensor view's bounds and trace record (:class:`TensorRecords`, a facet of
:class:`~neuron_kernels.interpreter.tensor.NkiTensor`): the check that a view stays inside its
allocation, and the :class:`~neuron_kernels.interpreter.trace.Access` an instruction records
for it (cached per view and per geometry)."""

from __future__ import annotations

import dataclasses
import math

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.trace import Access

__all__ = ["TensorRecords"]


class TensorRecords:
    """Bounds and trace records of an :class:`NkiTensor` view."""

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
                if len(_ACCESS_CACHE) >= _ACCESS_CACHE_MAX:
                    _ACCESS_CACHE.clear()
                _ACCESS_CACHE[geo_key] = geo
            acc = cache[key] = Access(st.uid, st.name, st.buffer_value, self.dtype, shape, *geo)
        self._acc = acc
        return acc

    def _indirect_access(self) -> Access:
        """An indirect view's trace record: its static pattern's shape and runs, with the
        byte range widened to what the dynamic offsets may reach (the whole allocation; on
        chip, each partition's bytes), since the addresses are only known on the device."""
        from neuron_kernels.interpreter.tensor import NkiTensor

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


# NkiTensor._access's cache: (shape, strides, offset, dtype, storage geometry) -> the
# storage-independent fields of the Access (itemsize .. inner_stride_bytes).
_ACCESS_CACHE: dict = {}
_ACCESS_CACHE_MAX = 1 << 16


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
