"""NkiTensor indexing and view methods against NumPy (nki/api/nki/language/__init__.py).

Each view is built inside a kernel on an HBM argument or on an SBUF copy of it, then copied
out with ``dma_copy`` (row-major), so a wrong stride, offset or shape shows up as wrong
values, not only as a wrong ``shape`` attribute.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.interpreter import NkiValidationError, nki, run
from neuron_kernels.interpreter.errors import NotImplementedByInterpreter

nl, nisa = nki.language, nki.isa

HBM, SBUF = "hbm", "sbuf"


def view_of(array, where, make_view, *, target="trn2", precise_fp=None):
    """Run ``make_view`` on ``array`` placed in HBM or SBUF; return (values, view attrs)."""
    seen = {}

    def kernel(x):
        if where == SBUF:
            t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf, name="t")
            nisa.dma_copy(dst=t, src=x)
        else:
            t = x
        v = make_view(t)
        seen.update(
            shape=v.shape,
            strides=v.strides,
            offset=v.offset,
            dtype=v.dtype,
            pattern=v.get_pattern(),
            contiguous=v.is_contiguous(),
            ndim=v.ndim,
        )
        out = nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm, name="out")
        nisa.dma_copy(dst=out, src=v)
        return out

    out = run(kernel, (array,), target=target, precise_fp=precise_fp).outputs
    return out, seen


def raises_in_kernel(array, where, make_view, exc=NkiValidationError):
    """The view construction raises ``exc``; returns the exception."""
    with pytest.raises(exc) as info:
        view_of(array, where, make_view)
    return info.value


def arange(shape, dtype=np.float32):
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape).astype(dtype)


# -- __getitem__ -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, sbuf_shape",
    [
        # The examples of nki/get-started/nki-language-guide.rst for t of shape (64, 64, 64).
        ((0, 0, 10), (1, 1)),
        ((slice(None), 0), (64, 64)),
        ((slice(None), 0, 10), (64, 1)),
        ((0, Ellipsis, slice(None)), (1, 64, 64)),
        ((slice(None), slice(None), slice(None, None, 2)), (64, 64, 32)),
    ],
)
def test_getitem_documented_examples(key, sbuf_shape):
    a = arange((64, 64, 64))
    out, seen = view_of(a, SBUF, lambda t: t[key])
    assert seen["shape"] == sbuf_shape
    np.testing.assert_array_equal(out, a[key].reshape(sbuf_shape))
    # HBM drops every integer-indexed dim, as NumPy does, but keeps at least 1 dim.
    out, seen = view_of(a, HBM, lambda t: t[key])
    assert seen["shape"] == (a[key].shape or (1,))
    np.testing.assert_array_equal(out, a[key].reshape(seen["shape"]))


def _nki_shape(np_key_parts, shape, on_chip):
    """The documented result shape: NumPy's, except on-chip an int on dim 0 keeps size 1 and
    fewer than 2 dims keep the last int-indexed free dim with size 1; HBM keeps >= 1 dim."""
    dims = []  # (original dim, size) kept
    dropped = []
    for dim, (k, n) in enumerate(zip(np_key_parts, shape)):
        if isinstance(k, int):
            if on_chip and dim == 0:
                dims.append((dim, 1))
            else:
                dropped.append(dim)
        else:
            dims.append((dim, len(range(*k.indices(n)))))
    need = 2 if on_chip else 1
    if len(dims) < need and dropped:
        dims.append((dropped[-1], 1))
        dims.sort()
    return tuple(n for _, n in dims)


@st.composite
def index_cases(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    parts = []
    for _dim, n in enumerate(shape):
        kind = draw(st.sampled_from(["all", "int", "slice", "ds"]))
        if kind == "int":
            i = draw(st.integers(0, n - 1))
            parts.append(i - n if draw(st.booleans()) else i)  # negative indices too
        elif kind == "slice":
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            step = draw(st.integers(1, 3))
            if draw(st.booleans()):  # negative bounds count from the end
                start -= n
                stop = stop - n if stop < n else None
            parts.append(slice(start, stop, step))
        elif kind == "ds":
            start = draw(st.integers(0, n - 1))
            parts.append(("ds", start, draw(st.integers(1, n - start))))
        else:
            parts.append(slice(None))
    n_trailing = draw(st.integers(0, ndim))  # drop trailing full slices, or use an Ellipsis
    use_ellipsis = n_trailing > 0 and draw(st.booleans())
    return shape, parts, n_trailing, use_ellipsis


def _as_keys(shape, parts, n_trailing, use_ellipsis):
    nki_key, np_key = [], []
    for p, _n in zip(parts, shape):
        if isinstance(p, tuple):
            nki_key.append(nl.ds(p[1], p[2]))
            np_key.append(slice(p[1], p[1] + p[2]))
        else:
            nki_key.append(p)
            np_key.append(p)
    # Only full slices may be left out at the end.
    cut = len(parts)
    while cut > 0 and len(parts) - cut < n_trailing and parts[cut - 1] == slice(None):
        cut -= 1
    nki_key = nki_key[:cut] + ([Ellipsis] if use_ellipsis and cut < len(parts) else [])
    return tuple(nki_key), tuple(np_key)


@settings(max_examples=60, deadline=None)
@given(case=index_cases(), where=st.sampled_from([HBM, SBUF]))
def test_getitem_matches_numpy(case, where):
    shape, parts, n_trailing, use_ellipsis = case
    nki_key, np_key = _as_keys(shape, parts, n_trailing, use_ellipsis)
    a = arange(shape)
    first = np_key[0]
    if (
        where == SBUF
        and isinstance(first, slice)
        and (first.step or 1) > 1
        and len(range(*first.indices(shape[0]))) > 1
    ):
        err = raises_in_kernel(a, where, lambda t: t[nki_key])  # no partition striding
        assert err.arg == "partition step"
        return
    out, seen = view_of(a, where, lambda t: t[nki_key])
    norm = [p if isinstance(p, int) else k for p, k in zip(parts, np_key)]
    want_shape = _nki_shape(norm, shape, on_chip=where == SBUF)
    assert seen["shape"] == want_shape
    np.testing.assert_array_equal(out, a[np_key].reshape(want_shape))


def test_getitem_psum_keeps_partition_dim():
    def kernel(x):
        ps = nl.ndarray((8, 4), nl.float32, buffer=nl.psum)
        sb = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x)
        nisa.tensor_copy(dst=ps, src=sb)
        row = ps[3]  # int on the partition dim keeps it (size 1)
        assert row.shape == (1, 4)
        col = ps[:, 2]  # the only free dim is kept with size 1
        assert col.shape == (8, 1)
        back = nl.ndarray((8, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=back, src=col)
        out = nl.ndarray((8, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=back)
        return out

    a = arange((8, 4))
    np.testing.assert_array_equal(run(kernel, (a,)).outputs, a[:, 2:3])


def test_chained_indexing_composes():
    a = arange((16, 8, 64))
    out, seen = view_of(a, SBUF, lambda t: t[0, ...][:, 0:4, 8:40:2][:, 1])
    assert seen["shape"] == (1, 16)
    np.testing.assert_array_equal(out, a[0:1, 1, 8:40:2])


@pytest.mark.parametrize(
    "key, arg",
    [
        (8, "index on dim 0"),  # out of range
        ((slice(None), -9), "index on dim 1"),
        ((slice(None), slice(0, 9)), "slice on dim 1"),  # NumPy would clamp to 8
        ((slice(None), slice(-20, None)), "slice on dim 1"),
        ((slice(None), slice(5, 5)), "slice on dim 1"),  # empty
        ((slice(None), slice(None, None, -1)), "slice step on dim 1"),
        ((slice(None), nl.ds(6, 3)), "nl.ds on dim 1"),
        ((slice(None), nl.ds(0, 0)), "nl.ds on dim 1"),
        ((0, 0, 0), "index"),  # too many entries
        ((Ellipsis, 0, Ellipsis), "index"),
        ((slice(None), 1.0), "index on dim 1"),
    ],
)
@pytest.mark.parametrize("where", [HBM, SBUF])
def test_getitem_rejects_bad_keys(key, arg, where):
    err = raises_in_kernel(arange((8, 8)), where, lambda t: t[key])
    assert err.op == "NkiTensor.__getitem__"
    assert err.arg == arg


def test_getitem_partition_step_rejected_on_chip_only():
    a = arange((8, 4))
    err = raises_in_kernel(a, SBUF, lambda t: t[0:8:2])
    assert (err.arg, err.value, err.limit) == ("partition step", 2, 1)
    assert "must be 1" in str(err)
    out, _ = view_of(a, HBM, lambda t: t[0:8:2])  # HBM rows may be strided
    np.testing.assert_array_equal(out, a[0:8:2])
    out, seen = view_of(a, SBUF, lambda t: t[3:4:5])  # a step on one partition is no step
    np.testing.assert_array_equal(out, a[3:4])


def test_getitem_tensor_index_not_implemented():
    with pytest.raises(NotImplementedByInterpreter, match="dynamic select"):
        view_of(arange((4, 4)), HBM, lambda t: t[t])


def test_no_iteration_truth_value_or_arithmetic():
    def iterate(x):  # one kernel per refusal: NKI kernels have no try/with to catch it
        list(x)

    def truth(x):
        bool(x)

    def add(x):
        x + x  # noqa: B018 (the operator is what raises)

    for kernel, exc, match in (
        (iterate, TypeError, "not iterable"),
        (truth, TypeError, "truth value"),
        (add, NotImplementedError, "arithmetic"),
    ):
        with pytest.raises(exc, match=match):
            run(kernel, (arange((2, 2)),))


# -- view methods --------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), data=st.data())
def test_permute_matches_transpose(shape, data):
    a = arange(shape)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    out, seen = view_of(a, HBM, lambda t: t.permute(perm))
    np.testing.assert_array_equal(out, np.transpose(a, perm))
    free = (0,) + tuple(data.draw(st.permutations(range(1, len(shape)))))
    out, seen = view_of(a, SBUF, lambda t: t.permute(free))
    np.testing.assert_array_equal(out, np.transpose(a, free))


def test_permute_rules():
    a = arange((4, 3, 2))
    err = raises_in_kernel(a, SBUF, lambda t: t.permute((1, 0, 2)))
    assert (err.op, err.arg, err.value, err.limit) == ("NkiTensor.permute", "dims[0]", 1, 0)
    err = raises_in_kernel(a, HBM, lambda t: t.permute((0, 0, 1)))
    assert err.arg == "dims" and "permutation" in str(err)
    err = raises_in_kernel(a, HBM, lambda t: t.permute((0, 1)))
    assert err.arg == "dims"


def test_broadcast_expand_squeeze_match_numpy():
    a = arange((4, 1, 3))
    out, seen = view_of(a, SBUF, lambda t: t.broadcast(1, 5))
    assert seen["strides"][1] == 0
    np.testing.assert_array_equal(out, np.broadcast_to(a, (4, 5, 3)))
    out, seen = view_of(a, HBM, lambda t: t.squeeze_dim(1).expand_dim(0).broadcast(0, 2))
    np.testing.assert_array_equal(out, np.broadcast_to(a[None, :, 0, :], (2, 4, 3)))
    out, seen = view_of(a, SBUF, lambda t: t.expand_dim(-1))
    assert seen["shape"] == (4, 1, 3, 1)
    np.testing.assert_array_equal(out, a[..., None])
    out, seen = view_of(a, SBUF, lambda t: t.squeeze_dim(-2))
    np.testing.assert_array_equal(out, a[:, 0, :])


@pytest.mark.parametrize(
    "make, api, arg",
    [
        (lambda t: t.broadcast(2, 4), "NkiTensor.broadcast", "shape[2]"),
        (lambda t: t[0:1].broadcast(0, 4), "NkiTensor.broadcast", "dim"),
        (lambda t: t.broadcast(1, 0), "NkiTensor.broadcast", "size"),
        (lambda t: t.expand_dim(0), "NkiTensor.expand_dim", "dim"),
        (lambda t: t.expand_dim(5), "NkiTensor.expand_dim", "dim"),
        (lambda t: t.squeeze_dim(2), "NkiTensor.squeeze_dim", "shape[2]"),
        (lambda t: t[0:1].squeeze_dim(0), "NkiTensor.squeeze_dim", "dim"),
    ],
)
def test_broadcast_expand_squeeze_rules_on_chip(make, api, arg):
    err = raises_in_kernel(arange((4, 1, 3)), SBUF, make)
    assert (err.op, err.arg) == (api, arg)


def test_hbm_may_broadcast_and_expand_dim0():
    a = arange((1, 3))
    out, _ = view_of(a, HBM, lambda t: t.broadcast(0, 4))
    np.testing.assert_array_equal(out, np.broadcast_to(a, (4, 3)))
    out, _ = view_of(a, HBM, lambda t: t.expand_dim(0))
    np.testing.assert_array_equal(out, a[None])


def test_reshape_dim_and_flatten_dims_match_numpy():
    a = arange((4, 24))
    out, seen = view_of(a, SBUF, lambda t: t.reshape_dim(1, (2, -1, 4)))
    assert seen["shape"] == (4, 2, 3, 4)
    np.testing.assert_array_equal(out, a.reshape(4, 2, 3, 4))
    out, _ = view_of(a, SBUF, lambda t: t.reshape_dim(0, (4,)))  # trivial on the partition dim
    np.testing.assert_array_equal(out, a)
    out, _ = view_of(a, HBM, lambda t: t.reshape_dim(0, (2, 2)).flatten_dims(1, 2))
    np.testing.assert_array_equal(out, a.reshape(2, 48))
    b = arange((4, 2, 3, 5))
    out, seen = view_of(b, SBUF, lambda t: t.flatten_dims(1, 2))
    assert seen["shape"] == (4, 6, 5)
    np.testing.assert_array_equal(out, b.reshape(4, 6, 5))
    out, _ = view_of(b, SBUF, lambda t: t[:, :, 1:2, :].flatten_dims(1, 2))  # size-1 inner dim
    np.testing.assert_array_equal(out, b[:, :, 1, :])


@pytest.mark.parametrize(
    "where, make, api, arg",
    [
        (SBUF, lambda t: t.reshape_dim(1, (5, 5)), "NkiTensor.reshape_dim", "shape"),
        (SBUF, lambda t: t.reshape_dim(1, (-1, -1)), "NkiTensor.reshape_dim", "shape"),
        (SBUF, lambda t: t.reshape_dim(1, (7, -1)), "NkiTensor.reshape_dim", "shape"),
        (SBUF, lambda t: t.reshape_dim(0, (2, 2)), "NkiTensor.reshape_dim", "dim"),
        (SBUF, lambda t: t.flatten_dims(0, 1), "NkiTensor.flatten_dims", "start_dim"),
        (SBUF, lambda t: t.flatten_dims(1, 0), "NkiTensor.flatten_dims", "start_dim"),
        (
            HBM,
            lambda t: t.permute((1, 0)).flatten_dims(0, 1),
            "NkiTensor.flatten_dims",
            "dims 0..1",
        ),
        (HBM, lambda t: t[:, 0:12].flatten_dims(0, 1), "NkiTensor.flatten_dims", "dims 0..1"),
    ],
)
def test_reshape_dim_and_flatten_dims_rules(where, make, api, arg):
    err = raises_in_kernel(arange((4, 24)), where, make)
    assert (err.op, err.arg) == (api, arg)


def test_flatten_dims_sees_through_size_one_dims():
    """Regression: a size-1 dim between two dims hid their non-contiguity."""
    a = arange((4, 3, 8))
    err = raises_in_kernel(a, HBM, lambda t: t[:, 0:1, :].flatten_dims(0, 2))
    assert err.arg == "dims 0..2" and "contiguous" in str(err)


def _numpy_view_reshape(x, shape):
    try:
        return np.reshape(x, shape, copy=False)
    except ValueError:
        return None


@st.composite
def reshape_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    perm = tuple(draw(st.permutations(range(len(shape)))))
    sl = tuple(slice(0, draw(st.integers(1, n)), draw(st.integers(1, 2))) for n in shape)
    view_shape = tuple(len(range(*s.indices(n))) for s, n in zip(sl, shape))
    view_shape = tuple(view_shape[p] for p in perm)
    total = int(np.prod(view_shape))
    factors = [f for f in range(1, total + 1) if total % f == 0]
    new = []
    rest = total
    for _ in range(draw(st.integers(0, 3))):
        f = draw(st.sampled_from([f for f in factors if rest % f == 0]))
        new.append(f)
        rest //= f
    new.append(rest)
    return shape, sl, perm, tuple(draw(st.permutations(new)))


@settings(max_examples=60, deadline=None)
@given(case=reshape_cases())
def test_reshape_matches_numpy_no_copy_reshape(case):
    shape, sl, perm, new = case
    a = arange(shape)
    expected = _numpy_view_reshape(np.transpose(a[sl], perm), new)

    def make(t):
        return t[sl].permute(perm).reshape(new)

    if expected is None:
        err = raises_in_kernel(a, HBM, make)
        assert (err.op, err.arg) == ("NkiTensor.reshape", "shape")
    else:
        out, seen = view_of(a, HBM, make)
        assert seen["shape"] == new
        np.testing.assert_array_equal(out, expected)


def test_reshape_rules_on_chip():
    a = arange((4, 6, 2))
    out, _ = view_of(a, SBUF, lambda t: t.reshape((4, 12)))
    np.testing.assert_array_equal(out, a.reshape(4, 12))
    out, _ = view_of(a, SBUF, lambda t: t.reshape((4, -1, 3)))
    np.testing.assert_array_equal(out, a.reshape(4, 4, 3))
    err = raises_in_kernel(a, SBUF, lambda t: t.reshape((8, 6)))
    assert (err.arg, err.value, err.limit) == ("shape[0]", 8, 4)
    err = raises_in_kernel(a, SBUF, lambda t: t.reshape((4, 5)))
    assert err.arg == "shape" and "48" in str(err)
    err = raises_in_kernel(a, SBUF, lambda t: t.permute((0, 2, 1)).reshape((4, 12)))
    assert err.arg == "shape"
    # The partition dim is never merged into the free dims, even when NumPy could.
    err = raises_in_kernel(arange((1, 4)), SBUF, lambda t: t.reshape((2, 2)))
    assert err.arg == "shape[0]"


def test_slice_and_select_match_numpy():
    a = arange((6, 10, 3))
    out, _ = view_of(a, SBUF, lambda t: t.slice(1, 2, 9, 3))
    np.testing.assert_array_equal(out, a[:, 2:9:3])
    out, _ = view_of(a, HBM, lambda t: t.slice(0, 1, 6, 2))
    np.testing.assert_array_equal(out, a[1:6:2])
    out, seen = view_of(a, SBUF, lambda t: t.select(1, 7))
    assert seen["shape"] == (6, 3)
    np.testing.assert_array_equal(out, a[:, 7])
    out, seen = view_of(a, HBM, lambda t: t.select(0, 5).select(1, 2))
    np.testing.assert_array_equal(out, a[5, :, 2])
    out, seen = view_of(a, HBM, lambda t: t.select(0, 1).select(0, 2).select(0, 0))
    assert seen["shape"] == (1,)
    np.testing.assert_array_equal(out, a[1, 2, 0:1])


@pytest.mark.parametrize(
    "make, api, arg",
    [
        (lambda t: t.slice(1, 0, 11), "NkiTensor.slice", "start/end"),
        (lambda t: t.slice(1, -1, 5), "NkiTensor.slice", "start/end"),
        (lambda t: t.slice(1, 4, 4), "NkiTensor.slice", "start/end"),
        (lambda t: t.slice(1, 0, 4, 0), "NkiTensor.slice", "step"),
        (lambda t: t.slice(0, 0, 6, 2), "NkiTensor.__getitem__", "partition step"),
        (lambda t: t.slice(3, 0, 1), "NkiTensor.slice", "dim"),
        (lambda t: t.select(1, 10), "NkiTensor.select", "index"),
        (lambda t: t.select(0, 1), "NkiTensor.select", "dim"),
    ],
)
def test_slice_and_select_rules_on_chip(make, api, arg):
    err = raises_in_kernel(arange((6, 10, 3)), SBUF, make)
    assert (err.op, err.arg) == (api, arg)


def test_dynamic_select_index_must_be_a_1x1_sbuf_tensor():  # working form: test_indirect.py
    with pytest.raises(NkiValidationError, match="1x1 SBUF tensor"):
        view_of(arange((4, 4)), HBM, lambda t: t.select(0, t))


@pytest.mark.parametrize(
    "src, dst",
    [
        (np.float32, np.uint8),
        (np.float32, np.int32),
        (np.float32, ml_dtypes.bfloat16),
        (np.uint8, np.float32),
        (np.int16, np.float16),
        (np.uint8, ml_dtypes.float8_e4m3fn),
    ],
)
@pytest.mark.parametrize("where", [HBM, SBUF])
def test_view_dtype_matches_numpy_view(src, dst, where):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, size=(4, 32 * np.dtype(src).itemsize), dtype=np.uint8).view(src)
    nki_dst = {np.dtype(d): d for d in (np.uint8, np.int32, np.int16, np.float32, np.float16)}
    name = (
        np.dtype(dst).name
        if np.dtype(dst) in nki_dst
        else {
            np.dtype(ml_dtypes.bfloat16): nl.bfloat16,
            np.dtype(ml_dtypes.float8_e4m3fn): nl.float8_e4m3fn,
        }[np.dtype(dst)]
    )
    out, seen = view_of(a, where, lambda t: t[:, 4:28].view(name))
    expected = a[:, 4:28].view(dst)
    assert seen["shape"] == expected.shape
    np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))


def test_view_dtype_rules():
    a = arange((4, 8))
    err = raises_in_kernel(a, SBUF, lambda t: t[:, ::2].view(nl.uint8))
    assert (err.op, err.arg, err.value, err.limit) == ("NkiTensor.view", "last dim stride", 2, 1)
    u = np.zeros((4, 6), np.uint8)
    err = raises_in_kernel(u, SBUF, lambda t: t.view(nl.float32))
    assert (err.arg, err.value, err.limit) == ("last dim", 6, 4)
    err = raises_in_kernel(np.zeros((4, 10), np.uint8), HBM, lambda t: t[:, 2:10].view(nl.float32))
    assert err.arg == "offset and strides"
    with pytest.raises(NotImplementedByInterpreter, match="NKI_PRECISE_FP=0"):
        view_of(
            np.zeros((2, 4), ml_dtypes.bfloat16), SBUF, lambda t: t.view(nl.int16), precise_fp=False
        )
    # Same-size reinterpretation of fp32 storage is still exact under NKI_PRECISE_FP=0.
    out, _ = view_of(a, SBUF, lambda t: t.view(nl.int32), precise_fp=False)
    np.testing.assert_array_equal(out, a.view(np.int32))


def test_ap_addresses_the_storage():
    a = arange((8, 16))
    flat = a.reshape(-1)
    # HBM: any pattern, from the view's storage offset (offset=None inherits it).
    out, seen = view_of(a, HBM, lambda t: t[2:].ap([[16, 3], [0, 2], [2, 4]]))
    want = np.lib.stride_tricks.as_strided(flat[32:], (3, 2, 4), (64, 0, 8))
    np.testing.assert_array_equal(out, want)
    # [CONFLICT reading] an int offset is added to the view's base offset (0.6 stub).
    out, _ = view_of(a, HBM, lambda t: t[1:].ap([[1, 5]], offset=3))
    np.testing.assert_array_equal(out, flat[19:24])
    # On-chip: the first pair steps whole partitions.
    out, seen = view_of(a, SBUF, lambda t: t.ap([[16, 4], [1, 2], [4, 3]], offset=1))
    want = np.lib.stride_tricks.as_strided(flat[1:], (4, 2, 3), (64, 4, 16))
    np.testing.assert_array_equal(out, want)
    assert seen["pattern"] == [[16, 4], [1, 2], [4, 3]]
    # dtype reinterpretation: pattern and offset count bf16 elements.
    out, _ = view_of(a, SBUF, lambda t: t.ap([[32, 8], [2, 16]], dtype=nl.bfloat16))
    np.testing.assert_array_equal(out.view(np.uint16), a.view(np.uint16)[:, 0::2])


@pytest.mark.parametrize(
    "where, make, arg",
    [
        (SBUF, lambda t: t.ap([[8, 4], [1, 8]]), "partition step"),
        (SBUF, lambda t: t.ap([[16, 4], [1, 17]]), "free access"),
        (SBUF, lambda t: t.ap([[16, 9], [1, 4]]), "access"),
        (SBUF, lambda t: t[4:].ap([[16, 5], [1, 4]]), "access"),
        (HBM, lambda t: t.ap([[16, 8], [1, 17]]), "access"),
        (HBM, lambda t: t.ap([[1, 0]]), "shape"),
        (HBM, lambda t: t.ap([[1, 2, 3]]), "pattern"),
        (HBM, lambda t: t.ap([]), "pattern"),
        (HBM, lambda t: t.ap([[1, 4]], offset=1.5), "offset"),
        (SBUF, lambda t: t[:, 1:].ap([[16, 8], [1, 4]], dtype=nl.float8_e4m3), "partition step"),
        (SBUF, lambda t: t[:, 1:].ap([[64, 7], [1, 61]], dtype=nl.float8_e4m3), "free access"),
    ],
)
def test_ap_rules(where, make, arg):
    err = raises_in_kernel(arange((8, 16)), where, make)
    assert (err.op, err.arg) == ("NkiTensor.ap", arg)


def test_ap_vector_offset_must_be_an_sbuf_index():  # the working forms: test_indirect.py
    with pytest.raises(NkiValidationError, match="SBUF tensor of row indices"):
        view_of(arange((4, 4)), HBM, lambda t: t.ap([[4, 4], [1, 4]], vector_offset=t))


def test_rearrange_matches_numpy():
    a = arange((4, 24))
    out, seen = view_of(
        a, SBUF, lambda t: t.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4})
    )
    assert seen["shape"] == (4, 6, 4)  # the example of the API stub
    np.testing.assert_array_equal(out, a.reshape(4, 4, 6).transpose(0, 2, 1))
    b = arange((2, 3, 4, 5))
    out, _ = view_of(b, HBM, lambda t: t.rearrange(("a", "b", "c", "d"), ("c", ("a", "b"), "d")))
    np.testing.assert_array_equal(out, b.transpose(2, 0, 1, 3).reshape(4, 6, 5))
    out, _ = view_of(b, HBM, lambda t: t.rearrange(("a", "b", "c", "d"), (("a", "b", "c"), "d")))
    np.testing.assert_array_equal(out, b.reshape(24, 5))


@pytest.mark.parametrize(
    "src, dst, sizes, arg",
    [
        (("b", ("h", "w")), ("b", "w", "x"), {"h": 4}, "dst_pattern"),
        (("b", ("h", "w")), ("b", "w", "h"), None, "fixed_sizes"),
        (("b", ("h", "w")), ("b", "h", "w"), {"h": 5}, "shape"),
        (("b", "c", "d"), ("b", "c", "d"), None, "src_pattern"),
        (("b", ("h", "h")), ("b", "h"), {"h": 4}, "src_pattern"),
        ((("b", "c"), "w"), ("b", "c", "w"), {"b": 2}, "dim"),  # splits the partition dim
        (("b", "w"), (("b", "w"),), None, "start_dim"),  # merges into the partition dim
        (("b", "w"), ("b", "w"), {"w": 3}, "fixed_sizes['w']"),
        (("b", 1), ("b",), None, "src_pattern"),
    ],
)
def test_rearrange_rules_on_chip(src, dst, sizes, arg):
    err = raises_in_kernel(arange((4, 24)), SBUF, lambda t: t.rearrange(src, dst, sizes))
    assert err.arg == arg


def test_get_pattern_and_is_contiguous():
    a = arange((6, 4, 5))
    _, seen = view_of(a, HBM, lambda t: t[1:5, :, 1:4:2])
    assert seen["pattern"] == [[20, 4], [5, 4], [2, 2]]
    assert seen["contiguous"] is False
    _, seen = view_of(a, HBM, lambda t: t[2:4])
    assert seen["pattern"] == [[20, 2], [5, 4], [1, 5]] and seen["contiguous"] is True
    _, seen = view_of(a, HBM, lambda t: t[2:3].expand_dim(2))  # size-1 dims do not count
    assert seen["contiguous"] is True
    _, seen = view_of(a, HBM, lambda t: t[:, 1:2, :])
    assert seen["contiguous"] is False
    # On-chip the partition stride is ignored: each partition's free bytes are what counts.
    _, seen = view_of(a, SBUF, lambda t: t[1:3, 1:3, :])
    assert seen["contiguous"] is True
    _, seen = view_of(a, SBUF, lambda t: t[:, :, 0:4])
    assert seen["contiguous"] is False
    _, seen = view_of(a, SBUF, lambda t: t.permute((0, 2, 1)))
    assert seen["contiguous"] is False


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_get_pattern_matches_numpy_strides(shape, data):
    a = arange(shape)
    sl = tuple(
        slice(data.draw(st.integers(0, n - 1)), None, data.draw(st.integers(1, 3))) for n in shape
    )
    out, seen = view_of(a, HBM, lambda t: t[sl])
    ref = a[sl]
    assert seen["pattern"] == [[s // 4, n] for s, n in zip(ref.strides, ref.shape)]
    assert seen["contiguous"] == ref.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(out, ref)


def test_views_share_storage():
    """A write through one view is visible through every overlapping view."""

    def kernel(x):
        t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        sub = t.reshape_dim(1, (2, 4)).select(2, 1)  # column 1 of each half
        zeros = nl.ndarray((4, 2), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
        nisa.tensor_copy(dst=sub, src=zeros)
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = arange((4, 8)) + 1
    want = a.copy()
    want[:, [1, 5]] = 0
    np.testing.assert_array_equal(run(kernel, (a,)).outputs, want)


def test_composed_views_match_numpy():
    """Pairs of view methods compose: each pair reads the same values as NumPy."""
    a = arange((4, 2, 3, 4))
    ops = {  # (NKI view, NumPy equivalent), both applicable to any 4-D input here
        "slice": (lambda t: t.slice(t.ndim - 1, 1, t.shape[-1]), lambda x: x[..., 1:]),
        "select": (lambda t: t.select(2, t.shape[2] - 1), lambda x: x[:, :, -1]),
        "permute": (lambda t: t.permute((0, 2, 1, 3)), lambda x: x.transpose(0, 2, 1, 3)),
        "expand": (lambda t: t.expand_dim(1), lambda x: x[:, None]),
    }
    for (n1, (f1, g1)), (n2, (f2, g2)) in itertools.product(ops.items(), repeat=2):
        if (n1, n2) in (("select", "select"), ("select", "permute"), ("expand", "permute")):
            continue  # permute needs exactly 4 dims, two selects would reach 2

        def make(t, f1=f1, f2=f2):
            return f2(f1(t))

        out, _ = view_of(a, SBUF, make)
        np.testing.assert_array_equal(out, g2(g1(a)), err_msg=f"{n1} then {n2}")
        out, _ = view_of(a, HBM, make)
        np.testing.assert_array_equal(out, g2(g1(a)), err_msg=f"HBM: {n1} then {n2}")


def test_remaining_view_rules():
    err = raises_in_kernel(arange((4,)), HBM, lambda t: t[0:1].squeeze_dim(0))
    assert (err.op, err.arg) == ("NkiTensor.squeeze_dim", "dim") and "at least one dim" in str(err)
    # A 2-byte view offset cannot be re-read as 4-byte elements.
    err = raises_in_kernel(
        np.zeros((4, 8), np.uint16), HBM, lambda t: t[:, 1:].ap([[1, 2]], dtype=nl.float32)
    )
    assert (err.op, err.arg) == ("NkiTensor.ap", "dtype") and "element-aligned" in str(err)
    # 3 bytes per partition do not hold whole fp32 elements.
    err = raises_in_kernel(
        np.zeros((4, 3), np.uint8), SBUF, lambda t: t.ap([[1, 4], [1, 1]], dtype=nl.float32)
    )
    assert (err.op, err.arg) == ("NkiTensor.ap", "dtype") and "3 bytes" in str(err)
