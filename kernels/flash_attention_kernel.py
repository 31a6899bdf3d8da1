"""The flash attention forward kernel (``flash_attention_fwd_kernel``): the two-pass and the
online softmax over the tile plan of :mod:`.flash_attention_plan`.

The forward kernel, two-pass softmax (the default; K/V resident in SBUF)::

    for each (batch, KV head) group of this core:            # kernel[lnc]: split by core
        load K^T [D, Sk] and V [Sk, D] once                   # shared by the group's heads
        steps = [(query tile, key tile) for every query tile of the group's heads
                 for every key tile it sees]                  # causal: clipped at the diagonal
        for step i (software pipeline, one key tile per stage):
            q^T load              of step i + lead + q_prefetch (its first key tile)
            max pass              of step i + lead: S = q K^T (TensorE, PSUM; + the edge
                                  bias where the diagonal or a window edge crosses), row
                                  max on VectorE from PSUM; a tile's last: -max
            exp pass              of step i: S again (TensorE, + bias), P = exp(scale S - max) on
                                  ScalarE, its row sum in ScalarE's reduce registers
            P^T                   of step i - lag_transpose: DMA transpose SBUF to SBUF
                                  (p_dma_tiles of 4), else TensorE + copy out of PSUM
            P V                   of step i - lag_pv: TensorE, accumulated over every key
                                  of the query tile in one PSUM bank
            close                 of step i - lag_close (its last key tile): 1 / l
                                  (VectorE); a step later out = (P V) / l (ScalarE, from
                                  PSUM), lse = log l + max, both stored

Each engine runs its instructions in program order, so the stages of one step wait on
nothing issued in that step. The online softmax (``softmax="online"``, and whenever K/V
are streamed in blocks) keeps a running max and rescales its accumulator per key tile,
``q_group`` query tiles in lockstep.
"""

from __future__ import annotations

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
    add_edge_bias,
    add_row_mask,
    dead_rows_column,
    dropout_bits,
    dropout_stage,
    edge_bias_applies,
    edge_biases,
    for_group,
    load_bounds,
    load_mask_tile,
    load_row_keys,
    mask_bounds,
    mask_window,
    matmul_over_d,
    plan_window,
    raw_bounds,
    score_inputs,
    transpose_blocks,
)
from neuron_kernels.kernels.tiling import tile_size, tiled

__all__ = [
    "OnlineStep",
    "OnlineTile",
    "QueryTile",
    "flash_attention_fwd_kernel",
    "masked_fill",
    "masked_fill_scaled",
    "select_mask",
    "stored_scale",
]


def _load_transposed(src, dst, rows, plan, hwdge=False):
    """Fill ``dst[d, t, r]`` (D on partitions, D tile ``t``) with ``src[r, t * d_tile + d]``
    for a ``[rows, D]`` HBM view ``src``, in chunks of ``d_tile`` rows. ``hwdge``: the
    contiguous loads go through the Sync engine's hardware DGE queue, not behind the
    GpSimd queue's transposes (isa dma_copy, ``dge_mode``)."""
    dt, d = plan.d_tile, plan.d
    for r0, rs in tiled(rows, dt):
        if plan.load_transpose == "pe":
            staged = nl.ndarray((rs, d), dtype=src.dtype, buffer=nl.sbuf, name="rows")
            if hwdge:
                nisa.dma_copy(
                    dst=staged,
                    src=src[r0 : r0 + rs, 0:d],
                    dge_mode=nisa.dge_mode.hwdge,
                    engine=nisa.engine.sync,
                )
            else:
                nisa.dma_copy(dst=staged, src=src[r0 : r0 + rs, 0:d])
        for t, (d0, ds) in enumerate(tiled(d, dt)):
            if plan.load_transpose == "pe":
                psum_dtype = src.dtype if plan.pe_transpose_keeps_dtype else nl.float32
                tp = nl.ndarray((ds, rs), dtype=psum_dtype, buffer=nl.psum, name="rows_t")
                nisa.nc_transpose(dst=tp, data=staged[0:rs, d0 : d0 + ds])
                nisa.tensor_copy(dst=dst[0:ds, t, r0 : r0 + rs], src=tp)
            elif plan.load_transpose == "dma":
                nisa.dma_transpose(
                    dst=dst[0:ds, t, r0 : r0 + rs], src=src[r0 : r0 + rs, d0 : d0 + ds]
                )
            else:
                nisa.dma_copy(
                    dst=dst[0:ds, t, r0 : r0 + rs],
                    src=src[r0 : r0 + rs, d0 : d0 + ds].permute((1, 0)),
                )


def _load_kv_block(k, v, b, kvh, r0, rows, plan):
    """K^T ``[D, rows]`` and V ``[128, chunks, D]`` of keys ``r0 .. r0 + rows`` in SBUF."""
    dt, d = plan.d_tile, plan.d
    kt = nl.ndarray((min(dt, d), plan.d_tiles, rows), dtype=k.dtype, buffer=nl.sbuf, name="k_t")
    _load_transposed(k[b, kvh, r0 : r0 + rows, 0:d], kt, rows, plan)
    chunks = tiled(rows, dt)
    vb = nl.ndarray((min(dt, rows), len(chunks), d), dtype=v.dtype, buffer=nl.sbuf, name="v_blk")
    for c, (c0, cs) in enumerate(chunks):
        nisa.dma_copy(dst=vb[0:cs, c, 0:d], src=v[b, kvh, r0 + c0 : r0 + c0 + cs, 0:d])
    return kt, vb


def _transpose_p(p_sb, qs, ks, plan):
    """P^T of ``p_sb [qs, ks]`` as ``[128, chunks, qs]``: in one PSUM bank ("pe", awaiting
    :func:`_evacuate_p`) or directly in SBUF ("vector", 32x32 blocks)."""
    dt = plan.d_tile
    chunks = (ks + dt - 1) // dt
    rows = min(dt, ks)
    if plan.p_transpose == "pe":
        psum_dtype = p_sb.dtype if plan.pe_transpose_keeps_dtype else nl.float32
        p_t = nl.ndarray((rows, chunks, qs), dtype=psum_dtype, buffer=nl.psum, name="p_t_psum")
    else:
        p_t = nl.ndarray((rows, chunks, qs), dtype=p_sb.dtype, buffer=nl.sbuf, name="p_t")
    for c, (c0, cs) in enumerate(tiled(ks, dt)):
        if plan.p_transpose == "pe":
            nisa.nc_transpose(dst=p_t[0:cs, c, 0:qs], data=p_sb[0:qs, c0 : c0 + cs])
        else:
            transpose_blocks(p_t[0:cs, c, 0:qs], p_sb[0:qs, c0 : c0 + cs], qs, cs, plan)
    return p_t


def _evacuate_p(p_t, qs, ks, q_dtype, plan):
    """P^T in SBUF: the PSUM tile copied out ("pe"; with ``p_copy="split"`` the second half
    of the chunks on ScalarE), or the SBUF tile as it is ("vector")."""
    if plan.p_transpose != "pe":
        return p_t
    dt = plan.d_tile
    chunks = (ks + dt - 1) // dt
    rows = min(dt, ks)
    out = nl.ndarray((rows, chunks, qs), dtype=q_dtype, buffer=nl.sbuf, name="p_t")
    full = ks // dt  # chunks with all 128 rows; a last partial chunk is copied on its own
    pieces = []
    if full:
        half = (full + 1) // 2 if plan.p_copy == "split" and full > 1 else full
        pieces.append((0, half, rows, "vector"))
        if half < full:
            pieces.append((half, full, rows, "scalar"))
    if full < chunks:
        pieces.append((full, chunks, ks - full * dt, "vector"))
    for c_lo, c_hi, r, eng in pieces:
        dst, src = out[0:r, c_lo:c_hi, 0:qs], p_t[0:r, c_lo:c_hi, 0:qs]
        if eng == "scalar":
            nisa.activation(dst=dst, op=nl.copy, data=src)
        else:
            nisa.tensor_copy(dst=dst, src=src)
    return out


