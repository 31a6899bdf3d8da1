"""The flash attention backward kernel (``flash_attention_bwd_kernel``): ``(dq, dk, dv)``
from ``(dout, q, k, v, out, lse)`` over the tile plan of :mod:`.flash_attention_bwd_plan`.

The contract (layout BHSD, ``lse [B, H, Sq]`` fp32 with the scale included, bottom-right
causal, fully masked rows, GQA) is the forward's: see :mod:`.attention_contract`.

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

Head dims 1..256 (two contraction chunks over D above 128; 64, 80, 96, 128, 192, 256
tested). The fp32 dK/dV sums of a KV head stay in SBUF, so the key length is bounded by
SBUF: the default config accepts Sk up to ~16K at D=128 bf16 on trn2 (``check`` refuses
longer before any kernel runs). Modeled (trn2 cost model, not measured) at B=1, H=32,
Hkv=8, S=4096, D=128 bf16, one physical core: 10.5 ms non-causal, 83% of the BF16 TensorE
peak in useful FLOPs (68% before the row loads left GpSimd's DMA queue, the heads of a KV
group shared their key tiles and PSUM tiles were packed two pairs' S and dP or four dQ
sums to a bank). TensorE binds (89% busy), ScalarE at 76%, the DMA engines at 99% (3 of
4 dS^T are DMA transposes). A sliding window (1024, 0) at S=8192 costs 0.30 of the causal
backward there (6.3 vs 21.1 ms).

Softcap (``softcap * tanh(y)``, ``y = scale * S / softcap``): ScalarE makes ``1 - t =
2 exp(-softplus(2 y))`` (softplus and exp share a table), TensorE subtracts D from dP in
PSUM, and stage 1 spans 7 loop steps (:func:`_softcap_steps`); above
``SOFTPLUS_SOFTCAP_MAX`` t = tanh(y) comes in bursts of a key block's pairs. Modeled as
above, causal: softcap 50 9.4 ms vs 5.7 ms without; bf16 softcap 2000 11.6 ms.

DMA: the row loads (Q, dO, O, lse per pass; K, V per key block) and the gradient stores
move a run of tiles per DMA on SyncE's hardware DGE queue (v3+); GpSimd's software DGE
queue keeps only the dS^T DMA transposes, so they never wait behind a prefetch.

Pipeline, per tile pair ``n`` in a query pass (stage 2 trails by ``lag_kv``, stage 3 by
``lag_q`` pairs)::

    for (b, kv head) group of this core:                  # dK, dV fp32 sums in SBUF
      for block of q_block query tiles:
        for query head h of the group:                    # a query pass
          Q, dO, O, lse, D resident; key blocks the previous pass held stay (kv_resident)
          for step n:                                     # key blocks of kv_block tiles
            stage 1 (pair n):          S, dP -> PSUM (two pairs a bank); P = exp(.);
                                       dS = P * (dP - D); the next pass prepared a step
            stage 2 (pair n - lag_kv): dV_j += P^T dO, dK_j += dS^T Q (PSUM over the
                                       block); dS^T (TensorE, or DMA on ds_dma_tiles of 4)
            stage 3 (pair n - lag_q):  dQ_i += dS K_j (PSUM over the block, then SBUF)
          dQ rows scaled and stored; dK, dV of key tiles no later pass sees stored

The state each level keeps is a record (``nl.NKIObject``): :class:`KVSums` per group,
:class:`QueryPass` and :class:`QuerySums` per query pass, :class:`KeyTile` per key tile,
:class:`TilePair` (where) and :class:`PairTiles` (its P, dS, dS^T) per tile pair. The
causal visibility of a tile (:mod:`.attention_contract`), its mask and the contraction over
D (:mod:`.attention_tiles`) are the forward's helpers, so both directions read the diagonal
the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.kernels.attention_contract import (
    MASK_FILL,
    dead_rows,
    key_bounds,
    tile_visibility,
)
from neuron_kernels.kernels.attention_tiles import (
    DROPOUT_STAGES,
    MASK_PREFETCH,
    DropBits,
    add_row_mask,
    dead_rows_column,
    dropout_stage,
    for_group,
    load_bounds,
    load_mask_tile,
    load_row_keys,
    mask_bounds,
    mask_window,
    matmul_over_d,
    score_inputs,
    transpose_blocks,
)
from neuron_kernels.kernels.flash_attention_bwd_plan import (
    DEAD_ROW_BIAS,
    SOFTCAP_TANH_BURST,
    STORE_TILES,
)
from neuron_kernels.kernels.spec import ceil_div
from neuron_kernels.kernels.tiling import tile_size, tiled

__all__ = [
    "KVSums",
    "KeyTile",
    "PairTiles",
    "QueryPass",
    "QuerySums",
    "SoftcapPass",
    "TilePair",
    "flash_attention_bwd_kernel",
]


@dataclass
class QueryPass(nl.NKIObject):
    """One query pass's SBUF tiles: ``n_tiles`` query tiles of one head, resident while the
    key tiles they see go by. :func:`_query_pass_dma` allocates them and starts their
    loads; :func:`_query_pass_prepare` adds the transposes and the ``-lse``/``-D`` columns."""

    q: object  # [tq, n_tiles, D] Q rows, tile t at [:, t, :] (the moving operand of dK)
    do: object  # [tq, n_tiles, D] dO rows (the moving operand of dV)
    o: object  # [tq, n_tiles, D] O rows in out's dtype (read once, for D)
    q_t: object  # [d_tile, d_chunks, n_tiles * tq] Q^T, D on partitions (S = Q K^T)
    do_t: object  # [d_tile, d_chunks, n_tiles * tq] dO^T (dP = dO V^T)
    neg_lse: object  # [tq, n_tiles] fp32: lse as loaded, -lse once prepared (the exp's bias)
    neg_dvec: object  # [tq, n_tiles] fp32: -D = -rowsum(dO * O)
    live: list  # (t, rows) of the tiles some key reaches, in order; the others get dq = 0
    q_src: list  # per live tile: its Q rows in HBM (what DMA transposes read)
    do_src: list  # per live tile: its dO rows in HBM
    sink: object  # [tq, 1] fp32 the head's sink on every row, None without sinks
    dsink_dst: list  # per live tile: its rows of the dsinks contributions in HBM
    n_dead: list  # per live tile: its leading rows that see no key
    bounds: object = None  # run-time bounds: (SBUF bounds, the pass's first tile), or None
    h: int = 0  # the query head
    feat: object = None  # ScoreInputs (attention mask, dropout), None without them
    row_key: object = None  # [tq, n_tiles] int32 dropout row keys, None without dropout
    steps: list = None  # (kind, first live index, count): "t" transposes, "d" -lse and -D


@dataclass
class KeyTile(nl.NKIObject):
    """One key tile's SBUF tiles, from its row loads (:func:`_load_kv_rows`) and transposes
    (:func:`_transpose_kv`) to the last tile pair that reads it. The rows and transposes
    are slot ``slot`` of its key block's tensors (one DMA per block and side)."""

    k: object  # [tk, block tiles, D] K rows, this tile's at [:, slot, :] (dQ += dS K moves it)
    v: object  # [tk, block tiles, D] V rows (what V^T's PE transposes read)
    k_t: object  # [d_tile, d_chunks, block tiles * tk] K^T, this tile's columns from c0
    v_t: object  # [d_tile, d_chunks, block tiles * tk] V^T (dP = dO V^T)
    k_src: object  # its K rows in HBM (what DMA transposes read)
    v_src: object  # its V rows in HBM
    n: int  # keys in the tile: tile_k, or fewer at the end of Sk
    slot: int = 0  # the tile within its block's tensors
    c0: int = 0  # its first column of k_t and v_t (slot * tile_k)


@dataclass
class KVSums(nl.NKIObject):
    """dK and dV of one (batch, KV head) group, summed in fp32 over its query heads and
    query tiles, unscaled until the store."""

    dk: object  # [tk, n_kt, D] fp32 SBUF: dK of key tile j at [:, j, :]
    dv: object  # [tk, n_kt, D] fp32 SBUF: dV
    started: list  # per key tile: dk/dv hold a contribution (the first one is copied in)
    dk_ps: object  # kv_outer: [tk, kv_block, D] fp32 PSUM, the current key block's dK sums
    dv_ps: object  # kv_outer: [tk, kv_block, D] fp32 PSUM, its dV sums
    in_block: list  # kv_outer: per slot of the key block, whether its PSUM sum has begun


@dataclass
class QuerySums(nl.NKIObject):
    """dQ of one query pass: summed in PSUM over a run of tile pairs of one query tile,
    then folded into fp32 SBUF (kv_outer) or scaled and stored (q_outer)."""

    dq: object  # kv_outer: [tq, n_tiles, D] fp32 SBUF, tile t at [:, t, :]; q_outer: None
    dq_ps: object  # [tq, D] fp32 PSUM: the current run's sum, None before the first
    started: list  # per query tile: dq holds a sum (kv_outer) or it was stored (q_outer)
    dq_bank: object = None  # [tq, runs, D] fp32 PSUM: one bank the next runs' sums share
    runs: int = 0  # runs begun in this pass


@dataclass
class TilePair(nl.NKIObject):
    """A (query tile, key tile) pair of a pass that some query sees: where it lies."""

    t: int  # query tile within the pass
    j: int  # key tile within the head
    q0: int  # first query row
    n_q: int  # query rows
    k0: int  # first key
    n_k: int  # keys
    seen: str  # "all", or "some" when the causal diagonal crosses it (P is masked)


@dataclass
class SoftcapPass(nl.NKIObject):
    """A query pass's softcap tiles (:func:`_softcap_pass`)."""

    bias: object  # [tq, n_tiles] fp32 softcap - lse, the exp's bias
    d_rows: object  # [2, n_tiles, tq] -D per query tile as a row: its high and low parts
    ones: object  # [2, tk] ones, the moving operand of the -D matmul
    ln2: object  # [tq, 1] fp32 ln 2
    two: object  # [tq, 1] fp32 2
    one: object  # [tq, 1] fp32 1


