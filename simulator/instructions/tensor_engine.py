"""Tensor Engine instructions: ``nisa.nc_matmul`` and ``nisa.nc_transpose``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (nc_matmul, nc_transpose),
nki/guides/architecture/trainium2_arch.rst. ``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]``;
inputs in SBUF, output in PSUM, fp32 accumulation.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.simulator import dtypes
from neuron_kernels.simulator.enums import engine as Engine
from neuron_kernels.simulator.enums import matmul_perf_mode as PerfMode
from neuron_kernels.simulator.instructions._common import Check
from neuron_kernels.simulator.tensor import (
    PSUM_MATMUL_WRITTEN,
    PSUM_UNWRITTEN,
    PSUM_VALUE_WRITTEN,
    MemoryRegion,
    NkiTensor,
)

__all__ = ["nc_matmul", "nc_transpose"]

_MATMUL_INPUTS = {"float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32"}
_FP32_FAMILY = {"float32", "tfloat32"}
_FP8 = {"float8_e4m3", "float8_e5m2", "float8_e4m3fn"}


def _psum_state_view(t: NkiTensor) -> np.ndarray:
    return t._psum_state()


def _check_bank(check: Check, t: NkiTensor, banks: int) -> None:
    acc = t._access()
    bank = check.target.psum_bank_bytes
    first, last = acc.byte_lo // bank, (acc.byte_hi - 1) // bank
    if last - first + 1 > banks:
        where = "one PSUM bank" if banks == 1 else f"{banks} PSUM banks"
        check.fail(
            "dst",
            f"must lie within {where} ({bank} B each per partition)",
            f"bytes {acc.byte_lo}..{acc.byte_hi} of the partition",
            limit=banks * bank,
        )


def _tiling(check: Check, tile_position, tile_size, k: int, m: int):
    if tile_position in ((), None) and tile_size in ((), None):
        return None
    if tile_position in ((), None) or tile_size in ((), None):
        check.fail("tile_position/tile_size", "must both be set to enable tiling mode", (tile_position, tile_size))
    try:
        row_size, col_size = (int(v) for v in tile_size)
        start_row, start_col = (int(v) for v in tile_position)
    except (TypeError, ValueError):
        check.fail("tile_size/tile_position", "must be 2-tuples of ints", (tile_size, tile_position))
    sizes = (32, 64, 128) if check.target.min_pe_tile == 32 else (64, 128)
    for arg, v in (("tile_size row_size", row_size), ("tile_size column_size", col_size)):
        if v not in sizes:
            check.fail(arg, f"must be one of {sizes} on {check.target.name}", v, limit=sizes)
    if start_row % row_size or not 0 <= start_row < 128:
        check.fail("tile_position start_row", f"must be a multiple of row_size {row_size} below 128", start_row)
    if start_col % col_size or not 0 <= start_col < 128:
        check.fail("tile_position start_column", f"must be a multiple of column_size {col_size} below 128", start_col)
    if k > row_size:
        check.fail("stationary partition dimension", f"must be <= row_size {row_size} in tiling mode", k,
                   limit=row_size)
    if m > col_size:
        check.fail("stationary free size", f"must be <= column_size {col_size} in tiling mode", m, limit=col_size)
    return (row_size, col_size, start_row, start_col)


def _write_result(check: Check, dst: NkiTensor, result: np.ndarray, accumulate) -> str:
    """Write or accumulate an fp32 result into PSUM per the accumulate flag."""
    state = _psum_state_view(dst)
    flat_state = state.reshape(dst.partitions, -1)
    if accumulate is None:
        acc_mask = flat_state == PSUM_MATMUL_WRITTEN
        mode = "accumulate" if acc_mask.all() else "overwrite" if not acc_mask.any() else "mixed"
    elif accumulate:
        ok = (flat_state == PSUM_MATMUL_WRITTEN) | (
            (flat_state == PSUM_VALUE_WRITTEN) & check.target.has_psum_value_init_accumulate
        )
        if not ok.all():
            bad = int(flat_state[~ok][0])
            why = {
                PSUM_UNWRITTEN: "a PSUM location never written",
                PSUM_VALUE_WRITTEN: f"PSUM initialised by a non-matmul instruction (UB on {check.target.name})",
            }[bad]
            check.fail(
                "accumulate",
                "=True must follow an overwriting matmul on the same PSUM location",
                why,
                hint="use accumulate=(k > 0) or leave accumulate=None",
            )
        acc_mask, mode = np.ones_like(flat_state, dtype=bool), "accumulate"
    else:
        acc_mask, mode = np.zeros_like(flat_state, dtype=bool), "overwrite"
    result = result.astype(np.float32)
    if acc_mask.any():
        old = dst._read_f32().reshape(result.shape)
        result = np.where(acc_mask, (old + result).astype(np.float32), result)
    dst._write(result.reshape(dst.shape))
    state[...] = PSUM_MATMUL_WRITTEN
    return mode


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=PerfMode.none, name=None):
    """``dst = stationary.T @ moving`` on the Tensor Engine, accumulating in fp32 PSUM.

    Raises:
        NkiValidationError: on any documented buffer, shape, dtype or mode limit.
    """
    check = Check("nisa.nc_matmul")
    tg = check.target
    stationary = check.engine_operand("stationary", stationary, "tensor")
    moving = check.engine_operand("moving", moving, "tensor")
    dst = check.engine_operand("dst", dst, "tensor", write=True)
    is_transpose = check.flag("is_transpose", is_transpose)
    check.flag("is_stationary_onezero", is_stationary_onezero)
    check.flag("is_moving_onezero", is_moving_onezero)
    if accumulate is not None:
        accumulate = check.flag("accumulate", accumulate)
    if not isinstance(perf_mode, PerfMode):
        check.fail("perf_mode", "must be an nisa.matmul_perf_mode member", repr(perf_mode))
    double_row = perf_mode is PerfMode.double_row

    # dtypes
    allowed_in = _MATMUL_INPUTS | ({"float8_e4m3fn"} if tg.has_fp8_e4m3fn else set())
    for arg, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in allowed_in:
            check.fail(f"{arg} dtype", f"must be one of {sorted(allowed_in)} on {tg.name}", t.dtype,
                       limit=sorted(allowed_in))
    s_dt, m_dt = stationary.dtype, moving.dtype
    if (s_dt in _FP32_FAMILY) != (m_dt in _FP32_FAMILY):
        check.fail("moving dtype", f"must be float32/tfloat32 when stationary is {s_dt} (and vice versa)", m_dt)
    if {s_dt, m_dt} == {"float8_e4m3", "float8_e4m3fn"}:
        check.fail("moving dtype", "must not mix legacy float8_e4m3 with OCP float8_e4m3fn", m_dt)

    # shapes
    k = stationary.partitions
    if moving.partitions != k:
        check.fail("moving partition dimension", f"must equal stationary's ({k})", moving.partitions, limit=k)
    if double_row:
        if not tg.has_double_row:
            check.fail("perf_mode", "double_row needs NeuronCore-v3 or newer", tg.name)
        if s_dt not in _FP8 or m_dt not in _FP8:
            check.fail("perf_mode", "double_row needs float8 stationary and moving", (s_dt, m_dt))
        if is_transpose:
            check.fail("perf_mode", "double_row cannot be combined with transpose mode", "is_transpose=True")
        for arg, t in (("stationary", stationary), ("moving", moving)):
            if t.ndim != 3 or t.shape[1] != 2:
                check.fail(f"{arg} shape", "must be [K, 2, F] in double_row mode", t.shape)
        m, n = stationary.shape[2], moving.shape[2]
    else:
        m, n = stationary.elems_per_partition, moving.elems_per_partition
    tiling = _tiling(check, tile_position, tile_size, k, m)
    if double_row and tiling is not None and tiling[1] != 128:
        check.fail("tile_size", "column tiling cannot be combined with double_row", tile_size)
    if m > tg.gemm_stationary_fmax:
        check.fail("stationary free size", f"must be <= {tg.gemm_stationary_fmax}", m, limit=tg.gemm_stationary_fmax)

    # destination
    transpose_dst_ok = is_transpose and tg.has_transpose_mode and dst.dtype == s_dt
    if dst.dtype == "float32" or transpose_dst_ok:
        n_max = tg.matmul_moving_fmax_fp32_dst
    elif dst.dtype == "bfloat16" and tg.matmul_moving_fmax_bf16_dst:
        n_max = tg.matmul_moving_fmax_bf16_dst
    else:
        allowed = ["float32"] + (["bfloat16"] if tg.matmul_moving_fmax_bf16_dst else [])
        if is_transpose and tg.has_transpose_mode:
            allowed.append(f"{s_dt} (transpose mode)")
        check.fail("dst dtype", f"must be one of {allowed} on {tg.name}", dst.dtype, limit=allowed)
    if n > n_max:
        check.fail("moving free size", f"must be <= {n_max} on {tg.name} ({dst.dtype} dst)", n, limit=n_max)
    if dst.partitions != m:
        check.fail("dst partition dimension", f"must equal the stationary free size ({m})", dst.partitions, limit=m)
    if dst.elems_per_partition != n:
        check.fail("dst elements per partition", f"must equal the moving free size ({n})",
                   dst.elems_per_partition, limit=n)
    if dst.itemsize != dtypes.info(dst._storage.dtype).itemsize:
        check.fail("dst", "must not reinterpret PSUM storage to another element size", dst.dtype)
    banks = max(1, -(-n * dst.itemsize // tg.psum_bank_bytes)) if tg.nc_version >= 4 else 1
    _check_bank(check, dst, banks)

    # math
    a = stationary._read_f32().reshape(k * (2 if double_row else 1), m) if double_row else \
        stationary._read_f32().reshape(k, m)
    b = moving._read_f32().reshape(a.shape[0], n)
    if is_transpose and tg.has_transpose_mode and a.shape[0] == b.shape[1] and \
            np.array_equal(b, np.eye(b.shape[0], dtype=np.float32)):
        # Transpose mode is bit-accurate from NeuronCore-v3 (NaN/Inf safe).
        if dst.dtype == s_dt:
            raw = stationary._read_raw().reshape(k, m).T
            _write_result_raw(dst, raw, accumulate, check)
            mode = "overwrite"
        else:
            mode = _write_result(check, dst, a.T.copy(), accumulate)
    else:
        if check.compute:
            with np.errstate(all="ignore"):
                result = np.matmul(a.T, b, dtype=np.float32)
        else:
            result = np.zeros((m, n), dtype=np.float32)
        mode = _write_result(check, dst, result, accumulate)
    return check.record(
        "tensor", [stationary, moving], [dst], name,
        K=k * (2 if double_row else 1), M=m, N=n, stationary_dtype=s_dt, moving_dtype=m_dt,
        is_transpose=is_transpose, perf_mode=perf_mode.value, tiling=tiling, accumulate=mode,
        is_stationary_onezero=bool(is_stationary_onezero), is_moving_onezero=bool(is_moving_onezero),
    )


def _write_result_raw(dst: NkiTensor, raw: np.ndarray, accumulate, check: Check) -> None:
    if accumulate:
        check.fail("accumulate", "is not supported for a transpose-mode result in the input dtype", True)
    dst._write(raw.reshape(dst.shape), raw=True)
    _psum_state_view(dst)[...] = PSUM_MATMUL_WRITTEN


def nc_transpose(dst, data, engine=Engine.unknown, name=None):
    """2-D transpose between the partition axis and the (flattened) free axis.

    Tensor Engine: SBUF -> PSUM, up to [128, 128]. Vector Engine: SBUF/PSUM, up to [32, 32].
    """
    check = Check("nisa.nc_transpose")
    tg = check.target
    dst = check.tensor("dst", dst)
    data = check.tensor("data", data)
    default = "tensor" if dst.buffer is MemoryRegion.psum and data.buffer is MemoryRegion.sbuf else "vector"
    eng = check.engine(engine, ("tensor", "vector"), default)
    data = check.engine_operand("data", data, eng)
    dst = check.engine_operand("dst", dst, eng, write=True)
    p, f = data.partitions, data.elems_per_partition
    limit = 128 if eng == "tensor" else tg.vector_transpose_max
    if p > limit or f > limit:
        check.fail("data shape", f"must be at most [{limit}, {limit}] on the {eng} engine", (p, f), limit=limit)
    if dst.partitions != f or dst.elems_per_partition != p:
        check.fail("dst shape", f"must be [{f}, {p}] (data transposed)", (dst.partitions, dst.elems_per_partition))
    v2_pe = eng == "tensor" and not tg.has_transpose_mode
    if dst.dtype != data.dtype and not (v2_pe and dst.dtype == "float32"):
        check.fail("dst dtype", f"must equal data dtype ({data.dtype})", dst.dtype, limit=data.dtype)
    if eng == "tensor":
        _check_bank(check, dst, 1)
    if v2_pe:
        # NeuronCore-v2 transposes with a real matmul against the identity: NaN/Inf spread.
        with np.errstate(all="ignore"):
            out = np.matmul(data._read_f32().reshape(p, f).T, np.eye(p, dtype=np.float32))
        dst._write(out.reshape(dst.shape))
    else:
        dst._write(data._read_raw().reshape(p, f).T.reshape(dst.shape), raw=dst.dtype == data.dtype)
    if eng == "tensor":
        _psum_state_view(dst)[...] = PSUM_MATMUL_WRITTEN
    attrs = {"K": p, "M": f, "N": p, "stationary_dtype": data.dtype, "moving_dtype": data.dtype,
             "is_transpose": True} if eng == "tensor" else {"P": p, "F": f}
    return check.record(eng, [data], [dst], name, **attrs)
