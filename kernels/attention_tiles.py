"""NKI helpers on score tiles, shared by the forward, backward and varlen kernels: the
contraction over D, VectorE block transposes, the causal diagonal and window edges (masked
by ``affine_select``, or added in PSUM as an :class:`EdgeBias` matmul), ``attn_mask``
tiles and bias rows, the dropout bits (:mod:`.counter_hash` on VectorE/GpSimd) and the
run-time key bounds of the varlen ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_kernels.backend import nisa, nl
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.attention_contract import MASK_FILL, tile_visibility
from neuron_kernels.kernels.counter_hash import (
    HASH_M1,
    HASH_M2,
)
from neuron_kernels.kernels.sbuf_constants import identity
from neuron_kernels.kernels.spec import ceil_div
from neuron_kernels.kernels.tiling import tiled

__all__ = [
    "DROPOUT_STAGES",
    "DropBits",
    "EdgeBias",
    "MASK_PREFETCH",
    "ScoreInputs",
    "add_edge_bias",
    "add_row_mask",
    "bias_dtype",
    "bounds_bytes",
    "dead_rows_column",
    "dropout_bits",
    "dropout_stage",
    "edge_bias_applies",
    "edge_biases",
    "edge_offsets",
    "feature_bytes",
    "for_group",
    "load_bounds",
    "load_mask_tile",
    "load_row_keys",
    "mask_bounds",
    "mask_window",
    "matmul_over_d",
    "raw_bounds",
    "runtime_bounds_mode",
    "score_inputs",
    "transpose_blocks",
    "uses_edge_bias",
]


def feature_bytes(features: dict, k_tile: int, burst: int, h: int, hkv: int, sk: int) -> int:
    """SBUF bytes per partition of the forward's mask and dropout (:func:`score_features`):
    the mask tiles in flight (4 bytes per key at most), loaded MASK_PREFETCH steps ahead of
    the earliest max burst (of ``burst`` key tiles) that reads them; dropout's hash tiles
    (x, y: 4 bytes per pair of keys; bits: 4 per key) of the steps its pipeline runs ahead,
    and the launch's key iota; a row mask's bias rows of the group (and their raw loads),
    on one partition. 0 for plain attention."""
    stored_mask = bool(features["mask"]) and not features["mask_row"]
    out = (MASK_PREFETCH + burst - 1) * k_tile * 4 * stored_mask
    if features["dropout"]:
        out += (DROPOUT_STAGES + 1) * k_tile * 8 + k_tile * 4
    if features["mask_row"]:
        out += (h // hkv if features["mask_dims"][1] else 1) * sk * 8 if hkv else 0
    return out


def runtime_bounds_mode(problem: dict, target: Target) -> str:
    """The plan's ``runtime_bounds``: "" unless ``problem["runtime_bounds"]``; then
    "range_select" where the target has it (NeuronCore-v3+), else "iota"."""
    if not problem.get("runtime_bounds"):
        return ""
    return "range_select" if target.has_range_select else "iota"


def bounds_bytes(mode: str, sq: int, q_tile: int) -> int:
    """SBUF bytes per partition of the run-time bounds (:func:`load_bounds`): two fp32
    columns per query tile; the "iota" masks add one key-position and two fp32 mask rows
    of at most one PSUM bank (512 keys)."""
    if not mode:
        return 0
    return ceil_div(sq, q_tile) * 2 * 4 + (3 * 512 * 4 if mode == "iota" else 0)


def matmul_over_d(dst, stationary_t, s0, n_s, moving_t, m0, n_m, plan):
    """``dst [n_s, n_m] = stationary^T moving`` contracted over D on TensorE: both operands
    D-on-partitions in SBUF (``[d_tile, D chunks, columns]``, columns ``s0 ..`` and
    ``m0 ..``), one matmul per D chunk accumulating in ``dst`` (PSUM). S = Q K^T in both
    directions; dP = dO V^T in the backward."""
    for c, (_, dcs) in enumerate(tiled(plan.d, plan.d_tile)):
        nisa.nc_matmul(
            dst=dst,
            stationary=stationary_t[0:dcs, c, s0 : s0 + n_s],
            moving=moving_t[0:dcs, c, m0 : m0 + n_m],
            accumulate=c > 0,
        )


def mask_window(tile, n_q, n_k, q0, k0, plan, fill):
    """Set the entries of the SBUF score-shaped ``tile [n_q, n_k]`` (query ``q0 + p`` on
    partition ``p``, key ``k0 + f`` in column ``f``) whose query does not see its key to
    ``fill``, in place on GpSimd (which cannot read PSUM): one ``affine_select`` per window
    edge that crosses the tile (the right one: the causal diagonal, or ``right`` keys past
    it; the left one: ``left`` keys before it), decided at trace time. The forward masks
    scaled scores with :data:`MASK_FILL` before the row max, the backward masks P with 0."""
    off = plan.sk - plan.sq
    if plan.right >= 0 and k0 + n_k > q0 + off + plan.right + 1:
        # keep key k0 + f for query q0 + p iff (q0 + off + right - k0) + p - f >= 0
        nisa.affine_select(
            dst=tile,
            pattern=[[-1, n_k]],
            channel_multiplier=1,
            on_true_tile=tile,
            on_false_value=fill,
            cmp_op=nl.greater_equal,
            offset=q0 + off + plan.right - k0,
        )
    if plan.left >= 0 and k0 < q0 + n_q - 1 + off - plan.left:
        # keep key k0 + f for query q0 + p iff (k0 - q0 - off + left) - p + f >= 0
        nisa.affine_select(
            dst=tile,
            pattern=[[1, n_k]],
            channel_multiplier=-1,
            on_true_tile=tile,
            on_false_value=fill,
            cmp_op=nl.greater_equal,
            offset=k0 - q0 - off + plan.left,
        )


def uses_edge_bias(left, right, softcap, stored_mask, runtime_bounds, scale) -> bool:
    """Whether the forward masks window edges and the causal diagonal on TensorE
    (:class:`EdgeBias`, the plan's ``edge_bias``): there is an edge, the scores stay raw in
    PSUM (no softcap: its tanh would squash the bias; no mask kept in SBUF; no run-time
    bounds) and the scale is at least 1e-6 (the bias, ``MASK_FILL / scale``, stays finite
    in bf16)."""
    edge = left >= 0 or right >= 0
    raw = not softcap and not stored_mask and not runtime_bounds
    return edge and raw and scale >= 1e-6


def edge_bias_applies(edge_bias: bool, n_dead: int) -> bool:
    """Whether score tiles of query rows with ``n_dead`` leading rows that see no key add
    the edges they cross in PSUM (:func:`add_edge_bias`): the plan chose the edge bias
    (``plan.edge_bias``, :func:`uses_edge_bias`) and no row is dead. Tiles of query rows
    with dead rows keep the SBUF mask, whose fill gives those rows out 0 and lse -inf.
    The one rule the plan's SBUF budget and every forward score path read."""
    return edge_bias and n_dead == 0


@dataclass
class EdgeBias(nl.NKIObject):
    """Window edges and the causal diagonal masked on TensorE (``plan.edge_bias``): for each
    chunk of ``pmax`` keys an edge crosses, one more matmul accumulates ``I^T B`` into the
    raw scores in PSUM (``I`` the identity, stationary; ``B [q, k]`` bf16: 0 where the query
    sees the key, ``MASK_FILL / scale`` where it does not), so ``scale * S`` of a masked key
    is at most about ``MASK_FILL`` and its exp 0. The tile then stays in PSUM like the tiles
    every row sees: its row max and its exp read it there, with no copy to SBUF and no
    GpSimd ``affine_select`` per tile. One bias tile per distinct pair of edge offsets
    (:func:`edge_offsets`), built at its first use and kept for the launch."""

    identity: object  # [pmax, pmax] bf16 identity: the bias matmuls' stationary
    offsets: list  # (right offset, left offset) of each bias tile built so far
    tiles: list  # [pmax, pmax] bf16 bias tiles, in the order of offsets


def edge_biases(plan):
    """The launch's :class:`EdgeBias` (its identity written here), or None without
    ``plan.edge_bias``."""
    if not plan.edge_bias:
        return None
    ident = identity(plan.q_tile, "edge_identity")
    return EdgeBias(identity=ident, offsets=[], tiles=[])


def edge_offsets(q0, c0, plan) -> tuple[int, int]:
    """``(o_right, o_left)`` of the keys from ``c0`` for the queries from ``q0``: query
    ``q0 + p`` sees key ``c0 + f`` iff ``o_right + p - f >= 0`` and ``o_left - p + f >= 0``
    (:func:`mask_window`'s predicates). Each is clamped to ``[-pmax, pmax - 1]``: at
    ``pmax - 1`` its edge masks nothing in a ``pmax x pmax`` tile, at ``-pmax`` everything,
    so chunks with the same masks share their bias tiles."""
    off = plan.sk - plan.sq
    n = plan.q_tile
    o_right = n - 1 if plan.right < 0 else q0 + off + plan.right - c0
    o_left = n - 1 if plan.left < 0 else c0 - q0 - off + plan.left
    return max(-n, min(o_right, n - 1)), max(-n, min(o_left, n - 1))


def _edge_bias_tile(edges, o_right, o_left, plan):
    """The bias tile of the offsets ``(o_right, o_left)``, built on its first use: zeros,
    then ``MASK_FILL / scale`` where either edge hides the key (GpSimd)."""
    found = None
    for i in range(len(edges.offsets)):
        if edges.offsets[i][0] == o_right and edges.offsets[i][1] == o_left:
            found = edges.tiles[i]
    if found is not None:
        return found
    n = plan.q_tile
    bias = nl.ndarray((n, n), dtype=nl.bfloat16, buffer=nl.sbuf, name="edge_bias")
    nisa.memset(dst=bias, value=0.0)
    fill = MASK_FILL / plan.scale
    if o_right < n - 1:
        nisa.affine_select(
            dst=bias, pattern=[[-1, n]], channel_multiplier=1, on_true_tile=bias,
            on_false_value=fill, cmp_op=nl.greater_equal, offset=o_right,
        )  # fmt: skip
    if o_left < n - 1:
        nisa.affine_select(
            dst=bias, pattern=[[1, n]], channel_multiplier=-1, on_true_tile=bias,
            on_false_value=fill, cmp_op=nl.greater_equal, offset=o_left,
        )  # fmt: skip
    edges.offsets.append((o_right, o_left))
    edges.tiles.append(bias)
    return bias


def add_edge_bias(s_ps, qs, q0, k0, ks, plan, edges):
    """The window edges added to the raw scores ``s_ps [qs, ks]`` (queries from ``q0``,
    keys from ``k0``) in PSUM: one identity matmul per ``pmax``-key chunk an edge crosses
    or hides from every row (:class:`EdgeBias`); the chunks every row sees get nothing."""
    for c0, cs in tiled(k0 + ks, plan.d_tile, k0):
        if tile_visibility(q0, qs, c0, cs, plan.sq, plan.sk, plan_window(plan)) != "all":
            o_right, o_left = edge_offsets(q0, c0, plan)
            bias = _edge_bias_tile(edges, o_right, o_left, plan)
            nisa.nc_matmul(
                dst=s_ps[0:qs, c0 - k0 : c0 - k0 + cs],
                stationary=edges.identity[0:qs, 0:qs],
                moving=bias[0:qs, 0:cs],
                accumulate=True,
            )


@dataclass
class ScoreInputs(nl.NKIObject):
    """The kernels' per-launch inputs of the score-side features (both directions): the
    attention mask and dropout's row keys in HBM, dropout's hash multipliers in SBUF, for
    the batch ``b`` of the group at work."""

    b: int  # the batch of the (batch, KV head) group at work
    kvh: int  # the KV head of that group (its query heads: kvh * G .. kvh * G + G - 1)
    group: int  # G: query heads per KV head
    mask: object  # attn_mask [Bm, Hm, Sqm, Skm] in HBM (bool as uint8), None without one
    row_keys: object  # [B, H, Sq, 1] int32 dropout row keys (dropout_row_keys), or None
    hash_m1: object  # [pmax, 1] int32 HASH_M1 (read as a stride-0 broadcast), or None
    hash_m2: object  # [pmax, 1] int32 HASH_M2, or None
    key_iota: object  # dropout: [pmax, widest key tile] int32, column f holding f
    ones: object  # row masks (plan.mask_row): [1, pmax] ones, the bias matmul's stationary
    bias_rows: list  # row masks: per query head of the group (one if shared) [1, Sk] bias
    edges: object = None  # forward with plan.edge_bias: its EdgeBias, else None


def score_inputs(attn_mask, row_keys, plan, rows, dtype, keys=0, edges=None):
    """The launch's :class:`ScoreInputs`; dropout's multiplier columns and key iota
    (``rows``: the query tile's partitions, ``keys``: the widest key tile) and a row mask's
    ones row (in :func:`bias_dtype` of the inputs' ``dtype``) are written here, once per
    launch. Nothing is issued without them. ``edges``: the forward's :class:`EdgeBias`."""
    m1 = m2 = ones = key_iota = None
    if plan.mask_row:
        ones = nl.ndarray((1, rows), dtype=bias_dtype(plan, dtype), buffer=nl.sbuf, name="ones")
        nisa.memset(dst=ones, value=1.0)
    if plan.dropout:
        m1 = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.sbuf, name="hash_m1")
        m2 = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.sbuf, name="hash_m2")
        nisa.iota(dst=m1, pattern=[[0, 1]], offset=HASH_M1)
        nisa.iota(dst=m2, pattern=[[0, 1]], offset=HASH_M2)
        key_iota = nl.ndarray((rows, keys), dtype=nl.int32, buffer=nl.sbuf, name="key_iota")
        nisa.iota(dst=key_iota, pattern=[[1, keys]], offset=0, channel_multiplier=0)
    return ScoreInputs(
        b=0, kvh=0, group=1, mask=attn_mask, row_keys=row_keys, hash_m1=m1, hash_m2=m2,
        key_iota=key_iota, ones=ones, bias_rows=[], edges=edges,
    )  # fmt: skip


