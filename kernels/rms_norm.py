"""RMSNorm forward ``y = x / sqrt(mean(x^2) + eps) * (offset + w)`` over the last dim, and
its op declarations.

Rows sit on the partitions (128 per tile, optionally several rows per partition so that
small rows still make large DMAs), the hidden dim H on the free axis: the statistics are
then per-partition free-axis reductions. Per row tile the kernel squares and sums on the
Scalar Engine (``activation`` with its add-reduction) or on the Vector Engine
(``bn_stats``/``bn_aggr``), takes ``rsqrt(sum * 1/H + eps)`` on the Scalar Engine with eps
as the bias (the documented valid input of ``rsqrt`` is [2^-87, 2^97]:
nki/api/nki.api.shared.rst, activation functions; the bias keeps a zero row in range),
normalizes with the per-row column and multiplies by the weight, which is broadcast once
to all partitions and stays resident in SBUF. When a whole row tile does not fit beside
the weight, the kernel runs two passes over H (sum of squares chunk by chunk, then
normalize chunk by chunk), re-reading x.

The forward kernel also writes the per-row reciprocal RMS (fp32) that the backward
(:mod:`neuron_kernels.kernels.rms_norm_bwd`) reads. Three ops share this math:

- ``rms_norm(x, weight, eps, offset, casting_mode) -> y``: the public op, composite over
  ``rms_norm_fwd`` (as torch's ``rms_norm`` is over ``_fused_rms_norm``), so autograd saves
  the rstd the forward kernel produced without the public op returning it;
- ``rms_norm_fwd(...) -> (y, rstd)``: the kernel's op, whose autograd calls
  ``rms_norm_bwd``.

Casting modes follow Liger-Kernel: ``llama`` computes in fp32 and casts the normalized x
to the input dtype before multiplying by ``offset + w`` (in w's dtype); ``gemma`` keeps
everything, ``offset + w`` included, in fp32 and casts once; ``none`` keeps every
intermediate (rstd, the normalized x, the product) in the input dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.spec import (
    DTYPES,
    ITEMSIZE,
    OpSpec,
    Tolerance,
    TunableConfig,
    ceil_div,
    dtype_name,
    register,
    runner_lnc,
    tunable,
)
from neuron_kernels.kernels.tiling import core_share, tiled

__all__ = [
    "CASTING_MODES",
    "FWD_SPEC",
    "RSQRT_MIN_INPUT",
    "MIN_EPS",
    "SPEC",
    "RmsNormConfig",
    "RmsNormFwdPlan",
    "RmsNormPlan",
    "rms_norm_fwd_kernel",
    "largest_h",
    "plan",
    "reference",
    "rows_plan",
    "reference_fwd",
]

OP = "rms_norm"
OP_FWD = "rms_norm_fwd"
CASTING_MODES = ("llama", "gemma", "none")
# The smallest input of the rsqrt activation (nki/api/nki.api.shared.rst, activation
# function table: rsqrt is valid on [2^-87, 2^97]). eps enters through the bias, so
# eps >= this keeps every row, a zero row included, inside the valid range.
RSQRT_MIN_INPUT = 2.0**-87
# Overflowing rows (issue 32 item 8). fp32 holds mean squares up to FP32_MAX (~2^128), but
# rsqrt's valid input stops at 2^97 and gives an invalid (NaN) output above it, so the mean
# square is scaled by RSQRT_PRESCALE (exact: a power of two) into [.., 2^96] and rstd by
# RSTD_RESCALE = sqrt(RSQRT_PRESCALE) back: every finite mean square gets its true rstd.
# A row whose sum of squares overflows fp32 (|x| >~ 1e19) gets rstd = 0, so y = 0 (NaN where
# x is inf): torch's result, which the reference mode and torch.nn.RMSNorm give, chosen over
# the mathematically right +-w (that needs a per-row max pass over H on every call, for
# inputs whose squares fp32 cannot hold). The bias eps * RSQRT_PRESCALE must stay in range,
# so eps >= MIN_EPS.
FP32_MAX = 3.4028234663852886e38
RSQRT_PRESCALE = 2.0**-32
RSTD_RESCALE = 2.0**-16
MIN_EPS = RSQRT_MIN_INPUT / RSQRT_PRESCALE  # 2^-55


@dataclass(frozen=True)
class RmsNormConfig(TunableConfig):
    """Tile-level choices of the RMSNorm kernels (forward; the backward has its own).

    Attributes:
        rows_per_partition: rows each partition holds per tile (a tile is 128 x this many
            rows): more rows per DMA when H is small.
        h_chunk: free-dim elements per compute instruction (and per DMA in two-pass mode).
        weight_broadcast: how w reaches all 128 partitions: "dma" (one stride-0 DMA from
            HBM per chunk, 128x w's bytes moved once) or "tensor" (a [1, H] row loaded once
            and broadcast by a K=1 TensorE matmul with a ones row, through PSUM).
        statistics: how the row's sum of squares and rsqrt are taken: "scalar" (ScalarE
            activation(square) with its add-reduction, then ScalarE rsqrt with eps as the
            bias), "scalar_gpsimd" (the same sum, then eps added on VectorE and GpSimd's
            tensor_scalar rsqrt, the docs' higher-precision path, which spares ScalarE an
            activation-table switch per row tile) or "vector" (VectorE bn_stats/bn_aggr,
            mean(x^2) = var + mean^2, then GpSimd's rsqrt).
        normalize: engines of ``x * rstd`` and of the weight multiply: "vector" (both on
            VectorE; tensor_scalar runs 4x in 2-byte perf mode), "scalar" (x * rstd as
            ScalarE activation(copy, scale=rstd)) or "vector_gpsimd" (x * rstd on VectorE,
            the weight multiply alternating VectorE / GpSimd chunk by chunk); gemma fuses
            both into one VectorE scalar_tensor_tensor (two instructions on GpSimd chunks).
    """

    op_name = OP

    rows_per_partition: int = tunable(
        1, (1, 4), "modeled: at H >= 1024 one row per partition already moves >= 2 KiB per DMA row"
    )
    h_chunk: int = tunable(
        512,
        (512, 2048),
        "modeled: with the statistics/normalize defaults, 75% of the DMA floor at [4096, 4096] "
        "bf16 vs 58% for 2048 (512-wide chunks alternate between VectorE and GpSimd)",
    )
    weight_broadcast: str = tunable(
        "dma",
        ("dma", "tensor"),
        "modeled: one broadcast DMA per kernel costs less than the PE path's PSUM copies",
    )
    statistics: str = tunable(
        "scalar_gpsimd",
        ("scalar", "scalar_gpsimd", "vector"),
        "modeled: with normalize vector_gpsimd, 75% / 92% of the DMA floor at [4096, 4096] / "
        "[16384, 8192] bf16 vs 63% / 86% for scalar; no slower in any casting mode or dtype "
        "(llama, gemma, none x bf16, fp32 at four shapes)",
    )
    normalize: str = tunable(
        "vector_gpsimd",
        ("vector", "scalar", "vector_gpsimd"),
        "modeled: 75% of the DMA floor at [4096, 4096] bf16 vs 55% for vector (VectorE binds)",
    )


# -- the tile plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class RmsNormPlan(nl.NKIObject):
    """What the RMSNorm forward and backward plans share: row tiles (split over the
    launch's cores), chunks over H, passes, the resident weight and the budgets. Built by
    :func:`rows_plan` only; each direction's plan adds its own choices."""

    rows: int
    h: int
    casting_mode: str  # "llama", "gemma" or "none"
    pmax: int  # partitions per row tile
    rows_per_partition: int  # rows per partition in full tiles (remainder tiles use 1)
    h_chunk: int  # free elements per instruction
    n_chunks: int
    two_pass: bool  # x re-read from HBM chunk by chunk (the row tile does not fit)
    weight_broadcast: str  # "dma" or "tensor"
    weight_fp32: bool  # the resident (offset + w) is fp32 (gemma, backward) or w's dtype
    matmul_fmax: int  # moving free size of one nc_matmul (PE broadcast / dw reduction)
    bn_fmax: int  # free size of one bn_stats
    lnc: int  # physical cores of the launch (kernel[lnc])
    core_tiles: tuple  # per core, its row tiles ((first row, partitions, rows per partition), ...)
    sbuf_bytes: int  # peak SBUF bytes per partition
    psum_banks: int  # PSUM banks held at once


@dataclass(frozen=True)
class RmsNormFwdPlan(RmsNormPlan):
    """The forward's plan: how the statistics and the normalization run."""

    statistics: str  # "scalar", "scalar_gpsimd" or "vector"
    normalize: str  # "vector", "scalar" or "vector_gpsimd"


def _row_tiles(rows: int, pmax: int, per_partition: int) -> list:
    """(first row, partitions, rows per partition) of every row tile: full tiles of
    ``pmax * per_partition`` rows, then the remainder in tiles of up to ``pmax`` rows."""
    tiles, r0 = [], 0
    full = pmax * per_partition
    while rows - r0 >= full:
        tiles.append((r0, pmax, per_partition))
        r0 += full
    while r0 < rows:
        p = min(pmax, rows - r0)
        tiles.append((r0, p, 1))
        r0 += p
    return tiles


def rows_plan(plan_type, problem, config, target, lnc, **fields) -> RmsNormPlan:
    """A ``plan_type`` (an :class:`RmsNormPlan`) with the shared fields derived here once:
    sizes, chunks, target limits and the row tiles, split over ``lnc`` cores by rows (each
    row's work is independent; the cores' row counts differ by at most one tile).
    ``fields`` are the direction's own and the budget fields."""
    rows, h = problem["rows"], problem["h"]
    chunk = min(config.h_chunk, h)  # choices are multiples of bn_stats_fmax (512)
    tiles = _row_tiles(rows, target.pmax, config.rows_per_partition)
    costs = [p * g for _, p, g in tiles]
    return plan_type(
        rows=rows,
        h=h,
        casting_mode=problem.get("casting_mode", "llama"),
        pmax=target.pmax,
        rows_per_partition=config.rows_per_partition,
        h_chunk=chunk,
        n_chunks=ceil_div(h, chunk),
        weight_broadcast=config.weight_broadcast,
        matmul_fmax=target.gemm_moving_fmax,
        bn_fmax=target.bn_stats_fmax,
        lnc=lnc,
        core_tiles=tuple(tuple(core_share(tiles, costs, c, lnc)) for c in range(lnc)),
        **fields,
    )


def _weight_bytes(h: int, chunk: int, item: int, w_item: int, config) -> int:
    """SBUF per partition of the resident (offset + w) and its staging."""
    staged = chunk * item if config.weight_broadcast == "dma" else 2 * chunk * item
    return h * w_item + staged


def plan(
    problem: dict, dtype: str, config: RmsNormConfig, target: Target, lnc: int = 1
) -> RmsNormFwdPlan:
    """The forward tile plan of ``config`` for ``problem`` in ``dtype`` on ``target``, the
    rows split over ``lnc`` cores.

    One pass when a row tile (x and y, ``rows_per_partition`` rows each) fits beside the
    resident weight, else two passes over H with ``h_chunk``-wide tiles. The largest H
    is what the resident weight leaves of the usable SBUF (see :func:`largest_h`).
    """
    h, mode = problem["h"], problem.get("casting_mode", "llama")
    item = ITEMSIZE[dtype]
    w_item = 4 if mode == "gemma" else item
    chunk = min(config.h_chunk, h)
    g = config.rows_per_partition
    stats = g * 6 * ceil_div(h, target.bn_stats_fmax) if config.statistics == "vector" else g
    small = 4 * (stats + 4 * g + 2)  # statistics, rstd columns, eps
    resident = _weight_bytes(h, chunk, item, w_item, config) + small
    one_pass = resident + 2 * g * h * item  # x tile and y tile
    two_pass = one_pass > target.sbuf_usable_bytes
    return rows_plan(
        RmsNormFwdPlan,
        problem,
        config,
        target,
        lnc,
        two_pass=two_pass,
        weight_fp32=w_item == 4,
        statistics=config.statistics,
        normalize=config.normalize,
        sbuf_bytes=resident + 2 * g * chunk * item if two_pass else one_pass,
        psum_banks=1 if config.weight_broadcast == "tensor" else 0,
    )


def largest_h(spec: OpSpec, dtype: str, casting_mode: str, target, config=None) -> int:
    """The largest H ``spec``'s plan fits in the target's usable SBUF (binary search on the
    plan's own budget, so the answer follows the plan and ``hardware.py``, never a copy)."""
    config = config if config is not None else spec.config.default()
    lo, hi = 1, 1 << 22
    while lo < hi:
        mid = (lo + hi + 1) // 2
        problem = {"rows": 128, "h": mid, "casting_mode": casting_mode}
        if spec.is_valid(problem, dtype, config, target):
            lo = mid
        else:
            hi = mid - 1
    return lo


# -- the NKI kernel ----------------------------------------------------------------------


def _load_weight(w, offset, plan, p_all, dtype):
    """(offset + w) broadcast to ``p_all`` partitions, resident in SBUF: fp32 for gemma,
    w's dtype otherwise (the sum rounds once, as torch's ``offset + w`` does)."""
    h, chunk = plan.h, plan.h_chunk
    w_dtype = nl.float32 if plan.weight_fp32 else dtype
    w_eff = nl.ndarray((p_all, h), dtype=w_dtype, buffer=nl.sbuf, name="w_eff")
    w_row = w.reshape((1, h))
    if plan.weight_broadcast == "tensor":
        ones = nl.ndarray((1, p_all), dtype=dtype, buffer=nl.sbuf, name="ones_row")
        nisa.memset(dst=ones, value=1.0)
    for c0, cs in tiled(h, chunk):
        if plan.weight_broadcast == "dma":
            staged = nl.ndarray((p_all, cs), dtype=dtype, buffer=nl.sbuf, name="w_staged")
            nisa.dma_copy(dst=staged, src=w_row[0:1, c0 : c0 + cs].broadcast(0, p_all))
            nisa.tensor_scalar(
                dst=w_eff[0:p_all, c0 : c0 + cs], data=staged, op0=nl.add, operand0=offset
            )
        else:
            row = nl.ndarray((1, cs), dtype=dtype, buffer=nl.sbuf, name="w_row")
            nisa.dma_copy(dst=row, src=w_row[0:1, c0 : c0 + cs])
            for m0, ms in tiled(cs, plan.matmul_fmax):
                bc = nl.ndarray((p_all, ms), dtype=nl.float32, buffer=nl.psum, name="w_bcast")
                nisa.nc_matmul(dst=bc, stationary=ones, moving=row[0:1, m0 : m0 + ms])
                nisa.tensor_scalar(
                    dst=w_eff[0:p_all, c0 + m0 : c0 + m0 + ms],
                    data=bc,
                    op0=nl.add,
                    operand0=offset,
                )
    return w_eff


def _sum_squares(x_chunk, stats, j, c0, first, last, plan, junk):
    """Add the squares of ``x_chunk`` [p, cs] (columns ``c0:`` of row ``j``) into the row's
    statistics: a ScalarE register chain over the chunks, read out at the last one, or
    VectorE bn_stats into one 6-value slot per ``bn_fmax`` elements."""
    p, cs = x_chunk.shape
    if plan.statistics != "vector":
        nisa.activation(
            dst=junk,
            op=nl.square,
            data=x_chunk,
            reduce_op=nl.add,
            reduce_res=stats[0:p, j : j + 1] if last else None,
            reduce_cmd=nisa.reduce_cmd.reset_reduce if first else nisa.reduce_cmd.reduce,
        )
    else:
        for b0, bs in tiled(cs, plan.bn_fmax):
            slot = (c0 + b0) // plan.bn_fmax * 6
            nisa.bn_stats(dst=stats[0:p, j, slot : slot + 6], data=x_chunk[0:p, b0 : b0 + bs])


def _rstd(stats, eps_col, eps, plan, p, g, dtype):
    """[p, g] fp32 rstd from the per-row statistics, rsqrt(sum/H + eps) with eps as the
    bias, and the [p, g] fp32 factor that scales x (rstd rounded to x's dtype in "none")."""
    rstd = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="rstd")
    finite = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="finite_ms")
    if plan.statistics == "scalar":
        # eps_col holds eps * RSQRT_PRESCALE (see forward)
        nisa.tensor_scalar(dst=finite, data=stats, op0=nl.less_equal, operand0=FP32_MAX)
        safe = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="sumsq_finite")
        nisa.tensor_scalar(dst=safe, data=stats, op0=nl.minimum, operand0=FP32_MAX)
        nisa.activation(
            dst=rstd,
            op=nl.rsqrt,
            data=safe,
            bias=eps_col[0:p, 0:1],
            scale=RSQRT_PRESCALE / plan.h,
        )
    elif plan.statistics == "scalar_gpsimd":
        ms = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="mean_sq")
        nisa.tensor_scalar(
            dst=ms, data=stats, op0=nl.multiply, operand0=1.0 / plan.h, op1=nl.add, operand1=eps
        )
        nisa.tensor_scalar(dst=finite, data=ms, op0=nl.less_equal, operand0=FP32_MAX)
        nisa.tensor_scalar(
            dst=ms, data=ms, op0=nl.minimum, operand0=FP32_MAX, op1=nl.multiply,
            operand1=RSQRT_PRESCALE,
        )  # fmt: skip
        nisa.tensor_scalar(
            dst=rstd, data=ms, op0=nl.rsqrt, operand0=None, engine=nisa.engine.gpsimd
        )
    else:
        n_slots = (plan.h + plan.bn_fmax - 1) // plan.bn_fmax
        mean_var = nl.ndarray((p, g, 2), dtype=nl.float32, buffer=nl.sbuf, name="mean_var")
        for j in range(g):
            nisa.bn_aggr(dst=mean_var[0:p, j, 0:2], data=stats[0:p, j, 0 : n_slots * 6])
        # mean(x^2) = mean^2 + var, per row
        ms = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="mean_sq")
        mean, var = mean_var[0:p, 0:g, 0], mean_var[0:p, 0:g, 1]
        nisa.tensor_tensor(dst=ms, data1=mean, data2=mean, op=nl.multiply)
        nisa.tensor_scalar(dst=ms, data=ms, op0=nl.add, operand0=eps)
        nisa.tensor_tensor(dst=ms, data1=ms, data2=var, op=nl.add)
        # A row holding an inf has var NaN here (inf - inf): its whole row is NaN, not only
        # the inf's position as in torch (a documented limit of this statistics path).
        nisa.tensor_scalar(dst=finite, data=ms, op0=nl.less_equal, operand0=FP32_MAX)
        nisa.tensor_scalar(
            dst=ms, data=ms, op0=nl.minimum, operand0=FP32_MAX, op1=nl.multiply,
            operand1=RSQRT_PRESCALE,
        )  # fmt: skip
        nisa.tensor_scalar(
            dst=rstd, data=ms, op0=nl.rsqrt, operand0=None, engine=nisa.engine.gpsimd
        )
    # rstd = rsqrt(ms * 2^-32) * 2^-16, and 0 where the mean square overflowed fp32
    nisa.scalar_tensor_tensor(
        dst=rstd, data=rstd, op0=nl.multiply, operand0=RSTD_RESCALE, op1=nl.multiply,
        operand1=finite,
    )  # fmt: skip
    if plan.casting_mode != "none":
        return rstd, rstd
    # Casting mode "none": rstd rounds to the input dtype before it scales x; the saved
    # rstd stays fp32.
    low = nl.ndarray((p, g), dtype=dtype, buffer=nl.sbuf, name="rstd_low")
    nisa.tensor_copy(dst=low, src=rstd)
    scale = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="rstd_scale")
    nisa.tensor_copy(dst=scale, src=low)
    return rstd, scale


