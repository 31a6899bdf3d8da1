"""Indirect access: ``.ap(vector_offset=... / scalar_offset=...)`` and ``vector_select``,
the gather / scatter / gather-transpose patterns of the nisa docstrings (dma_copy,
dma_transpose) and the fori_loop ``scalar_offset=i`` pattern, against NumPy indexing.
Exact comparisons: every case moves bits, no arithmetic."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa
RNG = np.random.default_rng(14)


def gather_rows(data, indices, skip=False):
    p, f = indices.shape[0], data.shape[1]
    out = nl.ndarray((p, f), data.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((p, 1), nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    rows = nl.ndarray((p, f), data.dtype, buffer=nl.sbuf)
    nisa.memset(dst=rows, value=-1.0)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    src = data.ap(pattern=[[f, p], [1, f]], vector_offset=idx, indirect_dim=0)
    nisa.dma_copy(dst=rows, src=src, oob_mode=mode)
    nisa.dma_copy(dst=out, src=rows)
    return out


def test_gather_matches_numpy_take():
    data = RNG.standard_normal((64, 24)).astype(np.float32)
    indices = RNG.integers(0, 64, (128, 1)).astype(np.uint32)  # more rows than data: repeats
    got = run(gather_rows, (data, indices))
    np.testing.assert_array_equal(got.outputs, data[indices[:, 0]])
    gather = [i for i in got.trace if i.attrs.get("indirect")]
    assert len(gather) == 1 and len(gather[0].reads) == 2  # the data and the index tile


def test_out_of_bounds_rows_raise_or_are_skipped():
    data = RNG.standard_normal((8, 4)).astype(np.float32)
    indices = np.array([[1], [8], [3], [2**31]], np.uint32)
    with pytest.raises(NkiValidationError, match="vector_offset row 1") as info:
        run(gather_rows, (data, indices))
    assert info.value.op == "nisa.dma_copy" and info.value.value == 8
    got = run(gather_rows, (data, indices, True)).outputs
    want = np.full((4, 4), -1.0, np.float32)
    want[[0, 2]] = data[[1, 3]]
    np.testing.assert_array_equal(got, want)


def scatter_rows(src_data, indices, output):
    p, f = src_data.shape
    src = nl.ndarray((p, f), src_data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=src_data)
    idx = nl.ndarray((p, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    nisa.dma_copy(dst=output.ap(pattern=[[f, p], [1, f]], vector_offset=idx), src=src)


def test_scatter_matches_numpy_assignment():
    src = RNG.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    indices = RNG.permutation(40)[:16].astype(np.int32).reshape(16, 1)
    output = np.zeros((40, 8), ml_dtypes.bfloat16)
    want = output.copy()
    want[indices[:, 0]] = src
    run(scatter_rows, (src, indices, output))
    np.testing.assert_array_equal(output, want)  # the HBM argument is updated in place


def gather_transpose(src_hbm, idx_hbm):
    f = idx_hbm.shape[0] * idx_hbm.shape[1]
    p = src_hbm.shape[1]
    out = nl.ndarray((p, f), src_hbm.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray(idx_hbm.shape, nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=idx_hbm)
    dst = nl.ndarray((p, f), src_hbm.dtype, buffer=nl.sbuf)
    view = src_hbm.ap(pattern=[[p, f], [1, p]], vector_offset=idx, indirect_dim=0)
    nisa.dma_transpose(dst=dst, src=view, axes=(1, 0))
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("cols", [1, 2])
def test_gather_transpose_is_src_at_column_major_indices_transposed(cols):
    src = RNG.standard_normal((256, 32)).astype(ml_dtypes.bfloat16)
    idx = RNG.integers(0, 256, (128, cols)).astype(np.uint32)
    got = run(gather_transpose, (src, idx)).outputs
    flat = idx.T.flatten()  # the docstring: indices.T.flatten()
    np.testing.assert_array_equal(got, src[flat, :].T)


def test_gather_transpose_limits():
    src = RNG.standard_normal((256, 32)).astype(np.float32)  # 4-byte: refused
    with pytest.raises(NkiValidationError, match="2-byte"):
        run(gather_transpose, (src, np.zeros((128, 1), np.uint32)))


def dynamic_columns(data, bound):
    """The fori_loop docstring: copy column i of data to column i of out, i < bound."""
    n = data.shape[1]
    out = nl.ndarray((1, n), data.dtype, buffer=nl.shared_hbm)
    ub = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ub, src=bound)
    reg = nisa.register_alloc()
    nisa.register_load(reg, ub)
    zeros = nl.zeros((1, n), dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=out, src=zeros)
    temp = nl.ndarray((1, 1), data.dtype, buffer=nl.sbuf)

    def body(i):
        nisa.dma_copy(dst=temp, src=data.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
        nisa.dma_copy(dst=out.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=temp)

    nl.fori_loop(0, reg, body)
    return out


def test_fori_loop_scalar_offset_pattern():
    data = RNG.standard_normal((1, 10)).astype(np.float32)
    got = run(dynamic_columns, (data, np.array([[6]], np.int32))).outputs
    want = np.zeros_like(data)
    want[0, :6] = data[0, :6]
    np.testing.assert_array_equal(got, want)


def window_copy(x, start):
    """tensor_copy with .ap(scalar_offset=) on SBUF (the tensor_copy_dynamic_src successor)."""
    p, f = x.shape
    out = nl.ndarray((p, 4), x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray((p, f), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    at = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=start)
    window = nl.ndarray((p, 4), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=window, src=tile.ap([[f, p], [1, 4]], scalar_offset=at, indirect_dim=1))
    nisa.dma_copy(dst=out, src=window)
    return out


def test_tensor_copy_scalar_offset_and_partition_bound():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    got = run(window_copy, (x, np.array([[5]], np.int32))).outputs
    np.testing.assert_array_equal(got, x[:, 5:9])
    with pytest.raises(NkiValidationError, match="scalar_offset"):  # 13..16 leaves the row
        run(window_copy, (x, np.array([[13]], np.int32)))


def test_vector_select_gathers_hbm_rows():
    def kernel(data, indices):
        out = nl.ndarray((4, 3, 2), data.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        tile = nl.ndarray((4, 3, 2), data.dtype, buffer=nl.sbuf)
        view = data.vector_select(0, idx)
        assert view.is_indirect() and view.shape == (4, 3, 2)
        nisa.dma_copy(dst=tile, src=view)
        nisa.dma_copy(dst=out, src=tile)
        return out

    data = RNG.standard_normal((5, 3, 2)).astype(np.float32)
    indices = np.array([[4], [0], [4], [2]], np.int32)
    np.testing.assert_array_equal(run(kernel, (data, indices)).outputs, data[[4, 0, 4, 2]])


def _refused(body, phrase):
    def kernel(x):
        idx = nl.zeros((4, 1), nl.int32)
        body(x, idx)

    with pytest.raises(NkiValidationError, match=phrase):
        run(kernel, (np.zeros((4, 4), np.float32),))


@pytest.mark.parametrize(
    "body, phrase",
    [
        (lambda x, i: x.ap([[4, 4], [1, 4]], vector_offset=i, scalar_offset=i), "exclusive"),
        (lambda x, i: x.ap([[4, 4], [1, 4]], vector_offset=i, indirect_dim=1), "must be 0"),
        (lambda x, i: x.ap([[4, 8], [1, 4]], vector_offset=i), "must not exceed"),
        (lambda x, i: x.ap([[4, 4], [1, 4]], vector_offset=i)[0:2, :], "indirect view"),
        (
            lambda x, i: x.ap([[4, 4], [1, 4]], vector_offset=i).ap([[1, 1]]),
            "re-indirection",
        ),
        (lambda x, i: x.ap([[4, 4], [1, 4]], scalar_offset=3), "VirtualRegister"),
        (
            lambda x, i: nl.zeros((4, 4), nl.float32).ap([[4, 4], [1, 4]], vector_offset=i),
            "HBM",
        ),
        (
            lambda x, i: nisa.tensor_tensor(
                dst=nl.zeros((4, 4), nl.float32),
                data1=nl.zeros((4, 4), nl.float32),
                data2=nl.zeros((4, 4), nl.float32).ap(
                    [[4, 4], [1, 4]], scalar_offset=nl.zeros((1, 1), nl.int32), indirect_dim=1
                ),
                op=nl.add,
            ),
            "must not be an indirect view here",
        ),
    ],
)
def test_bad_indirect_views_are_refused(body, phrase):
    _refused(body, phrase)


def test_dynamic_select_with_a_register_reads_the_row_at_run_time():
    def kernel(data):
        out = nl.ndarray((3, 1, 5), data.dtype, buffer=nl.shared_hbm)
        for k in range(3):
            reg = nisa.register_alloc(2 * k)
            row = nl.ndarray((1, 5), data.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=row, src=data.select(0, reg))
            nisa.dma_copy(dst=out[k], src=row)
        return out

    data = RNG.standard_normal((6, 5)).astype(np.float32)
    got = run(kernel, (data,)).outputs
    np.testing.assert_array_equal(got[:, 0, :], data[[0, 2, 4]])


# Kernels in aws-neuron/nki-library's style (written after reading its kernels and the nisa
# docstring examples, not copied): an embedding gather by ``.ap(vector_offset=...)`` with a plain
# (no ``@dataclass``) NKIObject config whose optional ``scale`` is tested with ``is not None``. The
# gather moves bits: exact.


class GatherConfig(nl.NKIObject):  # no @dataclass: the language guide's other form
    tokens_per_tile: int = 128
    scale: float = None


def _load(src, rows, cols, dtype):
    """A helper, as nki-library factors DMA loads out of its kernels."""
    tile = nl.ndarray((rows, cols), dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


@nki.jit
def embedding_kernel(table, token_ids, config):
    t, d = token_ids.shape[0], table.shape[1]
    out = nl.ndarray((t, d), table.dtype, buffer=nl.shared_hbm)
    for start in range(0, t, config.tokens_per_tile):
        p = min(config.tokens_per_tile, t - start)
        ids = _load(token_ids[start : start + p, :], p, 1, nl.int32)
        rows = nl.ndarray((p, d), table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(
            dst=rows, src=table.ap(pattern=[[d, p], [1, d]], vector_offset=ids, indirect_dim=0)
        )
        if config.scale is not None:
            nisa.tensor_scalar(dst=rows, data=rows, op0=nl.multiply, operand0=config.scale)
        nisa.dma_copy(dst=out[start : start + p, :], src=rows)
    return out


@pytest.mark.parametrize("scale", [None, 0.5])
def test_embedding_gather(scale):
    table = RNG.standard_normal((1000, 48)).astype(np.float32)
    ids = RNG.integers(0, 1000, (300, 1)).astype(np.int32)
    config = GatherConfig(scale=scale)  # tokens_per_tile from the class default
    got = embedding_kernel(table, ids, config)
    want = table[ids[:, 0]] * (1.0 if scale is None else np.float32(scale))
    np.testing.assert_array_equal(got, want)