def bias_dtype(plan, dtype):
    """The row mask's bias matmul dtype: bf16 for a bool mask with 2-byte inputs (its values
    are 0 and MASK_FILL / scale), else fp32 (a float mask's values keep their precision)."""
    if plan.mask == "bool" and dtype != nl.float32:
        return nl.bfloat16
    return nl.float32


def for_group(feat, b, kvh, group, scale, plan, dtype):
    """``feat`` for the (batch ``b``, KV head ``kvh``) group; with a row mask (plan.mask_row:
    no query dim, no softcap) its bias rows, ``[1, Sk]`` per query head of the group (one
    when the mask has no head dim): ``MASK_FILL / scale`` where a bool mask masks, 0 where
    it keeps; ``m / scale`` for a float one. One DMA and one VectorE op per row, once per
    group: each score tile then adds its slice on TensorE (:func:`add_row_mask`). ``group``
    is G, ``scale`` the softmax scale."""
    rows = []
    if plan.mask_row:
        fb, fh = plan.mask_dims[0], plan.mask_dims[1]
        heads = group if fh else 1
        for g in range(heads):
            src = feat.mask[b if fb else 0, kvh * group + g if fh else 0, 0:1, 0 : plan.sk]
            raw = nl.ndarray((1, plan.sk), dtype=feat.mask.dtype, buffer=nl.sbuf, name="mask_row")
            nisa.dma_copy(dst=raw, src=src)
            bias = nl.ndarray(
                (1, plan.sk), dtype=bias_dtype(plan, dtype), buffer=nl.sbuf, name="mask_bias"
            )
            if plan.mask == "bool":  # (keep - 1) * (-MASK_FILL / scale)
                nisa.tensor_scalar(
                    dst=bias, data=raw, op0=nl.subtract, operand0=1.0, op1=nl.multiply,
                    operand1=-MASK_FILL / scale,
                )  # fmt: skip
            else:
                nisa.tensor_scalar(dst=bias, data=raw, op0=nl.multiply, operand0=1.0 / scale)
            rows.append(bias)
    return ScoreInputs(
        b=b, kvh=kvh, group=group, mask=feat.mask, row_keys=feat.row_keys, hash_m1=feat.hash_m1,
        hash_m2=feat.hash_m2, key_iota=feat.key_iota, ones=feat.ones, bias_rows=rows,
        edges=feat.edges,
    )  # fmt: skip


