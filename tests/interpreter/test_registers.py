"""Virtual registers and runtime loops (nki/api/nki/isa register_*, nl.fori_loop,
nl.while_loop, nl.dynamic_range) against plain Python counting."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


def count_down(count):
    """The nl.while_loop docstring's pattern: add 1.0 per iteration while count_sb != 0."""
    out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    one_f = nl.ones((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    count_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=count_sb, src=count)
    one_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=one_sb, value=1)
    reg = nisa.register_alloc()
    nisa.register_load(reg, count_sb)

    def body(r):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=one_f, op=nl.add)
        nisa.tensor_tensor(dst=count_sb, data1=count_sb, data2=one_sb, op=nl.subtract)
        nisa.register_load(r, count_sb)
        return r

    nl.while_loop(reg, body)
    nisa.dma_copy(dst=out, src=acc)
    return out


@pytest.mark.parametrize("n", [0, 1, 5])
def test_while_loop_runs_until_the_register_is_zero(n):
    got = run(count_down, (np.array([[n]], np.int32),))
    assert got.outputs[0, 0] == n
    assert got.trace.count_by_api().get("nisa.register_load", 0) == n + 1


def loop_bounds(n):
    """fori_loop and dynamic_range with a register bound; register_store writes a value."""
    out = nl.ndarray((1, 2), nl.int32, buffer=nl.shared_hbm)
    total = nl.zeros((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    one = nl.ones((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    bound = nisa.register_alloc(n)
    copy = nisa.register_alloc()
    nisa.register_move(copy, bound)

    def body(i):
        nisa.tensor_tensor(dst=total, data1=total, data2=one, op=nl.add)

    nl.fori_loop(0, copy, body, step=2)
    for _ in nl.dynamic_range(1, bound):
        nisa.tensor_tensor(dst=total, data1=total, data2=one, op=nl.add)
    stored = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(stored, bound)
    nisa.dma_copy(dst=out[0:1, 0:1], src=total)
    nisa.dma_copy(dst=out[0:1, 1:2], src=stored)
    return out


def test_fori_loop_and_dynamic_range_take_register_bounds():
    got = run(loop_bounds, (7,)).outputs
    assert got.tolist() == [[len(range(0, 7, 2)) + len(range(1, 7)), 7]]


def _in_kernel(fn):
    def kernel(x):
        fn()
        return None

    return run(kernel, (np.zeros((1, 1), np.float32),))


@pytest.mark.parametrize(
    "misuse, error, phrase",
    [
        (lambda: bool(nisa.register_alloc(1)), TypeError, "no value at trace time"),
        (lambda: range(nisa.register_alloc(1)), TypeError, "no value at trace time"),
        (lambda: nisa.register_alloc(1) + 1, TypeError, "no value at trace time"),
        (lambda: nisa.register_alloc(2**31), NkiValidationError, "32-bit"),
        (lambda: nisa.register_move(3, 1), NkiValidationError, "VirtualRegister"),
        (lambda: nl.fori_loop(0, nisa.register_alloc(), print), NkiValidationError, "initialised"),
        (
            lambda: nl.fori_loop(0, 2, lambda i: nisa.register_move(i, 0)),
            NkiValidationError,
            "read-only",
        ),
        (lambda: nl.fori_loop(0, 2, lambda i: 1), NkiValidationError, "must not return"),
        (lambda: nl.fori_loop(0, 2, print, step=0), NkiValidationError, "step"),
        (
            lambda: nl.while_loop(nisa.register_alloc(1), lambda r: None),
            NkiValidationError,
            "return value",
        ),
        (
            lambda: nisa.register_load(nisa.register_alloc(), nl.zeros((1, 2), nl.int32)),
            NkiValidationError,
            "exactly one element",
        ),
        (
            lambda: nisa.register_load(nisa.register_alloc(), nl.zeros((1, 1), nl.float32)),
            NkiValidationError,
            "integer type",
        ),
    ],
)
def test_register_misuse_is_refused(misuse, error, phrase):
    with pytest.raises(error, match=phrase):
        _in_kernel(misuse)


def test_register_load_needs_computed_values():
    def kernel(x):
        t = nl.zeros((1, 1), nl.int32)
        nisa.register_load(nisa.register_alloc(), t)

    with pytest.raises(NotImplementedError, match="does not compute"):
        run(kernel, (np.zeros((1, 1), np.float32),), compute=False)
