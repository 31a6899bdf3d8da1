"""``nisa.sendrecv`` and ``nisa.core_barrier`` (interpreter/instructions/collective.py).

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py, ``sendrecv`` (the core sends
its SBUF ``src`` to ``dst`` of core ``send_to_rank`` while receiving ``recv_from_rank``'s into
its own ``dst``; same dtype and shape; SBUF only; ranks 0 or 1; NeuronCore-v3+ with LNC) and
``core_barrier`` (``data`` in shared HBM, ``cores=(0, 1)`` only).

What this proves: the exchange's values (bit-exact, any dtype) and every documented limit.
What only a Trn2 run can show: the hardware's timing of the exchange (the cost model's).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


def _ring(dtype, *, src_buffer=None, dst_shape=None, to=None, frm=None, pipe=0):
    @nki.jit
    def kernel(x):
        rows, cols = x.shape
        half = rows // 2
        c = nl.program_id(0)
        mine = nl.ndarray((half, cols), x.dtype, buffer=src_buffer or nl.sbuf)
        got = nl.ndarray(dst_shape or (half, cols), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=mine, src=x[c * half : (c + 1) * half, :])
        nisa.sendrecv(
            src=mine,
            dst=got,
            send_to_rank=(c + 1) % 2 if to is None else to,
            recv_from_rank=(c - 1) % 2 if frm is None else frm,
            pipe_id=pipe,
        )
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[c * half : (c + 1) * half, :], src=got)
        return out

    return kernel


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32])
def test_sendrecv_swaps_the_halves_bit_exactly(dtype):
    x = (np.arange(16 * 6).reshape(16, 6) * 1.5).astype(dtype)
    out = np.asarray(nki.simulate(_ring(dtype)[2])(x))
    want = np.concatenate([x[8:], x[:8]])
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


def test_sendrecv_is_traced_once_per_core():
    x = np.ones((4, 2), np.float32)
    r = run(_ring(np.float32)[2], (x,))
    calls = [i for i in r.trace if i.api == "nisa.sendrecv"]
    assert [(i.core, i.attrs["send_to_rank"], i.attrs["pipe_id"]) for i in calls] == [
        (0, 1, 0),
        (1, 0, 0),
    ]
    assert all(i.reads[0].buffer == "sbuf" and i.writes[0].buffer == "sbuf" for i in calls)


@pytest.mark.parametrize(
    ("change", "arg"),
    [
        ({"src_buffer": "hbm"}, "src"),
        ({"dst_shape": (2, 3)}, "dst shape"),
        ({"to": 2}, "send_to_rank"),
        ({"pipe": -1}, "pipe_id"),
        ({"to": 0, "frm": 0}, "core 0 recv_from_rank"),  # core 1 sends to 0, which hears 0
    ],
)
def test_sendrecv_limits(change, arg):
    if change.get("src_buffer") == "hbm":
        change = {**change, "src_buffer": nl.private_hbm}
    with pytest.raises(NkiValidationError) as info:
        run(_ring(np.float32, **change)[2], (np.ones((4, 2), np.float32),))
    assert info.value.arg == arg


@pytest.mark.parametrize(("grid", "target", "arg"), [(1, "trn2", "launch"), (1, "trn1", "target")])
def test_sendrecv_needs_lnc2_on_v3(grid, target, arg):
    with pytest.raises(NkiValidationError) as info:
        run(_ring(np.float32)[grid], (np.ones((4, 2), np.float32),), target=target)
    assert (info.value.op, info.value.arg) == ("nisa.sendrecv", arg)


def _barrier(cores=(0, 1), where="shared"):
    @nki.jit
    def kernel(x):
        data = x if where == "shared" else nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        nisa.core_barrier(data=data, cores=cores)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        return out

    return kernel


@pytest.mark.parametrize(
    ("kernel", "grid", "arg"),
    [
        (_barrier(cores=(0,)), 2, "cores"),
        (_barrier(cores=(0, 1, 2)), 2, "cores"),
        (_barrier(where="private"), 2, "data"),
        (_barrier(), 1, "launch"),
    ],
)
def test_core_barrier_limits(kernel, grid, arg):
    with pytest.raises(NkiValidationError) as info:
        run(kernel[grid], (np.ones((2, 2), np.float32),))
    assert (info.value.op, info.value.arg) == ("nisa.core_barrier", arg)