def add_row_mask(s_ps, feat, h, qs, k0, ks, plan):
    """A row mask added to the raw scores ``s_ps [qs, ks]`` in PSUM on TensorE: one K=1
    matmul (the ones row times the bias row's keys ``k0 ..``) accumulating into them, so
    ``scale * S`` carries the mask and the tile stays in PSUM (no VectorE pass)."""
    row = feat.bias_rows[h - feat.kvh * feat.group if plan.mask_dims[1] else 0]
    nisa.nc_matmul(
        dst=s_ps, stationary=feat.ones[0:1, 0:qs], moving=row[0:1, k0 : k0 + ks], accumulate=True
    )


def load_mask_tile(feat, h, q0, n_q, k0, n_k, plan):
    """The ``[n_q, n_k]`` SBUF tile of the attention mask for query rows ``q0 ..`` of head
    ``h`` of batch ``feat.b`` and keys ``k0 ..``, by one DMA that reads each broadcast dim of
    the mask with stride 0 (a ``[B, 1, 1, Sk]`` padding mask is never expanded in memory):
    uint8 (0 masks) for a bool mask, the mask's dtype for a float one."""
    fb, fh, fq, fk = plan.mask_dims
    mask = feat.mask
    qa, qb = (q0, q0 + n_q) if fq else (0, 1)
    ka, kb = (k0, k0 + n_k) if fk else (0, 1)
    src = mask[feat.b if fb else 0, h if fh else 0, qa:qb, ka:kb]
    if not fq and n_q > 1:
        src = src.broadcast(0, n_q)
    if not fk and n_k > 1:
        src = src.broadcast(1, n_k)
    tile = nl.ndarray((n_q, n_k), dtype=mask.dtype, buffer=nl.sbuf, name="mask_tile")
    nisa.dma_copy(dst=tile, src=src)
    return tile