def select_mask(plan) -> bool:
    """A bool mask with a query dim, no softcap and a positive scale: its tiles leave PSUM
    through one VectorE ``select_reduce`` (the raw scores where the mask keeps, the fill
    elsewhere, and their row max), kept raw (the exp takes the softmax scale)."""
    return plan.mask == "bool" and not plan.mask_row and not plan.softcap and plan.scale > 0


def stored_scale(plan) -> float:
    """The exp's scale of scores kept in SBUF (:func:`_stored_scores`): 1 for ``scale * S``,
    ``softcap`` for ``tanh(scale * S / softcap)`` (1 again once a float mask is added)."""
    if select_mask(plan):
        return plan.scale
    return plan.softcap if plan.softcap and plan.mask != "float" else 1.0  # (no row mask)


def masked_fill(plan) -> float:
    """What masked stored scores become: :data:`MASK_FILL`, or with a softcap (the stored
    value is ``t = tanh(.)``, the exp's input ``softcap * t``) ``min(-2, MASK_FILL /
    softcap)``: ``softcap * fill`` is at most -1e30 and at least ``softcap`` below any capped
    score (all in ``[-softcap, softcap]``), so its exp is 0 at every softcap."""
    if select_mask(plan):  # raw scores: the fill times the scale is MASK_FILL
        return MASK_FILL / plan.scale
    return MASK_FILL if plan.mask == "float" else masked_fill_scaled(plan.softcap)


def masked_fill_scaled(softcap) -> float:
    """:func:`masked_fill` for the stored scale of ``softcap`` (0: off)."""
    return min(-2.0, MASK_FILL / softcap) if softcap else MASK_FILL


def _stored_scores(s_ps, qs, ks, q0, k0, plan, bounds=None, tile=None, mask_t=None):
    """A score tile kept in SBUF: ``scale * S`` copied out of PSUM (VectorE), or with a
    softcap ``t = tanh(scale * S / softcap)`` (ScalarE's tanh, reading PSUM; the exp then
    takes ``softcap * t``); masked there with :func:`masked_fill` where a window edge
    crosses it (GpSimd cannot read PSUM). The source of its row max and of its exp, at
    the exp scale :func:`stored_scale`. Both softmaxes keep scores this way. With run-time
    bounds (``bounds = (SBUF bounds, query tile)``) every tile is masked by them instead
    (:func:`mask_bounds`). With an attention mask (``tile``: the query tile's record, its
    head and :class:`ScoreInputs`), a float one is added as the scores leave PSUM (after
    the softcap: ``softcap * t + m``, as Gemma 2 and HF add their mask), a bool one sets
    its False entries to the fill (``mask_t``: its tile, loaded steps ahead; else loaded
    here)."""
    s_sb = nl.ndarray((qs, ks), dtype=nl.float32, buffer=nl.sbuf, name="scores_masked")
    if plan.mask and not plan.mask_row and mask_t is None:  # (a row mask is in PSUM already)
        mask_t = load_mask_tile(tile.feat, tile.h, q0, qs, k0, ks, plan)
    if select_mask(plan):  # raw scores where kept, the fill elsewhere, in one pass
        nisa.select_reduce(dst=s_sb, predicate=mask_t, on_true=s_ps, on_false=masked_fill(plan))
        if tile_visibility(q0, qs, k0, ks, plan.sq, plan.sk, plan_window(plan)) == "some":
            mask_window(s_sb, qs, ks, q0, k0, plan, masked_fill(plan))
        return s_sb
    if plan.softcap:
        nisa.activation(dst=s_sb, op=nl.tanh, data=s_ps, scale=plan.scale / plan.softcap)
        if plan.mask == "float":  # (never a row mask: those need no softcap)
            nisa.scalar_tensor_tensor(
                dst=s_sb, data=s_sb, op0=nl.multiply, operand0=plan.softcap, op1=nl.add,
                operand1=mask_t,
            )  # fmt: skip
    elif plan.mask == "float" and not plan.mask_row:
        nisa.scalar_tensor_tensor(
            dst=s_sb, data=s_ps, op0=nl.multiply, operand0=plan.scale, op1=nl.add,
            operand1=mask_t,
        )  # fmt: skip
    else:
        nisa.tensor_scalar(dst=s_sb, data=s_ps, op0=nl.multiply, operand0=plan.scale)
    if bounds is not None:
        mask_bounds(s_sb, qs, ks, k0, bounds[0], bounds[1], plan, masked_fill(plan))
    elif tile_visibility(q0, qs, k0, ks, plan.sq, plan.sk, plan_window(plan)) == "some":
        mask_window(s_sb, qs, ks, q0, k0, plan, masked_fill(plan))
    if plan.mask == "bool" and not plan.mask_row:
        nisa.tensor_copy_predicated(
            dst=s_sb, src=masked_fill(plan), predicate=mask_t, reverse_pred=True
        )
    return s_sb


def _score_tile(q_t, kt, qs, kk0, ks, q0, k0, plan, bounds=None, ext=None, tile=None):
    """One key tile's scores: (source of its row max and exp, the exp's scale). Tiles
    crossing a window edge (every tile, with a softcap or an attention mask) are scaled
    into SBUF and masked there (the scale is then 1); the others stay raw in PSUM with
    the softmax scale. Under :func:`raw_bounds` a tile is masked raw into SBUF by the
    run-time bounds, its row max into ``ext``."""
    s_ps = nl.ndarray((qs, ks), dtype=nl.float32, buffer=nl.psum, name="scores")
    matmul_over_d(s_ps, q_t, 0, qs, kt, kk0, ks, plan)
    if plan.mask_row:
        add_row_mask(s_ps, tile.feat, tile.h, qs, k0, ks, plan)
    if bounds is not None and raw_bounds(plan):
        s_sb = nl.ndarray((qs, ks), dtype=nl.float32, buffer=nl.sbuf, name="scores_masked")
        mask_bounds(s_sb, qs, ks, k0, bounds[0], bounds[1], plan, MASK_FILL, s_ps, ext)
        return s_sb, plan.scale
    seen = tile_visibility(q0, qs, k0, ks, plan.sq, plan.sk, plan_window(plan))
    if seen != "all" and edge_bias_applies(plan.edge_bias, _dead_rows(q0, qs, plan)):
        add_edge_bias(s_ps, qs, q0, k0, ks, plan, tile.feat.edges)
        return s_ps, plan.scale
    if seen == "some" or plan.softcap or bounds is not None or (plan.mask and not plan.mask_row):
        return _stored_scores(s_ps, qs, ks, q0, k0, plan, bounds, tile), stored_scale(plan)
    return s_ps, plan.scale


