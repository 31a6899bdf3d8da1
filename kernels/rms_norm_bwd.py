"""RMSNorm backward: ``dx`` and ``dw`` from ``dy``, ``x``, ``w`` and the forward's saved rstd.

With ``r`` the row's rstd, ``g = dy * (offset + w)`` and ``s = sum_h (dy * x) * w`` per row:

    dx = r * (g + k * x), k = -r^2 s / H       dw = sum over rows of r * dy * x

Rows sit on the partitions, as in the forward; row units (row j of a row tile) are
software-pipelined, pass 1 of the next unit issued before pass 2 of this one.

- Pass 1, per chunk: ``dy * x`` in fp32 (GpSimd or VectorE; exact for 2-byte inputs).
  TensorE sums it over the rows into dw: each [rows, 128] block of ``dy * x`` is the
  stationary, the rstd column the moving tile, so the block's 128 sums land on the
  partitions of one column of a [128, ceil(H / 128)] fp32 PSUM tile that accumulates
  over every row tile (one bank; the equivalent of the diagonal of x^T diag(r) dy).
  With ``weight_broadcast="tensor"`` the fp32 ``offset + w`` is held as three bf16 rows
  whose sum is exact and broadcast per 512 columns into PSUM by a K=3 matmul with a
  ones stationary; VectorE forms ``g`` and ``(dy * x) * w`` with w read from PSUM (N
  cycles instead of 2N, nki/api/nki/isa tensor_tensor: one SBUF and one PSUM input).
  ScalarE sums ``(dy * x) * w`` over the row (register chain over the chunks).
- Then, on ScalarE: ``k`` and, for ``dx_combine="tensor"``, diag(k) in three exact
  bf16 parts (fp32 inputs: one fp32 diag(k)).
- Pass 2, per 512 columns: TensorE puts ``k * x`` in PSUM (the diag parts against x),
  VectorE adds ``g``, ScalarE scales by ``r`` into the output dtype; each chunk of dx
  is stored as it is done.

Every DMA is triggered from SyncE on the hardware DGE where the target has one, so
GpSimd's queue holds only products: ``dy * x`` on every chunk and, by default
(``product_engine="gpsimd_both"``), ``g`` on one chunk in two from an fp32 SBUF copy of w.

dw rounds once at the end (LNC=1) or is written as the core's fp32 partial (LNC > 1).
Every intermediate is fp32; no partial sum is ever held in bf16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.rms_norm import (
    _TEST_PROBLEMS,
    RmsNormPlan,
    check_h,
    reference_fwd,
    rows_plan,
    validate_common,
)
from neuron_kernels.kernels.sbuf_constants import identity
from neuron_kernels.kernels.spec import (
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
from neuron_kernels.kernels.tiling import tiled

__all__ = ["SPEC", "RmsNormBwdConfig", "RmsNormBwdPlan", "plan", "reference", "rms_norm_bwd_kernel"]

OP = "rms_norm_bwd"


@dataclass(frozen=True)
class RmsNormBwdConfig(TunableConfig):
    """Tile-level choices of the RMSNorm backward kernel.

    Attributes:
        rows_per_partition: rows each partition holds per tile (128 x this many rows).
        h_chunk: free-dim elements per compute instruction (and per DMA in two-pass mode).
        weight_broadcast: how (offset + w) reaches the 128 partitions: "dma" (a stride-0
            DMA into an fp32 SBUF tile; its products read two SBUF tiles, 2N VectorE
            cycles) or "tensor" (three exact bf16 parts of the fp32 row summed by a K=3
            TensorE matmul into PSUM per 512 columns; VectorE products with one PSUM
            operand cost N cycles).
        product_engine: engines of the SBUF-only products: "vector" (all on VectorE),
            "gpsimd" (``dy * x`` on GpSimd) or "gpsimd_both" (``dy * x`` on GpSimd, and
            ``g = dy * w`` on GpSimd on some chunks from an SBUF copy of w (GpSimd cannot
            read PSUM; with the DMA broadcast, the row-sum product on GpSimd instead)).
        gpsimd_sum_every: with "gpsimd_both" and the TensorE broadcast, every
            this-many-th chunk's g runs on GpSimd (the rest on VectorE).
        dw_reduce: where dw sums over row tiles: "psum" (one PSUM bank holds dw as
            [128, ceil(H / 128)] columns across all row tiles), "sbuf" (each row tile's
            columns fold into an fp32 SBUF accumulator) or "auto" (psum when one bank
            holds them, H <= 65536).
        dx_combine: how ``x * k + g`` is formed: "vector" (one VectorE
            scalar_tensor_tensor, 2N) or "tensor" (TensorE puts ``k * x`` in PSUM from the
            diagonal of k in three exact bf16 parts; VectorE adds g at N).
    """

    op_name = OP

    rows_per_partition: int = tunable(
        1, (1, 4), "modeled: one row per partition already moves >= 2 KiB per DMA row at H >= 1024"
    )
    h_chunk: int = tunable(
        1024,
        (512, 1024, 2048),
        "modeled: 1024 halves GpSimd's per-instruction start cost against 512 and keeps the "
        "engines' hand-offs short (2048 stalls them); 2964.5 vs 3189.1 (512) and 4012.0 "
        "(2048) us at [16384, 8192] bf16 LNC=1 with gpsimd_both, one g in 2 on GpSimd",
    )
    weight_broadcast: str = tunable(
        "tensor",
        ("dma", "tensor"),
        "modeled: PSUM-resident w halves VectorE's two w products (N, not 2N cycles)",
    )
    product_engine: str = tunable(
        "gpsimd_both",
        ("vector", "gpsimd", "gpsimd_both"),
        "modeled: with the DMAs triggered from SyncE, GpSimd has room for some of VectorE's "
        "g products; 2964.5 us vs 3433.4 (gpsimd) at [16384, 8192] bf16 LNC=1",
    )
    dw_reduce: str = tunable(
        "auto",
        ("psum", "sbuf", "auto"),
        "modeled: one PSUM bank holds dw for every H the backward fits; no per-tile fold",
    )
    gpsimd_sum_every: int = tunable(
        2,
        (2, 3, 4),
        "modeled: with gpsimd_both and h_chunk 1024, one g in 2 on GpSimd balances it with "
        "VectorE: 2964.5 us vs 3055.7 (one in 3) at [16384, 8192] bf16 LNC=1",
    )
    dx_combine: str = tunable(
        "tensor",
        ("vector", "tensor"),
        "modeled: k * x on TensorE (PSUM) leaves VectorE an N-cycle add instead of 2N",
    )


@dataclass(frozen=True)
class RmsNormBwdPlan(RmsNormPlan):
    """The backward's plan: where dw sums and which engines form the products.

    At LNC > 1 each core sums dw over its own rows into its own fp32 row of the
    ``[lnc, H]`` partials output (disjoint HBM bytes: no race); the op adds the rows in
    core order in fp32 and rounds once (deterministic: the same order every run)."""

    dw_in_psum: bool  # dw accumulates in PSUM across all row tiles
    product_engine: str  # engines of the SBUF-only products
    dx_combine: str  # "vector" or "tensor"
    gpsimd_sum_every: int  # gpsimd_both: every n-th chunk's row-sum product on GpSimd
    w_in_sbuf: bool  # an fp32 (offset + w) broadcast resident in SBUF
    dw_blocks: int  # ceil(H / 128): dw's PSUM / SBUF columns
    hwdge: bool  # DMAs on the hardware DGE triggered from SyncE (NeuronCore-v3+)


def plan(
    problem: dict, dtype: str, config: RmsNormBwdConfig, target: Target, lnc: int = 1
) -> RmsNormBwdPlan:
    """The backward tile plan: one pass when dy, x, dx and the fp32 g of a row tile fit
    beside the resident weight, else two passes over H (dy and x re-read); the rows split
    over ``lnc`` cores.

    Raises:
        LimitError: ``dw_reduce="psum"`` when dw's columns need more than one PSUM bank.
    """
    h = problem["h"]
    item = ITEMSIZE[dtype]
    chunk = min(config.h_chunk, h)
    g = config.rows_per_partition
    pmax = target.pmax
    blocks = ceil_div(h, pmax)
    fits_bank = blocks * 4 <= target.psum_bank_bytes
    in_psum = config.dw_reduce == "psum" or (config.dw_reduce == "auto" and fits_bank)
    if config.dw_reduce == "psum" and not fits_bank:
        raise LimitError(
            OP,
            "config dw_reduce",
            f"must be 'sbuf' when dw's {blocks} columns (H = {h}) need more than one PSUM bank",
            "psum",
        )
    tensor_w = config.weight_broadcast == "tensor"
    w_in_sbuf = not tensor_w or config.product_engine == "gpsimd_both"
    banks = 1 + (1 if tensor_w else 0) + (1 if config.dx_combine == "tensor" else 0)
    resident = (h * 4 + chunk * item) if w_in_sbuf else 0  # fp32 w and its staging
    resident += 2 * h if tensor_w else 0  # the three bf16 parts of w (3 partitions)
    resident += 0 if in_psum else blocks * 4  # fp32 dw accumulator
    resident += 2 * pmax * 4 if config.dx_combine == "tensor" else 0  # identity, diag(k)
    resident += blocks * 4 + 4 * (6 * g + 2)  # dw out; rstd, sums, factors
    scratch = 3 * chunk * 4 + chunk * item  # dy * x, its w product, x * k + g; dx chunk
    # two row tiles in flight (pass 1 of the next beside pass 2 of this one): dy and x
    # tiles and the fp32 g row of each
    one_pass = resident + scratch + 2 * (2 * g * h * item + h * 4)
    two_pass = one_pass > target.sbuf_usable_bytes
    return rows_plan(
        RmsNormBwdPlan,
        problem,
        config,
        target,
        lnc,
        two_pass=two_pass,
        weight_fp32=True,  # offset + w stays fp32: g = dy * (offset + w) has no low-precision step
        dw_in_psum=in_psum,
        product_engine=config.product_engine,
        dx_combine=config.dx_combine,
        gpsimd_sum_every=config.gpsimd_sum_every,
        w_in_sbuf=w_in_sbuf,
        dw_blocks=blocks,
        hwdge=target.has_hwdge,
        sbuf_bytes=resident + scratch + 2 * (2 * chunk * item + chunk * 4)
        if two_pass
        else one_pass,
        psum_banks=banks,
    )


# -- the NKI kernel ----------------------------------------------------------------------


def _engine(on_gpsimd):
    return nisa.engine.gpsimd if on_gpsimd else nisa.engine.vector


def _dma(plan, dst, src):
    """One DMA: on the hardware DGE triggered from SyncE when the target has one
    (NeuronCore-v3+; nki/api/nki/isa dma_copy: dge_mode, engine), which leaves GpSimd's
    queue to the products; else the compiler's default (software DGE on GpSimd)."""
    if plan.hwdge:
        nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync)
    else:
        nisa.dma_copy(dst=dst, src=src)


