"""A tensor's view methods (:class:`TensorViews`, a facet of
:class:`~neuron_kernels.interpreter.tensor.NkiTensor`): permute, broadcast, reshape,
rearrange, slice, select, ``.ap()`` access patterns and their indirection, dtype views; each
returns a new view of the same storage, never a copy (nki/api/nki/language/__init__.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.errors import NkiValidationError, not_implemented
from neuron_kernels.interpreter.storage import MemoryRegion, contiguous_strides
from neuron_kernels.interpreter.values import is_int

if TYPE_CHECKING:
    from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = ["Indirection", "TensorViews"]


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


class TensorViews:
    """The view methods of an :class:`NkiTensor`."""

    def _norm_dim(self, api, dim, ndim=None, arg="dim") -> int:
        ndim = self.ndim if ndim is None else ndim
        if not is_int(dim) or not -ndim <= dim < ndim:
            raise NkiValidationError(api, arg, f"must be an int in [-{ndim}, {ndim})", dim)
        return int(dim) % ndim

    def permute(self, dims) -> NkiTensor:
        api = "NkiTensor.permute"
        try:
            dims = tuple(dims)
        except TypeError:
            raise NkiValidationError(api, "dims", "must be a tuple of ints", dims) from None
        if not all(is_int(d) for d in dims) or sorted(dims) != list(range(self.ndim)):
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
        if not is_int(size) or size < 1:
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
        if is_int(shape):
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
            if not is_int(size) or size < 1:
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
        if not (is_int(start) and is_int(end) and 0 <= start < end <= n):
            raise NkiValidationError(
                api, "start/end", f"must satisfy 0 <= start < end <= {n}", (start, end), limit=n
            )
        if not is_int(step) or step < 1:
            raise NkiValidationError(api, "step", "must be an int >= 1", step, limit=1)
        key = [slice(None)] * self.ndim
        key[dim] = slice(int(start), int(end), int(step))
        return self[tuple(key)]

    def select(self, dim: int, index) -> NkiTensor:
        """``index`` along ``dim``, which is removed. An int selects statically; a 1x1 SBUF
        integer tensor or a VirtualRegister selects at run time (a scalar-offset indirect
        view, as ``.ap(scalar_offset=index, indirect_dim=dim)``)."""
        from neuron_kernels.interpreter.registers import VirtualRegister
        from neuron_kernels.interpreter.tensor import NkiTensor

        api = "NkiTensor.select"
        dim = self._norm_dim(api, dim)
        if isinstance(index, (NkiTensor, VirtualRegister)):
            if self.on_chip and dim == 0:
                raise NkiValidationError(api, "dim", "must not be 0 (partition dim) on-chip", dim)
            pattern = [[s, n] for i, (n, s) in enumerate(zip(self.shape, self.strides)) if i != dim]
            return self.ap(pattern or [[1, 1]], scalar_offset=index, indirect_dim=dim)
        if not is_int(index) or not 0 <= index < self.shape[dim]:
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
        from neuron_kernels.interpreter.tensor import NkiTensor

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
        from neuron_kernels.interpreter.tensor import NkiTensor

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
                if not (is_int(step) and is_int(num)):
                    raise TypeError
                pairs.append((int(step), int(num)))
        except (TypeError, ValueError):
            raise NkiValidationError(
                api, "pattern", "must be a list of [step, num] int pairs", pattern
            ) from None
        if not pairs:
            raise NkiValidationError(api, "pattern", "must not be empty", pattern)
        if offset is not None and not is_int(offset):
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
        from neuron_kernels.interpreter.tensor import NkiTensor

        if scalar_offset is not None and vector_offset is not None:
            raise NkiValidationError(
                api, "vector_offset", "and scalar_offset are mutually exclusive", "both given"
            )
        if not is_int(indirect_dim) or not 0 <= indirect_dim < self.ndim:
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


def _infer_shape(api, shape: tuple, total: int) -> tuple[int, ...]:
    if any((not is_int(n)) or (n < 1 and n != -1) for n in shape):
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
        return contiguous_strides(tuple(new_shape))
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