@dataclass
class OnlineTile(nl.NKIObject):
    """One query tile of the online softmax, from its q^T load to its store."""

    h: int  # query head
    q0: int  # first query row
    qs: int  # rows (partitions of its score tiles)
    k_start: int  # keys [k_start, k_end) are visible to some row (the window's span)
    k_end: int
    n_dead: int  # leading rows that see no key (causal with Sq > Sk): out 0, lse -inf
    q_t: object  # [d_tile, d_tiles, qs] q^T in SBUF, None when no key is visible
    neg_max: object  # [qs, 1] fp32 -running max of the key tiles folded so far, or None
    latest_max: object  # [qs, 1] fp32 the newest -running max (the front half runs ahead)
    row_sum: object  # [qs, 1] fp32 running sum of P, rescaled as the max grows
    o_acc: object  # [qs, D] fp32 running P V, rescaled as the max grows
    sink: object  # [qs, 1] fp32 the head's sink logit on every row, None without sinks
    bounds: object = None  # run-time bounds: (SBUF bounds, this query tile's index), or None
    feat: object = None  # ScoreInputs (attention mask, dropout), None without them
    row_key: object = None  # [qs, 1] int32 dropout row keys, None without dropout


@dataclass
class OnlineStep(nl.NKIObject):
    """One key tile of one query tile in the online softmax, from scores to fold."""

    s: OnlineTile  # the query tile
    ks: int  # keys in this key tile
    kk0: int  # its first key within the K/V block
    src: object  # scores for the exp: PSUM, or scaled and masked in SBUF
    act_scale: float  # the exp's scale of src (the softmax scale, or 1 once scaled)
    ext: object  # [qs, 1] fp32 the tile's max of S (min for a negative scale)
    prev: object  # [qs, 1] fp32 -running max before this tile, None on the first
    new_neg_max: object  # [qs, 1] fp32 -running max including this tile
    p: object  # [qs, ks] P = exp(scale * S - m_new) in q's dtype
    tile_sum: object  # [qs, 1] fp32 row sum of P
    alpha: object  # [qs, 1] fp32 exp(m_old - m_new), None on the first
    p_t: object  # P^T: in PSUM awaiting its copy ("pe") or in SBUF ("vector")
    o_ps: object  # [qs, D] fp32 PSUM: this tile's P V
    k0: int = 0  # its first key


def _dead_rows(q0, qs, plan):
    """Leading rows of the query tile at ``q0`` that see no key (:func:`dead_rows`): their
    out is 0 and lse -inf."""
    return dead_rows(q0, qs, plan.sq, plan.sk, plan_window(plan))


def _load_sink(sinks, h, qs, cache):
    """The sink logit of head ``h`` on each of ``qs`` rows (a ``[qs, 1]`` fp32 view of a
    ``[q_tile, 1]`` column loaded from the op's ``[H, 128, 1]`` broadcast of it once per
    head and kernel: ``cache`` holds the columns by head), or None without sinks."""
    if sinks is None:
        return None
    if cache[h] is None:
        col = nl.ndarray((sinks.shape[1], 1), dtype=nl.float32, buffer=nl.sbuf, name="sink")
        nisa.dma_copy(dst=col, src=sinks[h, :, :])
        cache[h] = col
    return cache[h][0:qs, 0:1]


def _open_query_tile(q, sink, b, h, q0, plan, feat=None):
    """The online-softmax state of query rows ``q0 .. q0 + qs`` of head ``h``, with q^T
    (and its dropout row keys)."""
    qs = tile_size(plan.sq, plan.q_tile, q0)
    # Keys in [k_start, k_end) are visible to some row of the tile.
    k_start, k_end, _, _ = key_bounds(q0, qs, plan.sq, plan.sk, plan_window(plan))
    n_dead = _dead_rows(q0, qs, plan)
    state = OnlineTile(h, q0, qs, k_start, k_end, n_dead, None, None, None, None, None, sink)
    if k_end > k_start:
        q_t = nl.ndarray(
            (min(plan.d_tile, plan.d), plan.d_tiles, qs), dtype=q.dtype, buffer=nl.sbuf, name="q_t"
        )
        _load_transposed(q[b, h, q0 : q0 + qs, 0 : plan.d], q_t, qs, plan)
        state.q_t = q_t
        state.feat = feat
        if plan.dropout:
            state.row_key = nl.ndarray((qs, 1), dtype=nl.int32, buffer=nl.sbuf, name="row_key")
            load_row_keys(state.row_key, feat, h, q0, qs)
    return state


def _front(states, kt, r0, rows, kk0, plan):
    """The first half of one key tile (keys ``r0 + kk0 ..`` of the block of ``rows`` keys
    at ``r0``) for every query tile in ``states`` that sees it: scores on TensorE, their
    row max and the new running max on VectorE. Returns the per-tile records the second
    half (:func:`_back`) consumes."""
    k0 = r0 + kk0
    work = []
    for s in states:
        ks = min(plan.k_tile, rows - kk0, s.k_end - k0)
        if k0 < s.k_end and k0 + ks > s.k_start:
            r = OnlineStep(s, ks, kk0, None, 1.0, None, None, None, None, None, None, None, None)
            r.k0 = k0
            work.append(r)
    for r in work:
        _scores_and_max(r, kt, k0, plan)
    for r in work:  # after every reduction: VectorE does not wait on the one just issued
        _running_max(r, plan)
    return work


def _back(work, vb, q_dtype, plan):
    """The second half of one key tile: exp on ScalarE, P^T and P V on TensorE, the fold
    into the running sum and accumulator. Issued stage by stage across the tiles: each
    engine runs in program order, so one tile's chain waits while the engine does the
    other tiles' independent work."""
    for r in work:
        _exponentiate(r, q_dtype, plan)
    # P^T of tile i is transposed while tile i - 1's is evacuated and multiplied with V,
    # so TensorE does not wait on the copy it just fed.
    for i in range(len(work) + 1):
        if i < len(work):
            r = work[i]
            r.p_t = _transpose_p(r.p, r.s.qs, r.ks, plan)
        if i >= 1:
            _multiply_v(work[i - 1], vb, q_dtype, plan)
    for r in work:
        _fold(r, plan)


def _scores_and_max(r, kt, k0, plan):
    """Scores on TensorE (masked on VectorE/GpSimd where the causal diagonal crosses) and
    their row max (or min, for a negative scale) on VectorE."""
    s, ks, kk0 = r.s, r.ks, r.kk0
    qs = s.qs
    ext = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="tile_ext")
    src, act_scale = _score_tile(s.q_t, kt, qs, kk0, ks, s.q0, k0, plan, s.bounds, ext, s)
    if s.bounds is None or not raw_bounds(plan):  # (else range_select took the max)
        # The tile's max of act_scale * S: the max of S, or its min if the scale < 0.
        nisa.tensor_reduce(dst=ext, op=nl.max if act_scale >= 0 else nl.min, data=src, axis=1)
    r.src, r.act_scale, r.ext = src, act_scale, ext


def _running_max(r, plan):
    """The running max, negated: -max(m_old, act_scale * tile max)."""
    s = r.s
    qs, ext, act_scale, prev = s.qs, r.ext, r.act_scale, s.latest_max
    new_neg_max = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="neg_m")
    if prev is None:
        nisa.tensor_scalar(dst=new_neg_max, data=ext, op0=nl.multiply, operand0=-act_scale)
    else:  # -max(m_old, m_tile) = min(-m_old, -m_tile)
        nisa.tensor_scalar(
            dst=new_neg_max,
            data=ext,
            op0=nl.multiply,
            operand0=-act_scale,
            op1=nl.minimum,
            operand1=prev,
        )
    if plan.mask == "float":
        _clamp_neg_max(new_neg_max)
    # The key tile's own max; the next tile's front half (issued before this tile's back
    # half) starts from it.
    r.prev, r.new_neg_max = prev, new_neg_max
    s.latest_max = new_neg_max