def _resident_weight(w, offset, plan, p_all, dtype):
    """fp32 ``offset + w`` broadcast to ``p_all`` partitions by a stride-0 DMA per chunk."""
    h = plan.h
    w_eff = nl.ndarray((p_all, h), dtype=nl.float32, buffer=nl.sbuf, name="w_eff")
    w_row = w.reshape((1, h))
    for c0, cs in tiled(h, plan.h_chunk):
        staged = nl.ndarray((p_all, cs), dtype=dtype, buffer=nl.sbuf, name="w_staged")
        _dma(plan, dst=staged, src=w_row[0:1, c0 : c0 + cs].broadcast(0, p_all))
        nisa.tensor_scalar(
            dst=w_eff[0:p_all, c0 : c0 + cs], data=staged, op0=nl.add, operand0=offset
        )
    return w_eff


def _split_bf16(dst_parts, value, p, f, name):
    """Write the three bf16 parts of the fp32 ``value`` [p, f] (hi + mid + lo == value:
    each part takes the next 8 significant bits, so three hold fp32's 24) into
    ``dst_parts[i]`` ([p, f] bf16 views) and return them."""
    rest = value
    for i in range(3):
        nisa.tensor_copy(dst=dst_parts[i], src=rest)
        if i < 2:
            nxt = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf, name=name)
            nisa.tensor_tensor(dst=nxt, data1=rest, data2=dst_parts[i], op=nl.subtract)
            rest = nxt
    return dst_parts


