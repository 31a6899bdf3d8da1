"""The values behind a tensor view (:class:`TensorValues`, a facet of
:class:`~neuron_kernels.interpreter.tensor.NkiTensor`): reads and writes through the view's
strides or its indirection, and the PSUM accumulation state of the elements it addresses."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.errors import NkiValidationError, not_implemented
from neuron_kernels.interpreter.storage import PSUM_STATE_UNALLOCATED, PSUM_VALUE_WRITTEN

if TYPE_CHECKING:
    from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = ["TensorValues"]


class TensorValues:
    """Physical access: the values of an :class:`NkiTensor` view in its storage."""

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
            if st.psum_state is PSUM_STATE_UNALLOCATED:
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