@dataclass
class PairTiles(nl.NKIObject):
    """A tile pair's SBUF tiles, from stage 1 (the scores) to stage 3 (dQ)."""

    p: object  # [tq, tk] P = exp(scale * S - lse) in q's dtype, 0 where masked
    ds: object  # [tq, tk] dS = P * (dP - D) in q's dtype
    ds_t: object  # [tk, tq] dS^T: made in stage 2 for stage 3, None before
    one_minus_t: object = None  # softcap: softplus(2 y), then 1 - t (fp32), until P is made
    tanh_t: object = None  # softcap_tanh: t (fp32) until P is made
    p_b: object = None  # softcap: P (1 - t), then (dP - D) P (1 - t), until dS is made
    dp: object = None  # softcap: dP - D in PSUM, from :func:`_softcap_dp` to :func:`_softcap_ds`
    one_plus_t: object = None  # softcap: 1 + t until :func:`_softcap_ds` makes dS


def _dma(dst, src, plan):
    """One HBM <-> SBUF copy: on SyncE's hardware DGE queue where the target has one
    (NeuronCore-v3+; nki/api/nki/isa dma_copy: ``dge_mode``, ``engine``), so the bulk row
    loads and gradient stores neither take GpSimd's instruction slots (a software DGE
    trigger each) nor queue in front of the dS^T DMA transposes, which stay on GpSimd's
    queue (a direct DMA transpose takes only ``unknown`` or a 16-row ``hwdge`` source)."""
    if plan.hwdge:
        nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync)
    else:
        nisa.dma_copy(dst=dst, src=src)


def _load_rows(src, rows_dst, plan):
    """DMA ``src [n, D]`` (HBM) into ``rows_dst [n, D]`` (SBUF)."""
    _dma(rows_dst, src, plan)


def _tile_runs(tiles, full, longest=0, ragged=False):
    """Runs ``(first index, count, rows of its last)`` of consecutive ``(index, rows)``
    entries of ``tiles`` (in increasing index order) whose rows are ``full`` (a sequence's
    last tile may be shorter: with ``ragged`` it may end a run, else it is a run of its
    own), at most ``longest`` entries each (0: no limit). One DMA (or one PSUM tile of
    transposes) takes each run."""
    runs = []
    for i, n in tiles:
        extend = len(runs) > 0 and runs[-1][2] == full and runs[-1][0] + runs[-1][1] == i
        if n != full and not ragged:
            extend = False
        if extend and longest > 0 and runs[-1][1] >= longest:
            extend = False
        if extend:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, n)
        else:
            runs.append((i, 1, n))
    return runs


def _tiled_rows(rows, r0, n_tiles, tile, n_last):
    """The ``[tile, n_tiles, F]`` view (row ``r0 + u * tile + p`` at ``[p, u, :]``) of the 2-D
    HBM view ``rows [R, F]``; a single tile of ``n_last`` rows stays ``[n_last, F]``."""
    if n_tiles == 1:
        return rows[r0 : r0 + n_last, :]
    f = rows.shape[1]
    return rows[r0 : r0 + n_tiles * tile, :].reshape((n_tiles, tile, f)).permute((1, 0, 2))


def _transpose_rows(src, t_dst, n, plan):
    """Fill the D-chunk views ``t_dst[c] [d_tile, n]`` with the transpose of ``src [n, D]``
    (HBM) by DMA transposes (``transpose="dma"``; PE transposes go by
    :func:`_transpose_group`)."""
    for c, (d0, dcs) in enumerate(tiled(plan.d, plan.d_tile)):
        nisa.dma_transpose(dst=t_dst[c][0:dcs, 0:n], src=src[0:n, d0 : d0 + dcs])


def _transpose_ds(ds, n_q, n_k, by_dma, plan, psum_dtype):
    """``dS^T [n_k, n_q]`` in SBUF from ``dS [n_q, n_k]`` (SBUF): by one DMA transpose when
    ``by_dma``, else on the configured engine."""
    dst = nl.ndarray((plan.tile_k, plan.tile_q), dtype=ds.dtype, buffer=nl.sbuf, name="ds_t")
    if by_dma:
        nisa.dma_transpose(dst=dst[0:n_k, 0:n_q], src=ds[0:n_q, 0:n_k])
    elif plan.transpose == "pe":
        tp = nl.ndarray((n_k, n_q), dtype=psum_dtype, buffer=nl.psum, name="ds_t_psum")
        nisa.nc_transpose(dst=tp, data=ds[0:n_q, 0:n_k])
        if plan.elementwise != "vector":
            nisa.activation(dst=dst[0:n_k, 0:n_q], op=nl.copy, data=tp)  # on ScalarE
        else:
            nisa.tensor_copy(dst=dst[0:n_k, 0:n_q], src=tp)
    else:
        transpose_blocks(dst[0:n_k, 0:n_q], ds[0:n_q, 0:n_k], n_q, n_k, plan)
    return dst


def _softcap_pass(qs, n_tiles, plan, psum_dtype):
    """Softcap, once per query pass once its ``-lse`` and ``-D`` columns are made (issued
    right after the last of the pass's prepare steps, during the previous pass's last
    pair; at the pass's start if nothing prepared it): the exp's bias
    column ``softcap - lse`` and, per live query tile, ``-D`` as a row on 2 partitions (its
    high and low parts in q's dtype, so their sum keeps ~16 bits of D) for the matmul that
    subtracts D from dP in PSUM (:func:`_softcap_dp`); VectorE's steps for all the tiles,
    then the PE transposes, then the copies, so no queue waits per tile. Returns a
    :class:`SoftcapPass`."""
    tq, tk = plan.tile_q, plan.tile_k
    dtype = qs.q.dtype
    consts = []
    for name, value in (("cap_ln2", math.log(2.0)), ("cap_two", 2.0), ("cap_one", 1.0)):
        c = nl.ndarray((tq, 1), dtype=nl.float32, buffer=nl.sbuf, name=name)
        nisa.memset(dst=c, value=value)
        consts.append(c)
    ones = nl.ndarray((2, tk), dtype=dtype, buffer=nl.sbuf, name="cap_ones")
    nisa.memset(dst=ones, value=1.0)
    bias = nl.ndarray((tq, n_tiles), dtype=nl.float32, buffer=nl.sbuf, name="cap_bias")
    d_rows = nl.ndarray((2, n_tiles, tq), dtype=dtype, buffer=nl.sbuf, name="neg_d_rows")
    hilo = nl.ndarray((tq, n_tiles, 2), dtype=dtype, buffer=nl.sbuf, name="neg_d_hilo")
    for t, n_q in qs.live:
        nisa.tensor_scalar(
            dst=bias[0:n_q, t : t + 1], data=qs.neg_lse[0:n_q, t : t + 1], op0=nl.add,
            operand0=plan.softcap,
        )  # fmt: skip
        nisa.tensor_copy(dst=hilo[0:n_q, t, 0:1], src=qs.neg_dvec[0:n_q, t : t + 1])
    for t, n_q in qs.live:
        nisa.tensor_tensor(
            dst=hilo[0:n_q, t, 1:2], data1=qs.neg_dvec[0:n_q, t : t + 1],
            data2=hilo[0:n_q, t, 0:1], op=nl.subtract,
        )  # fmt: skip
    # 4 tiles' transposes share one PSUM tile (<= 2 KiB, one bank, in fp32 too), so no
    # transpose waits for the copy of the one before
    for a0 in range(0, len(qs.live), 4):
        group = qs.live[a0 : a0 + 4]
        tp = nl.ndarray((2, 4, tq), dtype=psum_dtype, buffer=nl.psum, name="load_t")
        for g in range(len(group)):
            t, n_q = group[g]
            nisa.nc_transpose(dst=tp[0:2, g, 0:n_q], data=hilo[0:n_q, t, 0:2])
        for g in range(len(group)):
            t, n_q = group[g]
            nisa.tensor_copy(dst=d_rows[0:2, t, 0:n_q], src=tp[0:2, g, 0:n_q])
    return SoftcapPass(
        bias=bias, d_rows=d_rows, ones=ones, ln2=consts[0], two=consts[1], one=consts[2]
    )


def _softcap_dp(st, qs, kv, pair, plan, cap, s_dp):
    """Softcap without dropout: ``dP - D`` of a pair into ``s_dp``'s dP half (PSUM
    ``[tq, 2, tk]`` fp32: dP, then the -D row times ones as a K=2 matmul), issued steps
    after its scores so the PSUM bank is held only until :func:`_softcap_ds` reads it; the
    S half takes the scores of the pair that starts in this step."""
    t, n_q, n_k = pair.t, pair.n_q, pair.n_k
    dp = s_dp[:, 1, :]
    matmul_over_d(dp[0:n_q, 0:n_k], qs.do_t, t * plan.tile_q, n_q, kv.v_t, kv.c0, n_k, plan)
    nisa.nc_matmul(
        dst=dp[0:n_q, 0:n_k], stationary=cap.d_rows[0:2, t, 0:n_q], moving=cap.ones[0:2, 0:n_k],
        accumulate=True,
    )  # fmt: skip
    st.dp = dp


def _softcap_ds(st, pair, plan, last):
    """Softcap without dropout, on VectorE: ``(dP - D) P (1 - t)`` from PSUM (one multiply,
    N cycles; ``last`` False), then (a step later, ``last`` True) ``dS = (dP - D) P (1 - t)
    (1 + t)`` (2-byte SBUF operands: the fast mode), both in q's dtype."""
    n_q, n_k = pair.n_q, pair.n_k
    tq, tk = plan.tile_q, plan.tile_k
    if not last:
        g = nl.ndarray((tq, tk), dtype=st.p.dtype, buffer=nl.sbuf, name="dp_d_pb")
        nisa.tensor_tensor(
            dst=g[0:n_q, 0:n_k], data1=st.dp[0:n_q, 0:n_k], data2=st.p_b[0:n_q, 0:n_k],
            op=nl.multiply,
        )  # fmt: skip
        st.p_b, st.dp = g, None
        return
    ds = nl.ndarray((tq, tk), dtype=st.p.dtype, buffer=nl.sbuf, name="ds")
    nisa.tensor_tensor(
        dst=ds[0:n_q, 0:n_k], data1=st.p_b[0:n_q, 0:n_k], data2=st.one_plus_t[0:n_q, 0:n_k],
        op=nl.multiply,
    )  # fmt: skip
    st.ds, st.p_b, st.one_plus_t = ds, None, None


