"""Matmul ``C[M, N] = A[M, K] @ B[K, N]`` on the Tensor Engine, and its op declaration.

TensorE contracts over the partition dim of both operands (``dst = stationary.T @ moving``),
so A must reach SBUF transposed: ``A^T[K, M]``. The kernel blocks M, N and K in tiles
(the blocking of AWS's matrix-multiplication tutorial, nki/guides/tutorials/
matrix_multiplication.rst): a block of ``A^T`` and of ``B`` is loaded once per K block and
reused by every output tile of the block; partial sums over K stay in PSUM or are folded
into fp32 SBUF accumulators. Any M, N, K >= 1 works: remainder tiles are views of the
full-size tiles, never padded copies of the inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import target_from_name
from neuron_kernels.kernels.spec import OpSpec, Tolerance, TunableConfig, register, tunable

__all__ = ["MatmulConfig", "forward", "launch", "reference", "SPEC"]

OP = "matmul"
TILE_K = 128  # contraction per nc_matmul: the partition dim (tile_size.pmax)
STATIONARY_F = 128  # stationary free size (tile_size.gemm_stationary_fmax)
MOVING_F = 512  # moving free size: one 2 KiB PSUM bank of fp32 (gemm_moving_fmax)
DTYPES = ("float32", "bfloat16", "float16")
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MatmulConfig(TunableConfig):
    """Tile-level choices of the matmul kernel.

    Attributes:
        block_m: output tiles per block along M (tiles of 128 rows, 512 when B is stationary).
        block_n: output tiles per block along N (tiles of 512 columns, 128 when B is stationary).
        block_k: K tiles (of 128) loaded per block.
        stationary: "a" keeps A^T tiles in the systolic array (C lands M-on-partitions);
            "b" keeps B tiles there and streams A^T (C^T lands N-on-partitions, written back
            through a transposing DMA): better when M is small.
        accumulate: "psum" keeps each output tile's sum over all of K in one PSUM bank
            (blocks limited by the 8 banks); "sbuf" folds each K block into fp32 SBUF
            accumulators, freeing PSUM for larger blocks.
        transpose: how A^T reaches SBUF: "pe" (contiguous load, TensorE transpose via PSUM),
            "dma" (DMA transpose, 2-byte dtypes, trn2+) or "strided" (element-wise DMA).
    """

    op_name = OP

    # Defaults: the modeled best (trn2 cost model, exhaustive over the grid) at
    # M=N=K=1024 bf16 among configs valid for every dtype and target: 45.1 us modeled,
    # against 55.3 us for the first hand-picked default. The fastest bf16 config there
    # (36.3 us modeled) transposes by DMA, which fp32 and trn1 cannot: the autotuner
    # finds it per dtype and target.
    block_m: int = tunable(
        4,
        (1, 2, 4, 8, 16),
        "modeled: 512-row A^T blocks keep TensorE fed; 8+ gains nothing at 1024",
    )
    block_n: int = tunable(
        2, (1, 2, 4), "modeled: two 512-column tiles per block halve A^T reloads vs 1"
    )
    block_k: int = tunable(
        8, (1, 2, 4, 8), "modeled: 1024-deep K blocks amortise the PE transposes and DMAs"
    )
    stationary: str = tunable(
        "a", ("a", "b"), "modeled: b-stationary writes C through a transposing DMA, slower at 1024"
    )
    accumulate: str = tunable(
        "sbuf", ("psum", "sbuf"), "modeled: with PE transposes, psum mode's bank limit caps blocks"
    )
    transpose: str = tunable(
        "pe",
        ("pe", "dma", "strided"),
        "modeled: fastest transpose valid for every dtype and target",
    )


# -- the NKI kernel ----------------------------------------------------------------------


def _ceil_div(a, b):
    return (a + b - 1) // b


def _load_a_transposed(a, at_blk, m0, ms_blk, k0, ks_blk, transpose, psum_dtype):
    """Fill ``at_blk[k, kt, m]`` with ``A[m0 + m, k0 + kt * 128 + k]`` (A^T of one block)."""
    n_kt = _ceil_div(ks_blk, TILE_K)
    if transpose == "pe":
        for mc in range(0, ms_blk, STATIONARY_F):
            mcs = min(STATIONARY_F, ms_blk - mc)
            a_rows = nl.ndarray((mcs, ks_blk), dtype=a.dtype, buffer=nl.sbuf, name="a_rows")
            nisa.dma_copy(dst=a_rows, src=a[m0 + mc : m0 + mc + mcs, k0 : k0 + ks_blk])
            for kt in range(n_kt):
                ksz = min(TILE_K, ks_blk - kt * TILE_K)
                a_t = nl.ndarray((ksz, mcs), dtype=psum_dtype, buffer=nl.psum, name="a_t")
                nisa.nc_transpose(dst=a_t, data=a_rows[0:mcs, kt * TILE_K : kt * TILE_K + ksz])
                nisa.tensor_copy(dst=at_blk[0:ksz, kt, mc : mc + mcs], src=a_t)
    else:
        for kt in range(n_kt):
            ksz = min(TILE_K, ks_blk - kt * TILE_K)
            src = a[m0 : m0 + ms_blk, k0 + kt * TILE_K : k0 + kt * TILE_K + ksz]
            if transpose == "dma":
                nisa.dma_transpose(dst=at_blk[0:ksz, kt, 0:ms_blk], src=src)
            else:
                nisa.dma_copy(dst=at_blk[0:ksz, kt, 0:ms_blk], src=src.permute((1, 0)))


@nki.jit
def forward(
    a, b, block_m=4, block_n=2, block_k=8, stationary="a", accumulate="sbuf", transpose="pe"
):
    """``C = A @ B`` for ``A [M, K]`` and ``B [K, N]`` in HBM; returns ``C [M, N]`` (A's dtype).

    The tunables are compile-time arguments (see :class:`MatmulConfig`).
    """
    M, K = a.shape
    K_b, N = b.shape
    assert K == K_b, f"matmul: b.shape[0] must equal a.shape[1] ({K}), got {K_b}"
    out = nl.ndarray((M, N), dtype=a.dtype, buffer=nl.shared_hbm, name="c")

    a_stationary = stationary == "a"
    # Output tiles: (partition extent, free extent) = (M, N) tiles for "a", (N, M) for "b".
    tile_m = STATIONARY_F if a_stationary else MOVING_F
    tile_n = MOVING_F if a_stationary else STATIONARY_F
    blk_m, blk_n, blk_k = block_m * tile_m, block_n * tile_n, block_k * TILE_K
    # PE transposes keep the input dtype in PSUM from NeuronCore-v3 (bit-accurate mode);
    # NeuronCore-v2 transposes through an fp32 matmul.
    psum_dtype = a.dtype if nisa.get_nc_version() >= nisa.nc_version.gen3 else nl.float32
    n_kb = _ceil_div(K, blk_k)
    kt_alloc = min(block_k, _ceil_div(K, TILE_K))
    k_rows = min(TILE_K, K)

    for m0 in range(0, M, blk_m):
        ms_blk = min(blk_m, M - m0)
        for n0 in range(0, N, blk_n):
            ns_blk = min(blk_n, N - n0)
            # Output tiles of this block, indexed [p][q]: p along the partition side.
            p_ext, q_ext = (ms_blk, ns_blk) if a_stationary else (ns_blk, ms_blk)
            p_tile, q_tile = (tile_m, tile_n) if a_stationary else (tile_n, tile_m)
            n_p, n_q = _ceil_div(p_ext, p_tile), _ceil_div(q_ext, q_tile)
            p_alloc, q_alloc = min(p_tile, p_ext), min(q_tile, q_ext)

            sums = []  # PSUM tiles over all of K ("psum") or fp32 SBUF accumulators ("sbuf")
            for p in range(n_p):
                if accumulate == "psum":
                    row = []
                    for q in range(n_q):
                        row.append(
                            nl.ndarray(
                                (p_alloc, q_alloc), dtype=nl.float32, buffer=nl.psum, name="c_psum"
                            )
                        )
                    sums.append(row)
                elif n_kb > 1:
                    sums.append(
                        nl.ndarray((p_alloc, q_ext), dtype=nl.float32, buffer=nl.sbuf, name="c_acc")
                    )

            staged = []  # output rows in C's dtype, one DMA per partition tile
            for p in range(n_p):
                if accumulate == "sbuf" and n_kb > 1 and out.dtype == nl.float32:
                    staged.append(sums[p])  # fp32 accumulators are the output already
                else:
                    staged.append(
                        nl.ndarray((p_alloc, q_ext), dtype=out.dtype, buffer=nl.sbuf, name="c_out")
                    )

            for kb in range(n_kb):
                k0 = kb * blk_k
                ks_blk = min(blk_k, K - k0)
                n_kt = _ceil_div(ks_blk, TILE_K)
                b_blk = nl.ndarray(
                    (k_rows, kt_alloc, ns_blk), dtype=b.dtype, buffer=nl.sbuf, name="b_blk"
                )
                for kt in range(n_kt):
                    ksz = min(TILE_K, ks_blk - kt * TILE_K)
                    nisa.dma_copy(
                        dst=b_blk[0:ksz, kt, 0:ns_blk],
                        src=b[k0 + kt * TILE_K : k0 + kt * TILE_K + ksz, n0 : n0 + ns_blk],
                    )
                at_blk = nl.ndarray(
                    (k_rows, kt_alloc, ms_blk), dtype=a.dtype, buffer=nl.sbuf, name="at_blk"
                )
                _load_a_transposed(a, at_blk, m0, ms_blk, k0, ks_blk, transpose, psum_dtype)

                for p in range(n_p):
                    po = p * p_tile
                    psz = min(p_tile, p_ext - po)
                    for q in range(n_q):
                        qo = q * q_tile
                        qsz = min(q_tile, q_ext - qo)
                        # (offset, size) of this output tile along M and along N
                        mo, msz, no, nsz = (
                            (po, psz, qo, qsz) if a_stationary else (qo, qsz, po, psz)
                        )
                        if accumulate == "psum":
                            acc = sums[p][q]
                        else:
                            acc = nl.ndarray(
                                (p_alloc, q_alloc), dtype=nl.float32, buffer=nl.psum, name="c_part"
                            )
                        for kt in range(n_kt):
                            ksz = min(TILE_K, ks_blk - kt * TILE_K)
                            at_tile = at_blk[0:ksz, kt, mo : mo + msz]
                            b_tile = b_blk[0:ksz, kt, no : no + nsz]
                            nisa.nc_matmul(
                                dst=acc[0:psz, 0:qsz],
                                stationary=at_tile if a_stationary else b_tile,
                                moving=b_tile if a_stationary else at_tile,
                                accumulate=(kb > 0 or kt > 0) if accumulate == "psum" else kt > 0,
                            )
                        if accumulate == "sbuf":
                            if n_kb == 1:
                                nisa.tensor_copy(
                                    dst=staged[p][0:psz, qo : qo + qsz], src=acc[0:psz, 0:qsz]
                                )
                            elif kb == 0:
                                nisa.tensor_copy(
                                    dst=sums[p][0:psz, qo : qo + qsz], src=acc[0:psz, 0:qsz]
                                )
                            else:
                                nisa.tensor_tensor(
                                    dst=sums[p][0:psz, qo : qo + qsz],
                                    data1=sums[p][0:psz, qo : qo + qsz],
                                    data2=acc[0:psz, 0:qsz],
                                    op=nl.add,
                                )

            for p in range(n_p):
                po = p * p_tile
                psz = min(p_tile, p_ext - po)
                for q in range(n_q):
                    qo = q * q_tile
                    qsz = min(q_tile, q_ext - qo)
                    if accumulate == "psum":
                        nisa.tensor_copy(
                            dst=staged[p][0:psz, qo : qo + qsz], src=sums[p][q][0:psz, 0:qsz]
                        )
                    elif n_kb > 1 and out.dtype != nl.float32:
                        nisa.tensor_copy(
                            dst=staged[p][0:psz, qo : qo + qsz], src=sums[p][0:psz, qo : qo + qsz]
                        )
                if a_stationary:
                    nisa.dma_copy(
                        dst=out[m0 + po : m0 + po + psz, n0 : n0 + ns_blk],
                        src=staged[p][0:psz, 0:ns_blk],
                    )
                else:
                    # C^T rows (N on partitions) go back through a transposing access pattern.
                    nisa.dma_copy(
                        dst=out[m0 : m0 + ms_blk, n0 + po : n0 + po + psz].permute((1, 0)),
                        src=staged[p][0:psz, 0:ms_blk],
                    )
    return out


# -- op-level glue: shapes, limits, reference -------------------------------------------------


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def validate(a, b) -> None:
    """Refuse bad op input before any work: ranks, K agreement, dtypes, devices."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(OP, arg, "must be a torch.Tensor", type(t).__name__)
    if a.dim() < 2:
        raise LimitError(OP, "a rank", "must be >= 2 ([..., M, K])", a.dim(), limit=2)
    if b.dim() != 2:
        raise LimitError(OP, "b rank", "must be 2 ([K, N]; batch a instead)", b.dim(), limit=2)
    if b.shape[0] != a.shape[-1]:
        raise LimitError(
            OP,
            "b.shape[0]",
            f"must equal a.shape[-1] (K = {a.shape[-1]})",
            b.shape[0],
            limit=a.shape[-1],
        )
    for arg, t in (("a", a), ("b", b)):
        if _dtype_name(t) not in DTYPES:
            raise LimitError(
                OP, f"{arg} dtype", f"must be one of {DTYPES}", _dtype_name(t), limit=DTYPES
            )
    if a.dtype != b.dtype:
        raise LimitError(OP, "b dtype", f"must equal a's dtype ({_dtype_name(a)})", _dtype_name(b))
    if a.device != b.device:
        raise LimitError(OP, "b device", f"must equal a's device ({a.device})", str(b.device))


def problem(a, b) -> dict:
    return {"m": math.prod(a.shape[:-1]), "n": b.shape[1], "k": b.shape[0]}


def output_shapes(a, b) -> list:
    return [((*a.shape[:-1], b.shape[1]), a.dtype)]


def reference(a, b, upcast: bool = True):
    """``a @ b`` in plain torch: fp64 when ``upcast``, else in the inputs' dtype."""
    if upcast:
        return torch.matmul(a.double(), b.double())
    return torch.matmul(a, b)


def sbuf_bytes(problem: dict, dtype: str, config: MatmulConfig) -> int:
    """Peak SBUF bytes per partition the kernel holds for this problem (its tile plan)."""
    m, n, k = problem["m"], problem["n"], problem["k"]
    item = _ITEMSIZE[dtype]
    a_stationary = config.stationary == "a"
    tile_m, tile_n = (STATIONARY_F, MOVING_F) if a_stationary else (MOVING_F, STATIONARY_F)
    ms_blk, ns_blk = min(config.block_m * tile_m, m), min(config.block_n * tile_n, n)
    blk_k = config.block_k * TILE_K
    kt_alloc = min(config.block_k, _ceil_div(k, TILE_K))
    n_kb = _ceil_div(k, blk_k)
    q_ext = ns_blk if a_stationary else ms_blk
    p_ext = ms_blk if a_stationary else ns_blk
    n_p = _ceil_div(p_ext, tile_m if a_stationary else tile_n)
    total = kt_alloc * ns_blk * item + kt_alloc * ms_blk * item  # B block + A^T block
    if config.transpose == "pe":
        total += min(blk_k, k) * item  # A rows awaiting their PE transpose
    if config.accumulate == "sbuf" and n_kb > 1:
        total += n_p * q_ext * 4  # fp32 accumulators
        if dtype != "float32":
            total += n_p * q_ext * item  # staged output in C's dtype
    else:
        total += n_p * q_ext * item
    return total


def psum_banks(problem: dict, config: MatmulConfig) -> int:
    """PSUM banks the kernel holds at once (each output tile is one 2 KiB fp32 bank)."""
    m, n = problem["m"], problem["n"]
    a_stationary = config.stationary == "a"
    tile_m, tile_n = (STATIONARY_F, MOVING_F) if a_stationary else (MOVING_F, STATIONARY_F)
    ms_blk, ns_blk = min(config.block_m * tile_m, m), min(config.block_n * tile_n, n)
    tiles = _ceil_div(ms_blk, tile_m) * _ceil_div(ns_blk, tile_n)
    held = tiles if config.accumulate == "psum" else 1
    return held + (1 if config.transpose == "pe" else 0)


def check(problem: dict, dtype: str, config: MatmulConfig, target: str) -> None:
    """Raise LimitError when ``config`` cannot run ``problem`` in ``dtype`` on ``target``."""
    tg = target_from_name(target)
    if dtype not in DTYPES:
        raise LimitError(OP, "dtype", f"must be one of {DTYPES}", dtype, limit=DTYPES)
    for dim in ("m", "n", "k"):
        if problem[dim] < 1:
            raise LimitError(OP, dim, "must be >= 1", problem[dim], limit=1)
    if config.transpose == "dma":
        if not tg.has_dma_transpose:
            raise LimitError(
                OP,
                "config transpose",
                f"must not be 'dma' on {tg.name} (DMA transpose needs trn2+)",
                "dma",
            )
        if _ITEMSIZE[dtype] != 2:
            raise LimitError(
                OP,
                "config transpose",
                "must not be 'dma' for a 4-byte dtype (DMA transpose is 2-byte)",
                f"dma with {dtype}",
            )
    banks = psum_banks(problem, config)
    if banks > tg.psum_num_banks:
        raise LimitError(
            OP,
            "PSUM banks",
            f"must be <= {tg.psum_num_banks} ({tg.name})",
            banks,
            limit=tg.psum_num_banks,
            hint="lower block_m * block_n or accumulate in SBUF",
        )
    need = sbuf_bytes(problem, dtype, config)
    if need > tg.sbuf_usable_bytes:
        raise LimitError(
            OP,
            "SBUF bytes per partition",
            f"must be <= {tg.sbuf_usable_bytes} ({tg.name})",
            need,
            limit=tg.sbuf_usable_bytes,
            hint="lower block_k or the block sizes",
        )


# -- launch from torch -----------------------------------------------------------------------


def launch(a: torch.Tensor, b: torch.Tensor, *, config: MatmulConfig, runner) -> torch.Tensor:
    """Run the kernel for ``a [..., M, K] @ b [K, N]``: batch dims fold into M (B is shared)."""
    *batch, m, k = a.shape
    n = b.shape[1]
    rows = math.prod(batch) * m
    if rows == 0 or n == 0 or k == 0:
        return torch.zeros((*batch, m, n), dtype=a.dtype, device=a.device)
    a2 = a.reshape(rows, k).contiguous()
    out = runner(forward, a2, b.contiguous(), **config.to_dict())
    return out.reshape(*batch, m, n)


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """Inputs whose products sum to O(1): entries ~ N(0, 1/sqrt(K)) each."""
    m, n, k = problem["m"], problem["n"], problem["k"]
    scale = k**-0.25
    a = (torch.randn(m, k, generator=generator) * scale).to(getattr(torch, dtype))
    b = (torch.randn(k, n, generator=generator) * scale).to(getattr(torch, dtype))
    return a, b


def parse_shape(text: str) -> dict:
    """``"MxNxK"`` (e.g. ``4096x4096x4096``) -> problem dict."""
    parts = text.lower().replace(",", "x").split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise LimitError(OP, "shape", "must be MxNxK (three positive ints)", text)
    m, n, k = (int(p) for p in parts)
    return {"m": m, "n": n, "k": k}


def shape_bucket(problem: dict) -> str:
    """Each dim rounded up to a power of two (at least 128): configs transfer within a bucket."""

    def up(x):
        return max(128, 1 << (max(1, x) - 1).bit_length())

    return f"m{up(problem['m'])}_n{up(problem['n'])}_k{up(problem['k'])}"


def _setup_context(ctx, a, b, output):
    ctx.save_for_backward(a, b)


def _backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = torch.ops.neuron.matmul(grad.contiguous(), b.t().contiguous())
    if ctx.needs_input_grad[1]:
        k, n = b.shape
        grad_b = torch.ops.neuron.matmul(
            a.reshape(-1, k).t().contiguous(), grad.reshape(-1, n).contiguous()
        )
    return grad_a, grad_b


def _bad_inputs():
    """One bad input per op-boundary limit: (args, the argument the error must name)."""
    f = torch.zeros
    return [
        ((f(4), f(4, 3)), "a rank"),
        ((f(2, 4), f(2, 4, 3)), "b rank"),
        ((f(2, 4), f(5, 3)), "b.shape[0]"),
        ((f(2, 4, dtype=torch.float64), f(4, 3, dtype=torch.float64)), "a dtype"),
        ((f(2, 4), f(4, 3, dtype=torch.bfloat16)), "b dtype"),
        ((f(2, 4), f(4, 3, device="meta")), "b device"),
    ]


SPEC = register(
    OpSpec(
        name=OP,
        config=MatmulConfig,
        launch=launch,
        reference=reference,
        validate=validate,
        problem=problem,
        check=check,
        output_shapes=output_shapes,
        tolerances={
            # Inputs are exact in fp64, so the only errors are fp32 accumulation over K
            # (~sqrt(K) * 2^-24 for O(1) partial sums; << 1e-4 for K <= 4096) and the one
            # final rounding to the output dtype (<= 0.5 ulp = 2^-8 / 2^-11 / 2^-24 relative).
            "float32": Tolerance(1e-4, 2**-20, "fp32 accumulation over K, final fp32 rounding"),
            "bfloat16": Tolerance(
                1e-4, 2**-7, "one bf16 rounding of an fp32 sum: 2x the 0.5-ulp bound"
            ),
            "float16": Tolerance(
                1e-4, 2**-10, "one fp16 rounding of an fp32 sum: 2x the 0.5-ulp bound"
            ),
        },
        make_inputs=make_inputs,
        parse_shape=parse_shape,
        shape_bucket=shape_bucket,
        test_problems={
            "ranges": {"m": (1, 300), "n": (1, 700), "k": (1, 300)},
            "edges": (1, 127, 128, 129, 511, 512, 513),
            "probe": {"m": 130, "n": 520, "k": 260},  # every config runs here, checked
            "large": {"m": 2048, "n": 2048, "k": 1024},  # budgets bind here (trace-only runs)
        },
        dtypes=DTYPES,
        kernels=(forward,),
        autograd=(_setup_context, _backward),
        bad_inputs=_bad_inputs,
        description="C = A @ B on the Tensor Engine",
    )
)
