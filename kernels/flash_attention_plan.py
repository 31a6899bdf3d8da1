"""The forward's tunable config (``FlashAttentionConfig``) and its tile plan
(``FlashAttentionPlan``, built by :func:`plan`): the one place the kernel and the op's
``check`` read tile sizes, pipeline depths and the SBUF/PSUM budget from.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_kernels.backend import nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.attention_contract import (
    MAX_HEAD_DIM,
    OP,
    dead_rows,
    key_bounds,
    refuse_bounds_features,
    resolve_scale,
    score_features,
    window_bounds,
)
from neuron_kernels.kernels.attention_tiles import (
    bounds_bytes,
    edge_bias_applies,
    feature_bytes,
    runtime_bounds_mode,
    uses_edge_bias,
)
from neuron_kernels.kernels.spec import (
    ITEMSIZE,
    TunableConfig,
    ceil_div,
    tunable,
)
from neuron_kernels.kernels.tiling import split_work, tiled

__all__ = [
    "FlashAttentionConfig",
    "FlashAttentionPlan",
    "MAX_BURST",
    "plan",
    "query_tiles",
    "split_groups",
]


# Two-pass with a softcap: key tiles whose max pass (tanh on ScalarE) is issued at once.
# Modeled: each switch of ScalarE's activation table between tanh and exp costs 1.3 us
# (cost_model act_table_switch_ns, an unpublished, low-confidence figure); in bursts of 16
# the switches cost 2 per 16 key tiles, not 2 per key tile.
MAX_BURST = 16


@dataclass(frozen=True)
class FlashAttentionConfig(TunableConfig):
    """Tile-level choices of the flash attention forward kernel.

    The query tile is always one partition tile (128 rows on partitions): the scores
    ``S = q K^T`` land q-rows-on-partitions in PSUM, so the row max, the exp and the row
    sum run along the free axis, where VectorE and ScalarE reduce.

    Attributes:
        k_tile: keys per score tile (the moving free size of QK^T; 512 fills one PSUM bank).
        kv_block: K/V rows held in SBUF at once. When Sk fits, K^T and V of a KV head are
            loaded once and reused by every query tile of every query head of its group;
            otherwise each query tile streams the blocks again.
        load_transpose: how q^T and K^T (D on partitions) reach SBUF: "pe" (contiguous load,
            TensorE transpose through PSUM), "dma" (DMA transpose, 2-byte dtypes, trn2+) or
            "strided" (element-wise DMA access pattern).
        p_transpose: how the probabilities P [q, k] become P^T [k, q] for P V: "pe" (TensorE
            transpose through PSUM) or "vector" (VectorE 32x32 blocks, SBUF to SBUF).
        p_copy: which engines evacuate P^T from PSUM: "vector", or "split" (every other
            one on ScalarE).
        q_group: online softmax: query tiles processed in lockstep, stage by stage: each
            engine runs in program order, so one tile's dependency chain (QK^T -> max ->
            exp -> P^T -> P V -> rescale) is hidden behind the other tiles' work.
        softmax: "two_pass": a max pass (QK^T, row max on VectorE straight from PSUM) then
            an exp pass (QK^T again, exp, P^T, P V accumulated in one PSUM bank over every
            key): no running max, no rescale, one evacuation per query tile; it needs K/V
            resident (one kv_block), else the online softmax runs. "online": one pass with
            a running max and a rescaled accumulator per key tile.
        p_dma_tiles: two-pass: of every 4 key tiles, how many have P^T made by one
            SBUF-to-SBUF DMA transpose (no engine time; trn2+, 2-byte dtypes, else none);
            the others go the ``p_transpose`` way.
    """

    op_name = OP

    k_tile: int = tunable(
        512, (128, 512), "modeled: one full PSUM bank of scores per exp/reduce pass"
    )
    kv_block: int = tunable(
        8192,
        (512, 4096, 8192, 16384),
        "modeled: K/V of an 8192-token head stay resident (two-pass softmax), loaded once "
        "per KV head: Sq=Sk=8192 D=128 bf16 causal, 4 heads, LNC=1: 1735 us vs 3416 us "
        "with 4096 (two blocks: the online softmax)",
    )
    load_transpose: str = tunable(
        "pe", ("pe", "dma", "strided"), "correctness: valid for every dtype and target"
    )
    p_transpose: str = tunable(
        "pe", ("pe", "vector"), "modeled: one TensorE transpose per 128 keys, not 16 VectorE ones"
    )
    p_copy: str = tunable(
        "split",
        ("vector", "split"),
        "modeled: VectorE also takes the row max and rescales; ScalarE takes half the copies",
    )
    q_group: int = tunable(
        2,
        (1, 2, 4),
        "modeled: 31% of TensorE peak at Sq=Sk=4096 D=128 bf16 vs 21% with 1; 4 needs "
        "10 PSUM banks with the key-tile pipeline",
    )
    softmax: str = tunable(
        "two_pass",
        ("two_pass", "online"),
        "modeled: Sq=Sk=4096 D=128 bf16, 4 heads, LNC=1: 800 us vs 1400 us online "
        "(causal 586 vs 958): QK^T twice costs TensorE 1.7 us per query tile, the online "
        "rescale and P^T copies cost VectorE/ScalarE more",
    )
    p_dma_tiles: int = tunable(
        3,
        (0, 1, 2, 3, 4),
        "modeled: same shape 800 us with 3 vs 914 (0), 846 (2), 1003 (4): TensorE and "
        "the DMA queues balanced",
    )


@dataclass(frozen=True)
class FlashAttentionPlan(nl.NKIObject):
    """Tiles, loop counts and budgets of one flash attention forward, derived once by
    :func:`plan` and read by the kernel (a compile-time argument) and the budget check."""

    b: int
    h: int
    hkv: int
    sq: int
    sk: int
    d: int
    causal: bool
    left: int  # keys a query sees before its diagonal, -1 unbounded (window_bounds)
    right: int  # keys a query sees after its diagonal, -1 unbounded (causal: 0)
    softcap: float  # > 0: scores capped to softcap * tanh(scale * S / softcap); 0: off
    scale: float  # the softmax scale in use
    mask: str  # attn_mask: "" none, "bool" (uint8 in HBM, 0 masks) or "float" (added)
    mask_dims: tuple  # per dim of the 4-d mask (B, H, Sq, Sk): True full, False size 1
    mask_row: bool  # the mask has no query dim (and no softcap): added on TensorE (for_group)
    dropout: int  # dropout_threshold(p): a score whose 24 hashed bits are below is dropped
    inv_keep: float  # 1 / (1 - dropout_p): the kept weights' scale
    q_tile: int  # query rows per tile: the partition count
    d_tile: int  # contraction rows of D per matmul: the partition count
    d_tiles: int  # partition tiles D spans (1 for D <= 128, 2 above)
    k_tile: int  # keys per score tile
    kv_block: int  # K/V rows per SBUF block (clipped to Sk, a multiple of k_tile)
    kv_blocks: int  # blocks along Sk; 1 means K/V resident per KV head
    load_transpose: str
    p_transpose: str
    p_copy: str
    q_group: int  # query tiles in lockstep
    pe_transpose_keeps_dtype: bool  # TensorE transposes keep the dtype in PSUM (v3+)
    vector_transpose: int  # VectorE transpose block edge (32)
    softmax: str  # "two_pass" (K/V resident) or "online" (the config's, or online if streamed)
    p_dma_tiles: int  # two-pass: key tiles of every 4 whose P^T is made by DMA (0: none)
    lead: int  # two-pass: key tiles the max pass runs ahead of the exp pass
    max_burst: int  # two-pass: key tiles whose max pass is issued at once (softcap: > 1)
    lag_transpose: int  # two-pass: key tiles P^T runs behind its exp
    lag_pv: int  # two-pass: key tiles P V runs behind its exp
    lag_close: int  # two-pass: key tiles a query tile's close runs behind its exp
    hwdge: bool  # the target has hardware DGE queues (v3+): q loads go there
    q_prefetch: int  # two-pass: key tiles a query tile's q^T load runs ahead of its max pass
    lnc: int  # physical cores of the launch (kernel[lnc])
    core_groups: tuple  # per core, its work: ((b, kv head, ((head, q0), ...)), ...)
    sbuf_bytes: int
    psum_banks: int
    # Packed rows (varlen): q, k, v and out are [B, S, heads, D] in HBM, read and written
    # through BHSD views (a row stride of heads * D), never copied.
    packed: bool = False
    # Run-time key bounds (varlen): "" none; else each query row's visible keys [lo, hi)
    # are kernel data (:func:`load_bounds`) and every score tile is masked with them
    # (:func:`mask_bounds`): "range_select" (NeuronCore-v3+) or "iota" (v2).
    runtime_bounds: str = ""
    # Window edges and the causal diagonal masked on TensorE, the scores raw in PSUM
    # (:func:`uses_edge_bias`, :class:`EdgeBias`); query tiles with dead rows still mask
    # in SBUF.
    edge_bias: bool = False


def split_groups(b, hkv, group, tiles, costs, lnc):
    """Each core's ``((b, kv head, tiles), ...)``: whole (batch, KV head) groups round
    robin while every core gets one; the groups left over (fewer than the cores) split by
    their query tiles, balancing ``costs`` (a tile's visible keys: under causal masking
    the later tiles see more), so each core's share of those groups is a subset of their
    ``tiles`` (``(head within the group, q0)`` pairs, in order). At LNC=1 every group is
    whole and in the order of the LNC=1 loop."""
    groups = [(bb, kvh) for bb in range(b) for kvh in range(hkv)]
    whole = len(groups) - len(groups) % lnc
    shares = [[] for _ in range(lnc)]
    for i in range(whole):
        bb, kvh = groups[i]
        shares[i % lnc].append((bb, kvh, tuple((kvh * group + g, q0) for g, q0 in tiles)))
    for bb, kvh in groups[whole:]:
        split = split_work(costs, lnc)
        for c in range(lnc):
            mine = tuple((kvh * group + tiles[i][0], tiles[i][1]) for i in split[c])
            if mine:
                shares[c].append((bb, kvh, mine))
    return tuple(tuple(share) for share in shares)


def query_tiles(group: int, sq: int, sk: int, q_tile: int, causal: bool, window=None):
    """A group's query tiles ``(head within the group, q0)`` in the kernel's order, and
    each one's cost: the keys it sees (all of Sk, or those within the causal diagonal and
    the window, aligned bottom-right) plus one tile of fixed work (its load, close and
    store)."""
    tiles, costs = [], []
    bounds = window_bounds(causal, window)
    for g in range(group):
        for q0, qs in tiled(sq, q_tile):
            tiles.append((g, q0))
            k_start, k_end, _, _ = key_bounds(q0, qs, sq, sk, bounds)
            costs.append(max(0, k_end - k_start) + q_tile)
    return tiles, costs


def _two_pass_budget(sk, d, d_tiles, q_tile, item, masked, config, kv_chunks, lags):
    """(SBUF bytes per partition, PSUM banks) of the two-pass forward, for its pipeline
    ``lags = (lead, q_prefetch, lag_pv, lag_close)``: K^T and V resident; P and P^T live
    from a key tile's exp to its P V (``lag_pv + 1`` key tiles), masked scores from its max
    pass to its exp (``lead + 1``, when a window edge or the diagonal masks); each query tile with a step between its
    q^T load and its close holds q^T, its per-key-tile max columns and [q, 1] columns and
    its output rows."""
    lead, q_prefetch, lag_pv, lag_close = lags
    key_tiles = ceil_div(sk, config.k_tile)
    sbuf = d_tiles * sk * item + kv_chunks * d * item
    if config.load_transpose == "pe":
        sbuf += 2 * d * item  # q rows awaiting their TensorE transpose
    chunks = ceil_div(config.k_tile, q_tile)
    sbuf += (lag_pv + 1) * (config.k_tile * item + chunks * q_tile * item)  # P, P^T
    if masked:
        sbuf += (lead + 1) * config.k_tile * 4  # masked scores
    per_query_tile = d_tiles * q_tile * item + (2 * key_tiles + 8) * 4 + d * item
    sbuf += (lead + q_prefetch + lag_close + 2) * per_query_tile
    # Scores of the max pass and of the exp pass, the P V sums of the query tiles between
    # P V and their close, and the transposes' banks.
    banks = 2 + (lag_close - lag_pv + 1)
    banks += (config.p_transpose == "pe") + (config.load_transpose == "pe")
    return sbuf, banks


def plan(problem: dict, dtype: str, config: FlashAttentionConfig, target: Target, lnc: int = 1):
    """The tile plan of ``config`` for ``problem`` in ``dtype`` on ``target``, the work
    split over ``lnc`` cores (:func:`split_groups`).

    Raises:
        LimitError: a DMA transpose on a target or dtype that has none, a k_tile wider than
            one PSUM bank of fp32 scores, or a head dim above :data:`MAX_HEAD_DIM`.
    """
    b, h, hkv = problem["b"], problem["h"], problem["hkv"]
    sq, sk, d = problem["sq"], problem["sk"], problem["d"]
    causal = bool(problem.get("causal", False))
    window = (problem.get("window_left", -1), problem.get("window_right", -1))
    left, right = window_bounds(causal, window)
    softcap = float(problem.get("softcap", 0.0))
    scale = resolve_scale(problem.get("scale"), d)
    features = score_features(problem)
    stored_mask = bool(features["mask"]) and not features["mask_row"]
    bounded = runtime_bounds_mode(problem, target)
    refuse_bounds_features(OP, problem, features)
    edge_bias = uses_edge_bias(left, right, softcap, stored_mask, bounded, scale)
    # Tiles still masked in SBUF: every crossed one, or with the edge bias only those of
    # query tiles with dead rows (Sq > Sk + right).
    masked_sbuf = left >= 0 or right >= 0 or softcap > 0 or stored_mask or bool(bounded)
    if edge_bias_applies(edge_bias, dead_rows(0, sq, sq, sk, (left, right))):
        masked_sbuf = False
    if config.load_transpose == "dma":
        target.check_dma_transpose(OP, "config load_transpose", dtype, ITEMSIZE[dtype])
    if config.k_tile > target.psum_bank_fmax or config.k_tile > target.gemm_moving_fmax:
        raise LimitError(
            OP,
            "config k_tile",
            f"must be <= {min(target.psum_bank_fmax, target.gemm_moving_fmax)} "
            "(one PSUM bank of fp32 scores)",
            config.k_tile,
        )
    d_tile = target.pmax
    d_tiles = ceil_div(d, d_tile)
    if d > MAX_HEAD_DIM:
        raise LimitError(OP, "head dim", f"must be <= {MAX_HEAD_DIM}", d, limit=MAX_HEAD_DIM)
    q_tile = target.pmax
    kv_rows = min(config.kv_block, ceil_div(sk, config.k_tile) * config.k_tile)
    kv_blocks = ceil_div(sk, kv_rows)
    item = ITEMSIZE[dtype]
    kv_chunks = ceil_div(min(kv_rows, sk), target.pmax)
    # Per partition: the K^T and V blocks, q^T, then one key tile's working set, counted
    # twice (a tile of the next step is allocated while this step's is still live).
    # Per partition: the K^T and V blocks; per query tile of the group its q^T and one key
    # tile's working set, counted twice (the next step's tiles are allocated while this
    # step's are still live).
    sbuf = d_tiles * min(kv_rows, sk) * item + kv_chunks * d * item
    if config.load_transpose == "pe":
        sbuf += 2 * d * item  # q rows and K rows awaiting their TensorE transpose
    step = config.k_tile * 4 + config.k_tile * item + 2 * q_tile * item  # scores, P, P^T
    step += 2 * d * 4 + 8 * 4  # O accumulators (old and new) and the [q, 1] columns
    per_tile = d_tiles * q_tile * item + 2 * step + d * item  # + the output rows
    sbuf += config.q_group * per_tile
    # Per tile of the group: its next key tile's scores (issued ahead) and this key tile's
    # P V sums; plus the transposes' banks.
    banks = 2 * config.q_group + (config.p_transpose == "pe") + (config.load_transpose == "pe")
    # Two passes need every key of a row at hand twice: K/V resident (one block).
    softmax = config.softmax if kv_blocks == 1 else "online"
    # DMA transposes of P: 2-byte dtypes on trn2+ only; elsewhere every chunk goes the
    # p_transpose way.
    dma_ok = target.has_dma_transpose and item == 2
    p_dma_tiles = config.p_dma_tiles if dma_ok else 0
    key_tiles = ceil_div(sk, config.k_tile)
    lead, lag_t, lag_pv, lag_close, q_prefetch = key_tiles + 1, 2, 6, 7, 4
    if left >= 0:
        # A left edge adds up to 4 spans to a query tile (the edges' tiles split into
        # masked and raw runs); the max pass must still end before the tile's first exp.
        lead += 4
    # softcap: the max pass's tanh (ScalarE) runs in bursts of max_burst key tiles, so the
    # activation table switches between tanh and exp once per burst, not per key tile.
    # The longest burst (16, 8, .., 1) whose scores held from max pass to exp fit SBUF.
    max_burst = MAX_BURST if softcap > 0 and softmax == "two_pass" else 1
    while softmax == "two_pass" and max_burst > 1:
        lags = (lead + max_burst - 1, q_prefetch, lag_pv, lag_close)
        budget = _two_pass_budget(sk, d, d_tiles, q_tile, item, True, config, kv_chunks, lags)
        extra = feature_bytes(features, config.k_tile, max_burst, h, hkv, sk)
        if budget[0] + extra <= target.sbuf_usable_bytes:
            break
        max_burst //= 2
    if softmax == "two_pass":
        lags = (lead + max_burst - 1, q_prefetch, lag_pv, lag_close)
        sbuf, banks = _two_pass_budget(
            sk,
            d,
            d_tiles,
            q_tile,
            item,
            masked_sbuf,
            config,
            kv_chunks,
            lags,
        )
    sbuf += feature_bytes(features, config.k_tile, max_burst, h, hkv, sk)
    if edge_bias:  # the identity and up to 4 bias tiles (two offsets per edge), bf16
        sbuf += 5 * target.pmax * 2
    return FlashAttentionPlan(
        b=b,
        h=h,
        hkv=hkv,
        sq=sq,
        sk=sk,
        d=d,
        causal=causal,
        left=left,
        right=right,
        softcap=softcap,
        scale=scale,
        **score_features(problem),
        q_tile=q_tile,
        d_tile=d_tile,
        d_tiles=d_tiles,
        k_tile=config.k_tile,
        kv_block=kv_rows,
        kv_blocks=kv_blocks,
        load_transpose=config.load_transpose,
        p_transpose=config.p_transpose,
        p_copy=config.p_copy,
        q_group=config.q_group,
        pe_transpose_keeps_dtype=target.has_transpose_mode,
        vector_transpose=target.vector_transpose_max,
        softmax=softmax,
        p_dma_tiles=p_dma_tiles,
        lead=lead,
        max_burst=max_burst,
        lag_transpose=lag_t,
        lag_pv=lag_pv,
        lag_close=lag_close,
        hwdge=target.has_hwdge,
        q_prefetch=q_prefetch,
        lnc=lnc,
        core_groups=split_groups(
            b, hkv, h // hkv, *query_tiles(h // hkv, sq, sk, q_tile, causal, window), lnc
        ),
        sbuf_bytes=sbuf + bounds_bytes(bounded, sq, q_tile),
        psum_banks=banks,
        packed=bool(problem.get("packed", False)),
        runtime_bounds=bounded,
        edge_bias=edge_bias,
    )