def _softcap_pb(st, pair, plan):
    """Softcap without dropout, on GpSimd: ``P (1 - t)`` in q's dtype."""
    n_q, n_k = pair.n_q, pair.n_k
    pb = nl.ndarray((plan.tile_q, plan.tile_k), dtype=st.p.dtype, buffer=nl.sbuf, name="p_b")
    nisa.tensor_tensor(
        dst=pb[0:n_q, 0:n_k], data1=st.one_minus_t[0:n_q, 0:n_k], data2=st.p[0:n_q, 0:n_k],
        op=nl.multiply, engine=nisa.engine.gpsimd,
    )  # fmt: skip
    st.p_b, st.one_minus_t = pb, None


def _softcap_scores(qs, kv, pair, scale, plan, cap, s_dp):
    """Softcap, stage 1's first step: ``S`` on TensorE into ``s_dp``'s S half and
    ``softplus(2 y)``, ``y = scale * S / softcap``, on ScalarE (fp32).
    Returns the pair's :class:`PairTiles` (``one_minus_t`` holds the softplus until
    :func:`_softcap_one_minus_t`)."""
    t, n_q, n_k = pair.t, pair.n_q, pair.n_k
    tq, tk = plan.tile_q, plan.tile_k
    s = s_dp[0:n_q, 0, 0:n_k]
    matmul_over_d(s, qs.q_t, t * tq, n_q, kv.k_t, kv.c0, n_k, plan)
    sp = nl.ndarray((tq, tk), dtype=nl.float32, buffer=nl.sbuf, name="softplus_2y")
    if plan.softcap_tanh:  # t = tanh(y) itself (see SOFTPLUS_SOFTCAP_MAX)
        nisa.activation(dst=sp[0:n_q, 0:n_k], op=nl.tanh, data=s, scale=scale / plan.softcap)
        return PairTiles(p=None, ds=None, ds_t=None, tanh_t=sp)
    nisa.activation(dst=sp[0:n_q, 0:n_k], op=nl.softplus, data=s, scale=2.0 * scale / plan.softcap)
    return PairTiles(p=None, ds=None, ds_t=None, one_minus_t=sp)


def _softcap_one_minus_t(st, pair, plan, cap):
    """Softcap, stage 1's second step (ScalarE): ``b = 1 - tanh(y) = 2 exp(-softplus(2 y))``
    in fp32. softplus and exp share ScalarE's activation table (cost_model/schedule.py
    _TABLE_SET), so no pair switches tables (tanh would, twice per pair); the steps of a
    pair run on successive loop steps so ScalarE's in-order queue interleaves pairs rather
    than waiting out each result's latency. P follows in :func:`_scores` as
    ``exp(softcap t - lse) = exp(-softcap b + (softcap - lse))``."""
    n_q, n_k = pair.n_q, pair.n_k
    b = nl.ndarray((plan.tile_q, plan.tile_k), dtype=nl.float32, buffer=nl.sbuf, name="one_minus_t")
    if plan.softcap_tanh:  # 1 - t from t (an identity: no table)
        nisa.activation(
            dst=b[0:n_q, 0:n_k], op=nl.copy, data=st.tanh_t[0:n_q, 0:n_k], scale=-1.0,
            bias=cap.one[0:n_q, :],
        )  # fmt: skip
        st.one_minus_t = b
        return
    nisa.activation(
        dst=b[0:n_q, 0:n_k], op=nl.exp, data=st.one_minus_t[0:n_q, 0:n_k], scale=-1.0,
        bias=cap.ln2[0:n_q, :],
    )  # fmt: skip
    st.one_minus_t = b


def _scores(qs, kv, pair, scale, plan, cap=None, bits=None, mask_t=None, made=None, s_dp=None):
    """Stage 1 of a tile pair: S and dP on TensorE, ``P = exp(scale * S - lse)`` (masked on
    the diagonal) and ``dS = P * (dP - D)``; with a softcap (``cap``: the pass's
    :class:`SoftcapPass`), ``P = exp(softcap t - lse)`` with ``t = tanh(scale S / softcap)``
    (``made``: the pair's tiles from :func:`_softcap_scores`) and ``dS = P (1 - t^2)
    (dP - D)``. ``s_dp``: ``[tq, 2, tk]`` fp32 PSUM for S and dP (half of a bank two pairs
    share; a tile of its own if None). Returns the pair's SBUF tiles."""
    t, j, n_q, n_k = pair.t, pair.j, pair.n_q, pair.n_k
    tq, tk = plan.tile_q, plan.tile_k
    dtype = qs.q.dtype
    # S and dP side by side in one PSUM bank ([tq, 2, tk] fp32 <= 1 KiB per partition):
    # a pair holds one bank instead of two, so more pairs are in flight (modeled 61.2% vs
    # 53.4% TensorE at S4096; a matmul may write any region within one bank).
    if s_dp is None:
        s_dp = nl.ndarray((tq, 2, tk), dtype=nl.float32, buffer=nl.psum, name="s_dp")
    p = nl.ndarray((tq, tk), dtype=dtype, buffer=nl.sbuf, name="p")
    if plan.mask and not plan.mask_row and mask_t is None:  # (else loaded pairs ahead)
        mask_t = load_mask_tile(qs.feat, qs.h, pair.q0, n_q, pair.k0, n_k, plan)
    bias = qs.neg_lse[0:n_q, t : t + 1]
    one_minus_t = None
    if plan.softcap:  # P = exp(-softcap b + softcap - lse), b = 1 - t
        one_minus_t = made.one_minus_t
        src, exp_scale = one_minus_t[0:n_q, 0:n_k], -plan.softcap
        bias = cap.bias[0:n_q, t : t + 1]
        if plan.softcap_tanh:  # softcap t - lse straight from t
            src, exp_scale = made.tanh_t[0:n_q, 0:n_k], plan.softcap
            bias = qs.neg_lse[0:n_q, t : t + 1]
    else:
        s = s_dp[:, 0, :]
        matmul_over_d(s[0:n_q, 0:n_k], qs.q_t, t * tq, n_q, kv.k_t, kv.c0, n_k, plan)
        if plan.mask_row:  # the mask's bias row added to S in PSUM (TensorE)
            add_row_mask(s[0:n_q, 0:n_k], qs.feat, qs.h, n_q, pair.k0, n_k, plan)
        src, exp_scale = s[0:n_q, 0:n_k], scale
        if qs.bounds is not None:  # run-time bounds (no softcap): S masked in SBUF first
            bounded = nl.ndarray((tq, tk), dtype=nl.float32, buffer=nl.sbuf, name="s_bounded")
            at, sb = qs.bounds[1] + t, bounded[0:n_q, 0:n_k]
            if scale >= 1e-6:  # straight out of PSUM: scale * fill stays below -1e24, exp 0
                mask_bounds(sb, n_q, n_k, pair.k0, qs.bounds[0], at, plan, MASK_FILL, src)
                src = sb
            else:  # scale * S first, so a negative (or tiny) scale cannot lift the fill
                nisa.tensor_scalar(dst=sb, data=src, op0=nl.multiply, operand0=scale)
                mask_bounds(sb, n_q, n_k, pair.k0, qs.bounds[0], at, plan, MASK_FILL)
                src, exp_scale = sb, 1.0
    if plan.mask == "float" and not plan.mask_row:  # C = scale S (or -softcap b) + mask
        c = nl.ndarray((tq, tk), dtype=nl.float32, buffer=nl.sbuf, name="masked_scores")
        nisa.scalar_tensor_tensor(
            dst=c[0:n_q, 0:n_k], data=src, op0=nl.multiply, operand0=exp_scale, op1=nl.add,
            operand1=mask_t,
        )  # fmt: skip
        src, exp_scale = c[0:n_q, 0:n_k], 1.0
    nisa.activation(
        dst=p[0:n_q, 0:n_k],
        op=nl.exp,
        data=src,
        bias=bias,
        scale=exp_scale,
    )
    if pair.seen == "some" and qs.bounds is None:
        mask_window(p[0:n_q, 0:n_k], n_q, n_k, pair.q0, pair.k0, plan, 0.0)
    if plan.mask == "bool" and not plan.mask_row:
        nisa.tensor_copy_predicated(
            dst=p[0:n_q, 0:n_k], src=0.0, predicate=mask_t, reverse_pred=True
        )
    if plan.softcap and not plan.dropout:  # dP and dS later (_softcap_ds)
        # 1 + t = 2 - b on ScalarE (an identity: no table switch), in q's dtype
        c = nl.ndarray((tq, tk), dtype=dtype, buffer=nl.sbuf, name="one_plus_t")
        nisa.activation(
            dst=c[0:n_q, 0:n_k], op=nl.copy, data=one_minus_t[0:n_q, 0:n_k], scale=-1.0,
            bias=cap.two[0:n_q, :],
        )  # fmt: skip
        return PairTiles(p=p, ds=None, ds_t=None, one_minus_t=one_minus_t, one_plus_t=c)
    dp = s_dp[:, 1, :]
    matmul_over_d(dp[0:n_q, 0:n_k], qs.do_t, t * tq, n_q, kv.v_t, kv.c0, n_k, plan)
    ds = nl.ndarray((tq, tk), dtype=dtype, buffer=nl.sbuf, name="ds")
    neg_d = qs.neg_dvec[0:n_q, t : t + 1]
    if plan.softcap:  # and dropout
        pg = _softcap_dtanh(p, one_minus_t, n_q, n_k, plan)
        return _dropped_pair(qs, pair, p, dp, ds, neg_d, pg, bits, plan)
    if plan.dropout:
        return _dropped_pair(qs, pair, p, dp, ds, neg_d, None, bits, plan)
    split = plan.elementwise == "split" or (plan.elementwise == "balanced" and (t + j) % 2 == 0)
    if split:
        # ScalarE: dP - D out of PSUM; VectorE: one SBUF x SBUF multiply by P.
        dp_d = nl.ndarray((tq, tk), dtype=dtype, buffer=nl.sbuf, name="dp_minus_d")
        nisa.activation(dst=dp_d[0:n_q, 0:n_k], op=nl.copy, data=dp[0:n_q, 0:n_k], bias=neg_d)
        # Run-time bounds: VectorE masks S before the exp, so the multiply goes to GpSimd and
        # VectorE's in-order queue never waits on this pair's exp (modeled varlen, 4 x 512
        # causal, H4 D128 bf16: 260 us vs 411 us with the multiply on VectorE).
        nisa.tensor_tensor(
            dst=ds[0:n_q, 0:n_k],
            data1=dp_d[0:n_q, 0:n_k],
            data2=p[0:n_q, 0:n_k],
            op=nl.multiply,
            engine=nisa.engine.gpsimd if qs.bounds is not None else nisa.engine.unknown,
        )
    else:
        nisa.scalar_tensor_tensor(
            dst=ds[0:n_q, 0:n_k],
            data=dp[0:n_q, 0:n_k],
            op0=nl.add,
            operand0=neg_d,
            op1=nl.multiply,
            operand1=p[0:n_q, 0:n_k],
        )
    return PairTiles(p=p, ds=ds, ds_t=None)