def _weight_parts(w, offset, plan, dtype):
    """``[3, H]`` bf16: row i is part i of the fp32 ``offset + w`` (their sum is exact), the
    moving tile of the K=3 TensorE broadcast (a ones stationary sums the parts in fp32).
    Built chunk by chunk on one partition, each part then moved onto its own partition."""
    h = plan.h
    parts = nl.ndarray((3, h), dtype=nl.bfloat16, buffer=nl.sbuf, name="w_parts")
    w_row = w.reshape((1, h))
    for c0, cs in tiled(h, plan.h_chunk):
        row = nl.ndarray((1, cs), dtype=dtype, buffer=nl.sbuf, name="w_row")
        _dma(plan, dst=row, src=w_row[0:1, c0 : c0 + cs])
        value = nl.ndarray((1, cs), dtype=nl.float32, buffer=nl.sbuf, name="w_value")
        nisa.tensor_scalar(dst=value, data=row, op0=nl.add, operand0=offset)
        staged = []
        for i in range(3):
            staged.append(nl.ndarray((1, cs), dtype=nl.bfloat16, buffer=nl.sbuf, name="w_part"))
        _split_bf16(staged, value, 1, cs, "w_rest")
        for i in range(3):  # each part onto its own partition (SBUF to SBUF)
            _dma(plan, dst=parts[i : i + 1, c0 : c0 + cs], src=staged[i])
    return parts