def load_row_keys(dst, feat, h, q0, n_q):
    """Dropout's row keys of query rows ``q0 ..`` of head ``h`` (batch ``feat.b``) into the
    ``[n_q, 1]`` int32 column ``dst``."""
    nisa.dma_copy(dst=dst, src=feat.row_keys[feat.b, h, q0 : q0 + n_q, 0:1])


@dataclass
class DropBits(nl.NKIObject):
    """One score tile's dropout bits in the making (:func:`dropout_stage`)."""

    row_key: object  # [n_q, 1] int32 the rows' dropout keys
    n_q: int
    k0: int  # first key (even)
    n_k: int
    x: object  # [n_q, ceil(n_k / 2)] int32: one hash per pair of keys
    y: object  # [n_q, ceil(n_k / 2)] int32 scratch
    bits: object  # [n_q, n_k] int32: each key's 16 bits
    key: object = None  # [n_q, 1] int32 row_key ^ (k0 / 2) (an aligned tile)


# The instructions of dropout_bits, in order: issued one per pipeline step by the kernels
# (stage s of a tile DROPOUT_STAGES - s steps before its use), each engine works on other
# tiles' stages instead of waiting on the other engine's previous stage.
DROPOUT_STAGES = 7


# Steps (tile pairs in the backward) a mask tile with a query dim is loaded ahead of its use:
# its DMA's ~1.3 us latency, hidden.
MASK_PREFETCH = 2