def _softcap_dtanh(p, one_minus_t, n_q, n_k, plan):
    """``P (1 - t^2) = P b (2 - b)`` with ``b = 1 - t`` (fp32), in P's dtype: ``P b`` on
    GpSimd, times ``2 - b`` on VectorE (one scalar_tensor_tensor)."""
    tq, tk = plan.tile_q, plan.tile_k
    pb = nl.ndarray((tq, tk), dtype=p.dtype, buffer=nl.sbuf, name="p_one_minus_t")
    nisa.tensor_tensor(
        dst=pb[0:n_q, 0:n_k], data1=one_minus_t[0:n_q, 0:n_k], data2=p[0:n_q, 0:n_k],
        op=nl.multiply, engine=nisa.engine.gpsimd,
    )  # fmt: skip
    pg = nl.ndarray((tq, tk), dtype=p.dtype, buffer=nl.sbuf, name="p_dtanh")
    nisa.scalar_tensor_tensor(
        dst=pg[0:n_q, 0:n_k], data=one_minus_t[0:n_q, 0:n_k], op0=nl.subtract, operand0=2.0,
        reverse0=True, op1=nl.multiply, operand1=pb[0:n_q, 0:n_k],
    )  # fmt: skip
    return pg


def _dropped_pair(qs, pair, p, dp, ds, neg_d, p_dtanh, bits, plan):
    """Stage 1's end under dropout (the forward's keep mask, replayed from the same row
    keys; ``bits``: the pair's :class:`DropBits`, made in the steps before), with
    ``Z = keep / (1 - p)``: ``dS = P * (Z dP - D)`` (times ``1 - t^2`` under a softcap) and
    ``keep * P`` for dV (whose ``1 / (1 - p)`` is applied once, at its store). VectorE
    applies the keep to dP (from PSUM) and P; ScalarE takes ``Z dP - D`` (as "split")."""
    n_q, n_k = pair.n_q, pair.n_k
    tq, tk = plan.tile_q, plan.tile_k
    bits = bits.bits
    thr = float(plan.dropout)
    kdp = nl.ndarray((tq, tk), dtype=nl.float32, buffer=nl.sbuf, name="dp_keep")
    nisa.scalar_tensor_tensor(
        dst=kdp[0:n_q, 0:n_k], data=bits, op0=nl.greater_equal, operand0=thr, op1=nl.multiply,
        operand1=dp[0:n_q, 0:n_k],
    )  # fmt: skip
    pz = nl.ndarray((tq, tk), dtype=p.dtype, buffer=nl.sbuf, name="p_keep")
    nisa.scalar_tensor_tensor(
        dst=pz[0:n_q, 0:n_k], data=bits, op0=nl.greater_equal, operand0=thr, op1=nl.multiply,
        operand1=p[0:n_q, 0:n_k],
    )  # fmt: skip
    weight, dp_dtype = p[0:n_q, 0:n_k], p.dtype
    if p_dtanh is not None:  # softcap: P (1 - t^2), made as without dropout
        weight = p_dtanh[0:n_q, 0:n_k]
    dp_d = nl.ndarray((tq, tk), dtype=dp_dtype, buffer=nl.sbuf, name="dp_minus_d")
    nisa.activation(
        dst=dp_d[0:n_q, 0:n_k], op=nl.copy, data=kdp[0:n_q, 0:n_k], scale=plan.inv_keep,
        bias=neg_d,
    )  # fmt: skip
    nisa.tensor_tensor(dst=ds[0:n_q, 0:n_k], data1=dp_d[0:n_q, 0:n_k], data2=weight, op=nl.multiply)
    return PairTiles(p=pz, ds=ds, ds_t=None)


def _fold(acc, part, first):
    """``acc = part`` for the first contribution, else ``acc += part`` (VectorE)."""
    if first:
        nisa.tensor_copy(dst=acc, src=part)
    else:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=part, op=nl.add)


