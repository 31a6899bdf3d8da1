"""``nki.typing`` and ``nki.dtype``: annotations AWS's kernels use run unchanged
(nki/migration/index.rst "nki.typing module"; nki-library's ``compute_dtype: nki.dtype``)."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa, nt = nki.language, nki.isa, nki.typing


def add_annotated(
    x: nt.tensor[4, 8], y: nt.tensor, compute_dtype: nki.dtype = nl.float32
) -> nt.tensor:
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, compute_dtype, buffer=nl.sbuf)
    b = nl.ndarray(y.shape, compute_dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=b, src=y)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=a)
    return out


def test_annotated_kernel_runs():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(run(add_annotated, (x, x)).outputs, 2 * x)
    np.testing.assert_array_equal(run(add_annotated, (x, x, nl.bfloat16)).outputs, 2 * x)


def test_annotation_records_the_declared_shape():
    assert nt.tensor[128, 512].shape == (128, 512)
    assert nt.tensor[128] == nt.tensor[128] and repr(nt.tensor[2, 3]) == "nki.typing.tensor[2, 3]"
    assert nki.dtype is nl.DType is str and isinstance(nl.bfloat16, nki.dtype)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_declared_shape_is_refused(bad):
    with pytest.raises(NkiValidationError, match="shape"):
        nt.tensor[128, bad]


def test_typing_is_not_a_constructor_and_unknown_names_are_named():
    with pytest.raises(TypeError, match="annotation"):
        nt.tensor((1, 1), nl.float32, None)
    with pytest.raises(NotImplementedError, match="nki.typing.no_such_name"):
        nt.no_such_name  # noqa: B018
