"""NKI data types: names, storage in NumPy/ml_dtypes, and the one rounding step on write.

NKI dtypes are strings (``DType = str`` in the API stubs), so ``nl.bfloat16 == "bfloat16"``.
Engines compute in fp32 and convert to the destination dtype on write: floats round to
nearest even (ml_dtypes), fp32 -> int rounds half to even and saturates (NKI 0.6 simulator
fix). With ``NKI_PRECISE_FP=0`` every sub-32-bit float is stored as fp32, as AWS's simulator
does, to separate algorithm bugs from precision loss.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "DTypeInfo",
    "DTYPES",
    "PRECISE_FP_ENV",
    "info",
    "normalize",
    "precise_fp_from_env",
    "storage_dtype",
    "convert",
    "refuse_packed",
    "sentinel",
]

PRECISE_FP_ENV = "NKI_PRECISE_FP"


@dataclass(frozen=True)
class DTypeInfo:
    name: str
    itemsize: int  # bytes on the device
    kind: str  # "float", "int", "uint", "bool", "packed"
    np_dtype: object  # NumPy/ml_dtypes storage type in precise mode (None: not simulated)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint", "bool")


def _f(name, size, np_type):
    return DTypeInfo(name, size, "float", np_type)


DTYPES: dict[str, DTypeInfo] = {
    d.name: d
    for d in (
        DTypeInfo("bool_", 1, "bool", np.uint8),
        DTypeInfo("int8", 1, "int", np.int8),
        DTypeInfo("int16", 2, "int", np.int16),
        DTypeInfo("int32", 4, "int", np.int32),
        DTypeInfo("uint8", 1, "uint", np.uint8),
        DTypeInfo("uint16", 2, "uint", np.uint16),
        DTypeInfo("uint32", 4, "uint", np.uint32),
        _f("float32", 4, np.float32),
        _f("float16", 2, np.float16),
        _f("bfloat16", 2, ml_dtypes.bfloat16),
        _f("tfloat32", 4, np.float32),  # fp32 container, 10 mantissa bits kept on write
        _f("float8_e4m3", 1, ml_dtypes.float8_e4m3),  # legacy fp8, max finite 240
        _f("float8_e4m3fn", 1, ml_dtypes.float8_e4m3fn),  # OCP fp8, no inf, max 448
        _f("float8_e5m2", 1, ml_dtypes.float8_e5m2),
        _f("float8_e8m0fnu", 1, ml_dtypes.float8_e8m0fnu),
        # MX x4 types hold their bits: four fp8 bytes in a uint32, four fp4 nibbles in a
        # uint16, value q of the four at bits 8q (4q) - aws-neuron-sdk
        # nki/deep-dives/mxfp-matmul.rst ("32-bits wide", "16-bits wide", four elements) and
        # src/mxfp-matmul/mx_cpu_utils.py (pack_mx_data_into_x4: a little-endian uint32 view of
        # four adjacent fp8; fp4 first value in the low nibble). Only the MX instructions,
        # bit copies and memset(value=0) use them (interpreter/instructions/mx.py).
        DTypeInfo("float8_e5m2_x4", 4, "packed", np.uint32),
        DTypeInfo("float8_e4m3fn_x4", 4, "packed", np.uint32),
        DTypeInfo("float4_e2m1fn_x4", 2, "packed", np.uint16),
    )
}

_FROM_NUMPY = {
    np.dtype(np.bool_): "bool_",
    np.dtype(np.int8): "int8",
    np.dtype(np.int16): "int16",
    np.dtype(np.int32): "int32",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.uint32): "uint32",
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(ml_dtypes.float8_e4m3): "float8_e4m3",
    np.dtype(ml_dtypes.float8_e4m3fn): "float8_e4m3fn",
    np.dtype(ml_dtypes.float8_e5m2): "float8_e5m2",
    np.dtype(ml_dtypes.float8_e8m0fnu): "float8_e8m0fnu",
}


def normalize(dtype, api: str = "dtype") -> str:
    """Return the NKI dtype name for an NKI name, a NumPy/ml_dtypes dtype or a torch dtype."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    name = getattr(dtype, "_nki_name", None)
    if name is not None:
        return name
    torch_name = _torch_dtype_name(dtype)
    if torch_name is not None:
        return torch_name
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype in _FROM_NUMPY:
        return _FROM_NUMPY[np_dtype]
    from neuron_kernels.interpreter.errors import NkiValidationError

    raise NkiValidationError(
        api, "dtype", "must be an NKI dtype (nl.float32, nl.bfloat16, ...)", dtype
    )


_TORCH_NAMES = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float8_e4m3fn": "float8_e4m3fn",
    "torch.float8_e5m2": "float8_e5m2",
    "torch.int8": "int8",
    "torch.int16": "int16",
    "torch.int32": "int32",
    "torch.uint8": "uint8",
    "torch.uint16": "uint16",
    "torch.uint32": "uint32",
    "torch.bool": "bool_",
}


