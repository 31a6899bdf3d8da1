"""``nl.program_id`` and ``nl.num_programs`` (interpreter/nki/language.py): an axis that the
launch grid does not have (negative, past the grid, or not an int) is refused naming the API,
with or without a grid (nki/api/nki/language/__init__.py: ``axis`` indexes the launch grid)."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki

nl = nki.language


@pytest.mark.parametrize("api", ["program_id", "num_programs"])
@pytest.mark.parametrize("axis", [-1, 1, 1.0, True, "0"])
@pytest.mark.parametrize("grid", [None, (2,)])
def test_a_bad_grid_axis_is_refused_with_or_without_a_grid(api, axis, grid):
    @nki.jit
    def kernel(x):
        getattr(nl, api)(axis)
        return x

    launch = kernel if grid is None else kernel[grid]
    with pytest.raises(NkiValidationError) as info:
        nki.simulate(launch)(np.zeros((2, 2), np.float32))
    assert info.value.op == f"nl.{api}"
