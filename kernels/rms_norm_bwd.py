"""RMSNorm backward: ``dx`` and ``dw`` from ``dy``, ``x``, ``w`` and the forward's saved rstd.

With ``r`` the row's rstd, ``g = dy * (offset + w)`` and ``s = sum_h g * x`` per row:

    dx = r * g - (r^3 * s / H) * x            dw = sum over rows of r * dy * x

Rows sit on the partitions, as in the forward. Per row the kernel forms ``g`` and ``s``
(VectorE products, the row sum as a ScalarE add-reduction), then ``dx`` as one VectorE
``scalar_tensor_tensor`` (``x * k + g`` with the per-row ``k = -r^2 s / H``) scaled by
``r`` on the Scalar Engine on its way to the output dtype. ``dw`` is a sum over rows,
i.e. over partitions: TensorE contracts ``dy * x`` (fp32) against the rstd column
(stationary ``[rows, 1]``), so the row weights come for free and the fp32 partial sums
accumulate in PSUM across all row tiles (or, when H needs more banks than PSUM has, are
folded per row tile into an fp32 SBUF accumulator); dw is cast once at the end. No
partial sum is ever held in bf16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target, usable_psum_banks
from neuron_kernels.kernels.rms_norm import (
    _TEST_PROBLEMS,
    RmsNormPlan,
    _load_weight,
    _row_tiles,
    _weight_bytes,
    check_h,
    reference_fwd,
    validate_common,
)
from neuron_kernels.kernels.spec import (
    ITEMSIZE,
    OpSpec,
    Tolerance,
    TunableConfig,
    ceil_div,
    dtype_name,
    register,
    tunable,
)

__all__ = ["SPEC", "RmsNormBwdConfig", "backward", "plan", "reference"]

OP = "rms_norm_bwd"


@dataclass(frozen=True)
class RmsNormBwdConfig(TunableConfig):
    """Tile-level choices of the RMSNorm backward kernel.

    Attributes:
        rows_per_partition: rows each partition holds per tile (128 x this many rows).
        h_chunk: free-dim elements per compute instruction (and per DMA in two-pass mode).
        weight_broadcast: "dma" or "tensor", as in the forward.
        product_engine: engines of the products: "vector" (all on VectorE), "gpsimd"
            (the ``dy * x`` feeding dw on GpSimd) or "gpsimd_both" (``g * x`` too).
        dw_reduce: "psum" (dw accumulates in PSUM across every row tile: needs
            ceil(H / 512) banks), "sbuf" (each row tile's dw folds into fp32 SBUF) or
            "auto" (psum where the banks suffice, else sbuf).
    """

    op_name = OP

    rows_per_partition: int = tunable(
        1, (1, 4), "modeled: one row per partition already moves >= 2 KiB per DMA row at H >= 1024"
    )
    h_chunk: int = tunable(
        2048, (512, 2048), "modeled: 2048 amortises the per-instruction overhead"
    )
    weight_broadcast: str = tunable(
        "dma", ("dma", "tensor"), "modeled: one broadcast DMA per kernel, as in the forward"
    )
    product_engine: str = tunable(
        "gpsimd_both",
        ("vector", "gpsimd", "gpsimd_both"),
        "modeled: VectorE binds; 30.0% of the floor vs 24.7% (gpsimd), 19.1% (vector)",
    )
    dw_reduce: str = tunable(
        "auto",
        ("psum", "sbuf", "auto"),
        "modeled: psum 30.0% vs sbuf 25.5% of the floor at [4096, 4096] bf16; auto fits every H",
    )


def plan(problem: dict, dtype: str, config: RmsNormBwdConfig, target: Target) -> RmsNormPlan:
    """The backward tile plan: one pass when dy, x, dx and the fp32 g of a row tile fit
    beside the resident weight, else two passes over H (dy and x re-read).

    Raises:
        LimitError: ``dw_reduce="psum"`` when dw needs more PSUM banks than the target has.
    """
    rows, h, mode = problem["rows"], problem["h"], problem.get("casting_mode", "llama")
    item = ITEMSIZE[dtype]
    w_item = 4  # offset + w stays fp32: g = dy * (offset + w) has no low-precision step
    chunk = min(config.h_chunk, h)
    n_chunks = ceil_div(h, chunk)
    g = config.rows_per_partition
    pieces = ceil_div(h, target.gemm_moving_fmax)
    broadcast_bank = 1 if config.weight_broadcast == "tensor" else 0
    in_psum = config.dw_reduce == "psum" or (
        config.dw_reduce == "auto" and pieces + broadcast_bank <= usable_psum_banks(target)
    )
    if in_psum:
        banks = pieces + broadcast_bank
        if banks > usable_psum_banks(target):
            raise LimitError(
                OP,
                "config dw_reduce",
                f"must be 'sbuf' when dw needs more PSUM banks ({pieces} for H = {h}) than "
                f"{target.name} has ({usable_psum_banks(target)}, one for a PE broadcast)",
                "psum",
            )
    else:
        banks = 1 + broadcast_bank
    resident = _weight_bytes(h, chunk, item, w_item, config)
    resident += target.gemm_moving_fmax * item  # dw out, one piece at a time
    resident += 0 if in_psum else h * 4  # fp32 dw accumulator
    resident += 4 * (6 * g + 2)  # rstd, sums, factors
    scratch = 3 * chunk * 4  # g * x, x * k + g, dy * x (fp32)
    one_pass = resident + scratch + 3 * g * h * item + h * 4  # dy, x, dx tiles; fp32 g row
    two_pass = one_pass > target.sbuf_usable_bytes
    sbuf = resident + scratch + 3 * g * chunk * item + chunk * 4 if two_pass else one_pass
    return RmsNormPlan(
        rows=rows,
        h=h,
        casting_mode=mode,
        pmax=target.pmax,
        rows_per_partition=g,
        h_chunk=chunk,
        n_chunks=n_chunks,
        two_pass=two_pass,
        weight_broadcast=config.weight_broadcast,
        weight_fp32=w_item == 4,
        statistics="scalar",
        normalize="scalar",
        matmul_fmax=target.gemm_moving_fmax,
        bn_fmax=target.bn_stats_fmax,
        dw_in_psum=in_psum,
        product_engine=config.product_engine,
        sbuf_bytes=sbuf,
        psum_banks=banks,
    )


# -- the NKI kernel ----------------------------------------------------------------------


def _engine(on_gpsimd):
    return nisa.engine.gpsimd if on_gpsimd else nisa.engine.vector


def _row_sum_gx(dy_c, x_c, w_c, g_c, sums, j, first, last, p, cs, gx_engine):
    """``g_c = dy * w`` (fp32) and the row's running ``sum(g * x)`` (ScalarE register chain
    over the chunks, read out into column ``j`` at the last chunk)."""
    nisa.tensor_tensor(dst=g_c, data1=dy_c, data2=w_c, op=nl.multiply)
    gx = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="gx")
    nisa.tensor_tensor(dst=gx, data1=g_c, data2=x_c, op=nl.multiply, engine=gx_engine)
    nisa.activation(
        dst=gx,
        op=nl.copy,
        data=gx,
        reduce_op=nl.add,
        reduce_res=sums[0:p, j : j + 1] if last else None,
        reduce_cmd=nisa.reduce_cmd.reset_reduce if first else nisa.reduce_cmd.reduce,
    )


def _dx_and_dw(dy_c, x_c, g_c, dx_c, k_col, r_col, dw, c0, first_rows, plan, p, cs):
    """``dx_c = r * (x * k + g)`` and this chunk's ``r * dy * x`` summed over the tile's
    rows into ``dw`` (PSUM accumulators, or folded into the fp32 SBUF accumulator)."""
    t = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="x_k_g")
    nisa.scalar_tensor_tensor(
        dst=t, data=x_c, op0=nl.multiply, operand0=k_col, op1=nl.add, operand1=g_c
    )
    nisa.activation(dst=dx_c, op=nl.copy, data=t, scale=r_col)
    dyx = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="dy_x")
    nisa.tensor_tensor(
        dst=dyx,
        data1=dy_c,
        data2=x_c,
        op=nl.multiply,
        engine=_engine(plan.product_engine != "vector"),
    )
    fmax = plan.matmul_fmax
    for m0 in range(0, cs, fmax):
        ms = min(fmax, cs - m0)
        piece = (c0 + m0) // fmax
        if plan.dw_in_psum:
            nisa.nc_matmul(
                dst=dw[piece][0:1, 0:ms],
                stationary=r_col,
                moving=dyx[0:p, m0 : m0 + ms],
                accumulate=not first_rows,
            )
        else:
            part = nl.ndarray((1, ms), dtype=nl.float32, buffer=nl.psum, name="dw_part")
            nisa.nc_matmul(
                dst=part, stationary=r_col, moving=dyx[0:p, m0 : m0 + ms], accumulate=False
            )
            acc = dw[0:1, c0 + m0 : c0 + m0 + ms]
            if first_rows:
                nisa.tensor_copy(dst=acc, src=part)
            else:
                nisa.tensor_tensor(dst=acc, data1=acc, data2=part, op=nl.add)


@nki.jit
def backward(dy, x, w, rstd, plan, offset):
    """RMSNorm gradients for ``dy, x [N, H]``, ``w [H]`` (all one dtype) and the forward's
    ``rstd [N]`` (fp32) in HBM. Returns ``dx [N, H]`` (x's dtype) and ``dw [H]`` (w's)."""
    n, h = x.shape
    assert (n, h) == (plan.rows, plan.h), "rms_norm_bwd: the plan was made for other shapes"
    dx = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm, name="dx")
    dw_out = nl.ndarray((h,), dtype=w.dtype, buffer=nl.shared_hbm, name="dw")
    p_all = min(plan.pmax, n)
    chunk, n_chunks, fmax = plan.h_chunk, plan.n_chunks, plan.matmul_fmax
    w_eff = _load_weight(w, offset, plan, p_all, x.dtype)
    if plan.dw_in_psum:
        dw = []
        for q in range((h + fmax - 1) // fmax):
            dw.append(nl.ndarray((1, fmax), dtype=nl.float32, buffer=nl.psum, name="dw_psum"))
    else:
        dw = nl.ndarray((1, h), dtype=nl.float32, buffer=nl.sbuf, name="dw_acc")

    first_tile = True
    for r0, p, g in _row_tiles(n, plan.pmax, plan.rows_per_partition):
        dy_rows = dy[r0 : r0 + p * g, 0:h].reshape((p, g, h))
        x_rows = x[r0 : r0 + p * g, 0:h].reshape((p, g, h))
        dx_rows = dx[r0 : r0 + p * g, 0:h].reshape((p, g, h))
        r = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="rstd")
        nisa.dma_copy(dst=r, src=rstd[r0 : r0 + p * g].reshape((p, g)))
        # k = -r^2 * sum(g * x) / H, per row
        sums = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="sum_gx")
        k = nl.ndarray((p, g), dtype=nl.float32, buffer=nl.sbuf, name="k")
        if not plan.two_pass:
            dyt = nl.ndarray((p, g, h), dtype=x.dtype, buffer=nl.sbuf, name="dy_tile")
            xt = nl.ndarray((p, g, h), dtype=x.dtype, buffer=nl.sbuf, name="x_tile")
            dxt = nl.ndarray((p, g, h), dtype=x.dtype, buffer=nl.sbuf, name="dx_tile")
            nisa.dma_copy(dst=dyt, src=dy_rows)
            nisa.dma_copy(dst=xt, src=x_rows)
        for j in range(g):
            r_col = r[0:p, j : j + 1]
            if not plan.two_pass:
                g_row = nl.ndarray((p, h), dtype=nl.float32, buffer=nl.sbuf, name="g_row")
            for c in range(n_chunks):
                c0 = c * chunk
                cs = min(chunk, h - c0)
                if plan.two_pass:
                    dy_c = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="dy_chunk")
                    x_c = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="x_chunk")
                    nisa.dma_copy(dst=dy_c, src=dy_rows[0:p, j, c0 : c0 + cs])
                    nisa.dma_copy(dst=x_c, src=x_rows[0:p, j, c0 : c0 + cs])
                    g_c = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="g_chunk")
                else:
                    dy_c, x_c = dyt[0:p, j, c0 : c0 + cs], xt[0:p, j, c0 : c0 + cs]
                    g_c = g_row[0:p, c0 : c0 + cs]
                _row_sum_gx(
                    dy_c,
                    x_c,
                    w_eff[0:p, c0 : c0 + cs],
                    g_c,
                    sums,
                    j,
                    c == 0,
                    c == n_chunks - 1,
                    p,
                    cs,
                    _engine(plan.product_engine == "gpsimd_both"),
                )
            k_col = k[0:p, j : j + 1]
            nisa.tensor_tensor(dst=k_col, data1=r_col, data2=r_col, op=nl.multiply)
            nisa.tensor_tensor(dst=k_col, data1=k_col, data2=sums[0:p, j : j + 1], op=nl.multiply)
            nisa.tensor_scalar(dst=k_col, data=k_col, op0=nl.multiply, operand0=-1.0 / h)
            for c in range(n_chunks):
                c0 = c * chunk
                cs = min(chunk, h - c0)
                if plan.two_pass:
                    dy_c = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="dy_chunk")
                    x_c = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="x_chunk")
                    nisa.dma_copy(dst=dy_c, src=dy_rows[0:p, j, c0 : c0 + cs])
                    nisa.dma_copy(dst=x_c, src=x_rows[0:p, j, c0 : c0 + cs])
                    g_c = nl.ndarray((p, cs), dtype=nl.float32, buffer=nl.sbuf, name="g_chunk")
                    nisa.tensor_tensor(
                        dst=g_c, data1=dy_c, data2=w_eff[0:p, c0 : c0 + cs], op=nl.multiply
                    )
                    dx_c = nl.ndarray((p, cs), dtype=x.dtype, buffer=nl.sbuf, name="dx_chunk")
                else:
                    dy_c, x_c = dyt[0:p, j, c0 : c0 + cs], xt[0:p, j, c0 : c0 + cs]
                    g_c = g_row[0:p, c0 : c0 + cs]
                    dx_c = dxt[0:p, j, c0 : c0 + cs]
                _dx_and_dw(
                    dy_c, x_c, g_c, dx_c, k_col, r_col, dw, c0, first_tile and j == 0, plan, p, cs
                )
                if plan.two_pass:
                    nisa.dma_copy(dst=dx_rows[0:p, j, c0 : c0 + cs], src=dx_c)
        if not plan.two_pass:
            nisa.dma_copy(dst=dx_rows, src=dxt)
        first_tile = False

    # dw rounds once to w's dtype, one matmul-width piece at a time.
    dw_row = dw_out.reshape((1, h))
    for q in range((h + fmax - 1) // fmax):
        qs = min(fmax, h - q * fmax)
        dw_low = nl.ndarray((1, qs), dtype=w.dtype, buffer=nl.sbuf, name="dw_out")
        src = dw[q][0:1, 0:qs] if plan.dw_in_psum else dw[0:1, q * fmax : q * fmax + qs]
        nisa.tensor_copy(dst=dw_low, src=src)
        nisa.dma_copy(dst=dw_row[0:1, q * fmax : q * fmax + qs], src=dw_low)
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
        SPEC, problem(dy, x, weight, rstd, offset, casting_mode), dtype_name(x), config,
        runner.target,
    )  # fmt: skip
    dx, dw = runner(
        backward,
        dy.reshape(rows, h).contiguous(),
        x.reshape(rows, h).contiguous(),
        weight.contiguous(),
        rstd.reshape(rows).contiguous(),
        tiles,
        float(offset),
    )
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
        kernels=(backward,),
        bad_inputs=_bad_inputs,
        budget_hints={
            "sbuf": "lower h_chunk or rows_per_partition",
            "psum": "use dw_reduce='sbuf' or the DMA weight broadcast",
        },
        description="RMSNorm backward kernel: (dx, dw) from dy, x, w and the saved rstd",
    )
)