def _normalize(y_chunk, x_chunk, rstd_col, w_chunk, plan, chunk_index):
    """``y_chunk = cast(x * rstd) * w`` (llama, none) or ``cast(x * rstd * w)`` (gemma).
    With "vector_gpsimd", odd ``chunk_index``es multiply by w on GpSimd (not gemma: GpSimd
    has no scalar_tensor_tensor, and two instructions would round twice)."""
    on_gpsimd = plan.normalize == "vector_gpsimd" and chunk_index % 2 == 1
    if plan.casting_mode == "gemma":  # one fused VectorE instruction: one rounding
        nisa.scalar_tensor_tensor(
            dst=y_chunk,
            data=x_chunk,
            op0=nl.multiply,
            operand0=rstd_col,
            op1=nl.multiply,
            operand1=w_chunk,
        )
        return
    if plan.normalize == "scalar":
        nisa.activation(dst=y_chunk, op=nl.copy, data=x_chunk, scale=rstd_col)
    else:
        nisa.tensor_scalar(dst=y_chunk, data=x_chunk, op0=nl.multiply, operand0=rstd_col)
    engine = nisa.engine.gpsimd if on_gpsimd else nisa.engine.vector
    nisa.tensor_tensor(dst=y_chunk, data1=y_chunk, data2=w_chunk, op=nl.multiply, engine=engine)