def _k_and_diags(ts, j, ident, plan, dtype):
    """``k = -r^2 * sum / H`` for row ``j`` of ``ts`` and, for ``dx_combine="tensor"``, the
    stationaries whose matmuls with x sum to ``k * x``: diag(k) in three exact bf16 parts
    (fp32 x: one fp32 diag(k), as TensorE pairs fp32 only with fp32). On ScalarE (a short
    dependent chain the busy VectorE would stall on), issued as soon as the sum exists."""
    p = ts.p
    r_col = ts.r[0:p, j : j + 1]
    k_col = ts.k[0:p, j : j + 1]
    sr = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf, name="sum_r")
    nisa.activation(dst=sr, op=nl.copy, data=ts.sums[0:p, j : j + 1], scale=r_col)
    nisa.activation(dst=k_col, op=nl.copy, data=sr, scale=r_col)
    nisa.activation(dst=k_col, op=nl.copy, data=k_col, scale=-1.0 / plan.h)
    diags = []
    if plan.dx_combine != "tensor":
        return diags
    if dtype == nl.float32:
        d = nl.ndarray((p, p), dtype=nl.float32, buffer=nl.sbuf, name="diag_k")
        nisa.activation(dst=d, op=nl.copy, data=ident[0:p, 0:p], scale=k_col)
        diags.append(d)
        return diags
    rest = k_col
    for i in range(3):
        d = nl.ndarray((p, p), dtype=nl.bfloat16, buffer=nl.sbuf, name="diag_k")
        nisa.activation(dst=d, op=nl.copy, data=ident[0:p, 0:p], scale=rest)
        diags.append(d)
        if i < 2:  # rest - bf16(rest): exact in fp32
            part = nl.ndarray((p, 1), dtype=nl.bfloat16, buffer=nl.sbuf, name="k_part")
            nisa.activation(dst=part, op=nl.copy, data=rest)
            nxt = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf, name="k_rest")
            nisa.activation(dst=nxt, op=nl.copy, data=part, scale=-1.0, bias=rest)
            rest = nxt
    return diags


def _w_bcast(ones3, w_parts, c0, ms, p):
    """(offset + w)[c0 : c0 + ms] on ``p`` partitions in PSUM (fp32): the parts summed by
    a K=3 matmul with a ones stationary."""
    bc = nl.ndarray((p, ms), dtype=nl.float32, buffer=nl.psum, name="w_bcast")
    nisa.nc_matmul(dst=bc, stationary=ones3[0:3, 0:p], moving=w_parts[0:3, c0 : c0 + ms])
    return bc


def _load_chunk(rows, tile, j, c0, cs, p, plan, dtype, name):
    """Chunk ``c0 : c0 + cs`` of row ``j``: a view of the resident row tile (one pass), or
    loaded from the HBM rows ``rows`` into a fresh tile (two passes)."""
    if not plan.two_pass:
        return tile[0:p, j, c0 : c0 + cs]
    chunk = nl.ndarray((p, cs), dtype=dtype, buffer=nl.sbuf, name=name)
    _dma(plan, dst=chunk, src=rows[0:p, j, c0 : c0 + cs])
    return chunk


def _g_chunk(dy_c, w_eff, ones3, w_parts, g_c, c0, cs, p, plan, on_gpsimd=False):
    """``g_c = dy * (offset + w)`` (fp32) for one chunk; returns the PSUM broadcasts of w
    (per 512 columns) when the weight is broadcast on TensorE, else None. ``on_gpsimd``:
    g from the SBUF copy of w on GpSimd (the broadcasts still serve the row sum)."""
    if plan.weight_broadcast == "dma" or on_gpsimd:
        nisa.tensor_tensor(
            dst=g_c,
            data1=dy_c,
            data2=w_eff[0:p, c0 : c0 + cs],
            op=nl.multiply,
            engine=_engine(on_gpsimd),
        )
    if plan.weight_broadcast == "dma":
        return None
    bcs = []
    for m0, ms in tiled(cs, plan.matmul_fmax):
        bc = _w_bcast(ones3, w_parts, c0 + m0, ms, p)
        if not on_gpsimd:
            nisa.tensor_tensor(
                dst=g_c[0:p, m0 : m0 + ms],
                data1=dy_c[0:p, m0 : m0 + ms],
                data2=bc,
                op=nl.multiply,
            )
        bcs.append(bc)
    return bcs


@dataclass
class RowTile(nl.NKIObject):
    """One row tile's state, kept from its first pass-1 unit to its last pass-2 unit."""

    p: int  # partitions (rows per partition: rows_per_partition or 1)
    dy_rows: object  # [p, g, H] HBM views of dy, x and dx
    x_rows: object
    dx_rows: object
    r: object  # [p, g] fp32 rstd
    sums: object  # [p, g] fp32 row sums of (dy * x) * w
    k: object  # [p, g] fp32 -r^2 * sum / H
    dyt: object  # [p, g, H] resident dy and x (one pass), else None
    xt: object
    dw_part: object  # this tile's [128, blocks] dw columns (dw_reduce sbuf), else None