def _kv_grads(st, qs, pair, first, last, sums, plan, psum_dtype):
    """Stage 2 of a tile pair: ``dV_j += P^T dO_i`` and ``dK_j += dS^T Q_i`` into ``sums``
    (:class:`KVSums`), then ``dS^T`` for stage 3. Under "kv_outer" the sums of a key block's
    tiles stay in PSUM over the block's pairs (``first``/``last`` mark the block's first and
    last pair) and fold into the fp32 SBUF sums once; under "q_outer" each pair's product
    folds into SBUF."""
    t, j, n_q, n_k = pair.t, pair.j, pair.n_q, pair.n_k
    tk, d, kb = plan.tile_k, plan.d, plan.kv_block
    if plan.loop_order == "kv_outer":
        jb = (j // kb) * kb
        if first:
            sums.dk_ps = nl.ndarray((tk, kb, d), dtype=nl.float32, buffer=nl.psum, name="dk_ps")
            sums.dv_ps = nl.ndarray((tk, kb, d), dtype=nl.float32, buffer=nl.psum, name="dv_ps")
            sums.in_block = [False] * kb
        slot = j - jb
        dk_ps, dv_ps = sums.dk_ps[0:n_k, slot, :], sums.dv_ps[0:n_k, slot, :]
        chained = sums.in_block[slot]
        sums.in_block[slot] = True
    else:
        dk_ps = nl.ndarray((tk, d), dtype=nl.float32, buffer=nl.psum, name="dk_ps")[0:n_k, :]
        dv_ps = nl.ndarray((tk, d), dtype=nl.float32, buffer=nl.psum, name="dv_ps")[0:n_k, :]
        chained = False
    nisa.nc_matmul(
        dst=dv_ps,
        stationary=st.p[0:n_q, 0:n_k],
        moving=qs.do[0:n_q, t, :],
        accumulate=chained,
    )
    nisa.nc_matmul(
        dst=dk_ps,
        stationary=st.ds[0:n_q, 0:n_k],
        moving=qs.q[0:n_q, t, :],
        accumulate=chained,
    )
    if plan.loop_order == "kv_outer":
        if last:
            # one fold per run of the block's slots alike (summed here, first sum or not,
            # full tiles): dK's whole bank first, so the next block's PSUM tiles wait for
            # one VectorE pass over it, not for 2 x kv_block small ones
            runs = []
            for slot in range(kb):
                jj = jb + slot
                nk = tile_size(plan.sk, tk, jj * tk)
                if sums.in_block[slot]:
                    key = (sums.started[jj], nk)
                    if len(runs) > 0 and runs[-1][2] == key and runs[-1][0] + runs[-1][1] == slot:
                        runs[-1] = (runs[-1][0], runs[-1][1] + 1, key)
                    else:
                        runs.append((slot, 1, key))
            for acc, ps in ((sums.dk, sums.dk_ps), (sums.dv, sums.dv_ps)):
                for s0, ns, key in runs:
                    started, nk = key
                    j0 = jb + s0
                    _fold(acc[0:nk, j0 : j0 + ns, :], ps[0:nk, s0 : s0 + ns, :], not started)
            for s0, ns, _ in runs:
                for u in range(ns):
                    sums.started[jb + s0 + u] = True
    else:
        started = sums.started[j]
        _fold(sums.dk[0:n_k, j, :], dk_ps, not started)
        _fold(sums.dv[0:n_k, j, :], dv_ps, not started)
        sums.started[j] = True
    # ds_dma_tiles of every 4 pairs by DMA, spread evenly over (t + j) % 4 (2: every other)
    m = (t + j) % 4
    by_dma = (m + 1) * plan.ds_dma_tiles // 4 > m * plan.ds_dma_tiles // 4
    st.ds_t = _transpose_ds(st.ds, n_q, n_k, by_dma, plan, psum_dtype)


def _q_grads(st, kv, pair, first, last, sums, dq_dst, scale, plan):
    """Stage 3 of a tile pair: ``dQ_i += dS K_j`` into ``sums`` (:class:`QuerySums`),
    summed in PSUM over consecutive pairs of query tile i (``first``/``last``): a key
    block's pairs under "kv_outer", then folded into fp32 SBUF; every key tile under
    "q_outer", then scaled and stored."""
    t, q0, n_q, n_k = pair.t, pair.q0, pair.n_q, pair.n_k
    tq, d = plan.tile_q, plan.d
    if first:
        # consecutive runs' sums share one PSUM bank (as many as it holds at D), so a new
        # run waits for a bank once per bank, not once per run
        per_bank = plan.dq_runs
        if sums.runs % per_bank == 0:
            sums.dq_bank = nl.ndarray(
                (tq, per_bank, d), dtype=nl.float32, buffer=nl.psum, name="dq_ps"
            )
        sums.dq_ps = sums.dq_bank[:, sums.runs % per_bank, :]
        sums.runs += 1
    nisa.nc_matmul(
        dst=sums.dq_ps[0:n_q, :],
        stationary=st.ds_t[0:n_k, 0:n_q],
        moving=kv.k[0:n_k, kv.slot, :],
        accumulate=not first,
    )
    if not last:
        return
    if plan.loop_order == "kv_outer":
        _fold(sums.dq[0:n_q, t, :], sums.dq_ps[0:n_q, :], not sums.started[t])
    else:
        _store_scaled(dq_dst[q0 : q0 + n_q, :], sums.dq_ps[0:n_q, :], n_q, scale, plan.d)
    sums.started[t] = True


def _query_pass_dma(dout, q, out, lse, sinks, dsink, b, one_pass, plan, bounds=None, feat=None):
    """Phase 1 of a query pass ``(h, p0, n_tiles)``: allocate its SBUF tiles and start every
    DMA (Q, dO and O rows, lse; the head's sink) of the tiles some key reaches; their dQ is
    zero otherwise (and so is their dsinks contribution, stored here)."""
    h, p0, n_tiles = one_pass
    tq, d = plan.tile_q, plan.d
    rows = n_tiles * tq
    dtype = q.dtype
    qs = QueryPass(
        q=nl.ndarray((tq, n_tiles, d), dtype=dtype, buffer=nl.sbuf, name="q_rows"),
        do=nl.ndarray((tq, n_tiles, d), dtype=dtype, buffer=nl.sbuf, name="do_rows"),
        o=nl.ndarray((tq, n_tiles, d), dtype=out.dtype, buffer=nl.sbuf, name="o_rows"),
        q_t=nl.ndarray((plan.d_tile, plan.d_chunks, rows), dtype=dtype, buffer=nl.sbuf),
        do_t=nl.ndarray((plan.d_tile, plan.d_chunks, rows), dtype=dtype, buffer=nl.sbuf),
        neg_lse=nl.ndarray((tq, n_tiles), dtype=nl.float32, buffer=nl.sbuf, name="neg_lse"),
        neg_dvec=nl.ndarray((tq, n_tiles), dtype=nl.float32, buffer=nl.sbuf, name="neg_d"),
        live=[],
        q_src=[],
        do_src=[],
        sink=None,
        dsink_dst=[],
        n_dead=[],
        bounds=None if bounds is None else (bounds, p0),
    )
    qs.h, qs.feat = h, feat
    if plan.dropout:
        qs.row_key = nl.ndarray((tq, n_tiles), dtype=nl.int32, buffer=nl.sbuf, name="row_keys")
    if sinks is not None:
        qs.sink = nl.ndarray((tq, 1), dtype=nl.float32, buffer=nl.sbuf, name="sink")
        nisa.dma_copy(dst=qs.sink, src=sinks[h, 0:tq, 0:1])
    bounds = (plan.left, plan.right)
    for t, (q0, n_q) in enumerate(tiled(plan.sq, tq)[p0 : p0 + n_tiles]):
        k_start, k_end, _, _ = key_bounds(q0, n_q, plan.sq, plan.sk, bounds)
        if k_end <= k_start:  # no row of the tile sees a key: its dq (and dsinks part) is 0
            if sinks is not None:
                zeros = nl.ndarray((n_q, 1), dtype=nl.float32, buffer=nl.sbuf, name="no_dsink")
                nisa.memset(dst=zeros, value=0.0)
                nisa.dma_copy(dst=dsink[b, h, q0 : q0 + n_q, 0:1], src=zeros)
            continue
        if sinks is not None:
            qs.dsink_dst.append(dsink[b, h, q0 : q0 + n_q, 0:1])
            qs.n_dead.append(dead_rows(q0, n_q, plan.sq, plan.sk, bounds))
        qs.live.append((t, n_q))
        qs.q_src.append(q[b, h, q0 : q0 + n_q, :])
        qs.do_src.append(dout[b, h, q0 : q0 + n_q, :])
        if plan.dropout:
            load_row_keys(qs.row_key[0:n_q, t : t + 1], feat, h, q0, n_q)
    # Q, dO and O rows and lse: one DMA per run of consecutive live tiles each (a DMA's
    # fixed cost is paid per DMA and engine, not per tile).
    r_pass = p0 * tq
    qs.steps = []
    a = 0
    for _, nt, _ in _tile_runs(qs.live, tq, plan.t_group, True):
        qs.steps.append(("t", a, nt))
        for u in range(nt):
            qs.steps.append(("d", a + u, 1))
        a += nt
    for t0, nt, n_last in _tile_runs(qs.live, tq):
        r0 = r_pass + t0 * tq
        n_rows = n_last if nt == 1 else tq
        for src, dst in ((q, qs.q), (dout, qs.do), (out, qs.o)):
            rows = _tiled_rows(src[b, h], r0, nt, tq, n_last)
            if nt == 1:
                _load_rows(rows, dst[0:n_rows, t0, :], plan)
            else:
                _load_rows(rows, dst[:, t0 : t0 + nt, :], plan)
        if nt == 1:
            _dma(qs.neg_lse[0:n_rows, t0 : t0 + 1], lse[b, h, r0 : r0 + n_rows], plan)
        else:
            lse_rows = lse[b, h, r0 : r0 + nt * tq].reshape((nt, tq)).permute((1, 0))
            _dma(qs.neg_lse[:, t0 : t0 + nt], lse_rows, plan)
    return qs


def _query_pass_prepare(qs, plan, psum_dtype):
    """Phase 2 of a query pass, once its rows have arrived: Q^T and dO^T, ``-lse`` and
    ``-D = -rowsum(dO * O)`` columns, step by step (:func:`_prepare_step`)."""
    for i in range(len(qs.steps)):
        _prepare_step(qs, i, plan, psum_dtype)


def _prepare_step(qs, i, plan, psum_dtype):
    """Step ``i`` of :func:`_query_pass_prepare` (``qs.steps``): the transposes of a group
    of consecutive live tiles (as many as one PSUM bank holds), or one live tile's ``-lse``
    and ``-D``. The kernel spreads the next pass's steps over this pass's tile pairs, so no
    engine's in-order queue takes a burst of them at once."""
    tq, d = plan.tile_q, plan.d
    kind, a0, na = qs.steps[i]
    if kind == "t" and plan.transpose == "dma":
        for a in range(a0, a0 + na):
            t, n_q = qs.live[a]
            q_tv, do_tv = [], []
            for c in range(plan.d_chunks):
                q_tv.append(qs.q_t[:, c, t * tq : t * tq + n_q])
                do_tv.append(qs.do_t[:, c, t * tq : t * tq + n_q])
            _transpose_rows(qs.q_src[a], q_tv, n_q, plan)
            _transpose_rows(qs.do_src[a], do_tv, n_q, plan)
    elif kind == "t":
        sides = ((qs.q, qs.q_t), (qs.do, qs.do_t))
        n_last = qs.live[a0 + na - 1][1]
        _transpose_group(sides, qs.live[a0][0], na, n_last, tq, plan, psum_dtype)
    else:
        t, n_q = qs.live[a0]
        lse_col = qs.neg_lse[0:n_q, t : t + 1]
        nisa.tensor_scalar(dst=lse_col, data=lse_col, op0=nl.multiply, operand0=-1.0)
        if plan.mask:  # rows the mask leaves with no key (lse = -inf): P = exp(. - 3e38) = 0
            dead = dead_rows_column(lse_col, n_q)
            nisa.tensor_copy_predicated(dst=lse_col, src=DEAD_ROW_BIAS, predicate=dead)
        prod = nl.ndarray((tq, d), dtype=nl.float32, buffer=nl.sbuf, name="do_o")
        nisa.tensor_tensor(
            dst=prod[0:n_q, :],
            data1=qs.do[0:n_q, t, :],
            data2=qs.o[0:n_q, t, :],
            op=nl.multiply,
            engine=nisa.engine.gpsimd,
        )
        nisa.tensor_reduce(
            dst=qs.neg_dvec[0:n_q, t : t + 1], op=nl.add, data=prod[0:n_q, :], axis=1, negate=True
        )
        if qs.sink is not None:
            _dsink_rows(qs, a0, t, n_q)


def _dsink_rows(qs, a, t, n_q):
    """The dsinks contribution of live query tile ``t`` (the ``a``-th): per row,
    ``-exp(sink - lse) D`` from the ``-lse`` and ``-D`` columns the pass already holds,
    stored to HBM (the op sums the rows). Rows that see no key add 0 (their D is 0, and
    without a finite sink their ``exp(sink - lse)`` would be ``exp(-inf + inf)``)."""
    w = nl.ndarray((n_q, 1), dtype=nl.float32, buffer=nl.sbuf, name="sink_weight")
    nisa.activation(dst=w, op=nl.exp, data=qs.sink[0:n_q, 0:1], bias=qs.neg_lse[0:n_q, t : t + 1])
    part = nl.ndarray((n_q, 1), dtype=nl.float32, buffer=nl.sbuf, name="dsink_part")
    nisa.tensor_tensor(dst=part, data1=w, data2=qs.neg_dvec[0:n_q, t : t + 1], op=nl.multiply)
    if qs.n_dead[a]:
        nisa.memset(dst=part[0 : qs.n_dead[a], 0:1], value=0.0)
    nisa.dma_copy(dst=qs.dsink_dst[a], src=part)


def _load_kv_rows(k, v, b, hk, j0, n_j, plan):
    """Phase 1 of loading key tiles ``j0 .. j0 + n_j - 1`` (a key block): their K and V
    rows, one DMA per side for the block's full tiles (and, with DMA transposes, K^T and
    V^T too). Returns the tiles' :class:`KeyTile` s."""
    tk, d = plan.tile_k, plan.d
    k_rows = nl.ndarray((tk, n_j, d), dtype=k.dtype, buffer=nl.sbuf, name="k_rows")
    v_rows = nl.ndarray((tk, n_j, d), dtype=v.dtype, buffer=nl.sbuf, name="v_rows")
    k_t = nl.ndarray((plan.d_tile, plan.d_chunks, n_j * tk), dtype=k.dtype, buffer=nl.sbuf)
    v_t = nl.ndarray((plan.d_tile, plan.d_chunks, n_j * tk), dtype=v.dtype, buffer=nl.sbuf)
    tiles, sizes = [], []
    for u in range(n_j):
        k0 = (j0 + u) * tk
        n_k = tile_size(plan.sk, tk, k0)
        kv = KeyTile(
            k=k_rows,
            v=v_rows,
            k_t=k_t,
            v_t=v_t,
            k_src=k[b, hk, k0 : k0 + n_k, :],
            v_src=v[b, hk, k0 : k0 + n_k, :],
            n=n_k,
            slot=u,
            c0=u * tk,
        )
        tiles.append(kv)
        sizes.append((u, n_k))
    sides = [(k, k_rows)]
    if plan.transpose != "dma":
        sides.append((v, v_rows))
    for u0, nu, n_last in _tile_runs(sizes, tk):
        for src, rows in sides:
            view = _tiled_rows(src[b, hk], (j0 + u0) * tk, nu, tk, n_last)
            if nu == 1:
                _load_rows(view, rows[0:n_last, u0, :], plan)
            else:
                _load_rows(view, rows[:, u0 : u0 + nu, :], plan)
    if plan.transpose == "dma":
        for kv in tiles:
            _transpose_kv([kv], plan, None)
    return tiles


def _transpose_kv(tiles, plan, psum_dtype):
    """Phase 2 of loading key tiles (of one block, in slot order): K^T and V^T, issued once
    their rows have arrived: DMA transposes from HBM, or PE transposes of the rows, as many
    tiles at a time as one PSUM bank holds (:func:`_transpose_group`)."""
    if plan.transpose == "dma":
        for kv in tiles:
            k_tv, v_tv = [], []
            for c in range(plan.d_chunks):
                k_tv.append(kv.k_t[:, c, kv.c0 : kv.c0 + kv.n])
                v_tv.append(kv.v_t[:, c, kv.c0 : kv.c0 + kv.n])
            _transpose_rows(kv.k_src, k_tv, kv.n, plan)
            _transpose_rows(kv.v_src, v_tv, kv.n, plan)
        return
    kv0 = tiles[0]
    sizes = []
    for kv in tiles:
        sizes.append((kv.slot, kv.n))
    sides = ((kv0.k, kv0.k_t), (kv0.v, kv0.v_t))
    for u0, nu, n_last in _tile_runs(sizes, plan.tile_k, plan.t_group, True):
        _transpose_group(sides, u0, nu, n_last, plan.tile_k, plan, psum_dtype)


def _transpose_group(sides, u0, nu, n_last, tile, plan, psum_dtype):
    """PE transposes of tiles ``u0 .. u0 + nu - 1`` (all ``tile`` rows but the last, with
    ``n_last``) of each ``(rows [tile, tiles, D], dst [d_tile, d_chunks, tiles * tile])``
    of ``sides`` (2 sides: K and V, or Q and dO) into one PSUM tile, evacuated by one copy
    per side and D chunk (``tensor_copy``, whatever ``plan.elementwise``). One
    bank holds ``plan.t_group`` tiles of both sides: a handful of transposes run back to
    back into it, not one bank rotation (and one small copy) per transpose."""
    dt, dc = plan.d_tile, plan.d_chunks
    tp = nl.ndarray((dt, 2 * dc, nu * tile), dtype=psum_dtype, buffer=nl.psum, name="load_t")
    cols = (nu - 1) * tile + n_last
    for s, (rows, _) in enumerate(sides):
        for u in range(nu):
            n = tile if u < nu - 1 else n_last
            for c, (d0, dcs) in enumerate(tiled(plan.d, dt)):
                nisa.nc_transpose(
                    dst=tp[0:dcs, s * dc + c, u * tile : u * tile + n],
                    data=rows[0:n, u0 + u, d0 : d0 + dcs],
                )
    for s, (_, dst) in enumerate(sides):
        for c, (_, dcs) in enumerate(tiled(plan.d, dt)):
            out = dst[0:dcs, c, u0 * tile : u0 * tile + cols]
            nisa.tensor_copy(dst=out, src=tp[0:dcs, s * dc + c, 0:cols])


def _load_kv_block(k, v, b, hk, jb, kv_tiles, n_kt, plan, psum_dtype, phases):
    """Load the key tiles of block ``jb`` into ``kv_tiles``: ``phases`` 1 = rows (DMA),
    2 = transposes, 3 = both."""
    j0, n_j = tiled(n_kt, plan.kv_block)[jb]
    if phases != 2:
        tiles = _load_kv_rows(k, v, b, hk, j0, n_j, plan)
        for u in range(n_j):
            kv_tiles[j0 + u] = tiles[u]
    if phases != 1 and plan.transpose != "dma":
        tiles = []
        for j in range(j0, j0 + n_j):
            tiles.append(kv_tiles[j])
        _transpose_kv(tiles, plan, psum_dtype)


def _store_scaled(dst, acc, n, scale, d):
    """``dst [n, D]`` (HBM) = ``scale * acc`` rounded to dst's dtype; zeros when ``acc`` is None."""
    staged = nl.ndarray((n, d), dtype=dst.dtype, buffer=nl.sbuf, name="grad_out")
    if acc is None:
        nisa.memset(dst=staged, value=0.0)
    else:
        nisa.tensor_scalar(dst=staged, data=acc, op0=nl.multiply, operand0=scale)
    nisa.dma_copy(dst=dst, src=staged)


def _store_tiles(dst, acc, entries, tile, scale, plan, on_scalar=False):
    """Store ``scale * acc[:, i, :]`` (fp32 SBUF ``[tile, tiles, D]``) into rows
    ``i * tile ..`` of ``dst`` (HBM ``[rows, D]``) for the ``(i, rows, summed)`` entries (in
    increasing ``i``), zeros for an entry not ``summed``: one staging tile, one scaling
    (VectorE, or ScalarE when ``on_scalar``) and one DMA per run of consecutive full
    tiles alike."""
    d = plan.d
    runs = []
    for i, n, summed in entries:
        extend = len(runs) > 0 and runs[-1][3] == summed and runs[-1][2] == tile
        extend = extend and n == tile and runs[-1][0] + runs[-1][1] == i
        extend = extend and runs[-1][1] < STORE_TILES
        if extend:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, n, summed)
        else:
            runs.append((i, 1, n, summed))
    for i0, nt, n_last, summed in runs:
        staged = nl.ndarray((tile, nt, d), dtype=dst.dtype, buffer=nl.sbuf, name="grad_out")
        rows = n_last if nt == 1 else tile
        out = staged[0:rows, :, :]
        if not summed:
            nisa.memset(dst=out, value=0.0)
        elif on_scalar:
            src = acc[0:rows, i0 : i0 + nt, :]
            nisa.activation(dst=out, op=nl.copy, data=src, scale=scale)
        else:
            src = acc[0:rows, i0 : i0 + nt, :]
            nisa.tensor_scalar(dst=out, data=src, op0=nl.multiply, operand0=scale)
        view = _tiled_rows(dst, i0 * tile, nt, tile, n_last)
        _dma(view, out if nt > 1 else staged[0:rows, 0, :], plan)