def _clamp_neg_max(neg_max):
    """With an attention mask: ``-max`` at most ``-MASK_FILL``, so a row whose scores are
    all -inf (a float mask's) has a finite exp bias: ``exp(-inf + 1e30)`` is 0, never NaN."""
    nisa.tensor_scalar(dst=neg_max, data=neg_max, op0=nl.minimum, operand0=-MASK_FILL)


def _drop(p_sb, qs, k0, ks, tile, plan):
    """Dropout on P in place: the dropped scores' weights become 0 (the kept ones are
    scaled by 1 / (1 - p) at the close, on the [q, 1] reciprocal); VectorE."""
    bits = dropout_bits(tile.row_key, qs, k0, ks, tile.feat)
    nisa.scalar_tensor_tensor(
        dst=p_sb, data=bits, op0=nl.greater_equal, operand0=float(plan.dropout), op1=nl.multiply,
        operand1=p_sb,
    )  # fmt: skip


def _close_features(recip, neg_max, qs, plan):
    """The close's reciprocal ``1 / l`` times ``1 / (1 - p)`` under dropout, and 0 on the
    rows an attention mask leaves with no visible key (their ``-max >= 5e29``: P was
    exp(0) over masked scores). Returns those rows' uint8 column (None without a mask)."""
    if plan.dropout:
        nisa.tensor_scalar(dst=recip, data=recip, op0=nl.multiply, operand0=plan.inv_keep)
    if not plan.mask:
        return None
    dead = dead_rows_column(neg_max, qs)
    nisa.tensor_copy_predicated(dst=recip, src=0.0, predicate=dead)
    return dead


def _exponentiate(r, q_dtype, plan):
    """P = exp(scale * S - m_new) on ScalarE, summed per row by its accumulator; and
    alpha = exp(m_old - m_new), which rescales the running sum and accumulator."""
    qs, ks = r.s.qs, r.ks
    p_sb = nl.ndarray((qs, ks), dtype=q_dtype, buffer=nl.sbuf, name="p")
    tile_sum = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="tile_sum")
    nisa.activation(
        dst=p_sb,
        op=nl.exp,
        data=r.src,
        bias=r.new_neg_max,
        scale=r.act_scale,
        reduce_op=nl.add,
        reduce_res=tile_sum,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    r.p, r.tile_sum = p_sb, tile_sum
    if plan.dropout:
        _drop(p_sb, qs, r.k0, ks, r.s, plan)
    if r.prev is not None:
        alpha = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="alpha")
        nisa.activation(dst=alpha, op=nl.exp, data=r.prev, bias=r.new_neg_max, scale=-1.0)
        r.alpha = alpha


def _multiply_v(r, vb, q_dtype, plan):
    """P^T to SBUF, then O_tile = P V on TensorE, 128 keys per matmul, into PSUM."""
    qs, d, ks, kk0 = r.s.qs, plan.d, r.ks, r.kk0
    p_t = _evacuate_p(r.p_t, qs, ks, q_dtype, plan)
    o_ps = nl.ndarray((qs, d), dtype=nl.float32, buffer=nl.psum, name="o_psum")
    for c, (c0, cs) in enumerate(tiled(ks, plan.d_tile)):
        nisa.nc_matmul(
            dst=o_ps,
            stationary=p_t[0:cs, c, 0:qs],
            moving=vb[0:cs, (kk0 + c0) // plan.d_tile, 0:d],
            accumulate=c > 0,
        )
    r.o_ps = o_ps


def _fold(r, plan):
    """The tile into the running sum and accumulator: O_old * alpha on ScalarE, + P V
    from PSUM on VectorE (which also takes the row max, the busiest engine)."""
    s = r.s
    qs, d, o_ps = s.qs, plan.d, r.o_ps
    new_acc = nl.ndarray((qs, d), dtype=nl.float32, buffer=nl.sbuf, name="o_acc")
    if r.prev is None:
        s.row_sum = r.tile_sum
        nisa.tensor_copy(dst=new_acc, src=o_ps)
    else:
        new_sum = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="l")
        nisa.scalar_tensor_tensor(
            dst=new_sum,
            data=s.row_sum,
            op0=nl.multiply,
            operand0=r.alpha,
            op1=nl.add,
            operand1=r.tile_sum,
        )
        scaled = nl.ndarray((qs, d), dtype=nl.float32, buffer=nl.sbuf, name="o_scaled")
        nisa.activation(dst=scaled, op=nl.copy, data=s.o_acc, scale=r.alpha)
        nisa.tensor_tensor(dst=new_acc, data1=o_ps, data2=scaled, op=nl.add)
        s.row_sum = new_sum
    s.neg_max, s.o_acc = r.new_neg_max, new_acc


def _dead_lse(lse_t, rows, sink):
    """lse of rows that see no key: the sink (``sink``'s rows), else -inf."""
    if sink is None:
        nisa.memset(dst=lse_t[0:rows, 0:1], value=float("-inf"))
    else:
        nisa.tensor_copy(dst=lse_t[0:rows, 0:1], src=sink[0:rows, 0:1])


def _fold_sink(s):
    """The sink into the online state at its close: ``m' = max(m, sink)``, then
    ``l' = l exp(m - m') + exp(sink - m')``; returns ``(-m', l', exp(m - m'))``, the last to
    rescale the accumulator (a sink of -inf gives ``m' = m``, ``l' = l``, 1)."""
    qs = s.qs
    neg_max = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="neg_max_sink")
    nisa.tensor_scalar(
        dst=neg_max, data=s.sink, op0=nl.multiply, operand0=-1.0, op1=nl.minimum, operand1=s.neg_max
    )
    rescale = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="sink_rescale")
    nisa.activation(dst=rescale, op=nl.exp, data=s.neg_max, bias=neg_max, scale=-1.0)
    e_sink = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="exp_sink")
    nisa.activation(dst=e_sink, op=nl.exp, data=s.sink, bias=neg_max)
    row_sum = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="l_sink")
    nisa.scalar_tensor_tensor(
        dst=row_sum,
        data=s.row_sum,
        op0=nl.multiply,
        operand0=rescale,
        op1=nl.add,
        operand1=e_sink,
    )
    return neg_max, row_sum, rescale


