"""Flash attention backward on Trainium: ``(dq, dk, dv)`` from ``(dout, q, k, v, out, lse)``,
and the ``flash_attention_bwd`` op declaration.

The contract (layout BHSD, ``lse [B, H, Sq]`` fp32 with the scale included, bottom-right
causal, fully masked rows, GQA) is the forward's: see :mod:`.flash_attention`.

FlashAttention 2's backward, tile by tile, never holding an ``Sq x Sk`` matrix anywhere:
for a query tile ``i`` (queries on partitions) and a key tile ``j``,

    S   = Q_i K_j^T                        TensorE, PSUM (contraction over D on partitions)
    P   = exp(scale * S - lse_i)           ScalarE, reading PSUM; masked entries set to 0
    dP  = dO_i V_j^T                       TensorE, PSUM
    dS  = P * (dP - D_i),  D_i = rowsum(dO_i * O_i)          VectorE
    dV_j += P^T dO_i,  dK_j += dS^T Q_i,  dQ_i += dS K_j     TensorE (dS^T by a transpose)

with ``scale`` applied once to dK and dQ at the end. Per KV head, the query heads that share
it run one after the other, so dK and dV are summed over them in fp32 SBUF accumulators.
Every accumulation happens in program order (PSUM accumulation groups and SBUF adds in a
fixed sequence), so the result is bitwise reproducible for a given input and config.

Causal tiles that no query of the tile can see are skipped at trace time: no instruction is
issued for them. Query rows that see no key at all (``Sq > Sk``) get ``dq = 0`` and add
nothing to dK/dV: their ``lse = -inf`` makes ``exp`` overflow before the mask, and the mask
replaces every one of their entries with 0. Remainder tiles are views of full tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.flash_attention import (
    attention_reference,
    causal_visible,
    resolve_scale,
    validate_attention,
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

__all__ = [
    "SPEC",
    "FlashAttentionBwdConfig",
    "FlashAttentionBwdPlan",
    "backward",
    "plan",
    "reference",
    "run_kernels",
]

OP = "flash_attention_bwd"


@dataclass(frozen=True)
class FlashAttentionBwdConfig(TunableConfig):
    """Tile-level choices of the attention backward kernel.

    Attributes:
        tile_k: keys per tile: the partition extent of the dK/dV tiles and the free extent
            of the score tiles (queries are always 128 per tile, on partitions).
        q_block: query tiles whose Q, dO (both orientations), lse, D and dQ stay in SBUF
            for one pass over the keys; the longer the block, the fewer K/V reloads.
        loop_order: "kv_outer" loops keys outside queries within a pass: dK/dV sum in PSUM
            over the pass and dQ folds into fp32 SBUF accumulators per tile pair;
            "q_outer" holds every K/V tile of the KV head in SBUF, loops queries outside
            keys: dQ sums in PSUM and dK/dV fold into SBUF per tile pair.
        transpose: where the transposes happen (Q^T, dO^T, K^T, V^T from their rows, and
            dS^T for dQ): "pe" on TensorE through PSUM; "dma" by DMA transposes (2-byte
            dtypes, trn2+); "vector" loads like "pe" but transposes dS in 32x32 blocks on
            VectorE, freeing TensorE and a PSUM bank.
    """

    op_name = OP

    tile_k: int = tunable(
        128, (64, 128), "correctness: 128 keys fill the partitions of the dK/dV tiles"
    )
    q_block: int = tunable(
        16,
        (4, 16, 64),
        "correctness: 2048 query rows per pass keep SBUF under half full at D=128, S=4096",
    )
    loop_order: str = tunable(
        "kv_outer",
        ("kv_outer", "q_outer"),
        "correctness: one SBUF add per tile pair (dQ) instead of two (dK and dV)",
    )
    transpose: str = tunable(
        "pe", ("pe", "dma", "vector"), "correctness: the transpose every dtype and target has"
    )


# -- the tile plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class FlashAttentionBwdPlan(nl.NKIObject):
    """Tiles, loop order and budgets of one attention backward, derived once by :func:`plan`
    from (problem, dtype, config, target) and read by the kernel and the budget check."""

    b: int
    hkv: int
    groups: int  # query heads per KV head
    sq: int
    sk: int
    d: int
    causal: bool
    tile_q: int  # query rows per tile (partitions of the score tiles)
    tile_k: int  # keys per tile
    q_block: int  # query tiles per pass
    d_tile: int  # rows of one contraction chunk over D (<= pmax)
    d_chunks: int  # contraction chunks over D
    loop_order: str  # "kv_outer" or "q_outer"
    transpose: str  # "pe", "dma" or "vector"
    vector_transpose: int  # VectorE transpose block (32)
    pe_transpose_keeps_dtype: bool  # PE transposes write the input dtype to PSUM (v3+)
    sbuf_bytes: int
    psum_banks: int


def plan(problem: dict, dtype: str, config: FlashAttentionBwdConfig, target: Target):
    """The tile plan of ``config`` for ``problem`` in ``dtype`` on ``target``.

    Raises:
        LimitError: DMA transposes on a target or dtype that has none.
    """
    if config.transpose == "dma":
        if not target.has_dma_transpose:
            raise LimitError(
                OP,
                "config transpose",
                f"must not be 'dma' on {target.name} (DMA transpose needs trn2+)",
                "dma",
            )
        if ITEMSIZE[dtype] != 2:
            raise LimitError(
                OP,
                "config transpose",
                "must not be 'dma' for a 4-byte dtype (DMA transpose is 2-byte)",
                f"dma with {dtype}",
            )
    b, hkv, groups = problem["b"], problem["hkv"], problem["groups"]
    sq, sk, d = problem["sq"], problem["sk"], problem["d"]
    item = ITEMSIZE[dtype]
    tq = target.pmax
    tk = min(config.tile_k, target.pmax)
    d_tile = min(d, target.pmax)
    d_chunks = ceil_div(d, target.pmax)
    n_qt = min(config.q_block, ceil_div(sq, tq))  # query tiles held per pass
    rows = min(config.q_block * tq, sq)
    n_kt = ceil_div(sk, tk)
    keys = min(tk, sk)

    # SBUF bytes per partition, the live tiles at the peak (an upper bound).
    q_side = 2 * n_qt * d * item  # Q and dO rows
    q_side += 2 * d_chunks * rows * item  # Q^T and dO^T
    q_side += 2 * n_qt * 4  # -lse and D columns
    q_side += d * item + d * 4  # one O tile and its product with dO (for D)
    if config.loop_order == "kv_outer":
        q_side += n_qt * d * 4  # dQ accumulators
        kv_side = d * item + 2 * d_chunks * keys * item  # K rows, K^T, V^T
    else:
        kv_side = n_kt * d * item + 2 * d_chunks * sk * item  # every K/V tile of the head
    kv_side += d * item  # V rows awaiting their transpose
    group = 2 * n_kt * d * 4  # dK and dV fp32 accumulators over the query heads
    pair = 2 * keys * item + tq * item  # P, dS and dS^T of one tile pair
    staging = d * item  # one output tile in the output dtype
    sbuf = q_side + kv_side + group + pair + staging

    # PSUM: S and dP, the dQ and dK/dV sums (3 tiles: one sum, two partials or the reverse),
    # the dS^T of a PE transpose, and one bank for the PE transposes of the loads.
    banks = 2 + 3 + (config.transpose == "pe") + (config.transpose != "dma")
    return FlashAttentionBwdPlan(
        b=b,
        hkv=hkv,
        groups=groups,
        sq=sq,
        sk=sk,
        d=d,
        causal=bool(problem.get("causal", False)),
        tile_q=tq,
        tile_k=tk,
        q_block=config.q_block,
        d_tile=d_tile,
        d_chunks=d_chunks,
        loop_order=config.loop_order,
        transpose=config.transpose,
        vector_transpose=target.vector_transpose_max,
        pe_transpose_keeps_dtype=target.has_transpose_mode,
        sbuf_bytes=sbuf,
        psum_banks=banks,
    )


# -- the NKI kernel ----------------------------------------------------------------------


def _load_rows(src, rows_dst, t_dst, n, plan, psum_dtype):
    """Copy ``src [n, D]`` (HBM) into ``rows_dst [n, D]`` and its transpose into the
    D-chunk views ``t_dst[c] [d_tile, n]`` (SBUF); ``rows_dst`` may be None (V)."""
    d = plan.d
    dt = plan.d_tile
    if plan.transpose == "dma":
        if rows_dst is not None:
            nisa.dma_copy(dst=rows_dst, src=src)
        for c in range(plan.d_chunks):
            dcs = min(dt, d - c * dt)
            nisa.dma_transpose(dst=t_dst[c][0:dcs, 0:n], src=src[0:n, c * dt : c * dt + dcs])
        return
    if rows_dst is None:
        rows_dst = nl.ndarray((n, d), dtype=src.dtype, buffer=nl.sbuf, name="rows")
    nisa.dma_copy(dst=rows_dst, src=src)
    for c in range(plan.d_chunks):
        dcs = min(dt, d - c * dt)
        tp = nl.ndarray((dcs, n), dtype=psum_dtype, buffer=nl.psum, name="load_t")
        nisa.nc_transpose(dst=tp, data=rows_dst[0:n, c * dt : c * dt + dcs])
        nisa.tensor_copy(dst=t_dst[c][0:dcs, 0:n], src=tp)


def _transpose_ds(ds, n_q, n_k, plan, psum_dtype):
    """``dS^T [n_k, n_q]`` in SBUF from ``dS [n_q, n_k]`` (SBUF), on the configured engine."""
    dst = nl.ndarray((plan.tile_k, plan.tile_q), dtype=ds.dtype, buffer=nl.sbuf, name="ds_t")
    if plan.transpose == "pe":
        tp = nl.ndarray((n_k, n_q), dtype=psum_dtype, buffer=nl.psum, name="ds_t_psum")
        nisa.nc_transpose(dst=tp, data=ds[0:n_q, 0:n_k])
        nisa.tensor_copy(dst=dst[0:n_k, 0:n_q], src=tp)
    elif plan.transpose == "dma":
        nisa.dma_transpose(dst=dst[0:n_k, 0:n_q], src=ds[0:n_q, 0:n_k])
    else:
        blk = plan.vector_transpose
        for p0 in range(0, n_q, blk):
            ps = min(blk, n_q - p0)
            for f0 in range(0, n_k, blk):
                fs = min(blk, n_k - f0)
                nisa.nc_transpose(
                    dst=dst[f0 : f0 + fs, p0 : p0 + ps],
                    data=ds[p0 : p0 + ps, f0 : f0 + fs],
                    engine=nisa.engine.vector,
                )
    return dst


def _visibility(q0, n_q, k0, n_k, plan):
    """ "none" (skip the pair), "all" (no mask) or "some" (mask on the diagonal) for the
    queries ``[q0, q0 + n_q)`` and keys ``[k0, k0 + n_k)``: a trace-time decision."""
    if not plan.causal:
        return "all"
    off = plan.sk - plan.sq  # query i sees key j iff j <= i + off (bottom-right)
    if k0 > q0 + n_q - 1 + off:
        return "none"
    if k0 + n_k - 1 <= q0 + off:
        return "all"
    return "some"


def _tile_pair(qs, t, kv, j, n_q, n_k, q0, k0, seen, scale, plan, psum_dtype):
    """Recompute P and dS of one (query tile, key tile) pair; returns ``(p, ds, ds_t)`` SBUF
    tiles (``[n_q, n_k]``, ``[n_q, n_k]``, ``[n_k, n_q]``)."""
    tq, tk, dt = plan.tile_q, plan.tile_k, plan.d_tile
    dtype = qs["q"].dtype
    s = nl.ndarray((tq, tk), dtype=nl.float32, buffer=nl.psum, name="s")
    for c in range(plan.d_chunks):
        dcs = min(dt, plan.d - c * dt)
        nisa.nc_matmul(
            dst=s[0:n_q, 0:n_k],
            stationary=qs["q_t"][0:dcs, c, t * tq : t * tq + n_q],
            moving=kv["k_t"][0:dcs, c, j * tk : j * tk + n_k],
            accumulate=c > 0,
        )
    p = nl.ndarray((tq, tk), dtype=dtype, buffer=nl.sbuf, name="p")
    nisa.activation(
        dst=p[0:n_q, 0:n_k],
        op=nl.exp,
        data=s[0:n_q, 0:n_k],
        bias=qs["neg_lse"][0:n_q, t : t + 1],
        scale=scale,
    )
    if seen == "some":
        # Keep key k0 + f for query q0 + p iff (q0 + p + Sk - Sq) - (k0 + f) >= 0.
        nisa.affine_select(
            dst=p[0:n_q, 0:n_k],
            pattern=[[-1, n_k]],
            channel_multiplier=1,
            on_true_tile=p[0:n_q, 0:n_k],
            on_false_value=0.0,
            cmp_op=nl.greater_equal,
            offset=q0 + plan.sk - plan.sq - k0,
        )
    dp = nl.ndarray((tq, tk), dtype=nl.float32, buffer=nl.psum, name="dp")
    for c in range(plan.d_chunks):
        dcs = min(dt, plan.d - c * dt)
        nisa.nc_matmul(
            dst=dp[0:n_q, 0:n_k],
            stationary=qs["do_t"][0:dcs, c, t * tq : t * tq + n_q],
            moving=kv["v_t"][0:dcs, c, j * tk : j * tk + n_k],
            accumulate=c > 0,
        )
    ds = nl.ndarray((tq, tk), dtype=dtype, buffer=nl.sbuf, name="ds")
    nisa.scalar_tensor_tensor(
        dst=ds[0:n_q, 0:n_k],
        data=dp[0:n_q, 0:n_k],
        op0=nl.subtract,
        operand0=qs["dvec"][0:n_q, t : t + 1],
        op1=nl.multiply,
        operand1=p[0:n_q, 0:n_k],
    )
    ds_t = _transpose_ds(ds, n_q, n_k, plan, psum_dtype)
    return p, ds, ds_t


def _fold(acc, part, first):
    """``acc = part`` for the first contribution, else ``acc += part`` (VectorE)."""
    if first:
        nisa.tensor_copy(dst=acc, src=part)
    else:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=part, op=nl.add)


def _load_query_pass(dout, q, out, lse, b, h, p0, n_tiles, plan, psum_dtype):
    """SBUF tiles of one pass over query tiles ``p0 .. p0 + n_tiles``: Q and dO rows and
    transposes, ``-lse`` and ``D = rowsum(dO * O)`` columns; tiles no key can reach are
    left unloaded (their dQ is zero)."""
    tq, d = plan.tile_q, plan.d
    rows = n_tiles * tq
    dtype = q.dtype
    qs = {
        "q": nl.ndarray((tq, n_tiles, d), dtype=dtype, buffer=nl.sbuf, name="q_rows"),
        "do": nl.ndarray((tq, n_tiles, d), dtype=dtype, buffer=nl.sbuf, name="do_rows"),
        "q_t": nl.ndarray((plan.d_tile, plan.d_chunks, rows), dtype=dtype, buffer=nl.sbuf),
        "do_t": nl.ndarray((plan.d_tile, plan.d_chunks, rows), dtype=dtype, buffer=nl.sbuf),
        "neg_lse": nl.ndarray((tq, n_tiles), dtype=nl.float32, buffer=nl.sbuf, name="neg_lse"),
        "dvec": nl.ndarray((tq, n_tiles), dtype=nl.float32, buffer=nl.sbuf, name="dvec"),
    }
    for t in range(n_tiles):
        q0 = (p0 + t) * tq
        n_q = min(tq, plan.sq - q0)
        if _visibility(q0, n_q, 0, plan.sk, plan) == "none":
            continue
        q_tv = [qs["q_t"][:, c, t * tq : t * tq + n_q] for c in range(plan.d_chunks)]
        do_tv = [qs["do_t"][:, c, t * tq : t * tq + n_q] for c in range(plan.d_chunks)]
        _load_rows(q[b, h, q0 : q0 + n_q, :], qs["q"][0:n_q, t, :], q_tv, n_q, plan, psum_dtype)
        _load_rows(
            dout[b, h, q0 : q0 + n_q, :], qs["do"][0:n_q, t, :], do_tv, n_q, plan, psum_dtype
        )
        nisa.dma_copy(dst=qs["neg_lse"][0:n_q, t : t + 1], src=lse[b, h, q0 : q0 + n_q])
        nisa.tensor_scalar(
            dst=qs["neg_lse"][0:n_q, t : t + 1],
            data=qs["neg_lse"][0:n_q, t : t + 1],
            op0=nl.multiply,
            operand0=-1.0,
        )
        o_rows = nl.ndarray((tq, d), dtype=out.dtype, buffer=nl.sbuf, name="o_rows")
        nisa.dma_copy(dst=o_rows[0:n_q, :], src=out[b, h, q0 : q0 + n_q, :])
        prod = nl.ndarray((tq, d), dtype=nl.float32, buffer=nl.sbuf, name="do_o")
        nisa.tensor_tensor(
            dst=prod[0:n_q, :], data1=qs["do"][0:n_q, t, :], data2=o_rows[0:n_q, :], op=nl.multiply
        )
        nisa.tensor_reduce(dst=qs["dvec"][0:n_q, t : t + 1], op=nl.add, data=prod[0:n_q, :], axis=1)
    return qs


def _load_kv(k, v, b, hk, j0, n_tiles, plan, psum_dtype):
    """K rows, K^T and V^T of key tiles ``j0 .. j0 + n_tiles`` in SBUF."""
    tk, d = plan.tile_k, plan.d
    keys = min(n_tiles * tk, plan.sk - j0 * tk)
    kv = {
        "k": nl.ndarray((tk, n_tiles, d), dtype=k.dtype, buffer=nl.sbuf, name="k_rows"),
        "k_t": nl.ndarray((plan.d_tile, plan.d_chunks, keys), dtype=k.dtype, buffer=nl.sbuf),
        "v_t": nl.ndarray((plan.d_tile, plan.d_chunks, keys), dtype=v.dtype, buffer=nl.sbuf),
    }
    for j in range(n_tiles):
        k0 = (j0 + j) * tk
        n_k = min(tk, plan.sk - k0)
        k_tv = [kv["k_t"][:, c, j * tk : j * tk + n_k] for c in range(plan.d_chunks)]
        v_tv = [kv["v_t"][:, c, j * tk : j * tk + n_k] for c in range(plan.d_chunks)]
        _load_rows(k[b, hk, k0 : k0 + n_k, :], kv["k"][0:n_k, j, :], k_tv, n_k, plan, psum_dtype)
        _load_rows(v[b, hk, k0 : k0 + n_k, :], None, v_tv, n_k, plan, psum_dtype)
    return kv


def _store_scaled(dst, acc, n, scale, dtype, d):
    """``dst [n, D]`` (HBM) = ``scale * acc`` rounded to ``dtype``; zeros when ``acc`` is None."""
    staged = nl.ndarray((n, d), dtype=dtype, buffer=nl.sbuf, name="grad_out")
    if acc is None:
        nisa.memset(dst=staged, value=0.0)
    else:
        nisa.tensor_scalar(dst=staged, data=acc, op0=nl.multiply, operand0=scale)
    nisa.dma_copy(dst=dst, src=staged)


@nki.jit
def backward(dout, q, k, v, out, lse, scale, plan):
    """``(dq, dk, dv)`` for attention in BHSD layout (HBM): ``dout, q, out [B, H, Sq, D]``,
    ``k, v [B, Hkv, Sk, D]``, ``lse [B, H, Sq]`` fp32; ``scale`` is the softmax scale
    (a compile-time float) and ``plan`` the :class:`FlashAttentionBwdPlan` for these shapes.
    """
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    assert (B, Hkv, H // Hkv, Sq, Sk, D) == (
        plan.b,
        plan.hkv,
        plan.groups,
        plan.sq,
        plan.sk,
        plan.d,
    ), "flash_attention_bwd: the plan was made for other shapes"
    dq = nl.ndarray((B, H, Sq, D), dtype=q.dtype, buffer=nl.shared_hbm, name="dq")
    dk = nl.ndarray((B, Hkv, Sk, D), dtype=k.dtype, buffer=nl.shared_hbm, name="dk")
    dv = nl.ndarray((B, Hkv, Sk, D), dtype=v.dtype, buffer=nl.shared_hbm, name="dv")

    tq, tk = plan.tile_q, plan.tile_k
    n_qt, n_kt = (Sq + tq - 1) // tq, (Sk + tk - 1) // tk
    kv_outer = plan.loop_order == "kv_outer"
    # PE transposes keep the input dtype in PSUM from NeuronCore-v3 (bit-accurate mode);
    # NeuronCore-v2 transposes through an fp32 matmul.
    psum_dtype = q.dtype if plan.pe_transpose_keeps_dtype else nl.float32

    for b in range(B):
        for hk in range(Hkv):
            # dK and dV of this KV head, summed over its query heads and query tiles (fp32).
            dk_acc = nl.ndarray((tk, n_kt, D), dtype=nl.float32, buffer=nl.sbuf, name="dk_acc")
            dv_acc = nl.ndarray((tk, n_kt, D), dtype=nl.float32, buffer=nl.sbuf, name="dv_acc")
            kv_started = [False] * n_kt
            kv_all = None
            if not kv_outer:
                kv_all = _load_kv(k, v, b, hk, 0, n_kt, plan, psum_dtype)
            for g in range(plan.groups):
                h = hk * plan.groups + g
                for p0 in range(0, n_qt, plan.q_block):
                    n_tiles = min(plan.q_block, n_qt - p0)
                    qs = _load_query_pass(dout, q, out, lse, b, h, p0, n_tiles, plan, psum_dtype)
                    dq_acc = None
                    if kv_outer:
                        dq_acc = nl.ndarray(
                            (tq, n_tiles, D), dtype=nl.float32, buffer=nl.sbuf, name="dq_acc"
                        )
                    q_started = [False] * n_tiles
                    if kv_outer:
                        for j in range(n_kt):
                            k0 = j * tk
                            n_k = min(tk, Sk - k0)
                            pairs = []
                            for t in range(n_tiles):
                                q0 = (p0 + t) * tq
                                n_q = min(tq, Sq - q0)
                                seen = _visibility(q0, n_q, k0, n_k, plan)
                                if seen != "none":
                                    pairs.append((t, q0, n_q, seen))
                            if len(pairs) == 0:
                                continue
                            kv = _load_kv(k, v, b, hk, j, 1, plan, psum_dtype)
                            dk_ps = nl.ndarray((tk, D), dtype=nl.float32, buffer=nl.psum)
                            dv_ps = nl.ndarray((tk, D), dtype=nl.float32, buffer=nl.psum)
                            for n, pair in enumerate(pairs):
                                t, q0, n_q, seen = pair
                                p, ds, ds_t = _tile_pair(
                                    qs, t, kv, 0, n_q, n_k, q0, k0, seen, scale, plan, psum_dtype
                                )
                                nisa.nc_matmul(
                                    dst=dv_ps[0:n_k, :],
                                    stationary=p[0:n_q, 0:n_k],
                                    moving=qs["do"][0:n_q, t, :],
                                    accumulate=n > 0,
                                )
                                nisa.nc_matmul(
                                    dst=dk_ps[0:n_k, :],
                                    stationary=ds[0:n_q, 0:n_k],
                                    moving=qs["q"][0:n_q, t, :],
                                    accumulate=n > 0,
                                )
                                dq_ps = nl.ndarray((tq, D), dtype=nl.float32, buffer=nl.psum)
                                nisa.nc_matmul(
                                    dst=dq_ps[0:n_q, :],
                                    stationary=ds_t[0:n_k, 0:n_q],
                                    moving=kv["k"][0:n_k, 0, :],
                                    accumulate=False,
                                )
                                _fold(dq_acc[0:n_q, t, :], dq_ps[0:n_q, :], not q_started[t])
                                q_started[t] = True
                            _fold(dk_acc[0:n_k, j, :], dk_ps[0:n_k, :], not kv_started[j])
                            _fold(dv_acc[0:n_k, j, :], dv_ps[0:n_k, :], not kv_started[j])
                            kv_started[j] = True
                    for t in range(n_tiles):
                        q0 = (p0 + t) * tq
                        n_q = min(tq, Sq - q0)
                        dq_ps = None
                        if not kv_outer:
                            dq_ps = nl.ndarray((tq, D), dtype=nl.float32, buffer=nl.psum)
                            n = 0
                            for j in range(n_kt):
                                k0 = j * tk
                                n_k = min(tk, Sk - k0)
                                seen = _visibility(q0, n_q, k0, n_k, plan)
                                if seen == "none":
                                    continue
                                p, ds, ds_t = _tile_pair(
                                    qs,
                                    t,
                                    kv_all,
                                    j,
                                    n_q,
                                    n_k,
                                    q0,
                                    k0,
                                    seen,
                                    scale,
                                    plan,
                                    psum_dtype,
                                )
                                nisa.nc_matmul(
                                    dst=dq_ps[0:n_q, :],
                                    stationary=ds_t[0:n_k, 0:n_q],
                                    moving=kv_all["k"][0:n_k, j, :],
                                    accumulate=n > 0,
                                )
                                n += 1
                                dv_ps = nl.ndarray((tk, D), dtype=nl.float32, buffer=nl.psum)
                                nisa.nc_matmul(
                                    dst=dv_ps[0:n_k, :],
                                    stationary=p[0:n_q, 0:n_k],
                                    moving=qs["do"][0:n_q, t, :],
                                    accumulate=False,
                                )
                                _fold(dv_acc[0:n_k, j, :], dv_ps[0:n_k, :], not kv_started[j])
                                dk_ps = nl.ndarray((tk, D), dtype=nl.float32, buffer=nl.psum)
                                nisa.nc_matmul(
                                    dst=dk_ps[0:n_k, :],
                                    stationary=ds[0:n_q, 0:n_k],
                                    moving=qs["q"][0:n_q, t, :],
                                    accumulate=False,
                                )
                                _fold(dk_acc[0:n_k, j, :], dk_ps[0:n_k, :], not kv_started[j])
                                kv_started[j] = True
                            q_started[t] = n > 0
                        if q_started[t]:
                            src = dq_acc[0:n_q, t, :] if kv_outer else dq_ps[0:n_q, :]
                        else:
                            src = None
                        _store_scaled(dq[b, h, q0 : q0 + n_q, :], src, n_q, scale, dq.dtype, D)
            for j in range(n_kt):
                k0 = j * tk
                n_k = min(tk, Sk - k0)
                started = kv_started[j]
                dk_src = dk_acc[0:n_k, j, :] if started else None
                dv_src = dv_acc[0:n_k, j, :] if started else None
                _store_scaled(dk[b, hk, k0 : k0 + n_k, :], dk_src, n_k, scale, dk.dtype, D)
                _store_scaled(dv[b, hk, k0 : k0 + n_k, :], dv_src, n_k, 1.0, dv.dtype, D)
    return dq, dk, dv


# -- op-level glue: shapes, limits, reference -------------------------------------------------


def validate(dout, q, k, v, out, lse, causal=False, softmax_scale=None) -> None:
    """Refuse bad op input before any work: the attention checks on (q, k, v), then dout and
    out shaped, typed and placed as q, and lse ``[B, H, Sq]`` float32 on q's device."""
    validate_attention(OP, q, k, v, causal, softmax_scale)
    for arg, t in (("dout", dout), ("out", out), ("lse", lse)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(OP, arg, "must be a torch.Tensor", type(t).__name__)
    for arg, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != tuple(q.shape):
            raise LimitError(
                OP, f"{arg} shape", f"must equal q's shape {tuple(q.shape)}", tuple(t.shape)
            )
        if t.dtype != q.dtype:
            raise LimitError(
                OP, f"{arg} dtype", f"must equal q's dtype ({dtype_name(q)})", dtype_name(t)
            )
    want = tuple(q.shape[:3])
    if tuple(lse.shape) != want:
        raise LimitError(OP, "lse shape", f"must be [B, H, Sq] = {want}", tuple(lse.shape))
    if lse.dtype != torch.float32:
        raise LimitError(OP, "lse dtype", "must be float32", dtype_name(lse))
    for arg, t in (("dout", dout), ("out", out), ("lse", lse)):
        if t.device != q.device:
            raise LimitError(
                OP, f"{arg} device", f"must equal q's device ({q.device})", str(t.device)
            )


def problem(dout, q, k, v, out, lse, causal=False, softmax_scale=None) -> dict:
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    groups = h // hkv if hkv else 0
    return {"b": b, "hkv": hkv, "groups": groups, "sq": sq, "sk": sk, "d": d, "causal": causal}


def reference(dout, q, k, v, out, lse, causal=False, softmax_scale=None, upcast=True):
    """``(dq, dk, dv)`` in plain torch from the given ``out`` and ``lse`` (closed form):
    ``P = exp(scale * QK^T - lse)`` (0 where masked), ``dV = P^T dO``,
    ``dS = P * (dO V^T - rowsum(dO * O))``, ``dQ = scale * dS K``, ``dK = scale * dS^T Q``,
    dK and dV summed over the query heads of each KV head.

    fp64 when ``upcast`` (fp64 outputs), else fp32 math with outputs in the inputs' dtype.
    """
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    groups = h // hkv if hkv else 1
    scale = resolve_scale(softmax_scale, d)
    compute = torch.float64 if upcast else torch.float32
    qc = q.to(compute).reshape(b, hkv, groups, sq, d)
    doc = dout.to(compute).reshape(b, hkv, groups, sq, d)
    oc = out.to(compute).reshape(b, hkv, groups, sq, d)
    lsec = lse.to(compute).reshape(b, hkv, groups, sq, 1)
    kc = k.to(compute).unsqueeze(2)  # [B, Hkv, 1, Sk, D]: broadcast over the group
    vc = v.to(compute).unsqueeze(2)
    logits = torch.matmul(qc, kc.transpose(-1, -2)) * scale  # [B, Hkv, G, Sq, Sk]
    # Fully masked rows (lse = -inf) see no key: any finite shift leaves their P at 0.
    shift = torch.where(torch.isinf(lsec), torch.zeros_like(lsec), lsec)
    p = torch.exp(logits - shift)
    if causal:
        p = p.masked_fill(~causal_visible(sq, sk, q.device), 0.0)
    dv = torch.matmul(p.transpose(-1, -2), doc).sum(dim=2)
    dp = torch.matmul(doc, vc.transpose(-1, -2))
    ds = p * (dp - (doc * oc).sum(dim=-1, keepdim=True))
    dq = (torch.matmul(ds, kc) * scale).reshape(b, h, sq, d)
    dk = (torch.matmul(ds.transpose(-1, -2), qc) * scale).sum(dim=2)
    if not upcast:
        dq, dk, dv = dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    return dq, dk, dv


# -- launch from torch -----------------------------------------------------------------------


def run_kernels(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    config: FlashAttentionBwdConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernel; an empty dimension gives zero gradients without a launch."""
    if 0 in (*q.shape, k.shape[1], k.shape[2]):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    tiles = SPEC.check(
        problem(dout, q, k, v, out, lse, causal), dtype_name(q), config, runner.target
    )
    scale = resolve_scale(softmax_scale, q.shape[3])
    dq, dk, dv = runner(
        backward,
        dout.contiguous(),
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        out.contiguous(),
        lse.contiguous(),
        scale,
        tiles,
    )
    return dq, dk, dv


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """``(dout, q, k, v, out, lse, causal, None)``: q, k, v, dout ~ N(0, 1) in ``dtype``,
    out and lse from the fp64 reference forward (out rounded to ``dtype``, lse fp32)."""
    b, hkv, groups = problem["b"], problem["hkv"], problem["groups"]
    sq, sk, d = problem["sq"], problem["sk"], problem["d"]
    causal = bool(problem.get("causal", False))
    tdt = getattr(torch, dtype)
    h = hkv * groups
    q = torch.randn(b, h, sq, d, generator=generator).to(tdt)
    k = torch.randn(b, hkv, sk, d, generator=generator).to(tdt)
    v = torch.randn(b, hkv, sk, d, generator=generator).to(tdt)
    dout = torch.randn(b, h, sq, d, generator=generator).to(tdt)
    o, lse = attention_reference(q, k, v, causal, None, upcast=True)
    return dout, q, k, v, o.to(tdt), lse.to(torch.float32), causal, None


def _bad_inputs():
    """One bad input per op-boundary limit: (args, the argument the error must name)."""
    f = torch.zeros

    def args(**over):
        base = {
            "dout": f(1, 2, 3, 8),
            "q": f(1, 2, 3, 8),
            "k": f(1, 1, 5, 8),
            "v": f(1, 1, 5, 8),
            "out": f(1, 2, 3, 8),
            "lse": f(1, 2, 3),
        }
        base.update(over)
        return tuple(base.values())

    return [
        (args(q=f(2, 3, 8), dout=f(2, 3, 8), out=f(2, 3, 8)), "q rank"),
        (args(k=f(1, 1, 5, 4)), "k.shape[3]"),
        (args(k=f(1, 3, 5, 8), v=f(1, 3, 5, 8)), "k.shape[1]"),
        (args(v=f(1, 1, 6, 8)), "v.shape[2]"),
        (args(k=f(2, 1, 5, 8), v=f(2, 1, 5, 8)), "k.shape[0]"),
        (args(v=f(1, 1, 5, 8, dtype=torch.bfloat16)), "v dtype"),
        (args(dout=f(1, 2, 4, 8)), "dout shape"),
        (args(out=f(1, 2, 3, 8, dtype=torch.bfloat16)), "out dtype"),
        (args(lse=f(1, 2, 4)), "lse shape"),
        (args(lse=f(1, 2, 3, dtype=torch.bfloat16)), "lse dtype"),
        (args(lse=f(1, 2, 3, device="meta")), "lse device"),
        (args(q=f(1, 2, 3, 300), k=f(1, 1, 5, 300), v=f(1, 1, 5, 300)), "head dim"),
    ]


SPEC = register(
    OpSpec(
        name=OP,
        config=FlashAttentionBwdConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=validate,
        problem=problem,
        tolerances={
            # The reference is the closed form in fp64 from the same (rounded) inputs, out
            # and lse, so only the kernel's arithmetic counts. fp32: fp32 matmuls and exp,
            # PSUM/SBUF sums over <= a few hundred O(1) terms: ~1e-6 relative, 100x slack.
            "float32": Tolerance(1e-4, 1e-4, "fp32 matmuls, exp and sums over the tiles"),
            # 2-byte dtypes: P and dS are rounded to the input dtype before their matmuls
            # (TensorE takes them so), then each gradient is rounded once. The rows of dS sum
            # to 0, so a dK/dQ entry is a heavily cancelling sum of up to ~160 terms (the
            # contract's sizes) of magnitude ~0.5, each off by up to 2^-9 (bf16) / 2^-12
            # (fp16) relative: ~sqrt(160) * 0.5 * 2^-9 = 0.012 (bf16) absolute, x2.5 slack.
            # (First set to 5e-3 / 1e-3 without the cancellation; raised once after the first
            # contract run, where the kernel's error matched PyTorch's own bf16 SDPA's.)
            "bfloat16": Tolerance(
                3e-2, 2**-6, "bf16 P and dS into the matmuls, cancelling sums, bf16 output"
            ),
            "float16": Tolerance(
                4e-3, 2**-8, "fp16 P and dS into the matmuls, cancelling sums, fp16 output"
            ),
        },
        make_inputs=make_inputs,
        test_problems={
            "ranges": {
                "b": (1, 2),
                "hkv": (1, 2),
                "groups": (1, 3),
                "sq": (1, 160),
                "sk": (1, 160),
                "d": (1, 136),
            },
            "edges": (1, 2, 3, 64, 127, 128, 129),
            # every config runs here, checked: causal with Sq > Sk (fully masked rows),
            # GQA, remainder tiles on both sequence axes
            "probe": {"b": 1, "hkv": 1, "groups": 2, "sq": 130, "sk": 70, "d": 40, "causal": True},
            # budgets bind here (trace-only runs): long query passes at the largest head dim
            "large": {"b": 1, "hkv": 1, "groups": 1, "sq": 8192, "sk": 256, "d": 256},
        },
        kernels=(backward,),
        bad_inputs=_bad_inputs,
        budget_hints={
            "psum": "choose transpose='dma' or 'vector' to free PSUM banks",
            "sbuf": "lower q_block, or use loop_order='kv_outer' for long key sequences",
        },
        description="(dq, dk, dv) of attention from (dout, q, k, v, out, lse), FlashAttention-2 style",
    )
)
