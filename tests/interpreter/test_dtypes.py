"""NKI dtypes: names, storage, and the one rounding on write (dtypes.convert).

References are written independently of the code under test where possible: bf16 and tf32
by bit arithmetic, fp16 by NumPy's IEEE cast, fp32 -> int by rint + clip. fp8 follows
ml_dtypes, which is what AWS's simulator stores fp8 with (NKI_PRECISE_FP=1).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.errors import LimitError
from neuron_kernels.interpreter import NkiValidationError, dtypes, nki, run

nl, nisa = nki.language, nki.isa

f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
f32_arrays = st.lists(f32, min_size=1, max_size=64).map(lambda v: np.array(v, dtype=np.float32))


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round fp32 to bf16 by bit arithmetic (nearest, ties to even); NaN/inf kept."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    out = rounded.view(ml_dtypes.bfloat16).copy()
    out[np.isnan(x)] = np.nan
    return out


def tf32_reference(x: np.ndarray) -> np.ndarray:
    """Round fp32 to 10 stored mantissa bits in float64 arithmetic (ties to even)."""
    v = x.astype(np.float64)
    out = v.copy()
    finite = np.isfinite(v) & (v != 0)
    m, e = np.frexp(v[finite])  # v = m * 2**e, 0.5 <= |m| < 1
    quantum = np.ldexp(1.0, np.maximum(e - 11, -136))  # fp32 subnormals: fixed quantum 2**-136
    out[finite] = np.rint(v[finite] / quantum) * quantum
    with np.errstate(over="ignore"):
        return out.astype(np.float32)


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given_dtype, name",
    [
        (nl.bfloat16, "bfloat16"),
        ("float32", "float32"),
        (np.float16, "float16"),
        (np.dtype(np.int8), "int8"),
        (np.bool_, "bool_"),
        (ml_dtypes.bfloat16, "bfloat16"),
        (ml_dtypes.float8_e4m3fn, "float8_e4m3fn"),
        (torch.bfloat16, "bfloat16"),
        (torch.float8_e5m2, "float8_e5m2"),
        (torch.bool, "bool_"),
    ],
)
def test_normalize_accepts_nki_numpy_and_torch_dtypes(given_dtype, name):
    assert dtypes.normalize(given_dtype) == name
    assert nl.bfloat16 == "bfloat16"  # DType = str in the API


@pytest.mark.parametrize("bad", [np.float64, np.int64, torch.float64, "sbuf", "float", None])
def test_normalize_rejects_non_nki_dtypes(bad):
    with pytest.raises(NkiValidationError) as info:
        dtypes.normalize(bad, "nl.ndarray")
    assert (info.value.op, info.value.arg) == ("nl.ndarray", "dtype")


def test_packed_dtypes_hold_bits_and_are_no_numbers():
    """x4 tensors store their bits (uint32 for the fp8 x4 types, uint16 for fp4 x4: the MX
    deep dive's "32-bits wide" / "16-bits wide"); a numeric read of them is refused
    (tests/interpreter/instructions/test_mx.py covers the MX instructions)."""

    def kernel():
        t = nl.ndarray((4, 4), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0)
        out = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=t)

    assert dtypes.info(nl.float4_e2m1fn_x4).kind == "packed"
    assert dtypes.storage_dtype("float8_e4m3fn_x4") == np.uint32
    assert dtypes.storage_dtype("float4_e2m1fn_x4") == np.uint16
    with pytest.raises(NkiValidationError, match="float8_e4m3fn_x4"):
        run(kernel, target="trn3")


# -- float rounding ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(x=f32_arrays)
def test_bf16_rounds_to_nearest_even(x):
    got = dtypes.convert(x, "bfloat16")
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        got.view(np.uint16)[~np.isnan(x)], bf16_reference(x).view(np.uint16)[~np.isnan(x)]
    )
    assert np.isnan(got.astype(np.float32)[np.isnan(x)]).all()


def test_bf16_ties_and_overflow():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.3895314e38, 3.4e38], np.float32)
    got = dtypes.convert(x, "bfloat16").astype(np.float32)
    np.testing.assert_array_equal(got[:3], [1.0, 1 + 2**-6, -1.0])  # ties to even
    assert got[3] == np.float32(3.3895314e38)  # largest finite bf16
    assert got[4] == np.inf  # rounds past the largest finite: inf, as ml_dtypes


@settings(max_examples=60, deadline=None)
@given(x=f32_arrays)
def test_fp16_matches_ieee_cast(x):
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    got = dtypes.convert(x, "float16")
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(x=f32_arrays)
def test_tf32_rounds_to_ten_mantissa_bits(x):
    got = dtypes.convert(x, "tfloat32")
    assert got.dtype == np.float32
    want = tf32_reference(x)
    np.testing.assert_array_equal(got[~np.isnan(x)], want[~np.isnan(x)])
    assert (got.view(np.uint32)[np.isfinite(got)] & 0x1FFF == 0).all()


def test_tf32_ties_to_even():
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 2**-130 * 1.5], np.float32)
    got = dtypes.convert(x, "tfloat32")
    assert got[0] == 1.0 and got[1] == np.float32(1 + 2**-9)
    assert got[2] == tf32_reference(x[2:])[0]


@pytest.mark.parametrize(
    "name, np_type, max_finite",
    [
        ("float8_e4m3", ml_dtypes.float8_e4m3, 240.0),
        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, 448.0),
        ("float8_e5m2", ml_dtypes.float8_e5m2, 57344.0),
    ],
)
def test_fp8_round_once_from_fp32(name, np_type, max_finite):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4096) * 64).astype(np.float32)
    got = dtypes.convert(x, name)
    assert got.dtype == np.dtype(np_type)
    np.testing.assert_array_equal(got.view(np.uint8), x.astype(np_type).view(np.uint8))
    assert float(np.float32(dtypes.convert(np.float32([max_finite]), name)[0])) == max_finite
    # Exact halfway between the two fp8 neighbours of 1.0 rounds to the even one (1.0).
    mant = {"float8_e4m3": 3, "float8_e4m3fn": 3, "float8_e5m2": 2}[name]
    tie = np.float32(1 + 2.0 ** -(mant + 1))
    assert float(dtypes.convert(np.array([tie]), name)[0]) == 1.0


def test_float8_e8m0fnu_stores_powers_of_two():
    got = dtypes.convert(np.array([1.0, 4.0, 0.25], np.float32), "float8_e8m0fnu")
    np.testing.assert_array_equal(got.astype(np.float32), [1.0, 4.0, 0.25])


# -- integers ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(x=f32_arrays, name=st.sampled_from(["int8", "uint8", "int16", "uint16", "int32", "uint32"]))
def test_float_to_int_rounds_half_even_and_saturates(x, name):
    info = np.iinfo(name)
    want = np.clip(
        np.rint(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=np.inf, neginf=-np.inf)),
        info.min,
        info.max,
    ).astype(name)
    np.testing.assert_array_equal(dtypes.convert(x, name), want)


def test_float_to_int_examples():
    x = np.array([2.5, 3.5, -2.5, 1e10, -1e10, np.nan, np.inf, -0.5], np.float32)
    np.testing.assert_array_equal(
        dtypes.convert(x, "int32"), [2, 4, -2, 2**31 - 1, -(2**31), 0, 2**31 - 1, 0]
    )
    np.testing.assert_array_equal(
        dtypes.convert(np.float32([300, -1, 255.5]), "uint8"), [255, 0, 255]
    )
    np.testing.assert_array_equal(dtypes.convert(np.float32([200, -200]), "int8"), [127, -128])


def test_int_to_int_wraps_and_bool_is_nonzero():
    np.testing.assert_array_equal(dtypes.convert(np.int32([257, -1]), "uint8"), [1, 255])
    np.testing.assert_array_equal(dtypes.convert(np.float32([0, 2, np.nan]), "bool_"), [0, 1, 1])
    # A low-precision float source converts to int through its value, not its bits.
    b = np.array([2.5, -3.5], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(dtypes.convert(b, "int16"), [2, -4])


# -- through the interpreter -----------------------------------------------------------------


def _cast_round_trip(dtype):
    def kernel(x):
        t = nl.ndarray(x.shape, dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)  # fp32 -> dtype: one rounding
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)  # dtype -> fp32: exact
        return out

    return kernel


@pytest.mark.parametrize(
    "dtype, reference",
    [
        ("bfloat16", lambda x: bf16_reference(x).astype(np.float32)),
        ("float16", lambda x: x.astype(np.float16).astype(np.float32)),
        ("tfloat32", tf32_reference),
        ("int8", lambda x: np.clip(np.rint(x), -128, 127).astype(np.float32)),
    ],
)
def test_dma_copy_casts_round_once(dtype, reference):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 64)) * 50).astype(np.float32)
    np.testing.assert_array_equal(run(_cast_round_trip(dtype), (x,)).outputs, reference(x))


def test_precise_fp_off_stores_low_precision_as_fp32(monkeypatch):
    x = np.array([[1 + 2**-10, 3.14159, 1e-3, 1 + 2**-12]], np.float32)
    for dtype in ("bfloat16", "float16", "float8_e4m3", "tfloat32"):
        exact = run(_cast_round_trip(dtype), (x,), precise_fp=False).outputs
        np.testing.assert_array_equal(exact, x)  # no rounding at all
        rounded = run(_cast_round_trip(dtype), (x,), precise_fp=True).outputs
        assert not np.array_equal(rounded, x)
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    np.testing.assert_array_equal(nki.simulate(_cast_round_trip("bfloat16"))(x), x)
    monkeypatch.setenv("NKI_PRECISE_FP", "1")
    assert not np.array_equal(nki.simulate(_cast_round_trip("bfloat16"))(x), x)


def test_precise_fp_off_returns_the_declared_dtype():
    def kernel(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.array([[1 + 2**-10, 2.0]], np.float32)
    out = run(kernel, (x,), precise_fp=False).outputs
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out.astype(np.float32), bf16_reference(x).astype(np.float32))
    t_out = run(kernel, (torch.from_numpy(x),), precise_fp=False).outputs
    assert t_out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "dtype, sentinel", [("float32", np.nan), ("bfloat16", np.nan), ("int32", 4), ("uint8", 4)]
)
def test_fresh_memory_holds_the_sentinel(dtype, sentinel):
    def kernel():
        t = nl.ndarray((2, 3), dtype, buffer=nl.sbuf)
        out = nl.ndarray((2, 3), dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    out = np.asarray(run(kernel).outputs).astype(np.float64)
    if np.isnan(sentinel):
        assert np.isnan(out).all()
    else:
        assert (out == sentinel).all()


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