def dropout_stage(d, stage, feat):
    """Stage ``stage`` of the bits of :class:`DropBits` ``d``: ``x = hash32(u ^ row_key)``
    for the key pairs ``u = (k0 + f) / 2``, then key ``2u``'s bits ``x & 0xFFFF`` and key
    ``2u + 1``'s ``x >> 16`` (:func:`dropout_keep` in torch; a score is kept iff its bits
    are ``>= plan.dropout``). GpSimd: the exact int32 multiplies and the xor of two tiles
    (and the pair iota of an unaligned tile); VectorE: the xor with the row key (a column),
    the shifts and the mask."""
    n_q, n_k, gpsimd = d.n_q, d.n_k, nisa.engine.gpsimd
    n_u, u0 = (n_k + 1) // 2, d.k0 // 2
    # u0 a multiple of the power of two >= n_u: u0 + f = u0 ^ f, so the launch's iota
    # serves, xored with the column row_key ^ u0 (no GpSimd iota per tile).
    span = 1
    while span < n_u:
        span = span * 2
    aligned = u0 % span == 0 and feat.key_iota.shape[1] >= n_u
    if stage == 0:
        assert d.k0 % 2 == 0, "dropout: key tiles start on an even key"
        d.x = nl.ndarray((n_q, n_u), dtype=nl.int32, buffer=nl.sbuf, name="drop_x")
        d.y = nl.ndarray((n_q, n_u), dtype=nl.int32, buffer=nl.sbuf, name="drop_y")
        if aligned:
            d.key = nl.ndarray((n_q, 1), dtype=nl.int32, buffer=nl.sbuf, name="drop_key")
            nisa.tensor_scalar(dst=d.key, data=d.row_key, op0=nl.bitwise_xor, operand0=u0)
        else:
            nisa.iota(dst=d.x, pattern=[[1, n_u]], offset=u0, channel_multiplier=0)
    elif stage == 1:
        if aligned:
            iota = feat.key_iota[0:n_q, 0:n_u]
            nisa.tensor_scalar(dst=d.x, data=iota, op0=nl.bitwise_xor, operand0=d.key)
        else:
            nisa.tensor_scalar(dst=d.x, data=d.x, op0=nl.bitwise_xor, operand0=d.row_key)
    elif stage == 2:
        m1 = feat.hash_m1[0:n_q, :].broadcast(1, n_u)
        nisa.tensor_tensor(dst=d.x, data1=d.x, data2=m1, op=nl.multiply, engine=gpsimd)
    elif stage == 3:
        nisa.tensor_scalar(dst=d.y, data=d.x, op0=nl.right_shift, operand0=15)
    elif stage == 4:
        nisa.tensor_tensor(dst=d.x, data1=d.x, data2=d.y, op=nl.bitwise_xor, engine=gpsimd)
    elif stage == 5:
        m2 = feat.hash_m2[0:n_q, :].broadcast(1, n_u)
        nisa.tensor_tensor(dst=d.x, data1=d.x, data2=m2, op=nl.multiply, engine=gpsimd)
    else:  # even keys: the low half; odd keys: the high half (strided views of bits)
        d.bits = nl.ndarray((n_q, n_k), dtype=nl.int32, buffer=nl.sbuf, name="drop_bits")
        nisa.tensor_scalar(
            dst=d.bits[0:n_q, 0:n_k:2], data=d.x, op0=nl.bitwise_and, operand0=0xFFFF
        )
        if n_k > 1:
            n_odd = n_k // 2
            nisa.tensor_scalar(
                dst=d.bits[0:n_q, 1:n_k:2], data=d.x[0:n_q, 0:n_odd], op0=nl.right_shift,
                operand0=16,
            )  # fmt: skip