def _open_tile(dy, x, dx, rstd, r0, p, g, plan):
    """Load a row tile's rstd (and, in one pass, its dy and x rows) and make its state."""
    h, pmax = plan.h, plan.pmax
    dy_rows = dy[r0 : r0 + p * g, 0:h].reshape((p, g, h))
    x_rows = x[r0 : r0 + p * g, 0:h].reshape((p, g, h))
    dx_rows = dx[r0 : r0 + p * g, 0:h].reshape((p, g, h))
    r = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="rstd")
    _dma(plan, dst=r, src=rstd[r0 : r0 + p * g].reshape((p, g)))
    sums = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="sum_gx")
    k = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="k")
    dyt = xt = dw_part = None
    if not plan.two_pass:
        dyt = nl.ndarray((p, g, h), dtype=x.dtype, buffer=nl.sbuf, name="dy_tile")
        xt = nl.ndarray((p, g, h), dtype=x.dtype, buffer=nl.sbuf, name="x_tile")
        _dma(plan, dst=dyt, src=dy_rows)
        _dma(plan, dst=xt, src=x_rows)
    if not plan.dw_in_psum:
        dw_part = nl.ndarray(
            (pmax, plan.dw_blocks), dtype=nl.float32, buffer=nl.psum, name="dw_part"
        )
    return RowTile(p, dy_rows, x_rows, dx_rows, r, sums, k, dyt, xt, dw_part)


def _dw_matmuls(dw_dst, dyx, r_col, c0, p, first_sum, plan):
    """dw of one chunk: each [p, 128] block of dy*x (stationary) against the moving rstd
    column sums r * dy * x over the tile's rows onto the block's partitions (column b)."""
    pmax = plan.pmax
    for b0, bs in tiled(dyx.shape[1], pmax):
        b = (c0 + b0) // pmax
        nisa.nc_matmul(
            dst=dw_dst[0:bs, b : b + 1],
            stationary=dyx[0:p, b0 : b0 + bs],
            moving=r_col,
            accumulate=not first_sum,
        )


def _pass_one(ts, j, first_sum, dw, w_eff, ones3, w_parts, plan, dtype, unit):
    """Row ``j`` of tile ``ts``, pass 1: dy * x (fp32) into dw (TensorE), g = dy * w kept
    (one pass) and the row sum of (dy * x) * w (ScalarE register chain). Returns g's row."""
    p, h = ts.p, plan.h
    chunks = tiled(h, plan.h_chunk)
    n_chunks = len(chunks)
    r_col = ts.r[0:p, j : j + 1]
    dw_dst = dw if plan.dw_in_psum else ts.dw_part
    g_row = None
    if not plan.two_pass:
        g_row = nl.ndarray((p, h), dtype=nl.float32, buffer=nl.sbuf, name="g_row")
    prev_dyx = None
    prev_c0 = 0
    for c, (c0, cs) in enumerate(chunks):
        dy_c = _load_chunk(ts.dy_rows, ts.dyt, j, c0, cs, p, plan, dtype, "dy_chunk")
        x_c = _load_chunk(ts.x_rows, ts.xt, j, c0, cs, p, plan, dtype, "x_chunk")
        if plan.two_pass:
            g_c = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="g_chunk")
        else:
            g_c = g_row[0:p, c0 : c0 + cs]
        on_gpsimd = (
            plan.product_engine == "gpsimd_both"
            and (unit * n_chunks + c) % plan.gpsimd_sum_every == plan.gpsimd_sum_every - 1
        )
        bcs = _g_chunk(dy_c, w_eff, ones3, w_parts, g_c, c0, cs, p, plan, on_gpsimd)
        # dw of the previous chunk: TensorE has this chunk's w broadcast queued first
        if prev_dyx is not None:
            _dw_matmuls(dw_dst, prev_dyx, r_col, prev_c0, p, first_sum, plan)
        dyx = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="dy_x")
        nisa.tensor_tensor(
            dst=dyx,
            data1=dy_c,
            data2=x_c,
            op=nl.multiply,
            engine=_engine(plan.product_engine != "vector"),
        )
        gx = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="gx")
        if bcs is None:  # w in SBUF: the row-sum product on GpSimd with gpsimd_both
            nisa.tensor_tensor(
                dst=gx,
                data1=dyx,
                data2=w_eff[0:p, c0 : c0 + cs],
                op=nl.multiply,
                engine=_engine(plan.product_engine == "gpsimd_both"),
            )
        else:
            for q, (m0, ms) in enumerate(tiled(cs, plan.matmul_fmax)):
                nisa.tensor_tensor(
                    dst=gx[0:p, m0 : m0 + ms],
                    data1=dyx[0:p, m0 : m0 + ms],
                    data2=bcs[q],
                    op=nl.multiply,
                )
        nisa.activation(
            dst=gx,
            op=nl.copy,
            data=gx,
            reduce_op=nl.add,
            reduce_res=ts.sums[0:p, j : j + 1] if c == n_chunks - 1 else None,
            reduce_cmd=nisa.reduce_cmd.reset_reduce if c == 0 else nisa.reduce_cmd.reduce,
        )
        prev_dyx = dyx
        prev_c0 = c0
    _dw_matmuls(dw_dst, prev_dyx, r_col, prev_c0, p, first_sum, plan)
    return g_row