def _close_query_tile(s, out, lse, b, plan):
    """out = O / l and lse = log(l) + m to HBM (the sink folded in first); rows that see no
    key get 0 and the sink (-inf without sinks)."""
    d, qs, q0, h, n_dead = plan.d, s.qs, s.q0, s.h, s.n_dead
    o_out = nl.ndarray((qs, d), dtype=out.dtype, buffer=nl.sbuf, name="o_out")
    lse_t = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="lse_t")
    if s.neg_max is None:
        # Trace-time skip: no key is visible to any row of this tile.
        nisa.memset(dst=o_out, value=0.0)
        _dead_lse(lse_t, qs, s.sink)
    else:
        neg_max, row_sum = s.neg_max, s.row_sum
        recip = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="recip")
        if s.sink is None:
            nisa.reciprocal(dst=recip, data=row_sum)
            dead = _close_features(recip, neg_max, qs, plan)
            nisa.tensor_scalar(dst=o_out, data=s.o_acc, op0=nl.multiply, operand0=recip)
        else:
            neg_max, row_sum, rescale = _fold_sink(s)
            nisa.reciprocal(dst=recip, data=row_sum)
            dead = _close_features(recip, neg_max, qs, plan)
            nisa.tensor_scalar(
                dst=o_out,
                data=s.o_acc,
                op0=nl.multiply,
                operand0=recip,
                op1=nl.multiply,
                operand1=rescale,
            )
        log_sum = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="log_sum")
        nisa.activation(dst=log_sum, op=nl.log, data=row_sum)
        nisa.tensor_tensor(dst=lse_t, data1=log_sum, data2=neg_max, op=nl.subtract)
        if dead is not None:  # the sink folded in: dead only with a sink of -inf (or none)
            dead_lse = float("-inf") if s.sink is None else s.sink
            nisa.tensor_copy_predicated(dst=lse_t, src=dead_lse, predicate=dead)
        if n_dead:
            # Rows that see no key at all: zeros and the sink (or -inf), as the contract says.
            nisa.memset(dst=o_out[0:n_dead, 0:d], value=0.0)
            _dead_lse(lse_t, n_dead, s.sink)
    nisa.dma_copy(dst=out[b, h, q0 : q0 + qs, 0:d], src=o_out)
    nisa.dma_copy(dst=lse[b, h, q0 : q0 + qs, 0:1], src=lse_t)


def _key_tiles(states, plan):
    """``(r0, rows, kk0)`` for each key tile some query tile in ``states`` sees: the K/V
    block's first key and row count, and the tile's offset in the block (``kk0 == 0``
    starts a block, where a streamed block is loaded). The walk covers the keys the
    states see, from the first one's 128-key chunk (V's chunks, which P V reads, start
    on multiples of 128): resident K/V is one block from key 0; streamed blocks of up to
    ``kv_block`` rows start there and end at the last key seen, so a window's (or the
    causal diagonal's) tiles load only the keys they span."""
    k_start, k_end = plan.sk, 0
    for s in states:
        if s.k_end > s.k_start:
            k_start, k_end = min(k_start, s.k_start), max(k_end, s.k_end)
    out = []
    if k_end <= k_start:
        return out
    first = k_start // plan.d_tile * plan.d_tile
    if plan.kv_blocks == 1:  # resident: one block of every key
        for kk0, _ in tiled(k_end, plan.k_tile, first):
            out.append((0, plan.sk, kk0))
        return out
    for r0, rows in tiled(k_end, plan.kv_block, first):
        for kk0, _ in tiled(rows, plan.k_tile):
            out.append((r0, rows, kk0))
    return out


def _drain(pending, out, lse, b, q_dtype, plan):
    """The second half of a pending key tile, then the close of the query tiles it ends."""
    work, vb, finished = pending
    _back(work, vb, q_dtype, plan)
    for s in finished or ():
        _close_query_tile(s, out, lse, b, plan)


