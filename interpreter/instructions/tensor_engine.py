"""Tensor Engine instructions: ``nisa.nc_matmul`` and ``nisa.nc_transpose``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (nc_matmul, nc_transpose),
nki/guides/architecture/trainium_inferentia2_arch.rst ("Tensor Engine", "Near-memory
accumulation in PSUM"), trainium2_arch.rst ("Built-in Transpose Support").
``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]``; inputs in SBUF, output in PSUM,
products accumulated in fp32.

PSUM keeps a per-element state (unwritten / written by a non-matmul instruction / written
by a matmul), so ``accumulate`` is decided element by element, as the 0.6 simulator fix for
overlapping (convolution-style) accumulation requires.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.enums import engine as Engine
from neuron_kernels.interpreter.enums import enum_member
from neuron_kernels.interpreter.enums import matmul_perf_mode as PerfMode
from neuron_kernels.interpreter.instructions._common import OperandChecks
from neuron_kernels.interpreter.storage import (
    PSUM_MATMUL_WRITTEN,
    PSUM_UNWRITTEN,
    PSUM_VALUE_WRITTEN,
    MemoryRegion,
)
from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = ["nc_matmul", "nc_transpose"]

_MATMUL_INPUTS = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32")
_FP32_FAMILY = ("float32", "tfloat32")
_FP8 = ("float8_e4m3", "float8_e5m2", "float8_e4m3fn")


def _check_bank(check: OperandChecks, t: NkiTensor, banks: int) -> None:
    """The PSUM destination must lie within ``banks`` 2 KiB banks of each partition (a PSUM
    allocation starts on a bank boundary)."""
    acc = t._access()
    bank = check.target.psum_bank_bytes
    first, last = acc.byte_lo // bank, (acc.byte_hi - 1) // bank
    if last - first + 1 > banks:
        where = "one PSUM bank" if banks == 1 else f"{banks} PSUM banks"
        check.fail(
            "dst",
            f"must lie within {where} ({bank} B each per partition)",
            f"bytes {acc.byte_lo}..{acc.byte_hi - 1} of the partition",
            limit=banks * bank,
        )


def _tiling(check: OperandChecks, tile_position, tile_size, k: int, m: int):
    """Tensor Engine row/column tiling. [CONFLICT] The parameter list says start_column must
    be 0 and column_size 128, the body of the same docstring describes column tiling; we
    follow the body (column tiles allowed)."""
    if tile_position in ((), None) and tile_size in ((), None):
        return None
    if tile_position in ((), None) or tile_size in ((), None):
        check.fail(
            "tile_position/tile_size",
            "must both be set to enable tiling mode",
            (tile_position, tile_size),
        )
    try:
        row_size, col_size = tile_size
        start_row, start_col = tile_position
    except (TypeError, ValueError):
        check.fail(
            "tile_size/tile_position", "must be 2-tuples of ints", (tile_size, tile_position)
        )
    for arg, v in (
        ("tile_size", row_size),
        ("tile_size", col_size),
        ("tile_position", start_row),
        ("tile_position", start_col),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            check.fail(arg, "must hold ints", v)
    sizes = (32, 64, 128) if check.target.min_pe_tile == 32 else (64, 128)
    for arg, v in (("tile_size row_size", row_size), ("tile_size column_size", col_size)):
        if v not in sizes:
            check.fail(arg, f"must be one of {sizes} on {check.target.name}", v, limit=sizes)
    if start_row % row_size or not 0 <= start_row < 128:
        check.fail(
            "tile_position start_row",
            f"must be a multiple of row_size {row_size} below 128",
            start_row,
            limit=row_size,
        )
    if start_col % col_size or not 0 <= start_col < 128:
        check.fail(
            "tile_position start_column",
            f"must be a multiple of column_size {col_size} below 128",
            start_col,
            limit=col_size,
        )
    if k > row_size:
        check.fail(
            "stationary partition dimension",
            f"must be <= row_size {row_size} in tiling mode",
            k,
            limit=row_size,
        )
    if m > col_size:
        check.fail(
            "stationary free size",
            f"must be <= column_size {col_size} in tiling mode",
            m,
            limit=col_size,
        )
    return (int(row_size), int(col_size), int(start_row), int(start_col))


def _accumulation(check: OperandChecks, dst: NkiTensor, accumulate):
    """Per-element accumulate decision from the PSUM state of ``dst``: ``(mode, mask)`` where mode is
    "overwrite", "accumulate" or "mixed" and mask (mixed only) marks accumulating elements.

    ``None`` accumulates where the location was previously written by a matmul (the docs:
    "first write overwrites, subsequent writes accumulate"); on NeuronCore-v4, which may
    accumulate onto PSUM a memset/tensor_copy initialised, also there. On v2/v3 that is
    UB, so ``None`` starts a new group there (same result for the documented ``nl.zeros``
    + matmul idiom). ``True`` on a location that cannot accumulate is an error (UB on the
    hardware; AWS's simulator only warns).
    """
    if accumulate is False:
        return "overwrite", None
    tg = check.target
    # States are ordered (unwritten < value-written < matmul-written), so one min/max pass
    # decides the common all-or-nothing cases without temporaries.
    need = PSUM_VALUE_WRITTEN if tg.has_psum_value_init_accumulate else PSUM_MATMUL_WRITTEN
    # A tile whose elements all have one state (the common case: whole-tile writes) answers
    # without reading its per-element array.
    uniform = dst._psum_uniform()
    state = dst._psum_state() if uniform is None else None
    lowest = uniform if state is None else int(state.min())
    if lowest >= need:
        return "accumulate", None
    if accumulate:
        why = {
            PSUM_UNWRITTEN: "a PSUM location never written",
            PSUM_VALUE_WRITTEN: f"PSUM initialised by a non-matmul instruction (UB on {tg.name})",
        }[lowest]
        check.fail(
            "accumulate",
            "=True must follow an overwriting matmul on the same PSUM location",
            why,
            hint="use accumulate=(k > 0) or leave accumulate=None",
        )
    if state is None or int(state.max()) < need:
        return "overwrite", None
    return "mixed", state >= need


def _store(dst: NkiTensor, values: np.ndarray, mode: str, mask, raw: bool) -> None:
    """Write (or accumulate in fp32 into) the PSUM destination; one rounding to dst.dtype."""
    arr = dst._array()
    values = values.reshape(dst.shape)
    if mode == "overwrite":
        arr[...] = values if raw else dtypes.convert(values, dst.dtype, dst._storage.precise_fp)
        return
    if dst.dtype == "float32":
        if mode == "accumulate":
            arr += values  # fp32 add into PSUM, rounding once per element
        else:
            arr[...] = np.where(mask, arr + values, values)
        return
    old = arr.astype(np.float32)
    total = old + values if mode == "accumulate" else np.where(mask, old + values, values)
    arr[...] = dtypes.convert(total, dst.dtype, dst._storage.precise_fp)


def _mark_matmul_written(dst: NkiTensor) -> None:
    dst._psum_set(PSUM_MATMUL_WRITTEN)
    dst._storage.written = True


def nc_matmul(
    dst,
    stationary,
    moving,
    is_stationary_onezero=False,
    is_moving_onezero=False,
    is_transpose=False,
    accumulate=None,
    tile_position=(),
    tile_size=(),
    perf_mode=PerfMode.none,
    name=None,
):
    """``dst = stationary.T @ moving`` on the Tensor Engine, accumulating in fp32 PSUM.

    Raises:
        NkiValidationError: on any documented buffer, shape, dtype or mode limit.
    """
    check = OperandChecks("nisa.nc_matmul")
    tg = check.target
    stationary = check.engine_operand("stationary", stationary, "tensor")
    moving = check.engine_operand("moving", moving, "tensor")
    dst = check.engine_operand("dst", dst, "tensor", write=True)
    is_transpose = check.flag("is_transpose", is_transpose)
    check.flag("is_stationary_onezero", is_stationary_onezero)
    check.flag("is_moving_onezero", is_moving_onezero)
    if accumulate is not None:
        accumulate = check.flag("accumulate", accumulate)
    member = enum_member(PerfMode, perf_mode)
    if member is None:
        check.fail(
            "perf_mode",
            "must be an nisa.matmul_perf_mode member or its str value (as nki-library's "
            "qkv_cte passes)",
            repr(perf_mode),
        )
    perf_mode = member
    double_row = perf_mode is PerfMode.double_row

    # dtypes
    allowed_in = _MATMUL_INPUTS + (("float8_e4m3fn",) if tg.has_fp8_e4m3fn else ())
    for arg, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in allowed_in:
            check.fail(
                f"{arg} dtype",
                f"must be one of {', '.join(allowed_in)} on {tg.name}",
                t.dtype,
                limit=allowed_in,
            )
    s_dt, m_dt = stationary.dtype, moving.dtype
    if (s_dt in _FP32_FAMILY) != (m_dt in _FP32_FAMILY):
        check.fail(
            "moving dtype",
            f"must be float32/tfloat32 when stationary is {s_dt} (and vice versa)",
            m_dt,
        )
    if {s_dt, m_dt} == {"float8_e4m3", "float8_e4m3fn"}:
        check.fail("moving dtype", "must not mix legacy float8_e4m3 with OCP float8_e4m3fn", m_dt)

    # shapes
    k = stationary.partitions
    if moving.partitions != k:
        check.fail(
            "moving partition dimension",
            f"must equal stationary's ({k})",
            moving.partitions,
            limit=k,
        )
    if double_row:
        if not tg.has_double_row:
            check.fail("perf_mode", "double_row needs NeuronCore-v3 or newer", tg.name)
        if s_dt not in _FP8 or m_dt not in _FP8:
            check.fail("perf_mode", "double_row needs float8 stationary and moving", (s_dt, m_dt))
        if is_transpose:
            check.fail(
                "perf_mode",
                "double_row cannot be combined with transpose mode",
                "is_transpose=True",
            )
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
        check.fail(
            "stationary free size",
            f"must be <= {tg.gemm_stationary_fmax}",
            m,
            limit=tg.gemm_stationary_fmax,
        )

    # Transpose mode (v3+): stationary is the tile, moving the [K, K] identity; bit-accurate.
    # On v2 is_transpose only labels an ordinary matmul for the profiler.
    transpose_mode = is_transpose and tg.has_transpose_mode
    if transpose_mode and n != k:
        check.fail(
            "moving free size", f"must be {k} (the [K, K] identity) in transpose mode", n, limit=k
        )

    # destination dtype and size
    normal_dst = dst.dtype == "float32" or (
        dst.dtype == "bfloat16" and tg.matmul_moving_fmax_bf16_dst
    )
    if dst.dtype == "float32":
        n_max = tg.matmul_moving_fmax_fp32_dst
    elif normal_dst:
        n_max = tg.matmul_moving_fmax_bf16_dst
    elif transpose_mode and dst.dtype == s_dt:
        n_max = tg.matmul_moving_fmax_fp32_dst
    else:
        allowed = ["float32"] + (["bfloat16"] if tg.matmul_moving_fmax_bf16_dst else [])
        if transpose_mode:
            allowed.append(f"{s_dt} (transpose mode)")
        check.fail("dst dtype", f"must be one of {allowed} on {tg.name}", dst.dtype, limit=allowed)
    if n > n_max:
        check.fail(
            "moving free size", f"must be <= {n_max} on {tg.name} ({dst.dtype} dst)", n, limit=n_max
        )
    if dst.partitions != m:
        check.fail(
            "dst partition dimension",
            f"must equal the stationary free size ({m})",
            dst.partitions,
            limit=m,
        )
    if dst.elems_per_partition != n:
        check.fail(
            "dst elements per partition",
            f"must equal the moving free size ({n})",
            dst.elems_per_partition,
            limit=n,
        )
    if dst.itemsize != dst._storage.itemsize:
        check.fail("dst", "must not reinterpret PSUM storage to another element size", dst.dtype)
    # One bank on v2/v3 ("each nc_matmul can only write to a single PSUM bank"); on v4 the
    # banks the row needs, up to all 8.
    banks = max(1, -(-n * dst.itemsize // tg.psum_bank_bytes)) if tg.nc_version >= 4 else 1
    _check_bank(check, dst, banks)

    # accumulation
    dst._psum_uniform()  # (refuses a view reinterpreted to another element size)
    if transpose_mode and accumulate is not True:
        mode, mask = "overwrite", None  # a transpose is a copy; nc_transpose never accumulates
    else:
        if transpose_mode and not normal_dst:
            check.fail(
                "accumulate",
                f"must not be True with a {dst.dtype} dst: PSUM accumulates "
                "into float32 (or bfloat16 on NeuronCore-v4) tiles",
                True,
            )
        mode, mask = _accumulation(check, dst, accumulate)

    # math
    if check.compute:
        if transpose_mode:
            ident = moving._read_f32().reshape(k, k)
            if not np.array_equal(ident, np.eye(k, dtype=np.float32)):
                check.fail(
                    "moving", "must be the identity matrix in transpose mode", "a non-identity tile"
                )
            raw = stationary._read_raw().reshape(k, m).T
            if dst.dtype == s_dt:
                _store(dst, raw, mode, mask, raw=True)
            else:  # every matmul input dtype widens to fp32 exactly
                _store(dst, raw.astype(np.float32), mode, mask, raw=False)
        else:
            rows = k * 2 if double_row else k
            a = stationary._view_f32().reshape(rows, m)
            b = moving._view_f32().reshape(rows, n)
            with np.errstate(all="ignore"):
                result = np.matmul(a.T, b)
            _store(dst, result, mode, mask, raw=False)
    _mark_matmul_written(dst)
    return check.record(
        "tensor",
        [stationary, moving],
        [dst],
        name,
        K=k * (2 if double_row else 1),
        M=m,
        N=n,
        stationary_dtype=s_dt,
        moving_dtype=m_dt,
        is_transpose=is_transpose,
        perf_mode=perf_mode.value,
        tiling=tiling,
        accumulate=mode,
        is_stationary_onezero=bool(is_stationary_onezero),
        is_moving_onezero=bool(is_moving_onezero),
    )


def nc_transpose(dst, data, engine=Engine.unknown, name=None):
    """2-D transpose between the partition axis and the (flattened) free axis.

    Tensor Engine: SBUF -> PSUM, up to [128, 128]. Vector Engine: SBUF/PSUM, up to [32, 32].
    [CONFLICT] ``engine=unknown`` picks by buffers (0.4 release notes: "by destination
    buffer"), not by input shape (API text): TensorE for SBUF -> PSUM, else VectorE.
    """
    check = OperandChecks("nisa.nc_transpose")
    tg = check.target
    dst = check.tensor("dst", dst)
    data = check.tensor("data", data)
    to_psum = dst.buffer is MemoryRegion.psum and data.buffer is MemoryRegion.sbuf
    default = "tensor" if to_psum else "vector"
    eng = check.engine(engine, ("tensor", "vector"), default)
    data = check.engine_operand("data", data, eng)
    dst = check.engine_operand("dst", dst, eng, write=True)
    p, f = data.partitions, data.elems_per_partition
    limit = 128 if eng == "tensor" else tg.vector_transpose_max
    if p > limit or f > limit:
        check.fail(
            "data shape",
            f"must be at most [{limit}, {limit}] on the {eng} engine",
            (p, f),
            limit=limit,
        )
    if dst.partitions != f or dst.elems_per_partition != p:
        check.fail(
            "dst shape",
            f"must be [{f}, {p}] (data transposed)",
            (dst.partitions, dst.elems_per_partition),
        )
    # [CONFLICT] The API says dst.dtype == data.dtype; on NeuronCore-v2 the PE transpose is an
    # fp32 matmul (nki-library uses fp32 PSUM there), so fp32 dst is also accepted on v2.
    v2_pe = eng == "tensor" and not tg.has_transpose_mode
    if dst.dtype != data.dtype and not (v2_pe and dst.dtype == "float32"):
        check.fail(
            "dst dtype", f"must equal data dtype ({data.dtype})", dst.dtype, limit=data.dtype
        )
    if eng == "tensor":
        _check_bank(check, dst, 1)
    if check.compute:
        if v2_pe:
            # NeuronCore-v2 transposes with a real matmul against the identity: NaN/Inf spread.
            with np.errstate(all="ignore"):
                out = np.matmul(data._read_f32().reshape(p, f).T, np.eye(p, dtype=np.float32))
            values, raw = out, False
        else:
            values, raw = data._read_raw().reshape(p, f).T, True
        if eng == "tensor":
            _store(dst, values, "overwrite", None, raw=raw)
        else:
            dst._write(values.reshape(dst.shape), raw=raw)
    if eng == "tensor":
        _mark_matmul_written(dst)
    elif not check.compute:
        dst._write(None)  # marks PSUM state / written flag only
    attrs = (
        {
            "K": p,
            "M": f,
            "N": p,
            "stationary_dtype": data.dtype,
            "moving_dtype": data.dtype,
            "is_transpose": True,
        }
        if eng == "tensor"
        else {"P": p, "F": f}
    )
    return check.record(eng, [data], [dst], name, **attrs)