def dropout_bits(row_key, n_q, k0, n_k, feat):
    """``[n_q, n_k]`` int32: the 16 hashed bits of the scores of query rows with the
    ``[n_q, 1]`` dropout keys ``row_key`` and keys ``k0 ..``: every stage of
    :func:`dropout_stage` at once (where no pipeline spreads them)."""
    d = DropBits(row_key=row_key, n_q=n_q, k0=k0, n_k=n_k, x=None, y=None, bits=None)
    for stage in range(DROPOUT_STAGES):
        dropout_stage(d, stage, feat)
    return d.bits


def dead_rows_column(neg_max, n, name="dead"):
    """``[n, 1]`` uint8, 1 on rows whose (negated) max ``neg_max >= -MASK_FILL / 2``: rows
    an attention mask leaves without a visible key (their scores are all ``<= MASK_FILL``)."""
    dead = nl.ndarray((n, 1), dtype=nl.uint8, buffer=nl.sbuf, name=name)
    nisa.tensor_scalar(dst=dead, data=neg_max, op0=nl.greater_equal, operand0=-MASK_FILL / 2)
    return dead


def load_bounds(kv_bounds, plan):
    """The run-time key bounds in SBUF: ``kv_bounds [q_tile, query tiles, 2]`` fp32 (HBM;
    row ``p`` of query tile ``t`` is query ``t * q_tile + p``; its visible keys are
    ``[lo, hi) = kv_bounds[p, t, 0:2]``), one DMA per kernel, or None without bounds."""
    if kv_bounds is None:
        return None
    rows, tiles = kv_bounds.shape[0], kv_bounds.shape[1]
    sb = nl.ndarray((rows, tiles, 2), dtype=nl.float32, buffer=nl.sbuf, name="kv_bounds")
    nisa.dma_copy(dst=sb, src=kv_bounds)
    return sb


