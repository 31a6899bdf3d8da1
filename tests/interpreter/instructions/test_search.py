"""``nisa.nc_find_index8`` and ``nisa.nonzero_with_count`` (interpreter/instructions/search.py)
against NumPy (semantics from their docstrings in nki/api/nki/isa/__init__.py), and their
documented limits. Both return integers: compared exactly."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa
RNG = np.random.default_rng(6)


def find8_kernel(data, vals, out_dtype):
    p, f = data.shape
    out = nl.ndarray((p, 8), out_dtype, buffer=nl.shared_hbm)
    d = nl.ndarray((p, f), data.dtype, buffer=nl.sbuf)
    v = nl.ndarray((p, 8), vals.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=data)
    nisa.dma_copy(dst=v, src=vals)
    idx = nl.ndarray((p, 8), out_dtype, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=idx, data=d, vals=v)
    nisa.dma_copy(dst=out, src=idx)
    return out


@pytest.mark.parametrize("out_dtype, missing", [("uint32", 0xFFFFFFFF), ("uint16", 0xFFFF)])
def test_find_index8_first_occurrence_and_sentinel(out_dtype, missing):
    data = RNG.integers(0, 20, (4, 32)).astype(np.float32)
    vals = np.concatenate([data[:, [3, 7, 7, 0, 31, 12]], np.full((4, 2), 99.0)], axis=1)
    vals = vals.astype(np.float32)
    got = run(find8_kernel, (data, vals, out_dtype)).outputs
    want = np.array(
        [
            [np.flatnonzero(row == v)[0] if (row == v).any() else missing for v in vs]
            for row, vs in zip(data, vals)
        ]
    )
    np.testing.assert_array_equal(got.astype(np.int64), want)


def nonzero_kernel(src, offset, padding):
    p, t = src.shape
    out = nl.ndarray((p, t + 1), nl.int32, buffer=nl.shared_hbm)
    s = nl.ndarray((p, t), src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=src)
    d = nl.full((p, t + 1), 7, nl.int32, buffer=nl.sbuf)
    nisa.nonzero_with_count(dst=d, src=s, index_offset=offset, padding_val=padding)
    nisa.dma_copy(dst=out, src=d)
    return out


def test_nonzero_with_count_docstring_example_and_untouched_partitions():
    src = np.zeros((32, 8), np.float32)
    src[0] = [0, 1, 1, 0, 0, 1, 0, 0]  # the docstring's example row
    src[16, 7] = 3.0
    src[1] = 1.0  # partition 1 belongs to core 0 but is not its 0-th: ignored
    got = run(nonzero_kernel, (src, 16, -1)).outputs
    assert got[0].tolist() == [17, 18, 21, -1, -1, -1, -1, -1, 3]
    assert got[16].tolist() == [23, -1, -1, -1, -1, -1, -1, -1, 1]
    untouched = np.delete(np.arange(32), [0, 16])
    np.testing.assert_array_equal(got[untouched], 7)


def test_nonzero_with_count_limits():
    with pytest.raises(NkiValidationError, match="NeuronCore-v3"):
        run(nonzero_kernel, (np.zeros((16, 4), np.float32), 0, -1), target="trn1")
    with pytest.raises(NkiValidationError, match="src dtype"):
        run(nonzero_kernel, (np.zeros((16, 4), np.uint8), 0, -1))