@nki.jit
def rms_norm_fwd_kernel(x, w, plan, eps, offset):
    """RMSNorm of ``x [N, H]`` with weight ``w [H]`` (same dtype) in HBM.

    Returns ``y [N, H]`` (x's dtype) and ``rstd [N]`` (fp32, 1/sqrt(mean(x^2) + eps)).
    ``plan`` is the :class:`RmsNormFwdPlan`; ``eps`` and ``offset`` are compile-time floats.
    Launched as ``rms_norm_fwd_kernel[plan.lnc]``: each physical core normalizes its own row tiles
    (``plan.core_tiles[nl.program_id(0)]``) and writes only their rows of y and rstd.
    """
    n, h = x.shape
    assert (n, h) == (plan.rows, plan.h), "rms_norm: the plan was made for other shapes"
    assert nl.num_programs(0) == plan.lnc, "rms_norm: launch rms_norm_fwd_kernel[plan.lnc]"
    y = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm, name="y")
    rstd_out = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm, name="rstd")
    my_tiles = plan.core_tiles[nl.program_id(0)]
    if len(my_tiles) == 0:  # fewer row tiles than cores: this core has nothing to do
        return y, rstd_out
    p_all = min(plan.pmax, n)
    chunks = tiled(h, plan.h_chunk)
    n_chunks = len(chunks)
    w_eff = _load_weight(w, offset, plan, p_all, x.dtype)
    eps_col = nl.ndarray((p_all, 1), dtype=nl.float32, buffer=nl.sbuf, name="eps")
    nisa.memset(dst=eps_col, value=eps * RSQRT_PRESCALE)  # the scaled bias of _rstd
    slots = (h + plan.bn_fmax - 1) // plan.bn_fmax * 6

    for t, (r0, p, g) in enumerate(my_tiles):
        rows = x[r0 : r0 + p * g, 0:h].reshape((p, g, h))
        y_rows = y[r0 : r0 + p * g, 0:h].reshape((p, g, h))
        if plan.statistics != "vector":
            stats = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="sumsq")
        else:
            stats = nl.ndarray((p, g, slots), dtype=nl.float32, buffer=nl.sbuf, name="bn")
        # One pass: the row tile is resident and every chunk is a view of it; two passes:
        # each chunk is loaded (twice: for the statistics, then to normalize).
        if not plan.two_pass:
            xt = nl.ndarray((p, g, h), dtype=x.dtype, buffer=nl.sbuf, name="x_tile")
            yt = nl.ndarray((p, g, h), dtype=x.dtype, buffer=nl.sbuf, name="y_tile")
            nisa.dma_copy(dst=xt, src=rows)
        for j in range(g):
            for c, (c0, cs) in enumerate(chunks):
                if plan.two_pass:
                    xc = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="x_chunk")
                    nisa.dma_copy(dst=xc, src=rows[0:p, j, c0 : c0 + cs])
                    junk = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="sq_junk")
                else:
                    xc, junk = xt[0:p, j, c0 : c0 + cs], yt[0:p, j, c0 : c0 + cs]
                _sum_squares(xc, stats, j, c0, c == 0, c == n_chunks - 1, plan, junk)
        rstd, scale = _rstd(stats, eps_col, eps, plan, p, g, x.dtype)
        for j in range(g):
            for c, (c0, cs) in enumerate(chunks):
                if plan.two_pass:
                    xc = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="x_chunk")
                    nisa.dma_copy(dst=xc, src=rows[0:p, j, c0 : c0 + cs])
                    yc = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="y_chunk")
                else:
                    xc, yc = xt[0:p, j, c0 : c0 + cs], yt[0:p, j, c0 : c0 + cs]
                _normalize(
                    yc,
                    xc,
                    scale[0:p, j : j + 1],
                    w_eff[0:p, c0 : c0 + cs],
                    plan,
                    (t * g + j) * n_chunks + c,
                )
                if plan.two_pass:
                    nisa.dma_copy(dst=y_rows[0:p, j, c0 : c0 + cs], src=yc)
        if not plan.two_pass:
            nisa.dma_copy(dst=y_rows, src=yt)
        nisa.dma_copy(dst=rstd_out[r0 : r0 + p * g].reshape((p, g)), src=rstd)
    return y, rstd_out


