"""``Kernel.with_schedule`` (nki/guides/how-to-scheduling-apis.rst): edges between named
instructions become ``depends_on`` edges of the trace; an unknown name is an error."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


@nki.jit
def guide_kernel(t):
    x = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=t)
    a = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    b = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    c = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    nisa.reciprocal(dst=a, data=x, name="recip")
    nisa.tensor_scalar(dst=b, data=x, op0=nl.add, operand0=1.0, name="plus1")
    nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    # each core of an LNC=2 launch stores its share of the rows (two writers would race)
    rows = t.shape[0] // nl.num_programs(0)
    r0 = nl.program_id(0) * rows
    nisa.dma_copy(dst=out[r0 : r0 + rows, :], src=c[r0 : r0 + rows, :])
    return out


T = np.full((4, 8), 2.0, np.float32)


@pytest.mark.parametrize("edges", [[("plus1", "recip")], [("plus1", ["recip"])]])
def test_edges_become_trace_dependencies(edges):
    got = run(guide_kernel.with_schedule(edges), (T,))
    np.testing.assert_array_equal(got.outputs, 0.5 + 3.0)
    named = {i.name: i for i in got.trace if i.name}
    assert named["plus1"].depends_on == [named["recip"].index]
    assert named["recip"].depends_on == []
    plain = run(guide_kernel, (T,))
    assert all(not i.depends_on for i in plain.trace)  # the original kernel is unchanged


def test_grid_keeps_the_schedule_and_bad_edges_are_refused():
    scheduled = guide_kernel.with_schedule([("plus1", "recip")])[2]
    got = run(scheduled, (T,))
    assert sum(1 for i in got.trace if i.depends_on) == 2  # one edge per program instance
    with pytest.raises(NkiValidationError, match="'nope'"):
        run(guide_kernel.with_schedule([("plus1", "nope")]), (T,))
    with pytest.raises(NkiValidationError, match="pairs"):
        guide_kernel.with_schedule("plus1")
    with pytest.raises(NkiValidationError, match="consumer"):
        guide_kernel.with_schedule([("plus1",)])