def _torch_dtype_name(dtype) -> str | None:
    if type(dtype).__name__ != "dtype" or type(dtype).__module__ != "torch":
        return None
    return _TORCH_NAMES.get(str(dtype))


def info(name: str) -> DTypeInfo:
    return DTYPES[name]


_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def precise_fp_from_env() -> bool:
    """``NKI_PRECISE_FP``: 1/true/on/yes (default) or 0/false/off/no, in any case."""
    text = os.environ.get(PRECISE_FP_ENV, "1").strip().lower()
    if text in _ON or text == "":
        return True
    if text in _OFF:
        return False
    from neuron_kernels.errors import LimitError

    raise LimitError(
        "interpreter",
        PRECISE_FP_ENV,
        f"must be one of {'/'.join(_ON)} or {'/'.join(_OFF)}",
        os.environ[PRECISE_FP_ENV],
    )


def value_range(name: str) -> tuple[float, float] | None:
    """(lowest, highest) finite value ``name`` holds; None for dtypes not simulated."""
    d = DTYPES[name]
    if d.np_dtype is None or d.kind == "packed":
        return None
    if d.kind == "bool":
        return (0, 1)
    if d.is_integer:
        i = np.iinfo(d.np_dtype)
        return (int(i.min), int(i.max))
    import ml_dtypes

    f = ml_dtypes.finfo(d.np_dtype)
    return (float(f.min), float(f.max))


def storage_dtype(name: str, precise_fp: bool = True) -> np.dtype:
    """The NumPy dtype that stores ``name`` (fp32 for low-precision floats when not precise)."""
    d = DTYPES[name]
    if d.np_dtype is None:
        from neuron_kernels.interpreter.errors import not_implemented

        raise not_implemented(f"nl.{name} tensors")
    if not precise_fp and d.is_float and d.itemsize < 4:
        return np.dtype(np.float32)
    return np.dtype(d.np_dtype)


def refuse_packed(name: str, what: str):
    """Packed x4 values are not numbers an engine converts: refuse ``what`` on them."""
    from neuron_kernels.interpreter.errors import NkiValidationError

    raise NkiValidationError(
        "nki",
        f"{what} of dtype",
        "must not be a packed x4 MX dtype: only nisa.quantize_mx writes it, nisa.nc_matmul_mx "
        "reads it, and DMA/same-dtype copies and nisa.memset(value=0) move its bits "
        "(nki/api/nki/isa/__init__.py quantize_mx, nc_matmul_mx, memset)",
        name,
    )


def sentinel(name: str):
    """Fresh-memory fill: NaN for floats, 4 for integers (as AWS's simulator)."""
    return np.nan if DTYPES[name].is_float else 4


def _round_tf32(x: np.ndarray) -> np.ndarray:
    """Round fp32 to tf32 (10 mantissa bits), nearest even; NaN/inf pass through."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    finite = np.isfinite(x)
    rounded = (bits + 0x0FFF + ((bits >> 13) & 1)) & 0xFFFFE000
    out = np.where(finite, rounded, bits).astype(np.uint32)
    return out.view(np.float32)


def convert(values: np.ndarray, name: str, precise_fp: bool = True) -> np.ndarray:
    """Convert computed values (fp32 math or exact integers) to the storage of ``name``.

    Floats round to nearest even (ml_dtypes; out-of-range values follow ml_dtypes, as in
    AWS's simulator: inf for bf16/fp16/e5m2, NaN for the no-inf fp8 formats); tf32 keeps 10
    mantissa bits, rounding to nearest even. Float -> integer rounds half to even,
    saturates and maps NaN to 0 (NKI 0.6 simulator fix, release-notes/components/nki.rst);
    integer -> integer wraps (bit patterns, as the hardware's bitvec path). With
    ``precise_fp=False`` sub-32-bit floats and tf32 stay fp32, unrounded (NKI_PRECISE_FP=0
    "eliminates rounding and truncation effects", nki/guides/nki_simulator.rst).
    """
    d = DTYPES[name]
    target = storage_dtype(name, precise_fp)
    values = np.asarray(values)
    src = values.dtype
    if d.kind == "packed":
        refuse_packed(name, "a converting write")
    if d.is_float:
        if src == target:
            out = values
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf/NaN is meant
                if src.kind in "iub" or src == np.float64:
                    # Engines hand over fp32: integers and fp64 pass through fp32 first (one
                    # rounding from fp32, as the hardware's "to fp32, then to dst" conversions).
                    out = values.astype(np.float32).astype(target)
                else:
                    out = values.astype(target)
        if name == "tfloat32" and precise_fp:
            out = _round_tf32(out)
        return out
    if d.kind == "bool":
        return (values != 0).astype(np.uint8)
    if src.kind in "iub":
        return values.astype(target)
    v = np.asarray(values, dtype=np.float64)
    v = np.where(np.isnan(v), 0.0, np.rint(v))
    info_ = np.iinfo(target)
    return np.clip(v, info_.min, info_.max).astype(target)
