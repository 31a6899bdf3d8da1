"""NKI's value model (interpreter/values.py) and enum parameters (interpreter/enums.py).

aws-neuron/aws-neuron-sdk nki/get-started/nki-language-guide.rst (snapshot 81ce03ae),
"NKI Values", lines 145-146: "32-bit integer values", "32-bit IEEE floating-point values".
Enum parameters: the stub signatures (nki/api/nki/isa/__init__.py) default to members; the
plain values accepted are the ones aws-neuron/nki-library's kernels pass (interpreter/enums.py
names them). What only the NKI compiler can show: how it treats Python arithmetic that
overflows int32 between instructions (the guide is silent; values.py checks at instructions).
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


def memset_kernel(value, dtype=nl.float32):
    out = nl.ndarray((2, 4), dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 4), dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=value)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_float32_lowest_as_python_prints_it_is_accepted():
    """``-3.4028235e+38`` is below float32's range as a 64-bit float and rounds to exactly
    float32's lowest value: the range check applies after the 32-bit rounding."""
    assert -3.4028235e38 < float(np.finfo(np.float32).min)  # the case the issue names
    out = run(memset_kernel, (-3.4028235e38,)).outputs
    assert (out == np.finfo(np.float32).min).all()


def test_a_float_that_rounds_to_infinity_is_refused():
    with pytest.raises(NkiValidationError) as info:
        run(memset_kernel, (3.5e38,))
    assert (info.value.op, info.value.arg, info.value.value) == ("nisa.memset", "value", 3.5e38)


def test_an_integer_outside_int32_is_refused_naming_it():
    with pytest.raises(NkiValidationError) as info:
        run(memset_kernel, (2**31, nl.int32))
    assert (info.value.arg, info.value.value) == ("value", 2**31)
    out = run(memset_kernel, (2**31 - 1, nl.int32)).outputs
    assert (out == 2**31 - 1).all()


def scalar_kernel(x, operand):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=operand)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_scalar_operands_are_32_bit():
    x = np.zeros((2, 4), np.int32)
    with pytest.raises(NkiValidationError) as info:
        run(scalar_kernel, (x, -(2**31) - 1))
    assert (info.value.op, info.value.arg) == ("nisa.tensor_scalar", "operand0")
    y = np.zeros((2, 4), np.float32)
    out = run(scalar_kernel, (y, 0.1)).outputs  # 0.1 rounds to float32 first
    assert (out == np.float32(0.1)).all()


def range_kernel(stop):
    for _ in nl.affine_range(stop):
        pass


def test_loop_bounds_are_int32():
    with pytest.raises(NkiValidationError) as info:
        run(range_kernel, (2**32,))
    assert (info.value.op, info.value.arg, info.value.value) == (
        "nl.affine_range",
        "start",
        2**32,
    )  # the stub names the one bound start


def plain_range_kernel(start, stop, fill):
    out = nl.ndarray((2, 4), nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 4), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0)
    for i in range(start, stop):
        if fill:
            nisa.memset(dst=t, value=i)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_plain_range_bounds_are_trace_time_and_its_index_is_checked_where_used():
    """Guide line 88: "All ``for`` loops (except ``dynamic_range``) are **unrolled** at
    specialization time": a ``range()`` bound is consumed by the trace, never an operand,
    so it is not checked (values.py says so); the index it yields is an NKI int where it
    reaches an instruction (line 145: "32-bit integer values")."""
    out = run(plain_range_kernel, (2**40, 2**40 + 1, False)).outputs
    assert (out == 0).all()
    with pytest.raises(NkiValidationError) as info:
        run(plain_range_kernel, (2**31, 2**31 + 1, True))
    assert (info.value.op, info.value.arg, info.value.value) == ("nisa.memset", "value", 2**31)
    out = run(plain_range_kernel, (2**31 - 1, 2**31, True)).outputs
    assert (out == 2**31 - 1).all()


def as_lists(pattern):
    """The stub's form, a list of [step, num] lists (kernel arguments are tuples)."""
    levels = []
    for step, num in pattern:
        levels.append([step, num])
    return levels


def iota_kernel(pattern):
    out = nl.ndarray((2, 4), nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 4), nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=t, pattern=as_lists(pattern))
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize(
    "pattern, arg, value",
    [
        (((2**31, 4),), "pattern[0] step", 2**31),  # int64 would wrap it to -2**31
        (((2**40, 4),), "pattern[0] step", 2**40),  # int32 would truncate it to 0
        (((1, 2), (-(2**31) - 1, 2)), "pattern[1] step", -(2**31) - 1),
        (((1.7, 4),), "pattern[0] step", "1.7"),  # int() would truncate it to 1
        (((1, 4.0),), "pattern[0] num", "4.0"),
        (((1, True),), "pattern[0] num", "True"),
    ],
)
def test_iota_pattern_steps_and_nums_are_int32(pattern, arg, value):
    """Stub nki/api/nki/isa/__init__.py, iota: "a list of [step, num]" over which "the
    instruction generates a stream of values" in int32; guide 'NKI Values' line 145: "32-bit
    integer values". A step or num that is not an int within int32 is refused, naming it."""
    with pytest.raises(NkiValidationError) as info:
        run(iota_kernel, (pattern,))
    assert (info.value.op, info.value.arg, info.value.value) == ("nisa.iota", arg, value)
    assert "int" in info.value.rule


