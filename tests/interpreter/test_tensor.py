"""``NkiTensor`` (interpreter/tensor.py) at trace time: a tile has no value while the kernel
is traced, so truth value, comparison in Python, ``int``/``float`` and ``range`` of it all
fail with one message a user can act on."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import nki, run

nl, nisa = nki.language, nki.isa


def _copy_to(x, buffer):
    t = nl.ndarray(x.shape, x.dtype, buffer=buffer)
    nisa.dma_copy(dst=t, src=x)
    return t


@pytest.mark.parametrize(
    "use",
    [bool, float, int, lambda t: t > 0, lambda t: t <= 1, lambda t: range(t)],
    ids=["bool", "float", "int", "gt", "le", "range"],
)
def test_trace_time_values_of_a_tile_get_one_message(use):
    def kernel(x):
        t = _copy_to(x, nl.sbuf)
        use(t)
        return x

    with pytest.raises(TypeError, match="no value at trace time"):
        run(kernel, (np.zeros((2, 2), np.float32),))