def mask_bounds(tile, n_q, n_k, k0, bounds, t, plan, fill, src=None, reduce_res=None):
    """Set the fp32 SBUF score tile ``tile [n_q, n_k]`` (query row ``p`` of query tile
    ``t``, key ``k0 + f`` in column ``f``) to ``src`` (PSUM or SBUF; default ``tile``, in
    place) where the key is within the row's run-time bounds ``[lo, hi)``
    (:func:`load_bounds`), else to a fill. "range_select" (VectorE, NeuronCore-v3+; isa
    range_select: ``lo <= k0 + f < hi`` compared in fp32, exact below 2^24) fills with
    FP32_MIN, whatever ``fill`` is, and with ``reduce_res`` ([n_q, 1] fp32) also writes the
    row max of the result there, in the same pass. "iota" (v2): key positions by GpSimd
    iota, ``c = (k >= lo) * -fill`` then ``c = (k < hi) * c`` (VectorE, ALU compares give
    1.0 or 0.0), then ``tile = (c + fill) + src``: ``src`` exactly where visible
    (``-fill + fill = 0``), ``fill + src`` (``fill`` to within ``|src|``) elsewhere."""
    lo, hi = bounds[0:n_q, t, 0:1], bounds[0:n_q, t, 1:2]
    src = tile if src is None else src
    if plan.runtime_bounds == "range_select":
        nisa.range_select(
            dst=tile,
            on_true_tile=src,
            comp_op0=nl.greater_equal,
            comp_op1=nl.less,
            bound0=lo,
            bound1=hi,
            reduce_cmd=nisa.reduce_cmd.idle if reduce_res is None else nisa.reduce_cmd.reset_reduce,
            reduce_res=reduce_res,
            range_start=k0,
        )
        return
    keys = nl.ndarray((n_q, n_k), dtype=nl.float32, buffer=nl.sbuf, name="key_pos")
    nisa.iota(dst=keys, pattern=[[1, n_k]], offset=k0, channel_multiplier=0)
    keep = nl.ndarray((n_q, n_k), dtype=nl.float32, buffer=nl.sbuf, name="key_keep")
    nisa.tensor_scalar(
        dst=keep, data=keys, op0=nl.greater_equal, operand0=lo, op1=nl.multiply, operand1=-fill
    )
    nisa.scalar_tensor_tensor(
        dst=keep, data=keys, op0=nl.less, operand0=hi, op1=nl.multiply, operand1=keep
    )
    nisa.scalar_tensor_tensor(
        dst=tile, data=keep, op0=nl.add, operand0=fill, op1=nl.add, operand1=src
    )


def raw_bounds(plan) -> bool:
    """Run-time bounds mask raw S as it leaves PSUM (one range_select, which also takes its
    row max) and the exp then scales it, as for an unmasked tile: NeuronCore-v3+, no
    softcap, and a scale >= 1e-6 (the FP32_MIN fill times it stays below -3e32: exp 0, and
    the row max of the scaled scores is the scale times that of S)."""
    return plan.runtime_bounds == "range_select" and not plan.softcap and plan.scale >= 1e-6


def transpose_blocks(dst, src, rows, cols, plan):
    """``dst [cols, rows] = src [rows, cols]^T`` on VectorE, SBUF to SBUF, in blocks of
    ``plan.vector_transpose`` (32) rows and columns: P^T in the forward, dS^T in the
    backward, when TensorE and its PSUM bank are kept free."""
    e = plan.vector_transpose
    for r0, rs in tiled(rows, e):
        for c0, cs in tiled(cols, e):
            nisa.nc_transpose(
                dst=dst[c0 : c0 + cs, r0 : r0 + rs],
                data=src[r0 : r0 + rs, c0 : c0 + cs],
                engine=nisa.engine.vector,
            )


def plan_window(plan):
    """The plan's window ``(left, right)``, causal folded in."""
    return (plan.left, plan.right)