def test_iota_pattern_at_the_int32_limits_is_accepted():
    """The same stub: steps at int32's ends are valid; values wrap in int32 arithmetic."""
    out = run(iota_kernel, (((2**31 - 1, 2), (-(2**31), 2)),)).outputs
    want = np.array([0, -(2**31), 2**31 - 1, -1], np.int64).astype(np.int32)
    np.testing.assert_array_equal(out, np.tile(want, (2, 1)))


def affine_select_kernel(x, pattern, on_false_value):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.affine_select(
        dst=t,
        pattern=as_lists(pattern),
        channel_multiplier=0,
        on_true_tile=t,
        on_false_value=on_false_value,
        cmp_op=nl.greater_equal,
    )
    nisa.dma_copy(dst=out, src=t)
    return out


def test_affine_select_pattern_and_fill_are_32_bit():
    """Stub nki/api/nki/isa/__init__.py, affine_select: the same int32 [step, num] pattern;
    ``on_false_value`` a compile-time fp32 scalar, so (values.py) rounded to float32 and
    refused when a finite value rounds to infinity."""
    x = np.ones((2, 4), np.float32)
    for pattern, arg, value in (
        (((2**32, 4),), "pattern[0] step", 2**32),
        (((1, 2.5),), "pattern[0] num", "2.5"),
    ):
        with pytest.raises(NkiValidationError) as info:
            run(affine_select_kernel, (x, pattern, 0.0))
        assert (info.value.op, info.value.arg, info.value.value) == (
            "nisa.affine_select",
            arg,
            value,
        )
    with pytest.raises(NkiValidationError) as info:
        run(affine_select_kernel, (x, ((-1, 4),), 1e39))
    assert (info.value.arg, info.value.value) == ("on_false_value", 1e39)
    out = run(affine_select_kernel, (x, ((-1, 4),), -3.4028235e38)).outputs
    # affine value -j >= 0 only at j = 0; float32's lowest elsewhere (rounded, not refused)
    np.testing.assert_array_equal(out[:, 0], [1, 1])
    assert (out[:, 1:] == np.finfo(np.float32).min).all()


def dma_kernel(x, dge_mode):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x, dge_mode=dge_mode)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_dge_mode_takes_the_int_nki_library_passes():
    """nki-library core/qkv/qkv_tkg.py: ``dge_mode=_DGE_MODE_NONE`` with the value 3."""
    x = np.ones((2, 4), np.float32)
    r = run(dma_kernel, (x, 3))
    assert r.trace.instructions[0].attrs["dge_mode"] == "none"
    np.testing.assert_array_equal(r.outputs, x)


@pytest.mark.parametrize("bad", ["none", True, 9, 3.0])
def test_dge_mode_refuses_anything_else(bad):
    with pytest.raises(NkiValidationError) as info:
        run(dma_kernel, (np.ones((2, 4), np.float32), bad))
    assert info.value.arg == "dge_mode"


def matmul_kernel(s, m, perf_mode):
    st = nl.ndarray(s.shape, s.dtype, buffer=nl.sbuf)
    mv = nl.ndarray(m.shape, m.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=s)
    nisa.dma_copy(dst=mv, src=m)
    ps = nl.ndarray((s.shape[1], m.shape[1]), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, perf_mode=perf_mode)


def test_perf_mode_takes_the_string_nki_library_passes():
    """nki-library core/qkv/qkv_cte.py: ``perf_mode="double_row"``; ``"none"`` as
    core/mlp/mlp_cte/mlp_cte_projection.py passes it."""
    s = np.ones((4, 4), np.float32)
    r = run(matmul_kernel, (s, s, "none"))
    assert r.trace.instructions[-1].api == "nisa.nc_matmul"
    for bad in ("fast", 1):
        with pytest.raises(NkiValidationError) as info:
            run(matmul_kernel, (s, s, bad))
        assert info.value.arg == "perf_mode"


def engine_kernel(x, engine):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0, engine=engine)


def test_other_enum_parameters_take_members_only():
    """AWS's kernels pass engine members only (nisa.vector_engine, nisa.engine.gpsimd)."""
    with pytest.raises(NkiValidationError) as info:
        run(engine_kernel, (np.zeros((2, 4), np.float32), 5))
    assert info.value.arg == "engine"