def _pass_two(ts, j, g_row, diags, w_eff, ones3, w_parts, plan, dtype):
    """Row ``j`` of tile ``ts``, pass 2 (k and its diagonals made): dx = r * (x * k + g)
    chunk by chunk, each chunk stored as it is done."""
    p, h = ts.p, plan.h
    r_col = ts.r[0:p, j : j + 1]
    k_col = ts.k[0:p, j : j + 1]
    for c0, cs in tiled(h, plan.h_chunk):
        x_c = _load_chunk(ts.x_rows, ts.xt, j, c0, cs, p, plan, dtype, "x_chunk")
        if plan.two_pass:  # g again, from the re-read dy
            dy_c = _load_chunk(ts.dy_rows, ts.dyt, j, c0, cs, p, plan, dtype, "dy_chunk")
            g_c = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="g_chunk")
            _g_chunk(dy_c, w_eff, ones3, w_parts, g_c, c0, cs, p, plan)
        else:
            g_c = g_row[0:p, c0 : c0 + cs]
        t = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="x_k_g")
        if len(diags) == 0:
            nisa.scalar_tensor_tensor(
                dst=t, data=x_c, op0=nl.multiply, operand0=k_col, op1=nl.add, operand1=g_c
            )
        else:
            for m0, ms in tiled(cs, plan.matmul_fmax):
                kx = nl.ndarray((p, ms), dtype=nl.float32, buffer=nl.psum, name="k_x")
                for i in range(len(diags)):
                    nisa.nc_matmul(
                        dst=kx,
                        stationary=diags[i],
                        moving=x_c[0:p, m0 : m0 + ms],
                        accumulate=i > 0,
                    )
                nisa.tensor_tensor(
                    dst=t[0:p, m0 : m0 + ms], data1=g_c[0:p, m0 : m0 + ms], data2=kx, op=nl.add
                )
        dx_c = nl.ndarray((p, cs), dtype=dtype, buffer=nl.sbuf, name="dx_chunk")
        nisa.activation(dst=dx_c, op=nl.copy, data=t, scale=r_col)
        _dma(plan, dst=ts.dx_rows[0:p, j, c0 : c0 + cs], src=dx_c)