def _attend_kv_head(
    q, k, v, sinks, sink_cols, out, lse, kv, b, kvh, tiles, plan, bounds=None, feat=None
):
    """Online softmax for every (head, q0) query tile of KV head ``kvh``: groups of
    ``q_group`` tiles in lockstep over the key tiles they see, software-pipelined over
    key tiles and across groups: the next key tile's scores and max (the next group's
    first, at a group's end) are issued before this key tile's exp, P V and fold, so
    TensorE and VectorE never wait on this tile's chain."""
    pending = None  # (work, vb, states to close after it, or None)
    for t0 in range(0, len(tiles), plan.q_group):
        states = []
        for h, q0 in tiles[t0 : t0 + plan.q_group]:
            qs = tile_size(plan.sq, plan.q_tile, q0)
            sink = _load_sink(sinks, h, qs, sink_cols)
            states.append(_open_query_tile(q, sink, b, h, q0, plan, feat))
            if bounds is not None:
                states[-1].bounds = (bounds, q0 // plan.q_tile)
        last = None
        kt = vb = None
        if kv is not None:
            kt, vb = kv
        for r0, rows, kk0 in _key_tiles(states, plan):
            if kv is None and kk0 == 0:  # a streamed K/V block loads as the walk reaches it
                kt, vb = _load_kv_block(k, v, b, kvh, r0, rows, plan)
            work = _front(states, kt, r0, rows, kk0, plan)
            if pending is not None:
                _drain(pending, out, lse, b, q.dtype, plan)
            pending = (work, vb, None)
            last = pending
        if last is None:  # no key is visible to any tile of the group
            for s in states:
                _close_query_tile(s, out, lse, b, plan)
        else:
            pending = (pending[0], pending[1], states)
    if pending is not None:
        _drain(pending, out, lse, b, q.dtype, plan)


@dataclass
class QueryTile(nl.NKIObject):
    """One query tile of the two-pass forward, from its max pass to its store."""

    h: int  # query head
    q0: int  # first query row
    qs: int  # rows (partitions of its score tiles)
    n_dead: int  # leading rows that see no key (causal with Sq > Sk): out 0, lse -inf
    keys: list  # per key tile it sees: (k0, keys, masked, column in ext or ext_masked)
    n_raw: int  # key tiles whose max is taken on the raw scores in PSUM
    n_masked: int  # key tiles masked in SBUF (crossing the causal diagonal)
    q_t: object  # [d_tile, d_tiles, qs] q^T in SBUF, loaded q_prefetch steps before pass 1
    ext: object  # [qs, n_raw] fp32 max (min for a negative scale) of each raw score tile
    ext_masked: object  # [qs, n_masked] fp32 max of each scaled, masked score tile
    masked: list  # per key tile: its scaled, masked scores in SBUF (kept for the exp)
    neg_max: object  # [qs, 1] fp32 -max_j(scale * S): the exp's bias, once pass 1 ends
    row_sum: object  # [qs, 1] fp32 l = sum_j P: read out of ScalarE by the last exp
    recip: object  # [qs, 1] fp32 1 / l
    p: list  # per key tile: P = exp(scale * S - max) in SBUF, q's dtype
    p_t: list  # per key tile: ((P^T tile, chunk in it, keys, V chunk), ...) in SBUF
    o_ps: object  # [qs, D] fp32 PSUM: P V summed over every key the tile sees
    sink: object  # [qs, 1] fp32 the head's sink logit on every row, None without sinks
    bounds: object = None  # run-time bounds: (SBUF bounds, this query tile's index), or None
    feat: object = None  # ScoreInputs (attention mask, dropout), None without them
    row_key: object = None  # [qs, 1] int32 dropout row keys, None without dropout
    dead: object = None  # [qs, 1] uint8: rows an attention mask leaves with no key
    bits: list = None  # dropout: per key tile its DropBits, built ahead of its exp
    mask_tiles: list = None  # a mask with a query dim: per key tile its tile, loaded ahead


def _query_tile(h, q0, plan):
    """The tile's key tiles, split by where their max is taken; no instruction yet."""
    qs = tile_size(plan.sq, plan.q_tile, q0)
    bounds = plan_window(plan)
    k_start, k_end, _, _ = key_bounds(q0, qs, plan.sq, plan.sk, bounds)
    n_dead = _dead_rows(q0, qs, plan)
    keys = []
    n_raw = n_masked = 0
    spans = []
    first = k_start // plan.d_tile * plan.d_tile  # on V's 128-key chunks
    for k0, ks in tiled(k_end if k_end > k_start else 0, plan.k_tile, first):
        # A key tile a window edge crosses: its 128-key chunks every row sees (whole
        # chunks, so P^T chunks stay on V's chunks) stay in PSUM; only the chunks an edge
        # crosses (before and after them) are scaled and masked in SBUF.
        seen = tile_visibility(q0, qs, k0, ks, plan.sq, plan.sk, bounds)
        stored = plan.softcap or (plan.mask and not plan.mask_row)
        if edge_bias_applies(plan.edge_bias, n_dead):  # edges added in PSUM: raw
            spans.append((k0, ks, False))
            continue
        if seen != "some" or stored or plan.runtime_bounds:  # one span per key tile
            # softcap, a mask with a query dim: every tile is kept (and masked) in SBUF
            bounded = bool(plan.runtime_bounds) and not raw_bounds(plan)
            spans.append((k0, ks, bool(stored) or bounded))
            continue
        for c0, cs in tiled(k0 + ks, plan.d_tile, k0):
            masked = tile_visibility(q0, qs, c0, cs, plan.sq, plan.sk, bounds) != "all"
            if spans and spans[-1][2] == masked and spans[-1][0] + spans[-1][1] == c0:
                if spans[-1][0] >= k0:  # merge within this key tile only
                    spans[-1] = (spans[-1][0], spans[-1][1] + cs, masked)
                    continue
            spans.append((c0, cs, masked))
    for k0, ks, masked in spans:
        if masked:
            keys.append((k0, ks, True, n_masked))
            n_masked += 1
        else:
            keys.append((k0, ks, False, n_raw))
            n_raw += 1
    none = []
    for _ in keys:
        none.append(None)
    return QueryTile(
        h,
        q0,
        qs,
        n_dead,
        keys,
        n_raw,
        n_masked,
        None,
        None,
        None,
        list(none),
        None,
        None,
        None,
        list(none),
        list(none),
        None,
        None,
    )


def _scores(qt, kt, k0, ks, plan):
    """S = q K^T of one key tile into a PSUM bank (fp32), over the D tiles."""
    s_ps = nl.ndarray((qt.qs, ks), dtype=nl.float32, buffer=nl.psum, name="scores")
    matmul_over_d(s_ps, qt.q_t, 0, qt.qs, kt, k0, ks, plan)
    if plan.mask_row:
        add_row_mask(s_ps, qt.feat, qt.h, qt.qs, k0, ks, plan)
    if edge_bias_applies(plan.edge_bias, qt.n_dead):
        add_edge_bias(s_ps, qt.qs, qt.q0, k0, ks, plan, qt.feat.edges)
    return s_ps


def _load_query(q, b, qt, plan):
    """q^T of the tile into SBUF, issued ``plan.q_prefetch`` steps before its max pass."""
    q_t = nl.ndarray(
        (min(plan.d_tile, plan.d), plan.d_tiles, qt.qs), dtype=q.dtype, buffer=nl.sbuf, name="q_t"
    )
    _load_transposed(q[b, qt.h, qt.q0 : qt.q0 + qt.qs, 0 : plan.d], q_t, qt.qs, plan, plan.hwdge)
    qt.q_t = q_t


def _max_step(q, b, qt, j, kt, plan):
    """Pass 1 on key tile ``j``: its scores and their row max on VectorE, straight from
    PSUM; a tile crossing the diagonal is scaled and masked into SBUF first (GpSimd cannot
    read PSUM), and kept there for the exp pass."""
    qs = qt.qs
    if j == 0:
        if qt.n_raw:
            qt.ext = nl.ndarray((qs, qt.n_raw), dtype=nl.float32, buffer=nl.sbuf, name="ext")
        if qt.n_masked:
            qt.ext_masked = nl.ndarray(
                (qs, qt.n_masked), dtype=nl.float32, buffer=nl.sbuf, name="ext_masked"
            )
    k0, ks, masked, col = qt.keys[j]
    s_ps = _scores(qt, kt, k0, ks, plan)
    if not masked and qt.bounds is not None:  # raw_bounds: S masked out of PSUM, kept
        s_sb = nl.ndarray((qs, ks), dtype=nl.float32, buffer=nl.sbuf, name="scores_masked")
        ext = qt.ext[0:qs, col : col + 1]
        mask_bounds(s_sb, qs, ks, k0, qt.bounds[0], qt.bounds[1], plan, MASK_FILL, s_ps, ext)
        qt.masked[j] = s_sb
        return
    if not masked:
        nisa.tensor_reduce(
            dst=qt.ext[0:qs, col : col + 1],
            op=nl.max if plan.scale >= 0 else nl.min,
            data=s_ps,
            axis=1,
        )
        return
    mask_t = None
    if qt.mask_tiles is not None:  # loaded MASK_PREFETCH steps before
        mask_t, qt.mask_tiles[j] = qt.mask_tiles[j], None
    seen = tile_visibility(qt.q0, qs, k0, ks, plan.sq, plan.sk, plan_window(plan))
    if select_mask(plan) and seen != "some":  # select, keep and take the row max at once
        s_sb = nl.ndarray((qs, ks), dtype=nl.float32, buffer=nl.sbuf, name="scores_masked")
        nisa.select_reduce(
            dst=s_sb, predicate=mask_t, on_true=s_ps, on_false=masked_fill(plan),
            reduce_res=qt.ext_masked[0:qs, col : col + 1],
            reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum,
        )  # fmt: skip
        qt.masked[j] = s_sb
        return
    s_sb = _stored_scores(s_ps, qs, ks, qt.q0, k0, plan, qt.bounds, qt, mask_t)
    nisa.tensor_reduce(dst=qt.ext_masked[0:qs, col : col + 1], op=nl.max, data=s_sb, axis=1)
    qt.masked[j] = s_sb


def _row_max(qt, plan):
    """The end of pass 1: ``neg_max = -max_j(scale * S)`` over every key tile's max."""
    qs = qt.qs
    neg_max = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="neg_max")
    neg_masked = None
    if qt.n_masked:
        neg_masked = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="neg_masked")
        if stored_scale(plan) != 1.0:  # t = tanh(.) (or raw S): -max(c t) = -c max(t), c > 0
            t_max = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="t_max")
            nisa.tensor_reduce(dst=t_max, op=nl.max, data=qt.ext_masked, axis=1)
            nisa.tensor_scalar(
                dst=neg_masked, data=t_max, op0=nl.multiply, operand0=-stored_scale(plan)
            )
        else:
            nisa.tensor_reduce(dst=neg_masked, op=nl.max, data=qt.ext_masked, axis=1, negate=True)
    if qt.n_raw:
        ext = qt.ext
        if qt.n_raw > 1:
            ext = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="raw_ext")
            nisa.tensor_reduce(
                dst=ext, op=nl.max if plan.scale >= 0 else nl.min, data=qt.ext, axis=1
            )
        # -(scale * max S) = -max(scale * S); with a negative scale the min was taken.
        if neg_masked is None:
            nisa.tensor_scalar(dst=neg_max, data=ext, op0=nl.multiply, operand0=-plan.scale)
        else:
            nisa.tensor_scalar(
                dst=neg_max,
                data=ext,
                op0=nl.multiply,
                operand0=-plan.scale,
                op1=nl.minimum,
                operand1=neg_masked,
            )
    else:
        neg_max = neg_masked
    if plan.mask == "float":
        _clamp_neg_max(neg_max)
    if qt.sink is not None:  # the sink is one more logit: -max(m, sink) = min(-m, -sink)
        with_sink = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="neg_max_sink")
        nisa.tensor_scalar(
            dst=with_sink,
            data=qt.sink,
            op0=nl.multiply,
            operand0=-1.0,
            op1=nl.minimum,
            operand1=neg_max,
        )
        neg_max = with_sink
    qt.neg_max = neg_max