# -- op-level glue: shapes, limits, reference -------------------------------------------------


def validate_common(op: str, x, weight, offset, casting_mode) -> None:
    """The checks every RMSNorm op shares: x and weight tensors, [H] weight, dtypes,
    devices, offset and casting mode."""
    for arg, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(op, arg, "must be a torch.Tensor", type(t).__name__)
    if x.dim() < 1:
        raise LimitError(op, "x rank", "must be >= 1 ([..., H])", x.dim(), limit=1)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise LimitError(op, "weight shape", f"must be [H] = [{x.shape[-1]}]", list(weight.shape))
    if dtype_name(x) not in DTYPES:
        raise LimitError(op, "x dtype", f"must be one of {DTYPES}", dtype_name(x), limit=DTYPES)
    if weight.dtype != x.dtype:
        raise LimitError(
            op, "weight dtype", f"must equal x's dtype ({dtype_name(x)})", dtype_name(weight)
        )
    if weight.device != x.device:
        raise LimitError(
            op, "weight device", f"must equal x's device ({x.device})", str(weight.device)
        )
    if (
        isinstance(offset, bool)
        or not isinstance(offset, (int, float))
        or not math.isfinite(offset)
    ):
        raise LimitError(op, "offset", "must be a finite float", repr(offset))
    if casting_mode not in CASTING_MODES:
        raise LimitError(
            op,
            "casting_mode",
            f"must be one of {CASTING_MODES}",
            repr(casting_mode),
            limit=CASTING_MODES,
        )