@nki.jit
def rms_norm_bwd_kernel(dy, x, w, rstd, plan, offset):
    """RMSNorm gradients for ``dy, x [N, H]``, ``w [H]`` (all one dtype) and the forward's
    ``rstd [N]`` (fp32) in HBM. Returns ``dx [N, H]`` (x's dtype) and ``dw``: ``[H]`` in
    w's dtype at LNC=1; at LNC > 1 the ``[lnc, H]`` fp32 partial sums, row ``c`` summed
    over core ``c``'s rows (launched as ``rms_norm_bwd_kernel[plan.lnc]``; each core takes
    ``plan.core_tiles[nl.program_id(0)]``; the op adds the rows, see :class:`RmsNormBwdPlan`)."""
    n, h = x.shape
    assert (n, h) == (plan.rows, plan.h), "rms_norm_bwd: the plan was made for other shapes"
    assert nl.num_programs(0) == plan.lnc, "rms_norm_bwd: launch rms_norm_bwd_kernel[plan.lnc]"
    dx = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm, name="dx")
    core = nl.program_id(0)
    if plan.lnc == 1:
        dw_out = nl.ndarray((h,), dtype=w.dtype, buffer=nl.shared_hbm, name="dw")
        dw_row = dw_out.reshape((1, h))
    else:
        dw_out = nl.ndarray((plan.lnc, h), dtype=nl.float32, buffer=nl.shared_hbm, name="dw")
        dw_row = dw_out[core : core + 1, 0:h]
    pmax = plan.pmax
    blocks = tiled(h, pmax)  # dw's columns: block b's sums sit in column b, on partitions
    my_tiles = plan.core_tiles[core]
    if len(my_tiles) == 0:  # fewer row tiles than cores: this core's partial is zero
        zero = nl.ndarray((1, h), dtype=nl.float32, buffer=nl.sbuf, name="dw_out")
        nisa.memset(dst=zero, value=0.0)
        _dma(plan, dst=dw_row, src=zero)
        return dx, dw_out
    p_all = min(pmax, n)
    w_eff = None
    if plan.w_in_sbuf:
        w_eff = _resident_weight(w, offset, plan, p_all, x.dtype)
    ones3 = w_parts = None
    if plan.weight_broadcast == "tensor":
        w_parts = _weight_parts(w, offset, plan, x.dtype)
        ones3 = nl.ndarray((3, p_all), dtype=nl.bfloat16, buffer=nl.sbuf, name="ones3")
        nisa.memset(dst=ones3, value=1.0)
    ident = None
    if plan.dx_combine == "tensor":
        ident = identity(p_all)
        if x.dtype == nl.float32:
            ident32 = nl.ndarray((p_all, p_all), dtype=nl.float32, buffer=nl.sbuf, name="id32")
            nisa.tensor_copy(dst=ident32, src=ident)
            ident = ident32
    n_blocks = len(blocks)
    if plan.dw_in_psum:
        dw = nl.ndarray((pmax, n_blocks), dtype=nl.float32, buffer=nl.psum, name="dw_psum")
    else:
        dw = nl.ndarray((pmax, n_blocks), dtype=nl.float32, buffer=nl.sbuf, name="dw_acc")

    # Row units (row j of a tile) are software-pipelined: pass 1 of unit u + 1 is issued
    # before pass 2 of unit u, so the in-order engines have the next unit's products to
    # run while unit u's k waits for its row sum (ScalarE) to finish.
    units = []
    for ti in range(len(my_tiles)):
        for j in range(my_tiles[ti][2]):
            units.append((ti, j))
    tiles = []
    pending = None  # (tile, j, g row, diagonals of k) whose pass 2 is due
    for u in range(len(units) + 1):
        current = None
        if u < len(units):
            ti, j = units[u]
            r0, p, g = my_tiles[ti]
            if j == 0:
                tiles.append(_open_tile(dy, x, dx, rstd, r0, p, g, plan))
            first_sum = u == 0 if plan.dw_in_psum else j == 0
            g_row = _pass_one(tiles[ti], j, first_sum, dw, w_eff, ones3, w_parts, plan, x.dtype, u)
            current = (ti, j, g_row, _k_and_diags(tiles[ti], j, ident, plan, x.dtype))
        if pending is not None:
            pti, pj, pg_row, pdiags = pending
            _pass_two(tiles[pti], pj, pg_row, pdiags, w_eff, ones3, w_parts, plan, x.dtype)
            if not plan.dw_in_psum and pj == my_tiles[pti][2] - 1:  # fold the tile's dw
                if pti == 0:
                    nisa.tensor_copy(dst=dw, src=tiles[pti].dw_part)
                else:
                    nisa.tensor_tensor(dst=dw, data1=dw, data2=tiles[pti].dw_part, op=nl.add)
        pending = current

    # dw rounds once to w's dtype (LNC=1), or this core's fp32 partial is written as it is;
    # column b of the [128, blocks] sums holds dw[b * 128 : b * 128 + 128] on its partitions
    out_dtype = w.dtype if plan.lnc == 1 else nl.float32
    dw_low = nl.ndarray((pmax, n_blocks), dtype=out_dtype, buffer=nl.sbuf, name="dw_out")
    nisa.tensor_copy(dst=dw_low, src=dw)
    full = h // pmax
    if full > 0:
        dst = dw_row[0:1, 0 : full * pmax].reshape((full, pmax)).permute((1, 0))
        _dma(plan, dst=dst, src=dw_low[0:pmax, 0:full])
    if full < n_blocks:
        tail = h - full * pmax
        dst = dw_row[0:1, full * pmax : h].reshape((tail, 1))
        _dma(plan, dst=dst, src=dw_low[0:tail, full : full + 1])
    return dx, dw_out


# -- op-level glue ---------------------------------------------------------------------------