def _exp_step(qt, j, kt, q_dtype, plan):
    """Pass 2 on key tile ``j``: the scores again (TensorE; a masked tile's stay in SBUF),
    then P = exp(scale * S - max) on ScalarE. Its row sum accumulates in ScalarE's reduce
    registers over the tile's key tiles (their exps run back to back, and no other
    instruction in between reduces), read out into ``row_sum`` by the last one."""
    qs = qt.qs
    last = j == len(qt.keys) - 1
    if last:
        qt.row_sum = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="row_sum")
    k0, ks, masked, _ = qt.keys[j]
    if masked:
        src, act_scale = qt.masked[j], stored_scale(plan)
    elif qt.bounds is not None:  # raw S masked by run-time bounds in the max pass, kept
        src, act_scale = qt.masked[j], plan.scale
    else:
        src, act_scale = _scores(qt, kt, k0, ks, plan), plan.scale
    p_sb = nl.ndarray((qs, ks), dtype=q_dtype, buffer=nl.sbuf, name="p")
    nisa.activation(
        dst=p_sb,
        op=nl.exp,
        data=src,
        bias=qt.neg_max,
        scale=act_scale,
        reduce_op=nl.add,
        reduce_res=qt.row_sum if last and qt.sink is None else None,
        reduce_cmd=nisa.reduce_cmd.reset_reduce if j == 0 else nisa.reduce_cmd.reduce,
    )
    if last and qt.sink is not None:
        # exp(sink - max) joins the row sum in the same registers, which it reads out.
        e_sink = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="exp_sink")
        nisa.activation(
            dst=e_sink,
            op=nl.exp,
            data=qt.sink,
            bias=qt.neg_max,
            reduce_op=nl.add,
            reduce_res=qt.row_sum,
            reduce_cmd=nisa.reduce_cmd.reduce,
        )
    if plan.dropout:  # the bits were made in the steps before (_two_pass_kv_head)
        nisa.scalar_tensor_tensor(
            dst=p_sb, data=qt.bits[j].bits, op0=nl.greater_equal, operand0=float(plan.dropout),
            op1=nl.multiply, operand1=p_sb,
        )  # fmt: skip
        qt.bits[j] = None
    qt.masked[j] = None
    qt.p[j] = p_sb


