"""MX (microscaling) instructions: ``nisa.quantize_mx`` and ``nisa.nc_matmul_mx``.

Sources (aws-neuron/aws-neuron-sdk, snapshot 81ce03ae):

- [isa] nki/api/nki/isa/__init__.py, ``quantize_mx`` and ``nc_matmul_mx``: NeuronCore-v4
  only; groups of 8 partitions x 4 elements; the block scale
  ``X = 2**(floor(log2(amax)) - (Emax - 1))`` with Emax 8 (e4m3fn) / 15 (e5m2), and
  ``2**-127`` for an all-zero group; dtypes, buffers and tile-size limits.
- [dive] nki/deep-dives/mxfp-matmul.rst: the x4 element packs four values of the contraction
  axis that sit adjacent on the free axis ("pack groups of 4 free-dimension elements into a
  single MXFP_x4 element"); scales sit "in the quadrant from which the corresponding
  scaling group originated"; scale tiles are ``[P//8, F//4]`` when P <= 32 and ``[P, F//4]``
  ("oversize required") when P > 32; quantize_mx has no FP4 output; its packed-scale
  kernel shows a scale view may start at partition 4 of a quadrant and that quantize_mx
  "requires that the input tile's free dimension contains exactly 4x as many elements as
  the scale tile".
- [gold] nki/deep-dives/src/mxfp-matmul/mx_cpu_utils.py, AWS's golden model:
  ``get_p_contiguous_scale`` (group i of 8 partitions at scale partition
  ``i // 4 * 32 + i % 4``), ``pack_mx_data_into_x4`` (value q of an element at byte q of a
  little-endian uint32; fp4: nibble q of 16 bits), ``quantize_mx_golden`` (divide by the
  scale, clip to the format's largest finite value, then cast: round to nearest even),
  ``nc_matmul_mx_golden`` (``einsum("kiq,kjq->ij")`` of the dequantized tiles).

[CONFLICT] [gold]'s ``quantize_mx_golden`` uses Emax (OCP's sample conversion) by default;
[isa] says the instruction's scale is "two times larger" (Emax - 1). We follow [isa], the
instruction's own contract; the two differ by one bit of precision, within the deep dive's
5e-2 comparison tolerance. Not documented, our choice: a scale exponent below 2**-127
(bf16 subnormal inputs) is clamped to 2**-127; a NaN/inf input is refused.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.instructions._common import SBUF, OperandChecks
from neuron_kernels.interpreter.instructions.tensor_engine import (
    _accumulation,
    _check_bank,
    _mark_matmul_written,
    _store,
    _tiling,
)

__all__ = ["quantize_mx", "nc_matmul_mx", "FP8_X4", "MX_X4", "SCALE_DTYPES"]

FP8_X4 = {"float8_e4m3fn_x4": "float8_e4m3fn", "float8_e5m2_x4": "float8_e5m2"}
MX_X4 = (*FP8_X4, "float4_e2m1fn_x4")
SCALE_DTYPES = ("float8_e8m0fnu", "uint8")
# [isa] quantize_mx "Scale calculation": Emax, the largest unbiased exponent of the element.
_EMAX = {"float8_e4m3fn": 8, "float8_e5m2": 15}
# OCP float4_e2m1fn code points 0..15 (sign bit 3): the values ml_dtypes.float4_e2m1fn decodes.
_FP4_VALUES = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)
_QUADRANT = 32
_GROUP_P, _GROUP_F = 8, 4


def _needs_v4(check: OperandChecks) -> None:
    if check.target.nc_version < 4:  # [isa] "Available only on NeuronCore-v4 and newer."
        check.fail(
            "target",
            "must be NeuronCore-v4 or newer (trn3): MX is 'Available only on NeuronCore-v4'",
            check.target.name,
        )


def scale_rows(p: int) -> np.ndarray:
    """Scale-tile partition (from the scale view's start) of each 8-partition group of a
    P-partition data tile ([gold] ``get_p_contiguous_scale``: partitions 0..3 of each
    32-partition quadrant; for P <= 32 that is simply groups 0..P//8-1)."""
    groups = np.arange(p // _GROUP_P)
    return groups // 4 * _QUADRANT + groups % 4


def _check_scale(check, arg: str, scale, data_arg: str, data, p: int, f: int, exact: bool):
    """Scale dtype, shape and quadrant placement for a data tile of P partitions whose free
    size (in x4 elements) is ``f``. [dive] "Scales must be placed in the quadrant from which
    the corresponding scaling group originated"; its packed-scale kernel
    (``kernel_copy_strided_quantize_matmul_mx_packed_scale``) puts a second tensor's scales
    at partitions 4..7 of each quadrant through a view starting at partition 4, so the rule
    is per group, not the view's start."""
    if scale.dtype not in SCALE_DTYPES:
        check.fail(f"{arg} dtype", f"must be one of {', '.join(SCALE_DTYPES)}", scale.dtype)
    rows = scale_rows(p)
    need = int(rows[-1]) + 1
    if scale.partitions < need:
        check.fail(
            f"{arg} partition dimension",
            f"must be >= {need} for a {p}-partition {data_arg} (each group's scale at "
            "partitions 0..3 of its quadrant)",
            scale.partitions,
            limit=need,
        )
    if (scale.elems_per_partition != f) if exact else (scale.elems_per_partition < f):
        rule = "must equal" if exact else "must be >="
        check.fail(
            f"{arg} free size",
            f"{rule} the {data_arg} free size ({f}): one scale per 4-element group",
            scale.elems_per_partition,
            limit=f,
        )
    d_start = data._access().partition_start
    s_start = scale._access().partition_start
    data_quadrant = (d_start + _GROUP_P * np.arange(p // _GROUP_P)) // _QUADRANT
    scale_quadrant = (s_start + rows) // _QUADRANT
    bad = np.flatnonzero(data_quadrant != scale_quadrant)
    if bad.size:
        g = int(bad[0])
        check.fail(
            f"{arg} partitions",
            f"must put each group's scale in its {data_arg} quadrant: group {g} "
            f"({data_arg} partitions {d_start + 8 * g}..{d_start + 8 * g + 7}) has its scale "
            f"at partition {s_start + int(rows[g])}",
            f"{arg} starting at partition {s_start}",
        )


def _flat2d(t) -> np.ndarray:
    return t._read_raw().reshape(t.partitions, t.elems_per_partition)


def quantize_mx(dst, src, dst_scale, name=None):
    """Quantize a bf16/fp16 SBUF tile to MXFP8 data (x4-packed) and per-group scales.

    Raises:
        NkiValidationError: on any documented target, buffer, dtype or shape limit.
    """
    check = OperandChecks("nisa.quantize_mx")
    _needs_v4(check)
    src = check.engine_operand("src", src, "vector")
    dst = check.engine_operand("dst", dst, "vector", write=True)
    dst_scale = check.engine_operand("dst_scale", dst_scale, "vector", write=True)
    for arg, t in (("src", src), ("dst", dst), ("dst_scale", dst_scale)):
        check.buffer(arg, t, SBUF, "quantize_mx reads and writes SBUF only")
    if src.dtype not in ("float16", "bfloat16"):
        check.fail("src dtype", "must be float16 or bfloat16", src.dtype)
    if dst.dtype not in FP8_X4:
        check.fail(
            "dst dtype",
            "must be float8_e5m2_x4 or float8_e4m3fn_x4 (no FP4 output)",
            dst.dtype,
        )
    p, f = src.partitions, src.elems_per_partition
    if p % _QUADRANT or p > 128:
        check.fail("src partition dimension", "must be a multiple of 32 and <= 128", p)
    if f % _GROUP_F:
        check.fail("src free size", "must be a multiple of 4", f, limit=_GROUP_F)
    if dst.partitions != p:
        check.fail("dst partition dimension", f"must equal src's ({p})", dst.partitions)
    if dst.elems_per_partition != f // 4:
        check.fail(
            "dst free size",
            f"must be 1/4 of src's ({f // 4}): four fp8 per x4 element",
            dst.elems_per_partition,
            limit=f // 4,
        )
    _check_scale(check, "dst_scale", dst_scale, "src", src, p, f // 4, exact=True)
    if check.compute:
        x = _flat2d(src).astype(np.float64)
        if not np.isfinite(x).all():
            check.fail("src", "must be finite: the docs define no scale for NaN/inf", "NaN/inf")
        elem = FP8_X4[dst.dtype]
        groups = np.abs(x).reshape(p // 8, 8, f // 4, 4).max(axis=(1, 3))
        _, exp2 = np.frexp(groups)  # groups = m * 2**exp2, m in [0.5, 1): floor(log2) = exp2-1
        biased = (exp2 - 1) - (_EMAX[elem] - 1) + 127  # [isa] X = 2**(floor(log2 amax)-(Emax-1))
        biased = np.where(groups == 0, 0, np.clip(biased, 0, 254)).astype(np.uint8)
        factor = np.ldexp(1.0, biased.astype(np.int64) - 127)
        q = x / np.repeat(np.repeat(factor, 8, axis=0), 4, axis=1)  # exact: powers of two
        finfo = dtypes.value_range(elem)
        q = np.clip(q, finfo[0], finfo[1])  # [gold] OCP saturation, then
        codes = q.astype(dtypes.storage_dtype(elem)).view(np.uint8)  # RNE cast (ml_dtypes)
        b = codes.reshape(p, f // 4, 4).astype(np.uint32)
        packed = b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24
        dst._write(packed, raw=True)
        scale = _flat2d(dst_scale).view(np.uint8).copy()
        scale[scale_rows(p), : f // 4] = biased
        dst_scale._write(scale.view(dst_scale._np_dtype()), raw=True)
    else:
        dst._write(np.zeros(dst.shape, dst._np_dtype()), raw=True)
        dst_scale._write(np.zeros(dst_scale.shape, dst_scale._np_dtype()), raw=True)
    return check.record("vector", [src], [dst, dst_scale], name, F=f, element_dtype=dst.dtype)


def unpack_x4(bits: np.ndarray, dtype: str) -> np.ndarray:
    """x4 elements ``[K, F]`` (their storage bits) -> fp32 values ``[K, F, 4]`` ([gold])."""
    if dtype == "float4_e2m1fn_x4":
        shifts = np.array([0, 4, 8, 12], dtype=np.uint16)
        nibbles = (bits[..., None] >> shifts) & 0xF
        return _FP4_VALUES[nibbles]
    raw = np.ascontiguousarray(bits, dtype=np.uint32)[..., None] >> np.array(
        [0, 8, 16, 24], dtype=np.uint32
    )
    codes = (raw & 0xFF).astype(np.uint8)
    return codes.view(dtypes.storage_dtype(FP8_X4[dtype])).astype(np.float32)


def _scale_factors(scale: np.ndarray, p: int, f: int) -> np.ndarray:
    """Per-group multipliers ``[P//8, F]`` from a scale tile's bits (e8m0: 2**(s-127),
    0xFF is NaN for float8_e8m0fnu and read the same for uint8)."""
    s = scale.view(np.uint8)[scale_rows(p), :f].astype(np.int64)
    out = np.ldexp(np.float32(1.0), s - 127).astype(np.float32)
    return np.where(s == 255, np.float32(np.nan), out)


def nc_matmul_mx(
    dst,
    stationary,
    moving,
    stationary_scale,
    moving_scale,
    tile_position=None,
    tile_size=None,
    accumulate=None,
    name=None,
):
    """``dst[M, N] (+)= sum over (k, q) of deq(stationary)[k, M, q] * deq(moving)[k, N, q]``.

    Raises:
        NkiValidationError: on any documented target, buffer, dtype, shape or tiling limit.
    """
    check = OperandChecks("nisa.nc_matmul_mx")
    tg = check.target
    _needs_v4(check)
    stationary = check.engine_operand("stationary", stationary, "tensor")
    moving = check.engine_operand("moving", moving, "tensor")
    stationary_scale = check.engine_operand("stationary_scale", stationary_scale, "tensor")
    moving_scale = check.engine_operand("moving_scale", moving_scale, "tensor")
    dst = check.engine_operand("dst", dst, "tensor", write=True)
    if accumulate is not None:
        accumulate = check.flag("accumulate", accumulate)
    for arg, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in MX_X4:
            check.fail(f"{arg} dtype", f"must be one of {', '.join(MX_X4)}", t.dtype)
    if dst.dtype not in ("float32", "bfloat16"):
        check.fail("dst dtype", "must be float32 or bfloat16", dst.dtype)
    k = stationary.partitions
    if k % _QUADRANT or k > 128:
        check.fail("stationary partition dimension", "must be a multiple of 32 and <= 128", k)
    if moving.partitions != k:
        check.fail(
            "moving partition dimension", f"must equal stationary's ({k})", moving.partitions
        )
    m, n = stationary.elems_per_partition, moving.elems_per_partition
    if m % 2 or m > tg.gemm_stationary_fmax:
        check.fail("stationary free size", f"must be even and <= {tg.gemm_stationary_fmax}", m)
    n_max = 4096 if dst.dtype == "float32" else 8192  # [isa]: the 8 PSUM banks
    if n > n_max:
        check.fail("moving free size", f"must be <= {n_max} with a {dst.dtype} dst", n, limit=n_max)
    if dst.partitions != m:
        check.fail(
            "dst partition dimension", f"must equal the stationary free size ({m})", dst.partitions
        )
    if dst.elems_per_partition != n:
        check.fail(
            "dst elements per partition",
            f"must equal the moving free size ({n})",
            dst.elems_per_partition,
        )
    tiling = _tiling(check, tile_position, tile_size, k, m)
    if tiling is not None and (tiling[1] != 128 or tiling[3] != 0):
        check.fail(
            "tile_size/tile_position",
            "must be row tiling only: column_size 128 and start_column 0",
            (tile_size, tile_position),
        )
    _check_scale(
        check, "stationary_scale", stationary_scale, "stationary", stationary, k, m, exact=False
    )
    _check_scale(check, "moving_scale", moving_scale, "moving", moving, k, n, exact=False)
    banks = max(1, -(-n * dst.itemsize // tg.psum_bank_bytes))
    _check_bank(check, dst, banks)
    dst._psum_uniform()  # (refuses a view reinterpreted to another element size)
    mode, mask = _accumulation(check, dst, accumulate)
    if check.compute:
        a = unpack_x4(_flat2d(stationary), stationary.dtype)
        b = unpack_x4(_flat2d(moving), moving.dtype)
        a *= np.repeat(_scale_factors(_flat2d(stationary_scale), k, m), 8, axis=0)[..., None]
        b *= np.repeat(_scale_factors(_flat2d(moving_scale), k, n), 8, axis=0)[..., None]
        # contraction over partitions and the four values of each x4 element ([gold] einsum)
        a2 = a.transpose(0, 2, 1).reshape(k * 4, m)
        b2 = b.transpose(0, 2, 1).reshape(k * 4, n)
        with np.errstate(all="ignore"):
            result = np.matmul(a2.T, b2)
        _store(dst, result, mode, mask, raw=False)
    _mark_matmul_written(dst)
    return check.record(
        "tensor",
        [stationary, moving, stationary_scale, moving_scale],
        [dst],
        name,
        K=k * 4,
        M=m,
        N=n,
        stationary_dtype=stationary.dtype,
        moving_dtype=moving.dtype,
        tiling=tiling,
        accumulate=mode,
        mx=True,
    )