def _store_kv_sums(kv_sums, js, dk_dst, dv_dst, scale, plan):
    """dK (scaled on ScalarE) and dV (VectorE; dropout's ``1 / (1 - p)``) of key tiles
    ``js`` (increasing) into the rows of ``dk_dst``, ``dv_dst`` (HBM ``[Sk, D]``)."""
    entries = []
    for j in js:
        entries.append((j, tile_size(plan.sk, plan.tile_k, j * plan.tile_k), kv_sums.started[j]))
    _store_tiles(dk_dst, kv_sums.dk, entries, plan.tile_k, scale, plan, True)
    _store_tiles(dv_dst, kv_sums.dv, entries, plan.tile_k, plan.inv_keep, plan)


def _pass_pairs(p0, n_tiles, n_kt, plan):
    """The :class:`TilePair` s of one query pass that some query sees, in the loop order:
    "kv_outer" walks key blocks, and within a block each query tile against the block's key
    tiles; "q_outer" walks query tiles, each against every key tile."""
    tq, tk, kb = plan.tile_q, plan.tile_k, plan.kv_block
    pairs = []
    if plan.loop_order == "kv_outer":
        triples = []
        for jb, jbs in tiled(n_kt, kb):
            for t in range(n_tiles):
                for j in range(jb, jb + jbs):
                    triples.append((t, j))
    else:
        triples = []
        for t in range(n_tiles):
            for j in range(n_kt):
                triples.append((t, j))
    for tj in triples:
        t, j = tj
        q0, k0 = (p0 + t) * tq, j * tk
        n_q, n_k = tile_size(plan.sq, tq, q0), tile_size(plan.sk, tk, k0)
        seen = tile_visibility(q0, n_q, k0, n_k, plan.sq, plan.sk, (plan.left, plan.right))
        if seen != "none":
            pairs.append(TilePair(t=t, j=j, q0=q0, n_q=n_q, k0=k0, n_k=n_k, seen=seen))
    return pairs