def validate(x, weight, eps=1e-6, offset=0.0, casting_mode="llama", op=OP) -> None:
    """Refuse bad op input before any work."""
    validate_common(op, x, weight, offset, casting_mode)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps):
        raise LimitError(op, "eps", "must be a finite float", repr(eps))
    if eps < MIN_EPS:
        raise LimitError(
            op,
            "eps",
            "must be >= 2**-55 (eps * 2**-32 must be >= 2**-87, the rsqrt activation's "
            "smallest valid input, so that a zero row stays in range)",
            eps,
            limit=MIN_EPS,
        )


def validate_fwd(x, weight, eps=1e-6, offset=0.0, casting_mode="llama") -> None:
    validate(x, weight, eps, offset, casting_mode, op=OP_FWD)


def problem(x, weight, eps=1e-6, offset=0.0, casting_mode="llama") -> dict:
    return {
        "rows": math.prod(x.shape[:-1]),
        "h": x.shape[-1],
        "casting_mode": casting_mode,
    }


def reference_fwd(x, weight, eps=1e-6, offset=0.0, casting_mode="llama", upcast: bool = True):
    """``(y, rstd)`` in plain torch. ``upcast``: everything in fp64 (the exact math, every
    casting mode alike). Otherwise the casting mode's roundings (Liger-Kernel's llama /
    gemma / none), rstd in fp32; an empty last dim has mean(x^2) = 0."""
    h = x.shape[-1]
    if upcast:
        xf = x.double()
        ms = xf.pow(2).sum(-1, keepdim=True) / max(h, 1)
        rstd = torch.rsqrt(ms + eps)
        return xf * rstd * (offset + weight.double()), rstd.squeeze(-1)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / max(h, 1) + eps)
    if casting_mode == "llama":
        y = (xf * rstd).to(x.dtype) * (offset + weight)
    elif casting_mode == "gemma":
        y = (xf * rstd * (offset + weight.float())).to(x.dtype)
    else:
        y = (x * rstd.to(x.dtype)) * (offset + weight)
    return y, rstd.squeeze(-1)


