"""Rough edges a new user hit in the interpreter, each refused with the message a user can
act on: containers of on-chip tiles as kernel results, memset values a dtype cannot hold,
grid axes that do not exist, trace-time values of tiles, and NKI_PRECISE_FP spellings."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.errors import LimitError
from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


def _copy_to(x, buffer):
    t = nl.ndarray(x.shape, x.dtype, buffer=buffer)
    nisa.dma_copy(dst=t, src=x)
    return t


@pytest.mark.parametrize(
    "wrap,path",
    [
        (lambda t, o: (o, t), "1"),
        (lambda t, o: [o, [t]], "1[0]"),
        (lambda t, o: {"out": o, "tile": t}, "'tile'"),
    ],
    ids=["tuple", "nested-list", "dict"],
)
def test_a_container_holding_an_on_chip_tile_is_refused(wrap, path):
    def kernel(x):
        return wrap(_copy_to(x, nl.sbuf), _copy_to(x, nl.shared_hbm))

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (np.zeros((2, 2), np.float32),))
    assert info.value.arg.startswith(f"returned tensor {path} (")
    assert info.value.value == "sbuf"


def test_containers_of_hbm_outputs_come_back_with_their_values():
    def kernel(x):
        return {"a": _copy_to(x, nl.shared_hbm), "b": [_copy_to(x, nl.shared_hbm)]}

    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    out = run(kernel, (x,)).outputs
    np.testing.assert_array_equal(out["a"], x)
    np.testing.assert_array_equal(out["b"][0], x)


@pytest.mark.parametrize(
    "dtype,value",
    [("int8", 300), ("int8", -129), ("uint8", -1), ("int32", 2**31), ("bfloat16", 1e39)],
)
def test_memset_refuses_a_value_the_dtype_cannot_hold(dtype, value):
    def kernel(x):
        t = nl.ndarray((2, 2), getattr(nl, dtype), buffer=nl.sbuf)
        nisa.memset(dst=t, value=value)
        return x

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (np.zeros((2, 2), np.float32),))
    assert (info.value.op, info.value.arg) == ("nisa.memset", "value")
    assert "range" in info.value.rule


@pytest.mark.parametrize("dtype,value", [("int8", 127), ("int8", -128), ("float32", -np.inf)])
def test_memset_keeps_values_in_range(dtype, value):
    def kernel(x):
        t = nl.ndarray((2, 2), getattr(nl, dtype), buffer=nl.sbuf)
        nisa.memset(dst=t, value=value)
        o = nl.ndarray((2, 2), getattr(nl, dtype), buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o

    out = run(kernel, (np.zeros((2, 2), np.float32),)).outputs
    assert (np.asarray(out, dtype=np.float64) == value).all()


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


@pytest.mark.parametrize(
    "text,precise",
    [("1", True), ("true", True), ("ON", True), ("0", False), ("FALSE", False), ("off", False)],
)
def test_precise_fp_reads_the_spellings_users_type(text, precise, monkeypatch):
    from neuron_kernels.interpreter.dtypes import precise_fp_from_env

    monkeypatch.setenv("NKI_PRECISE_FP", text)
    assert precise_fp_from_env() is precise


def test_precise_fp_refuses_other_values(monkeypatch):
    from neuron_kernels.interpreter.dtypes import precise_fp_from_env

    monkeypatch.setenv("NKI_PRECISE_FP", "maybe")
    with pytest.raises(LimitError, match="NKI_PRECISE_FP must be one of"):
        precise_fp_from_env()