def _softcap_steps(
    step, states, pairs, qs, kv_tiles, scale, plan, cap, drop, masks, s_dp, kv_group
):
    """Softcap, stage 1 of loop step ``step``: each part on a pair some steps behind the part
    issued after it, so no in-order engine queue waits out the latency of a result it has
    just made (oldest first): dS of pair ``step - 6`` and ``(dP - D) P (1 - t)`` of pair
    ``step - 5`` (VectorE), dP - D of pair ``step - 4`` (TensorE, into ``s_dp``'s dP half),
    ``P (1 - t)`` of pair ``step - 3`` (GpSimd), P, ``1 + t`` and the masks of pair
    ``step - 2`` (:func:`_scores`), ``1 - t`` of pair ``step - 1``, S (into ``s_dp``'s S
    half) and the softplus of pair ``step``. ``s_dp``: ``[tq, 2, tk]`` fp32 PSUM, half of
    a bank two loop steps share (the kernel's loop). Under dropout :func:`_scores` does
    the rest, its dP in ``s_dp``'s dP half. With ``plan.softcap_tanh`` the S and t of
    pair ``step`` and up to SOFTCAP_TANH_BURST - 1 later pairs of its key block
    (``kv_group``: per pair its block) come in one burst, unless an earlier burst made
    them: ScalarE switches between the tanh and exp tables twice per burst."""
    n_pairs = len(pairs)
    if not plan.dropout:
        for lag in (6, 5):
            n = step - lag
            if 0 <= n < n_pairs:
                _softcap_ds(states[n], pairs[n], plan, lag == 6)
        n = step - 4
        if 0 <= n < n_pairs:
            _softcap_dp(states[n], qs, kv_tiles[pairs[n].j], pairs[n], plan, cap, s_dp)
        n = step - 3
        if 0 <= n < n_pairs:
            _softcap_pb(states[n], pairs[n], plan)
    n = step - 2
    if 0 <= n < n_pairs:
        kv = kv_tiles[pairs[n].j]
        states[n] = _scores(qs, kv, pairs[n], scale, plan, cap, drop[n], masks[n], states[n], s_dp)
        drop[n], masks[n] = None, None
    n = step - 1
    if 0 <= n < n_pairs:
        _softcap_one_minus_t(states[n], pairs[n], plan, cap)
    n = step
    if 0 <= n < n_pairs and not plan.softcap_tanh:
        kv = kv_tiles[pairs[n].j]
        states[n] = _softcap_scores(qs, kv, pairs[n], scale, plan, cap, s_dp)
    if 0 <= n < n_pairs and plan.softcap_tanh and states[n] is None:
        # a burst: S and t of this pair and the next ones up to SOFTCAP_TANH_BURST, their
        # S four to a PSUM bank; under kv_outer only of this pair's key block (the next
        # block's K^T is made at this block's last pair)
        m = n
        while m < min(n + SOFTCAP_TANH_BURST, n_pairs) and (
            plan.loop_order == "q_outer" or kv_group[m] == kv_group[n]
        ):
            if (m - n) % 4 == 0:
                s_cap = nl.ndarray(
                    (plan.tile_q, 4, plan.tile_k), dtype=nl.float32, buffer=nl.psum, name="s_cap"
                )
            s_m = s_cap[:, (m - n) % 4 : (m - n) % 4 + 1, :]
            kv = kv_tiles[pairs[m].j]
            states[m] = _softcap_scores(qs, kv, pairs[m], scale, plan, cap, s_m)
            m += 1