def reference(x, weight, eps=1e-6, offset=0.0, casting_mode="llama", upcast: bool = True):
    """``y`` in plain torch (see :func:`reference_fwd`)."""
    return reference_fwd(x, weight, eps, offset, casting_mode, upcast=upcast)[0]


# -- launch from torch -----------------------------------------------------------------------


def check_h(spec, problem: dict, dtype: str, config, target, lnc: int = 1):
    """``spec.check`` at launch LNC ``lnc``, with an SBUF refusal said in the caller's terms:
    "H must be <= N for dtype D" (N from :func:`largest_h` at this config), not the plan's
    internal fields."""
    try:
        return spec.check(problem, dtype, config, target, lnc)
    except LimitError as exc:
        if not exc.arg.startswith("SBUF"):
            raise
        most = largest_h(spec, dtype, problem.get("casting_mode", "llama"), target, config)
        raise LimitError(
            spec.name,
            "H (x.shape[-1])",
            f"must be <= {most} for dtype {dtype} ({problem.get('casting_mode', 'llama')} "
            f"casting) on {getattr(target, 'name', target)}: the row tile and the weight "
            "must fit in SBUF",
            problem["h"],
            limit=most,
        ) from None


def _run_forward(x, weight, eps, offset, casting_mode, config, runner, spec):
    *batch, h = x.shape
    rows = math.prod(batch)
    if rows == 0 or h == 0:  # nothing to launch; rstd of an empty row is eps^-1/2, rounded once
        y, rstd = reference_fwd(x, weight, eps, offset, casting_mode, upcast=True)
        return y.to(x.dtype), rstd.float()
    tiles = check_h(
        spec,
        problem(x, weight, eps, offset, casting_mode),
        dtype_name(x),
        config,
        runner.target,
        runner_lnc(runner),
    )
    y, rstd = runner(
        rms_norm_fwd_kernel[tiles.lnc],
        x.reshape(rows, h).contiguous(),
        weight.contiguous(),
        tiles,
        float(eps),
        float(offset),
    )
    return y.reshape(*batch, h), rstd.reshape(batch)