def validate(dy, x, weight, rstd, offset=0.0, casting_mode="llama") -> None:
    """Refuse bad op input before any work."""
    validate_common(OP, x, weight, offset, casting_mode)
    for arg, t in (("dy", dy), ("rstd", rstd)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(OP, arg, "must be a torch.Tensor", type(t).__name__)
    if dy.shape != x.shape:
        raise LimitError(OP, "dy shape", f"must equal x's shape {list(x.shape)}", list(dy.shape))
    if dy.dtype != x.dtype:
        raise LimitError(OP, "dy dtype", f"must equal x's dtype ({dtype_name(x)})", dtype_name(dy))
    if rstd.shape != x.shape[:-1]:
        raise LimitError(
            OP, "rstd shape", f"must be x's shape without H {list(x.shape[:-1])}", list(rstd.shape)
        )
    if rstd.dtype != torch.float32:
        raise LimitError(OP, "rstd dtype", "must be float32", dtype_name(rstd))
    for arg, t in (("dy", dy), ("rstd", rstd)):
        if t.device != x.device:
            raise LimitError(
                OP, f"{arg} device", f"must equal x's device ({x.device})", str(t.device)
            )


def problem(dy, x, weight, rstd, offset=0.0, casting_mode="llama") -> dict:
    return {"rows": math.prod(x.shape[:-1]), "h": x.shape[-1], "casting_mode": casting_mode}


def reference(dy, x, weight, rstd, offset=0.0, casting_mode="llama", upcast: bool = True):
    """``(dx, dw)`` in plain torch from the closed form, using the given rstd: fp64 when
    ``upcast``, else fp32 math cast to the inputs' dtypes. Every casting mode has the same
    gradient (a cast's gradient is the identity)."""
    ct = torch.float64 if upcast else torch.float32
    h = x.shape[-1]
    r = rstd.to(ct).unsqueeze(-1)
    xf, dyf = x.to(ct), dy.to(ct)
    xhat = xf * r
    g = dyf * (offset + weight.to(ct))
    dx = r * (g - xhat * (g * xhat).sum(-1, keepdim=True) / max(h, 1))
    dw = (dyf * xhat).reshape(math.prod(x.shape[:-1]), h).sum(0)  # explicit: H may be 0
    if upcast:
        return dx, dw
    return dx.to(x.dtype), dw.to(weight.dtype)


def run_kernels(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    offset: float = 0.0,
    casting_mode: str = "llama",
    *,
    config: RmsNormBwdConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm gradients for ``x [..., H]`` (batch dims fold into rows): ``(dx, dw)``."""
    *batch, h = x.shape
    rows = math.prod(batch)
    if rows == 0 or h == 0:
        return reference(dy, x, weight, rstd, offset, casting_mode, upcast=False)
    tiles = check_h(
        SPEC,
        problem(dy, x, weight, rstd, offset, casting_mode),
        dtype_name(x),
        config,
        runner.target,
        runner_lnc(runner),
    )
    dx, dw = runner(
        rms_norm_bwd_kernel[tiles.lnc],
        dy.reshape(rows, h).contiguous(),
        x.reshape(rows, h).contiguous(),
        weight.contiguous(),
        rstd.reshape(rows).contiguous(),
        tiles,
        float(offset),
    )
    if tiles.lnc > 1:  # the cores' fp32 partial sums, added in core order, rounded once
        total = dw[0]
        for c in range(1, tiles.lnc):
            total = total + dw[c]
        dw = total.to(weight.dtype)
    return dx.reshape(*batch, h), dw


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """dy, x ~ N(0, 1), w ~ 1 + N(0, 0.1^2) and x's rstd from the fp32 reference forward."""
    rows, h = problem["rows"], problem["h"]
    torch_dtype = getattr(torch, dtype)
    dy = torch.randn(rows, h, generator=generator).to(torch_dtype)
    x = torch.randn(rows, h, generator=generator).to(torch_dtype)
    w = (1.0 + 0.1 * torch.randn(h, generator=generator)).to(torch_dtype)
    mode = problem.get("casting_mode", "llama")
    offset = problem.get("offset", 0.0)
    rstd = reference_fwd(x, w, 1e-6, offset, mode, upcast=False)[1].float()
    return dy, x, w, rstd, offset, mode


def _bad_inputs():
    """One bad input per op-boundary limit: (args, the argument the error must name)."""
    f = torch.zeros
    return [
        ((f(2, 4), f(2, 4), f(3), f(2)), "weight shape"),
        ((f(2, 3), f(2, 4), f(4), f(2)), "dy shape"),
        ((f(2, 4, dtype=torch.bfloat16), f(2, 4), f(4), f(2)), "dy dtype"),
        ((f(2, 4), f(2, 4), f(4), f(3)), "rstd shape"),
        ((f(2, 4), f(2, 4), f(4), f(2, dtype=torch.float64)), "rstd dtype"),
        ((f(2, 4), f(2, 4), f(4), f(2, device="meta")), "rstd device"),
        ((f(2, 4), f(2, 4), f(4), f(2), 0.0, "mistral"), "casting_mode"),
    ]


SPEC = register(
    OpSpec(
        name=OP,
        config=RmsNormBwdConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=validate,
        problem=problem,
        tolerances={
            # dx = r * (g - xhat * mean(g * xhat)) and dw = sum of r * dy * x are O(1) and
            # O(sqrt(rows)); every intermediate is fp32 (row sums over H and dw's sum over
            # rows in fp32: relative ~ sqrt(n) * 2^-24), then one rounding to the output
            # dtype: 2x the 0.5-ulp bound, atol for values near 0 after cancellation.
            "float32": Tolerance(1e-5, 2**-18, "fp32 sums over H and over rows, fp32 output"),
            "bfloat16": Tolerance(1e-3, 2**-8, "fp32 math, one bf16 rounding of dx and of dw"),
            "float16": Tolerance(1e-4, 2**-10, "fp32 math, one fp16 rounding of dx and of dw"),
        },
        make_inputs=make_inputs,
        # As the forward's, but "large" within the backward's smaller largest H (fp32: 18171).
        test_problems={**_TEST_PROBLEMS, "large": {"rows": 130, "h": 16384}},
        kernels=(rms_norm_bwd_kernel,),
        bad_inputs=_bad_inputs,
        budget_hints={
            "sbuf": "lower h_chunk or rows_per_partition",
            "psum": "use dw_reduce='sbuf' or the DMA weight broadcast",
        },
        description="RMSNorm backward kernel: (dx, dw) from dy, x, w and the saved rstd",
    )
)
