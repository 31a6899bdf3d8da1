"""The backward's tunable config (``FlashAttentionBwdConfig``) and its tile plan
(``FlashAttentionBwdPlan``, built by :func:`plan`): query passes, key blocks, the split of
(batch, KV head) groups over cores, pipeline lags and the SBUF/PSUM budget, read by both
the kernel and the op's ``check``.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_kernels.backend import nl
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.attention_contract import (
    key_bounds,
    refuse_bounds_features,
    score_features,
    window_bounds,
)
from neuron_kernels.kernels.attention_tiles import (
    DROPOUT_STAGES,
    bounds_bytes,
    runtime_bounds_mode,
)
from neuron_kernels.kernels.spec import (
    ITEMSIZE,
    TunableConfig,
    ceil_div,
    tunable,
)
from neuron_kernels.kernels.tiling import split_work, tiled

__all__ = [
    "DEAD_ROW_BIAS",
    "FlashAttentionBwdConfig",
    "FlashAttentionBwdPlan",
    "OP",
    "PIPELINE_LAG_KV",
    "PIPELINE_LAG_Q",
    "SOFTCAP_STEPS",
    "SOFTCAP_TANH_BURST",
    "SOFTPLUS_SOFTCAP_MAX",
    "STORE_TILES",
    "plan",
]


OP = "flash_attention_bwd"


# The exp bias of a row an attention mask leaves with no key (its lse is -inf): every P of
# the row is exp(score - 3e38) = 0, whatever its (finite or -inf) masked scores.
DEAD_ROW_BIAS = -3.0e38


# Software pipeline depth (tile pairs): stage 2 (dK/dV, dS^T) and stage 3 (dQ) trail the
# scores by this many pairs, so each in-order engine queue has independent work while a
# pair's results cross engines (~200-cycle engine latency, cost_model/params.py).
# Modeled at B1 H4 S4096 D128 bf16 non-causal (with S and dP sharing a PSUM bank, half the
# dS^T by DMA): 6/12 gives 68.6% TensorE, 4/8 64.7%, 8/16 68.5%, 3/6 53.4% (before the
# ds_dma_tiles spread settled on pairs 1 and 3 of every 4: 68.1% with 6/12). Since the
# loads left GpSimd's DMA queue and 3 of 4 dS^T go by DMA, 8/16 is ahead everywhere
# (B1 H32 Hkv8 D128 bf16, LNC=1, whole launch): non-causal S4096 10,617.6 us vs 10,647.3
# with 6/12, causal S4096 5,971.4 vs 6,087.0, causal S8192 21,812.6 vs 22,096.0, window
# (1024, 0) at S8192 7,102.3 vs 7,614.3; 8/20 gains ~1% more but its pairs in flight no
# longer fit the default config under 128 KiB of SBUF at S4096.
PIPELINE_LAG_KV = 8


PIPELINE_LAG_Q = 16


# Softcap: ``1 - t = 2 exp(-softplus(2 y))`` keeps ScalarE in one activation table (softplus
# and exp), but ``softcap * t - lse = -softcap (1 - t) + (softcap - lse)`` then carries an
# absolute error ~softcap * 2^-22 (fp32 ulps of values near 1 and of softcap - lse), so a
# relative error of P that stays below 2^-16 in fp32 (its tolerance is 1e-4) and 2^-3 of a
# half ulp of P in bf16 and fp16 up to these softcaps. Larger ones (tanh nearly the identity;
# Gemma 2 uses 50 and 30) take t = tanh(y) itself and switch ScalarE tables twice per burst
# of pairs (SOFTCAP_TANH_BURST).
SOFTPLUS_SOFTCAP_MAX = {"float32": 64.0, "float16": 256.0, "bfloat16": 1024.0}


# Softcap: stage 1 spans this many more loop steps (:func:`_softcap_steps`), so stages 2
# and 3 trail it by as many more.
# Modeled (B1 H4 Hkv1 S4096 D128 bf16 causal, softcap 50): 12 gives 1,401 us, 6 1,479 us,
# 16 1,391 us (more SBUF for the pairs in flight). With the lags at 8/16, the loads on
# SyncE's queue and 3 of 4 dS^T by DMA (B1 H32 Hkv8, LNC=1): 12 gives 9,388 us, 6 9,391.
SOFTCAP_STEPS = 12


# Softcap above SOFTPLUS_SOFTCAP_MAX (t = tanh(y)): ScalarE makes the tanh of up to this
# many pairs of one key block back to back, so it switches tables (tanh, exp) twice per
# burst rather than per pair (:func:`_softcap_steps`); the default key block has 64 pairs.
# Modeled (B1 H32 Hkv8 S4096 D128 bf16 causal, softcap 2000, LNC=1): 64 gives 11,992 us,
# 32 12,345, 16 12,830, 8 15,283, 1 (per pair) 51,685.
SOFTCAP_TANH_BURST = 64


# Output tiles one store stages and moves at most (one DMA; its SBUF staging is budgeted).
STORE_TILES = 8


@dataclass(frozen=True)
class FlashAttentionBwdConfig(TunableConfig):
    """Tile-level choices of the attention backward kernel.

    Attributes:
        tile_k: keys per tile: the partition extent of the dK/dV tiles and the free extent
            of the score tiles (queries are always 128 per tile, on partitions).
        kv_block: key tiles per block under "kv_outer": their dK/dV sums share one PSUM
            bank each and every query tile meets the block's tiles in a row, so dQ sums in
            PSUM over the block before one fold into SBUF (clipped to what one bank holds
            at the head dim: 2 tiles at D=256).
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
        ds_dma_tiles: under "pe" or "vector", of every 4 tile pairs (by ``(t + j) % 4``,
            spread evenly), how many make dS^T by one SBUF-to-SBUF DMA transpose instead,
            moving work from TensorE and ScalarE (the PSUM evacuation) to the idle DMA
            queues; 2-byte dtypes on trn2+ only (0 elsewhere). A softcap takes it too
            (modeled causal S4096 softcap 50, B1 H32 Hkv8 D128 bf16, LNC=1: 9,388 us with 3
            vs 9,524 with 0, 9,454 with 2, 9,472 with 4).
        elementwise: which engines do the per-pair elementwise work besides exp (ScalarE):
            "vector" computes dS in one VectorE pass from PSUM and evacuates dS^T on VectorE;
            "split" has ScalarE compute dP - D from PSUM and evacuate dS^T, leaving VectorE
            one 2-byte SBUF multiply (its fast mode) for dS (an extra rounding of dP - D to the
            input dtype); "balanced" alternates the two by tile pair.
    """

    op_name = OP

    tile_k: int = tunable(
        128,
        (64, 128),
        "modeled: 42.0% TensorE with 64 (trn2 B1 H4 S4096 D128 bf16) vs 68.1% with 128",
    )
    kv_block: int = tunable(
        4,
        (1, 4),
        "modeled: 68.1% TensorE (trn2 B1 H4 S4096 D128 bf16) vs 54.8% with 1-tile blocks",
    )
    q_block: int = tunable(
        16,
        (4, 16, 64),
        "modeled: 68.1% TensorE at S4096 (54.0% with 4, 70.7% with 64, which needs 2x the SBUF)",
    )
    loop_order: str = tunable(
        "kv_outer",
        ("kv_outer", "q_outer"),
        "modeled: 68.1% TensorE at S4096 vs 50.9% q_outer (two SBUF folds per pair)",
    )
    transpose: str = tunable(
        "pe",
        ("pe", "dma", "vector"),
        "modeled: 68.1% TensorE at S4096 vs 50.5% dma, 34.3% vector; every dtype and target",
    )
    ds_dma_tiles: int = tunable(
        3,
        (0, 1, 2, 3, 4),
        "modeled: trn2, B1 H32 Hkv8 D128 bf16, LNC=1, the loads on SyncE's DGE queue: "
        "non-causal S4096 10,647 us vs 11,052 with 2; causal S8192 22,096 vs 23,081; "
        "window (1024, 0) at S8192 7,614 vs 8,009; causal S4096 6,087 vs 7,443 with 4",
    )
    elementwise: str = tunable(
        "split",
        ("vector", "split", "balanced"),
        "modeled: 68.1% TensorE at S4096 vs 60.7% vector (VectorE binds), 62.1% balanced",
    )


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
    left: int  # keys a query sees before its diagonal, -1 unbounded (window_bounds)
    right: int  # keys a query sees after its diagonal, -1 unbounded (causal: 0)
    softcap: float  # > 0: scores capped to softcap * tanh(scale * S / softcap); 0: off
    softcap_tanh: bool  # softcap > SOFTPLUS_SOFTCAP_MAX: t by tanh, not 1 - t by softplus
    mask: str  # attn_mask: "" none, "bool" (uint8 in HBM, 0 masks) or "float" (added)
    mask_dims: tuple  # per dim of the 4-d mask (B, H, Sq, Sk): True full, False size 1
    mask_row: bool  # no query dim, no softcap: added to S on TensorE (the forward's for_group)
    dropout: int  # dropout_threshold(p), 0 off (the forward's draw, replayed)
    inv_keep: float  # 1 / (1 - dropout_p)
    tile_q: int  # query rows per tile (partitions of the score tiles)
    tile_k: int  # keys per tile
    q_block: int  # query tiles per pass
    kv_block: int  # key tiles per block (kv_outer), fitted to one PSUM bank per sum
    d_tile: int  # rows of one contraction chunk over D (<= pmax)
    d_chunks: int  # contraction chunks over D
    loop_order: str  # "kv_outer" or "q_outer"
    transpose: str  # "pe", "dma" or "vector"
    ds_dma_tiles: int  # tile pairs of every 4 whose dS^T is a DMA transpose (all under "dma")
    elementwise: str  # "vector" or "split"
    vector_transpose: int  # VectorE transpose block (32)
    lag_kv: int  # pipeline: stage 2 (dK/dV, dS^T) runs this many pairs behind the scores
    lag_q: int  # pipeline: stage 3 (dQ) runs this many pairs behind the scores
    pe_transpose_keeps_dtype: bool  # PE transposes write the input dtype to PSUM (v3+)
    lnc: int  # physical cores of the launch (kernel[lnc])
    core_groups: tuple  # per core: ((b, kv head, its query passes, split slot or -1), ...)
    split_groups: int  # groups whose query passes are split over the cores (dK/dV partials)
    sbuf_bytes: int
    psum_banks: int
    packed: bool = False  # dout, q, k, v, out and the gradients in [B, S, heads, D] rows
    runtime_bounds: str = ""  # run-time key bounds per query row (the forward's plan field)
    hwdge: bool = False  # row loads and gradient stores on SyncE's hardware DGE queues (v3+)
    t_group: int = 1  # row tiles whose PE transposes (both sides: K and V, Q and dO) share a bank
    kv_resident: bool = False  # kv_outer: a pass's key blocks stay loaded for the next pass
    dq_runs: int = 1  # dQ PSUM sums (runs of pairs of one query tile) one bank holds


def plan(problem: dict, dtype: str, config: FlashAttentionBwdConfig, target: Target, lnc: int = 1):
    """The tile plan of ``config`` for ``problem`` in ``dtype`` on ``target``, the
    (batch, KV head) groups split over ``lnc`` cores: a group's dK and dV sum over all its
    query heads and rows, so a group stays on one core and the cores write disjoint
    gradients (with fewer groups than cores, a core idles: splitting a group would need
    a cross-core sum of dK/dV).

    Raises:
        LimitError: DMA transposes on a target or dtype that has none.
    """
    if config.transpose == "dma":
        target.check_dma_transpose(OP, "config transpose", dtype, ITEMSIZE[dtype])
    # DMA transposes of dS: 2-byte dtypes on trn2+ only; elsewhere every pair goes the
    # configured transpose's way.
    dma_ok = target.has_dma_transpose and ITEMSIZE[dtype] == 2
    ds_dma_tiles = 4 if config.transpose == "dma" else (config.ds_dma_tiles if dma_ok else 0)
    b, hkv, groups = problem["b"], problem["hkv"], problem["groups"]
    sq, sk, d = problem["sq"], problem["sk"], problem["d"]
    causal = bool(problem.get("causal", False))
    window = (problem.get("window_left", -1), problem.get("window_right", -1))
    bounds = window_bounds(causal, window)
    item = ITEMSIZE[dtype]
    tq = target.pmax
    tk = min(config.tile_k, target.pmax)
    d_tile = min(d, target.pmax)
    d_chunks = ceil_div(d, target.pmax)
    n_qt = min(config.q_block, ceil_div(sq, tq))  # query tiles held per pass
    rows = min(config.q_block * tq, sq)
    n_kt = ceil_div(sk, tk)
    keys = min(tk, sk)

    # One PSUM bank per dK and per dV sum of a key block (kv_outer).
    kv_block = max(1, min(config.kv_block, n_kt, target.psum_bank_bytes // (d * 4)))
    if config.loop_order == "q_outer":
        kv_block = 1
    lag = PIPELINE_LAG_Q

    # SBUF bytes per partition, the live tiles at the peak (an upper bound). Of the query
    # side, this pass's and the next's (prefetched) rows are live together; O only for
    # the next pass (dead once its D is made, during this pass), dQ sums only for this one.
    q_side = 2 * n_qt * d * item  # Q and dO rows
    q_side += 2 * d_chunks * rows * item  # Q^T and dO^T
    q_side += 2 * n_qt * 4  # -lse and -D columns
    q_once = n_qt * d * item  # O rows (for D)
    rows_t = d_chunks * tk * item  # K^T or V^T of a key tile
    key_tile = 2 * d * item + 2 * rows_t  # K and V rows, K^T and V^T
    kv_resident = False
    if config.loop_order == "kv_outer":
        q_once += n_qt * d * 4  # dQ accumulators
        kv_side = 2 * kv_block * key_tile  # this key block and the next (prefetch)
        # Resident: a pass's key blocks stay for the next pass that sees them too (the
        # group's heads one after the other over a block of rows: one load and one set of
        # transposes per key tile and block of rows, not per head), when SBUF holds K, K^T
        # and V^T of the most blocks a pass sees and the next one's first (V rows die at
        # their transposes: two blocks' worth in flight).
        most = _most_pass_blocks(sq, sk, tq, tk, config.q_block, kv_block, bounds)
        resident = (most + 1) * kv_block * (d * item + 2 * rows_t) + 2 * kv_block * d * item
        resident_extra = resident - kv_side
    else:
        kv_side = n_kt * key_tile  # every key tile of the head
        resident_extra = 0
    group = 2 * n_kt * d * 4  # dK and dV fp32 accumulators over the query heads
    q_side = 2 * q_side + q_once + d * 4  # this pass and the next; one dO * O product
    pair = (lag + 1) * (3 * keys * item + tq * item)  # P, dP - D, dS, dS^T of pairs in flight
    softcap = float(problem.get("softcap", 0.0))
    softcap_tanh = softcap > SOFTPLUS_SOFTCAP_MAX.get(dtype, 64.0)
    if softcap:  # the pairs in flight SOFTCAP_STEPS longer; the 7 pairs in stage 1
        # (_softcap_steps) at most 2 fp32 (softplus or t, 1 - t) and 3 more tiles (1 + t,
        # P (1 - t), (dP - D) P (1 - t)) each; a tanh burst's t (fp32) of its pairs
        pair += SOFTCAP_STEPS * (3 * keys * item + tq * item)
        pair += 7 * (2 * keys * 4 + 3 * keys * item)
        if softcap_tanh:
            pair += SOFTCAP_TANH_BURST * keys * 4
    # per pair in flight: a mask tile (4 bytes per key at most; and its masked scores), and
    # dropout's kept dP (fp32) and P; dropout's hash tiles of the pairs its pipeline runs
    # ahead, and the launch's key iota
    features = score_features(problem)
    refuse_bounds_features(OP, problem, features)
    stored_mask = bool(features["mask"]) and not features["mask_row"]
    pair += (lag + 1) * keys * (8 * stored_mask + (8 + item) * bool(features["dropout"]))
    if features["dropout"]:
        pair += (DROPOUT_STAGES + 1) * keys * 8 + keys * 4
    if features["mask_row"]:  # the group's bias rows (and their raw loads), on one partition
        pair += (groups if features["mask_dims"][1] else 1) * sk * 8
    staging = STORE_TILES * d * item  # one run of output tiles in the output dtype
    sbuf = q_side + kv_side + group + pair + staging
    if softcap:  # the pass's softcap - lse column, -D rows, ones row, ln 2 column
        sbuf += n_qt * 4 + n_qt * tq * item + keys * item + 4 + 2 * item
    bounded = runtime_bounds_mode(problem, target)
    if bounded:  # the bounds, and each pair's scaled scores masked in SBUF before the exp
        sbuf += bounds_bytes(bounded, sq, tq) + (lag + 1) * keys * 4
    if config.loop_order == "kv_outer":
        kv_resident = resident_extra <= 0 or sbuf + resident_extra <= target.sbuf_usable_bytes
        if kv_resident:
            sbuf += max(0, resident_extra)

    # PE transposes of the loads write the input dtype to PSUM from NeuronCore-v3 (fp32
    # before): a bank holds t_group row tiles of both sides, transposed.
    psum_item = item if target.has_transpose_mode else 4
    # PSUM: S and dP (one bank, side by side); dQ's sum; dK's and dV's sums (a block's, or
    # one pair's partials); the dS^T of a PE transpose; one bank for the PE transposes of
    # the loads.
    sum_banks = ceil_div(kv_block * d * 4, target.psum_bank_bytes)
    pe_ds_t = config.transpose == "pe" and ds_dma_tiles < 4
    banks = 1 + 1 + 2 * sum_banks + pe_ds_t + (config.transpose != "dma")
    # softcap: a pair's S beside an earlier pair's dP, live over 2 loop steps (one more bank);
    # the -D rows' PE transposes in the loads' bank (one of their own under "dma")
    banks += (softcap > 0) + (softcap > 0 and config.transpose == "dma")
    return FlashAttentionBwdPlan(
        b=b,
        hkv=hkv,
        groups=groups,
        sq=sq,
        sk=sk,
        d=d,
        causal=causal,
        left=bounds[0],
        right=bounds[1],
        softcap=softcap,
        softcap_tanh=softcap_tanh,
        **features,
        tile_q=tq,
        tile_k=tk,
        q_block=config.q_block,
        kv_block=kv_block,
        d_tile=d_tile,
        d_chunks=d_chunks,
        loop_order=config.loop_order,
        transpose=config.transpose,
        ds_dma_tiles=ds_dma_tiles,
        # softcap: ScalarE has the softplus, two exps and 1 + t per pair, so VectorE
        # evacuates dS^T (the softcap path has its own dS, the only other use of this)
        elementwise="vector" if softcap else config.elementwise,
        vector_transpose=target.vector_transpose_max,
        lag_kv=PIPELINE_LAG_KV + (SOFTCAP_STEPS if softcap else 0),
        lag_q=PIPELINE_LAG_Q + (SOFTCAP_STEPS if softcap else 0),
        pe_transpose_keeps_dtype=target.has_transpose_mode,
        lnc=lnc,
        core_groups=_core_groups(b, hkv, groups, sq, sk, tq, config.q_block, bounds, lnc),
        split_groups=(b * hkv) % lnc if lnc > 1 else 0,
        sbuf_bytes=sbuf,
        psum_banks=banks,
        packed=bool(problem.get("packed", False)),
        runtime_bounds=bounded,
        hwdge=target.has_hwdge,
        kv_resident=kv_resident,
        dq_runs=max(1, target.psum_bank_bytes // (d * 4)),
        t_group=max(1, target.psum_bank_bytes // (2 * d_chunks * tq * psum_item)),
    )


def _most_pass_blocks(sq, sk, tq, tk, q_block, kv_block, bounds):
    """The most key blocks (``kv_block`` tiles of ``tk`` keys, from key 0) one query pass
    (``q_block`` tiles of ``tq`` rows) sees within ``bounds``."""
    most = 0
    tiles = tiled(sq, tq)
    for p0, n_pass in tiled(len(tiles), q_block):
        lo, hi = sk, 0
        for q0, n_q in tiles[p0 : p0 + n_pass]:
            k_start, k_end, _, _ = key_bounds(q0, n_q, sq, sk, bounds)
            if k_end > k_start:
                lo, hi = min(lo, k_start), max(hi, k_end)
        if hi > lo:
            most = max(most, (hi - 1) // (tk * kv_block) - lo // (tk * kv_block) + 1)
    return most


def _query_passes(groups, sq, sk, tq, q_block, bounds):
    """A KV group's query passes ``(head within the group, first tile, tiles)`` in the
    kernel's order, and each one's cost: the keys its query rows see (all of Sk, or those
    within the window ``bounds``, aligned bottom-right) plus one tile of fixed work per
    query tile. The group's heads run one after the other over each block of query rows:
    their passes see the same key tiles, which stay loaded from one to the next
    (``kv_resident``), and a key tile no later block of rows sees is final (its dK and dV
    are stored while the kernel goes on)."""
    passes, costs = [], []
    tiles = tiled(sq, tq)
    for p0, n_pass in tiled(len(tiles), q_block):
        cost = 0
        for q0, n_q in tiles[p0 : p0 + n_pass]:
            k_start, k_end, _, _ = key_bounds(q0, n_q, sq, sk, bounds)
            cost += max(0, k_end - k_start) + tq
        for g in range(groups):
            passes.append((g, p0, n_pass))
            costs.append(cost)
    return passes, costs


def _core_groups(b, hkv, groups, sq, sk, tq, q_block, bounds, lnc) -> tuple:
    """Each core's ``(b, kv head, query passes, split slot)``: whole (batch, KV head)
    groups round robin while every core gets one (slot -1: the core writes the group's dK
    and dV); the groups left over (fewer than the cores) split by their query passes,
    balancing the keys seen, each core summing dK/dV over its own passes into partial slot
    ``slot`` (the op adds the cores' partials in core order). At LNC=1 every group is whole,
    with all its passes in the LNC=1 order."""
    all_groups = [(bb, kvh) for bb in range(b) for kvh in range(hkv)]
    passes, costs = _query_passes(groups, sq, sk, tq, q_block, bounds)
    whole = len(all_groups) - len(all_groups) % lnc
    shares = [[] for _ in range(lnc)]
    for i in range(whole):
        bb, kvh = all_groups[i]
        shares[i % lnc].append((bb, kvh, tuple(passes), -1))
    for slot, (bb, kvh) in enumerate(all_groups[whole:]):
        split = split_work(costs, lnc)
        for c in range(lnc):
            shares[c].append((bb, kvh, tuple(passes[i] for i in split[c]), slot))
    return tuple(tuple(share) for share in shares)
