"""Helpers for the compute-instruction tests (vector, scalar, gpsimd, operators, nl wrappers).

``launch`` places NumPy operands on chip (SBUF or PSUM, optionally through an offset or a
strided view), runs a body of instructions on them and reads the results back bit-exactly.
References are float64 NumPy of the operands as stored; ``assert_close`` compares with a
per-element bound the test states (and justifies) before looking at results.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

from neuron_kernels.interpreter import NkiValidationError, dtypes, nki, run

nl, nisa = nki.language, nki.isa

FLOATS = ("float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2")
INTS = ("int8", "int16", "int32", "uint8", "uint16", "uint32")

# Half an ulp relative to the value (round to nearest) and the smallest subnormal (the
# absolute error floor of rounding near zero), per destination dtype.
HALF_ULP = {
    "float32": 2.0**-24,
    "tfloat32": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "float8_e4m3": 2.0**-4,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}
TINY = {
    "float32": 2.0**-149,
    "tfloat32": 2.0**-149,
    "bfloat16": 2.0**-133,
    "float16": 2.0**-24,
    "float8_e4m3": 2.0**-9,
    "float8_e4m3fn": 2.0**-9,
    "float8_e5m2": 2.0**-16,
}
F32 = 2.0**-24  # one fp32 rounding, relative


def np_dtype(dtype: str):
    return dtypes.storage_dtype(dtype)


def stored(x, dtype: str) -> np.ndarray:
    """``x`` as the interpreter stores it in ``dtype`` (storage NumPy type)."""
    x = np.asarray(x)
    if dtypes.info(dtype).is_integer and x.dtype.kind in "iu":
        return x.astype(np_dtype(dtype))
    return dtypes.convert(x.astype(np.float32), dtype)


def as64(a) -> np.ndarray:
    a = np.asarray(a)
    return (
        a.astype(np.float64) if a.dtype.kind in "iub" else a.astype(np.float32).astype(np.float64)
    )


def rounding(dtype: str) -> tuple[float, float]:
    """(relative, absolute) error of one rounding into ``dtype`` (0 for integers: exact
    tests convert their reference themselves)."""
    return (HALF_ULP.get(dtype, 0.0), TINY.get(dtype, 0.0))


def random_values(rng, shape, dtype: str, lo=-4.0, hi=4.0, full_range=False) -> np.ndarray:
    """Random operand values already representable in ``dtype``; integers in [-20, 20]
    (clipped to the dtype) unless ``full_range``."""
    if dtypes.info(dtype).is_integer:
        info = np.iinfo(np_dtype(dtype))
        a, b = (int(info.min), int(info.max)) if full_range else (max(-20, int(info.min)), 20)
        return rng.integers(a, b + 1, size=shape, dtype=np.int64).astype(np_dtype(dtype))
    return stored(rng.uniform(lo, hi, size=shape), dtype)


def f32(x) -> np.ndarray:
    """Values rounded to fp32 (an engine's input conversion or intermediate), as float64."""
    return np.asarray(x).astype(np.float32).astype(np.float64)


def round_to(x64, dtype: str) -> np.ndarray:
    """The engines' output: the exact result rounded to fp32, then once into ``dtype``
    (floats to nearest even; integers half to even, saturating, NaN -> 0), as float64."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf/NaN is meant
        x32 = np.asarray(x64, dtype=np.float64).astype(np.float32)
    if dtypes.info(dtype).is_integer:
        info = np.iinfo(np_dtype(dtype))
        v = np.where(np.isnan(x32), 0.0, np.rint(x32.astype(np.float64)))
        return np.clip(v, info.min, info.max)
    with np.errstate(over="ignore", invalid="ignore"):
        return as64(x32.astype(np_dtype(dtype)))


def assert_close(got, want, bound, context: str = "") -> None:
    """``|got - want| <= bound`` element-wise (NaN must match NaN, inf must match exactly)."""
    got64, want64 = as64(got), np.asarray(want, dtype=np.float64)
    assert got64.shape == want64.shape, f"shape {got64.shape} != {want64.shape} {context}"
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), want64.shape)
    both_nan = np.isnan(got64) & np.isnan(want64)
    same = (got64 == want64) | both_nan
    with np.errstate(invalid="ignore"):
        ok = same | (np.abs(got64 - want64) <= bound)
    if not ok.all():
        bad = np.argwhere(~ok)
        i = tuple(bad[0])
        raise AssertionError(
            f"{len(bad)}/{ok.size} elements out of bound {context}; first at {i}: got {got64[i]!r}, "
            f"want {want64[i]!r}, |diff| {abs(got64[i] - want64[i]):.3g} > bound {bound[i]:.3g}"
        )


# -- placing operands on chip ---------------------------------------------------------------------


@dataclass
class In:
    """An on-chip input: values (storage dtype, shape [P, ...]), buffer and view kind.

    view: None (whole fresh tile), "offset" (partition and free offsets inside a bigger
    tile) or "strided" (every other element of the last dim).
    """

    values: np.ndarray
    dtype: str
    buffer: str = "sbuf"
    view: str | None = None


@dataclass
class Out:
    """An on-chip output tile; ``init`` (optional values) is written before the body."""

    shape: tuple
    dtype: str
    buffer: str = "sbuf"
    view: str | None = None
    init: np.ndarray | None = None


def _alloc(shape, dtype, buffer, view):
    buf = nl.psum if buffer == "psum" else nl.sbuf
    shape = tuple(shape)
    p, free = shape[0], shape[1:]
    if view == "offset":
        dp = min(3, 128 - p)
        base = nl.ndarray((p + dp,) + free[:-1] + (free[-1] + 3,), dtype, buffer=buf)
        return base[dp : dp + p, ..., 2 : 2 + free[-1]]
    if view == "strided":
        base = nl.ndarray((p,) + free[:-1] + (2 * free[-1],), dtype, buffer=buf)
        return base[..., ::2]
    return nl.ndarray(shape, dtype, buffer=buf)


def _place(hbm, spec_dtype, buffer, view):
    t = _alloc(hbm.shape, spec_dtype, buffer, view)
    if buffer == "psum":
        stage = nl.ndarray(hbm.shape, spec_dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=stage, src=hbm)
        nisa.tensor_copy(dst=t, src=stage, engine=nisa.engine.vector)
    else:
        nisa.dma_copy(dst=t, src=hbm)
    return t


def _read_back(t, dtype):
    src = t
    if t.buffer == nl.psum:
        src = nl.ndarray(t.shape, dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=src, src=t, engine=nisa.engine.vector)
    out = nl.ndarray(t.shape, dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=src)
    return out


def _call(body, t):
    """``body(*t)`` written without * unpacking (NKI has none), for up to 8 tiles."""
    n = len(t)
    assert n <= 8, n
    if n == 1:
        body(t[0])
    elif n == 2:
        body(t[0], t[1])
    elif n == 3:
        body(t[0], t[1], t[2])
    elif n == 4:
        body(t[0], t[1], t[2], t[3])
    elif n == 5:
        body(t[0], t[1], t[2], t[3], t[4])
    elif n == 6:
        body(t[0], t[1], t[2], t[3], t[4], t[5])
    elif n == 7:
        body(t[0], t[1], t[2], t[3], t[4], t[5], t[6])
    else:
        body(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7])


def launch(body, ins, outs, *, target="trn2", precise_fp=None):
    """Run ``body(*in_tiles, *out_tiles)`` on chip; return the outputs as NumPy arrays."""
    ins, outs = list(ins), list(outs)
    has_init = [s.init is not None for s in outs]
    arrays = [np.ascontiguousarray(s.values) for s in ins]
    arrays += [np.ascontiguousarray(s.init) for s, init in zip(outs, has_init) if init]

    n_ins = len(ins)

    def kernel(hbm):  # NKI Python: no * unpacking, comprehensions or generators
        tiles = []
        for i in range(n_ins):
            tiles.append(_place(hbm[i], ins[i].dtype, ins[i].buffer, ins[i].view))
        next_input = n_ins
        for j in range(len(outs)):
            s = outs[j]
            if has_init[j]:
                tiles.append(_place(hbm[next_input], s.dtype, s.buffer, s.view))
                next_input += 1
            else:
                tiles.append(_alloc(s.shape, s.dtype, s.buffer, s.view))
        _call(body, tiles)
        result = ()
        for j in range(len(outs)):
            result = result + (_read_back(tiles[n_ins + j], outs[j].dtype),)
        return result

    outputs = run(kernel, (tuple(arrays),), target=target, precise_fp=precise_fp).outputs
    return list(outputs)


def run_body(body, *, target="trn2"):
    """Run a body that allocates its own tiles; returns the Run. (The kernel takes one
    unused argument: a kernel called with no arguments at all is not the NKI norm.)"""

    def kernel(unused):
        return body()

    return run(kernel, (np.zeros((1, 1), np.float32),), target=target)


def expect_error(body, *, op, arg, target="trn2", rule=None, limit=None, value=None):
    """``body`` must raise NkiValidationError with these fields; returns the error."""
    with pytest.raises(NkiValidationError) as info:
        run_body(body, target=target)
    err = info.value
    assert (err.op, err.arg) == (op, arg), str(err)
    assert str(err).startswith(f"{op}: {arg} {err.rule}, got "), str(err)
    if rule is not None:
        assert rule in err.rule, str(err)
    if limit is not None:
        assert err.limit == limit, str(err)
        parts = limit if isinstance(limit, tuple) else (limit,)
        assert all(str(x) in err.rule for x in parts), f"the rule should name the limit: {err}"
    if value is not None:
        assert err.value == value, str(err)
    return err


def tile(shape, dtype="float32", buffer="sbuf"):
    """A fresh on-chip tile (for limit tests; contents are the NaN / 4 sentinel)."""
    return nl.ndarray(tuple(shape), dtype, buffer=nl.psum if buffer == "psum" else nl.sbuf)


class T:
    """A tile to allocate later, inside the kernel (limit tests build arguments outside it)."""

    def __init__(self, shape, dtype="float32", buffer="sbuf"):
        self.spec = (tuple(shape), dtype, buffer)


def make(args: dict) -> dict:
    """``args`` with every :class:`T` allocated (call inside a kernel)."""
    return {k: tile(*v.spec) if isinstance(v, T) else v for k, v in args.items()}


# -- hypothesis strategies ------------------------------------------------------------------------


@st.composite
def tile_shapes(draw, max_free=384, max_dims=3, max_p=128):
    """[P, *free]: P in 1..max_p, 1..max_dims free dims (odd sizes included) with a bounded
    product."""
    p = draw(st.integers(1, max_p))
    dims = draw(st.integers(1, max_dims))
    free = []
    budget = max_free
    for _ in range(dims):
        n = draw(st.integers(1, max(1, min(budget, 67 if dims > 1 else max_free))))
        free.append(n)
        budget = max(1, budget // n)
    return (p, *free)


views = st.sampled_from([None, "offset", "strided"])


def bf16(x):
    return np.asarray(x, dtype=ml_dtypes.bfloat16)


def present(a=None, b=None, c=None, d=None, e=None, f=None):
    """The given tiles of a body's trailing parameters, in order (NKI has no *args)."""
    out = ()
    for x in (a, b, c, d, e, f):
        if x is not None:
            out = out + (x,)
    return out