def _transpose_step(qt, j, q_dtype, plan):
    """P^T of key tile ``j`` in SBUF, 128 keys per chunk: on ``p_dma_tiles`` of every 4
    key tiles, every full chunk by one SBUF-to-SBUF DMA transpose (no engine time), the
    rest on TensorE through PSUM (copied out per ``p_copy``) or on VectorE
    (``p_transpose="vector"``)."""
    qs, dt = qt.qs, plan.d_tile
    k0, ks, _, _ = qt.keys[j]
    p_sb = qt.p[j]
    full = ks // dt
    # Whole key tiles by DMA (one transpose of every full chunk: its fixed cost is paid
    # once), p_dma_tiles of every 4.
    n_dma = full if (k0 // plan.k_tile) % 4 < plan.p_dma_tiles else 0
    pieces = []
    if n_dma:
        p_dma = nl.ndarray((dt, n_dma, qs), dtype=q_dtype, buffer=nl.sbuf, name="p_t_dma")
        nisa.dma_transpose(dst=p_dma, src=p_sb[0:qs, 0 : n_dma * dt].reshape((qs, n_dma, dt)))
        for c in range(n_dma):
            pieces.append((p_dma, c, dt, (k0 + c * dt) // dt))
    rest = ks - n_dma * dt
    if rest > 0:
        p_rest = p_sb[0:qs, n_dma * dt : ks]
        p_t = _transpose_p(p_rest, qs, rest, plan)
        p_t = _evacuate_p(p_t, qs, rest, q_dtype, plan)
        for c, (c0, cs) in enumerate(tiled(rest, dt)):
            pieces.append((p_t, c, cs, (k0 + n_dma * dt + c0) // dt))
    qt.p_t[j] = pieces
    qt.p[j] = None


def _pv_step(qt, j, vb, plan):
    """P V of key tile ``j`` on TensorE, 128 keys per matmul, accumulated in the query
    tile's one PSUM bank over every key it sees (evacuated once, at its close)."""
    qs, d = qt.qs, plan.d
    if j == 0:
        qt.o_ps = nl.ndarray((qs, d), dtype=nl.float32, buffer=nl.psum, name="o_psum")
    first = j == 0
    for p_t, c, cs, vc in qt.p_t[j]:
        nisa.nc_matmul(
            dst=qt.o_ps,
            stationary=p_t[0:cs, c, 0:qs],
            moving=vb[0:cs, vc, 0:d],
            accumulate=not first,
        )
        first = False
    qt.p_t[j] = None


def _dropout_step(qt, j, stage, feat):
    """Stage ``stage`` of the dropout bits of key tile ``j`` of the query tile."""
    if stage == 0:
        k0, ks, _, _ = qt.keys[j]
        qt.bits[j] = DropBits(
            row_key=qt.row_key, n_q=qt.qs, k0=k0, n_k=ks, x=None, y=None, bits=None
        )
    dropout_stage(qt.bits[j], stage, feat)


def _close_sum(qt, plan):
    """The close's first half: 1 / l on VectorE (the rest waits for it, a step later)."""
    qt.recip = nl.ndarray((qt.qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="recip")
    nisa.reciprocal(dst=qt.recip, data=qt.row_sum)
    qt.dead = _close_features(qt.recip, qt.neg_max, qt.qs, plan)


def _close_two_pass(qt, out, lse, b, plan):
    """out = (P V) / l straight from PSUM on ScalarE, lse = log(l) + max (log on ScalarE,
    the sum on GpSimd), both to HBM; rows that see no key get 0 and -inf."""
    d, qs, q0, h = plan.d, qt.qs, qt.q0, qt.h
    o_out = nl.ndarray((qs, d), dtype=out.dtype, buffer=nl.sbuf, name="o_out")
    lse_t = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="lse_t")
    if not qt.keys:
        nisa.memset(dst=o_out, value=0.0)
        _dead_lse(lse_t, qs, qt.sink)
    else:
        nisa.activation(dst=o_out, op=nl.copy, data=qt.o_ps, scale=qt.recip)
        log_sum = nl.ndarray((qs, 1), dtype=nl.float32, buffer=nl.sbuf, name="log_sum")
        nisa.activation(dst=log_sum, op=nl.log, data=qt.row_sum)
        nisa.tensor_tensor(
            dst=lse_t, data1=log_sum, data2=qt.neg_max, op=nl.subtract, engine=nisa.engine.gpsimd
        )
        if qt.dead is not None:  # the sink folded in: dead only with a sink of -inf (or none)
            dead_lse = float("-inf") if qt.sink is None else qt.sink
            nisa.tensor_copy_predicated(dst=lse_t, src=dead_lse, predicate=qt.dead)
        if qt.n_dead:
            nisa.memset(dst=o_out[0 : qt.n_dead, 0:d], value=0.0)
            _dead_lse(lse_t, qt.n_dead, qt.sink)
    nisa.dma_copy(dst=out[b, h, q0 : q0 + qs, 0:d], src=o_out)
    nisa.dma_copy(dst=lse[b, h, q0 : q0 + qs, 0:1], src=lse_t)


def _two_pass_kv_head(
    q, sinks, sink_cols, out, lse, kt, vb, b, tiles, plan, bounds=None, feat=None
):
    """Every (head, q0) query tile of one KV head in two passes over its keys, software-
    pipelined over the flat list of (query tile, key tile) steps: at step ``i`` the max
    pass runs ``plan.lead`` steps ahead (so a tile's max is known before its exps), the exp
    pass at ``i``, P^T ``lag_transpose`` behind it, P V ``lag_pv`` behind and the close
    ``lag_close`` behind: each engine, in program order, finds its next step's inputs ready
    instead of waiting on the chain of the step it just fed."""
    states = []
    steps = []  # (query tile, key tile), in order
    for h, q0 in tiles:
        qt = _query_tile(h, q0, plan)
        qt.feat = feat
        qt.sink = _load_sink(sinks, h, qt.qs, sink_cols)
        if bounds is not None:
            qt.bounds = (bounds, q0 // plan.q_tile)
        if not qt.keys:  # no key is visible to any row of the tile
            _close_two_pass(qt, out, lse, b, plan)
            continue
        if plan.mask and not plan.mask_row:
            qt.mask_tiles = [None] * len(qt.keys)
        if plan.dropout:  # its rows' keys, early: the bits are made steps ahead
            qt.row_key = nl.ndarray((qt.qs, 1), dtype=nl.int32, buffer=nl.sbuf, name="row_key")
            load_row_keys(qt.row_key, feat, h, q0, qt.qs)
            qt.bits = [None] * len(qt.keys)
        states.append(qt)
        for j in range(len(qt.keys)):
            steps.append((len(states) - 1, j))
    n = len(steps)
    burst = plan.max_burst
    first = min(-plan.lead - burst - plan.q_prefetch, -DROPOUT_STAGES)
    for i in range(first, n + plan.lag_close + 1):
        f = i + plan.lead + burst - 1 + plan.q_prefetch
        if 0 <= f < n:
            t, j = steps[f]
            if j == 0:
                assert len(states[t].keys) <= plan.lead + 1, "flash_attention: lead too short"
                _load_query(q, b, states[t], plan)
        # its mask tile, MASK_PREFETCH steps ahead of the earliest burst its max pass is in
        f = i + plan.lead + burst - 1 + MASK_PREFETCH
        if 0 <= f < n and plan.mask and not plan.mask_row:
            t, j = steps[f]
            qt = states[t]
            k0, ks, _, _ = qt.keys[j]
            qt.mask_tiles[j] = load_mask_tile(feat, qt.h, qt.q0, qt.qs, k0, ks, plan)
        for stage in range(DROPOUT_STAGES if plan.dropout else 0):
            f = i + DROPOUT_STAGES - stage  # stage s of step f, DROPOUT_STAGES - s steps ahead
            if 0 <= f < n:
                t, j = steps[f]
                _dropout_step(states[t], j, stage, feat)
        if (i + plan.lead) % burst == 0:
            for f in range(i + plan.lead, i + plan.lead + burst):
                if 0 <= f < n:
                    t, j = steps[f]
                    _max_step(q, b, states[t], j, kt, plan)
                    if j == len(states[t].keys) - 1:
                        _row_max(states[t], plan)
        if 0 <= i < n:
            t, j = steps[i]
            _exp_step(states[t], j, kt, q.dtype, plan)
        f = i - plan.lag_transpose
        if 0 <= f < n:
            t, j = steps[f]
            _transpose_step(states[t], j, q.dtype, plan)
        f = i - plan.lag_pv
        if 0 <= f < n:
            t, j = steps[f]
            _pv_step(states[t], j, vb, plan)
        f = i - plan.lag_close
        if 0 <= f < n:
            t, j = steps[f]
            if j == len(states[t].keys) - 1:
                _close_sum(states[t], plan)
        f = i - plan.lag_close - 1
        if 0 <= f < n:
            t, j = steps[f]
            if j == len(states[t].keys) - 1:
                _close_two_pass(states[t], out, lse, b, plan)


@nki.jit
def flash_attention_fwd_kernel(q, k, v, sinks, plan, kv_bounds=None, attn_mask=None, row_keys=None):
    """Flash attention forward: ``(out [B, H, Sq, D] in q's dtype, lse [B, H, Sq, 1] fp32)``
    for q ``[B, H, Sq, D]``, k and v ``[B, Hkv, Sk, D]`` in HBM; ``sinks`` is None or each
    head's sink logit broadcast to ``[H, 128, 1]`` fp32 (one value per partition row).

    ``plan`` is the :class:`FlashAttentionPlan` for these shapes (a compile-time argument).
    Launched as ``flash_attention_fwd_kernel[plan.lnc]``: each physical core runs its share
    ``plan.core_groups[nl.program_id(0)]`` of (batch, KV head) groups and query tiles and
    writes only those rows of out and lse.

    ``plan.packed``: q ``[B, Sq, H, D]``, k and v ``[B, Sk, Hkv, D]`` and out in that
    layout (read and written through BHSD views). ``kv_bounds`` (``plan.runtime_bounds``):
    each query row's visible keys, :func:`load_bounds`. ``attn_mask`` (plan.mask: "bool"
    as uint8, or "float"; 4-d, broadcast dims of size 1) and ``row_keys``
    (``[B, H, Sq, 1]`` int32, plan.dropout) are the score-side features' inputs, None
    without them.
    """
    if plan.packed:
        q, k, v = q.permute((0, 2, 1, 3)), k.permute((0, 2, 1, 3)), v.permute((0, 2, 1, 3))
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    assert (B, H, Hkv, Sq, Sk, D) == (plan.b, plan.h, plan.hkv, plan.sq, plan.sk, plan.d), (
        "flash_attention: the plan was made for other shapes"
    )
    assert nl.num_programs(0) == plan.lnc, (
        "flash_attention: launch flash_attention_fwd_kernel[plan.lnc]"
    )
    out_shape = (B, Sq, H, D) if plan.packed else (B, H, Sq, D)
    out_hbm = nl.ndarray(out_shape, dtype=q.dtype, buffer=nl.shared_hbm, name="out")
    out = out_hbm.permute((0, 2, 1, 3)) if plan.packed else out_hbm
    lse = nl.ndarray((B, H, Sq, 1), dtype=nl.float32, buffer=nl.shared_hbm, name="lse")
    sink_cols = [None] * H  # per head: its sink column, loaded once (sinks only)
    assert (kv_bounds is None) == (not plan.runtime_bounds), (
        "flash_attention: kv_bounds and plan.runtime_bounds go together"
    )
    bounds = load_bounds(kv_bounds, plan)
    feat = score_inputs(
        attn_mask, row_keys, plan, plan.q_tile, q.dtype, plan.k_tile, edge_biases(plan)
    )
    for b, kvh, tiles in plan.core_groups[nl.program_id(0)]:
        # K/V resident: loaded once, shared by every query tile of the group's heads.
        kv = _load_kv_block(k, v, b, kvh, 0, Sk, plan) if plan.kv_blocks == 1 else None
        group_feat = for_group(feat, b, kvh, H // Hkv, plan.scale, plan, q.dtype)
        if plan.softmax == "two_pass":
            _two_pass_kv_head(
                q, sinks, sink_cols, out, lse, kv[0], kv[1], b, tiles, plan, bounds, group_feat
            )
        else:
            _attend_kv_head(
                q, k, v, sinks, sink_cols, out, lse, kv, b, kvh, tiles, plan, bounds, group_feat
            )
    return out_hbm, lse