@nki.jit
def flash_attention_bwd_kernel(
    dout, q, k, v, out, lse, sinks, scale, plan, kv_bounds=None, attn_mask=None, row_keys=None
):
    """``(dq, dk, dv)`` for attention in BHSD layout (HBM): ``dout, q, out [B, H, Sq, D]``,
    ``k, v [B, Hkv, Sk, D]``, ``lse [B, H, Sq]`` fp32; ``scale`` is the softmax scale
    (a compile-time float) and ``plan`` the :class:`FlashAttentionBwdPlan` for these shapes.

    The tile pairs of a pass run as a three-stage software pipeline in program order
    (scores of pair n, dK/dV and dS^T of pair n - lag_kv, dQ of pair n - lag_q), so each engine's
    in-order queue has independent work while the previous pair's results travel.
    Launched as ``flash_attention_bwd_kernel[plan.lnc]``: each physical core takes its
    (batch, KV head) groups ``plan.core_groups[nl.program_id(0)]`` and writes only their
    dq, dk and dv. A group split over the cores by query passes (fewer groups than cores)
    has each core write its dq rows and its fp32 dK/dV partial sums (scaled) to its own
    slot of the extra outputs ``dk_part, dv_part [lnc, split groups, Sk, D]``, returned
    after dq, dk and dv; the op adds the slots in core order.

    ``plan.packed``: dout, q, out, dq ``[B, Sq, H, D]`` and k, v, dk, dv ``[B, Sk, Hkv, D]``
    (read and written through BHSD views). ``kv_bounds`` (``plan.runtime_bounds``): each
    query row's visible keys, as the forward's; a row that sees none must come with a
    finite ``lse`` (its P is then 0). ``attn_mask`` and ``row_keys`` are the forward
    kernel's (None without them).
    """
    if plan.packed:
        dout, q, out = (
            dout.permute((0, 2, 1, 3)),
            q.permute((0, 2, 1, 3)),
            out.permute((0, 2, 1, 3)),
        )
        k, v = k.permute((0, 2, 1, 3)), v.permute((0, 2, 1, 3))
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
    assert nl.num_programs(0) == plan.lnc, "flash_attention_bwd: launch it [plan.lnc]"
    q_shape, k_shape = (B, H, Sq, D), (B, Hkv, Sk, D)
    if plan.packed:
        q_shape, k_shape = (B, Sq, H, D), (B, Sk, Hkv, D)
    dq_hbm = nl.ndarray(q_shape, dtype=q.dtype, buffer=nl.shared_hbm, name="dq")
    dk_hbm = nl.ndarray(k_shape, dtype=k.dtype, buffer=nl.shared_hbm, name="dk")
    dv_hbm = nl.ndarray(k_shape, dtype=v.dtype, buffer=nl.shared_hbm, name="dv")
    dq, dk, dv = dq_hbm, dk_hbm, dv_hbm
    if plan.packed:
        bhsd = (0, 2, 1, 3)
        dq, dk, dv = dq_hbm.permute(bhsd), dk_hbm.permute(bhsd), dv_hbm.permute(bhsd)
    assert (kv_bounds is None) == (not plan.runtime_bounds), (
        "flash_attention_bwd: kv_bounds and plan.runtime_bounds go together"
    )
    bounds = load_bounds(kv_bounds, plan)
    core = nl.program_id(0)
    parts = (plan.lnc, plan.split_groups, Sk, D)
    if plan.split_groups:
        dk_part = nl.ndarray(parts, dtype=nl.float32, buffer=nl.shared_hbm, name="dk_part")
        dv_part = nl.ndarray(parts, dtype=nl.float32, buffer=nl.shared_hbm, name="dv_part")
    dsink = None
    if sinks is not None:
        dsink = nl.ndarray((B, H, Sq, 1), dtype=nl.float32, buffer=nl.shared_hbm, name="dsink")

    tq, tk = plan.tile_q, plan.tile_k
    n_kt = (Sk + tk - 1) // tk
    kv_outer = plan.loop_order == "kv_outer"
    # PE transposes keep the input dtype in PSUM from NeuronCore-v3 (bit-accurate mode);
    # NeuronCore-v2 transposes through an fp32 matmul.
    psum_dtype = q.dtype if plan.pe_transpose_keeps_dtype else nl.float32
    launch_feat = score_inputs(attn_mask, row_keys, plan, plan.tile_q, q.dtype, plan.tile_k)

    for b, hk, group_passes, slot in plan.core_groups[core]:
        feat = for_group(launch_feat, b, hk, plan.groups, scale, plan, q.dtype)
        if len(group_passes) == 0:  # a split group none of whose passes is this core's
            for k0, n_k in tiled(Sk, tk):
                _store_scaled(dk_part[core, slot, k0 : k0 + n_k, :], None, n_k, scale, D)
                _store_scaled(dv_part[core, slot, k0 : k0 + n_k, :], None, n_k, 1.0, D)
            continue
        # dK and dV of this KV head, summed over its query heads and query tiles (fp32).
        kv_sums = KVSums(
            dk=nl.ndarray((tk, n_kt, D), dtype=nl.float32, buffer=nl.sbuf, name="dk_acc"),
            dv=nl.ndarray((tk, n_kt, D), dtype=nl.float32, buffer=nl.sbuf, name="dv_acc"),
            started=[False] * n_kt,
            dk_ps=None,
            dv_ps=None,
            in_block=[],
        )
        kv_all = None
        if not kv_outer:  # every key tile of the head stays in SBUF
            kv_all = _load_kv_rows(k, v, b, hk, 0, n_kt, plan)
            if plan.transpose != "dma":
                _transpose_kv(kv_all, plan, psum_dtype)
        # This core's query passes of this KV head (all of them unless the group is split):
        # each query head's tiles, q_block at a time.
        passes = []
        for g, p0, n_pass in group_passes:
            passes.append((hk * plan.groups + g, p0, n_pass))
        pass_pairs = []
        for ps in passes:
            pass_pairs.append(_pass_pairs(ps[1], ps[2], n_kt, plan))
        kb = plan.kv_block
        # per pass its key blocks in order of first use; per key tile the last pass seeing it
        pass_blocks, last_pass = [], [-1] * n_kt
        for i in range(len(passes)):
            pass_blocks.append([])
            for pr in pass_pairs[i]:
                last_pass[pr.j] = i
                if len(pass_blocks[i]) == 0 or pass_blocks[i][-1] != pr.j // kb:
                    pass_blocks[i].append(pr.j // kb)
        if slot < 0:
            dk_dst, dv_dst = dk[b, hk], dv[b, hk]
        else:  # this core's fp32 partial sums of a split group
            dk_dst, dv_dst = dk_part[core, slot], dv_part[core, slot]
        qs_next = _query_pass_dma(dout, q, out, lse, sinks, dsink, b, passes[0], plan, bounds, feat)
        _query_pass_prepare(qs_next, plan, psum_dtype)
        kv_next = kv_all
        if kv_outer:
            kv_next = [None] * n_kt
            if len(pass_pairs[0]) > 0:
                jb0 = pass_pairs[0][0].j // kb
                _load_kv_block(k, v, b, hk, jb0, kv_next, n_kt, plan, psum_dtype, 3)
        cap_next = None
        for i in range(len(passes)):
            h, p0, n_tiles = passes[i]
            qs, kv_tiles = qs_next, kv_next
            pairs = pass_pairs[i]
            n_pairs = len(pairs)
            cap, cap_next = cap_next, None  # softcap: made after the pass's prepare
            if plan.softcap and cap is None:
                cap = _softcap_pass(qs, n_tiles, plan, psum_dtype)
            # Prefetch the next pass while this one runs: its DMAs now, its transposes
            # (and its first key block, under kv_outer) near this pass's end.
            has_next = i + 1 < len(passes)
            next_block = -1
            if has_next:
                qs_next = _query_pass_dma(
                    dout, q, out, lse, sinks, dsink, b, passes[i + 1], plan, bounds, feat
                )
                if kv_outer and len(pass_pairs[i + 1]) > 0:
                    next_block = pass_pairs[i + 1][0].j // kb
            if kv_outer:
                kv_next = [None] * n_kt
                if plan.kv_resident and next_block in pass_blocks[i]:
                    next_block = -1  # held over from this pass (see its end)
            loading = []  # (block, into kv_next) whose rows this pass loads: transposes due
            prepared = 0  # steps of the next pass's preparation issued so far
            q_sums = QuerySums(dq=None, dq_ps=None, started=[False] * n_tiles)
            if kv_outer:
                q_sums.dq = nl.ndarray(
                    (tq, n_tiles, D), dtype=nl.float32, buffer=nl.sbuf, name="dq_acc"
                )
            # Where PSUM sums start and end: the key block of a pair (dK/dV under
            # kv_outer) and its run of consecutive pairs with one query tile (dQ).
            kv_group, q_group = [], []
            for n in range(len(pairs)):
                kv_group.append(pairs[n].j // kb if kv_outer else n)
                q_group.append((pairs[n].t, kv_group[n]) if kv_outer else pairs[n].t)
            blocks = []  # key blocks in the order the pass first uses them
            for jb in kv_group if kv_outer else ():
                if len(blocks) == 0 or blocks[-1] != jb:
                    blocks.append(jb)
            states = [None] * n_pairs  # per pair: its PairTiles, from stage 1 to stage 3
            drop = [None] * n_pairs  # dropout: per pair its DropBits, made ahead of stage 1
            masks = [None] * n_pairs  # a mask with a query dim: per pair its tile, loaded ahead
            stored_mask = plan.mask and not plan.mask_row
            ahead = max(DROPOUT_STAGES if plan.dropout else 0, MASK_PREFETCH if stored_mask else 0)
            for step in range(-ahead, n_pairs + plan.lag_q):
                n = step + MASK_PREFETCH
                if stored_mask and 0 <= n < n_pairs:
                    pr = pairs[n]
                    masks[n] = load_mask_tile(feat, h, pr.q0, pr.n_q, pr.k0, pr.n_k, plan)
                for stage in range(DROPOUT_STAGES if plan.dropout else 0):
                    n = step + DROPOUT_STAGES - stage
                    if 0 <= n < n_pairs:
                        if stage == 0:
                            t, n_q = pairs[n].t, pairs[n].n_q
                            drop[n] = DropBits(
                                row_key=qs.row_key[0:n_q, t : t + 1], n_q=n_q, k0=pairs[n].k0,
                                n_k=pairs[n].n_k, x=None, y=None, bits=None,
                            )  # fmt: skip
                        dropout_stage(drop[n], stage, feat)
                n = step
                if 0 <= n < n_pairs:
                    pair = pairs[n]
                    first = n == 0 or kv_group[n - 1] != kv_group[n]
                    last = n == n_pairs - 1 or kv_group[n + 1] != kv_group[n]
                    # prefetch the next key block: rows now, transposes at its end
                    ahead, dst_tiles = -1, kv_tiles
                    if kv_outer:
                        at = blocks.index(kv_group[n])
                        if at + 1 < len(blocks):
                            ahead = blocks[at + 1]
                        else:
                            ahead, dst_tiles = next_block, kv_next
                    if ahead >= 0 and first and dst_tiles[ahead * kb] is None:
                        _load_kv_block(k, v, b, hk, ahead, dst_tiles, n_kt, plan, psum_dtype, 1)
                        loading.append((ahead, dst_tiles is kv_next))
                    if not plan.softcap:
                        kv_n = kv_tiles[pair.j]
                        # two consecutive pairs' S and dP share one PSUM bank ([tq, 4, tk] fp32)
                        if n % 2 == 0:
                            s_dp2 = nl.ndarray(
                                (tq, 4, tk), dtype=nl.float32, buffer=nl.psum, name="s_dp"
                            )
                        half = s_dp2[:, 2 * (n % 2) : 2 * (n % 2) + 2, :]
                        states[n] = _scores(
                            qs, kv_n, pair, scale, plan, None, drop[n], masks[n], None, half
                        )
                        drop[n], masks[n] = None, None
                    if ahead >= 0 and last:
                        if (ahead, dst_tiles is kv_next) in loading:
                            _load_kv_block(k, v, b, hk, ahead, dst_tiles, n_kt, plan, psum_dtype, 2)
                    if has_next:
                        # the next pass's transposes, -lse and -D, tile by tile over this
                        # pass's last 3/4 of pairs (its rows were loaded at this pass's
                        # start): no burst of VectorE and PE work at the pass boundary
                        n_next = len(qs_next.steps)
                        lead = n_pairs // 4
                        due = 0
                        if n >= lead:
                            due = ceil_div((n - lead + 1) * n_next, n_pairs - lead)
                        while prepared < due:
                            _prepare_step(qs_next, prepared, plan, psum_dtype)
                            prepared += 1
                        if plan.softcap and prepared == n_next and cap_next is None:
                            # its -lse and -D made: the next pass's softcap columns and rows
                            cap_next = _softcap_pass(qs_next, passes[i + 1][2], plan, psum_dtype)
                if plan.softcap:  # stage 1 over 7 loop steps (_softcap_steps)
                    # the S of pair `step` beside the dP of an earlier pair (4 steps back;
                    # 2 under dropout) in one half of a PSUM bank two steps share
                    half = None
                    if 0 <= step < n_pairs + (2 if plan.dropout else 4):
                        if step % 2 == 0:
                            s_dp2 = nl.ndarray(
                                (tq, 4, tk), dtype=nl.float32, buffer=nl.psum, name="s_dp"
                            )
                        half = s_dp2[:, 2 * (step % 2) : 2 * (step % 2) + 2, :]
                    _softcap_steps(
                        step, states, pairs, qs, kv_tiles, scale, plan, cap, drop, masks, half,
                        kv_group,
                    )  # fmt: skip
                n = step - plan.lag_kv
                if 0 <= n < n_pairs:
                    first = n == 0 or kv_group[n - 1] != kv_group[n]
                    last = n == n_pairs - 1 or kv_group[n + 1] != kv_group[n]
                    _kv_grads(states[n], qs, pairs[n], first, last, kv_sums, plan, psum_dtype)
                n = step - plan.lag_q
                if 0 <= n < n_pairs:
                    first = n == 0 or q_group[n - 1] != q_group[n]
                    last = n == n_pairs - 1 or q_group[n + 1] != q_group[n]
                    kv = kv_tiles[pairs[n].j]
                    _q_grads(states[n], kv, pairs[n], first, last, q_sums, dq[b, h], scale, plan)
                    states[n] = None
            if has_next and n_pairs == 0:  # a pass no key reaches
                _query_pass_prepare(qs_next, plan, psum_dtype)
                if next_block >= 0:
                    _load_kv_block(k, v, b, hk, next_block, kv_next, n_kt, plan, psum_dtype, 3)
            if kv_outer and has_next and plan.kv_resident:
                # the next pass's blocks this pass holds: kept, not loaded again
                for jb in pass_blocks[i + 1]:
                    if jb in pass_blocks[i]:
                        j0, n_j = tiled(n_kt, kb)[jb]
                        for j in range(j0, j0 + n_j):
                            kv_next[j] = kv_tiles[j]
            entries = []  # dq: this pass's tiles (under q_outer, those stored already skipped)
            for t, (q0, n_q) in enumerate(tiled(Sq, tq)[p0 : p0 + n_tiles]):
                if kv_outer or not q_sums.started[t]:
                    entries.append((t, n_q, q_sums.started[t]))
            rows = dq[b, h, p0 * tq : p0 * tq + min(n_tiles * tq, Sq - p0 * tq), :]
            _store_tiles(rows, q_sums.dq, entries, tq, scale, plan, True)
            # key tiles no later pass of this core sees: dK and dV are final, stored now
            done = []
            for j in range(n_kt):
                if last_pass[j] == i:
                    done.append(j)
            _store_kv_sums(kv_sums, done, dk_dst, dv_dst, scale, plan)
        rest = []  # key tiles no pass of this core sees: zeros
        for j in range(n_kt):
            if last_pass[j] < 0:
                rest.append(j)
        _store_kv_sums(kv_sums, rest, dk_dst, dv_dst, scale, plan)
    if plan.split_groups and sinks is not None:
        return dq_hbm, dk_hbm, dv_hbm, dk_part, dv_part, dsink
    if plan.split_groups:
        return dq_hbm, dk_hbm, dv_hbm, dk_part, dv_part
    if sinks is not None:
        return dq_hbm, dk_hbm, dv_hbm, dsink
    return dq_hbm, dk_hbm, dv_hbm