def run_kernels_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
    *,
    config: RmsNormConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of ``x [..., H]`` (batch dims fold into rows): ``(y, rstd [...])``."""
    return _run_forward(x, weight, eps, offset, casting_mode, config, runner, FWD_SPEC)


def run_kernels(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
    *,
    config: RmsNormConfig,
    runner,
) -> torch.Tensor:
    """RMSNorm of ``x [..., H]``: ``y`` (the forward kernel's rstd is dropped)."""
    return _run_forward(x, weight, eps, offset, casting_mode, config, runner, SPEC)[0]


def composite(x, weight, eps=1e-6, offset=0.0, casting_mode="llama"):
    """The public op as torch runs it: the fused forward's y; autograd saves its rstd."""
    return torch.ops.neuron.rms_norm_fwd(x, weight, eps, offset, casting_mode)[0]


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """x ~ N(0, 1), w ~ 1 + N(0, 0.1^2): the magnitudes of a trained model's norm inputs."""
    rows, h = problem["rows"], problem["h"]
    x = torch.randn(rows, h, generator=generator).to(getattr(torch, dtype))
    w = (1.0 + 0.1 * torch.randn(h, generator=generator)).to(getattr(torch, dtype))
    return x, w, 1e-6, problem.get("offset", 0.0), problem.get("casting_mode", "llama")


def _setup_context(ctx, x, weight, eps, offset, casting_mode, output):
    _, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.mark_non_differentiable(rstd)
    ctx.offset, ctx.casting_mode = offset, casting_mode


def _backward(ctx, grad_y, grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = torch.ops.neuron.rms_norm_bwd(
        grad_y.contiguous(), x, weight, rstd, ctx.offset, ctx.casting_mode
    )
    return dx, dw, None, None, None


def _bad_inputs():
    """One bad input per op-boundary limit: (args, the argument the error must name)."""
    f = torch.zeros
    return [
        ((f(2, 4), f(3)), "weight shape"),
        ((f(2, 4), f(4, 1)), "weight shape"),
        ((f(2, 4, dtype=torch.float64), f(4, dtype=torch.float64)), "x dtype"),
        ((f(2, 4), f(4, dtype=torch.bfloat16)), "weight dtype"),
        ((f(2, 4), f(4, device="meta")), "weight device"),
        ((f(2, 4), f(4), -1e-6), "eps"),
        ((f(2, 4), f(4), 1e-6, 0.0, "mistral"), "casting_mode"),
        ((f(2, 4), f(4), 1e-6, float("nan")), "offset"),
    ]


_TOLERANCES = {
    # y = x * rstd * w with |y| ~ 1. fp32: the sum of squares in fp32 (relative ~ sqrt(H) *
    # 2^-24 << 1e-5 for H <= 2^16), rsqrt and two products each rounded once: 2^-20 rtol
    # leaves 8x the few-ulp bound; atol for outputs near 0.
    "float32": Tolerance(1e-5, 2**-20, "fp32 sum of squares, rsqrt, two fp32 roundings"),
    # Low precision: the llama and none modes round the normalized x (and for none rstd)
    # to the input dtype before the weight multiply, then the output rounds again: up to
    # three 0.5-ulp roundings, 2x margin: 3 * 2^-8 for bf16, 3 * 2^-11 for fp16.
    "bfloat16": Tolerance(1e-3, 3 * 2**-8, "up to three bf16 roundings (rstd, x*rstd, y)"),
    "float16": Tolerance(1e-4, 3 * 2**-11, "up to three fp16 roundings (rstd, x*rstd, y)"),
}

_TEST_PROBLEMS = {
    # Hypothesis draws here: rows not multiples of 128, odd H, H = 1.
    "ranges": {"rows": (1, 300), "h": (1, 600)},
    "edges": (1, 3, 127, 128, 129, 257, 511, 513),
    "probe": {"rows": 130, "h": 520},  # every config runs here: two chunks of 512, a remainder tile
    "large": {"rows": 130, "h": 40960},  # two passes for every dtype: budgets bind here
    "empty": [{"rows": 0, "h": 64}, {"rows": 5, "h": 0}],
}

_BUDGET_HINTS = {
    "sbuf": "lower h_chunk or rows_per_partition; H beyond largest_h() does not fit the resident weight",
}

FWD_SPEC = register(
    OpSpec(
        name=OP_FWD,
        config=RmsNormConfig,
        plan=plan,
        run_kernels=run_kernels_fwd,
        reference=reference_fwd,
        validate=validate_fwd,
        problem=problem,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs,
        test_problems=_TEST_PROBLEMS,
        kernels=(rms_norm_fwd_kernel,),
        autograd=(_setup_context, _backward),
        bad_inputs=lambda: [(a, arg) for a, arg in _bad_inputs()],
        budget_hints=_BUDGET_HINTS,
        description="RMSNorm forward kernel: (y, rstd); its autograd calls rms_norm_bwd",
    )
)

SPEC = register(
    OpSpec(
        name=OP,
        config=RmsNormConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=validate,
        problem=problem,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs,
        test_problems=_TEST_PROBLEMS,
        kernels=(rms_norm_fwd_kernel,),
        composite=composite,
        bad_inputs=_bad_inputs,
        budget_hints=_BUDGET_HINTS,
        description="y = x / sqrt(mean(x^2) + eps) * (offset + w) over the last dim",
    )
)
