"""Flash attention forward on Trainium, the attention contract shared with the backward
(and the helpers both kernels use: the causal diagonal, its mask, the contraction over D,
VectorE block transposes), and the ``flash_attention`` / ``flash_attention_fwd`` op
declarations.

Layout BHSD, as ``torch.nn.functional.scaled_dot_product_attention`` takes it:
q ``[B, H, Sq, D]``, k and v ``[B, Hkv, Sk, D]`` with ``H % Hkv == 0`` (GQA/MQA: query head
``h`` reads KV head ``h // (H // Hkv)``; nothing is repeated in memory).

The contract both directions keep:
    - ``lse [B, H, Sq]`` float32 is ``log(sum_j exp(scale * q_i . k_j))`` over the unmasked
      ``j`` (natural log, scale included; the capped scores with a softcap, plus
      ``exp(sink_h)`` with sinks, below): the one layout the backward consumes.
    - causal with ``Sq != Sk`` aligns to the bottom-right corner (FlashAttention 2): query
      ``i`` sees key ``j`` iff ``j <= i + (Sk - Sq)``. When ``Sq > Sk`` the first
      ``Sq - Sk`` query rows see no key: such fully masked rows give ``out = 0`` and
      ``lse = -inf`` (never NaN).
    - ``softmax_scale=None`` means ``1 / sqrt(D)``.
    - ``window=(left, right)`` (FlashAttention's ``window_size``; None is ``(-1, -1)``, -1
      is unbounded on that side), aligned bottom-right like causal: query ``i`` sees key
      ``j`` iff ``i + (Sk - Sq) - left <= j <= i + (Sk - Sq) + right``. With ``causal``
      the causal bound also holds (the intersection). Rows that see no key give
      ``out = 0`` and ``lse = -inf`` as above. Tiles no row sees are skipped at trace
      time (a window of W keys costs O(S * W) tiles), tiles a window edge crosses are
      masked (GpSimd ``affine_select``, one per edge that crosses).
    - ``softcap > 0``: the scaled scores ``s = scale * q . k`` become
      ``softcap * tanh(s / softcap)`` before the softmax (FlashAttention, Gemma 2; the scale
      first); lse is over the capped scores; the backward multiplies by
      ``d(capped)/ds = 1 - tanh^2``. The kernels keep ``t = tanh(s / softcap)`` (ScalarE's
      tanh, reading PSUM) in SBUF and exponentiate ``softcap * t``. 0 is off.
    - ``sinks [H]`` (gpt-oss; float32 or q's dtype): one learned logit per query head
      that joins every row's softmax denominator: ``lse_i = log(sum_j exp(s_ij) +
      exp(sink_h))`` (so lse includes the sink, and the backward's ``P = exp(s - lse)``
      stays right), ``out_i = sum_j exp(s_ij - lse_i) v_j``. A sink of -inf is no sink. A
      row that sees no key gets ``out = 0`` and ``lse = sink_h``. The kernels fold the sink
      into the row max (``max(m, sink)``) and the row sum. Its gradient
      ``dsink_h = -sum_{b,i} exp(sink_h - lse_{b,h,i}) D_{b,h,i}`` with
      ``D_i = sum_d dO_id O_id``: the backward kernel writes each row's term from the
      ``-lse`` and ``-D`` columns it already holds, and the op sums them over (b, i) in
      torch (a head's rows lie in several query passes and, at LNC=2, on both cores; an
      in-kernel sum would need a cross-core reduction for one scalar per head).
      ``flash_attention_bwd`` returns ``(dq, dk, dv, dsinks)``, dsinks in sinks' dtype, an
      empty float32 tensor without sinks.
    - ``attn_mask`` (torch's: broadcastable to ``[B, H, Sq, Sk]``; bool True attends, or
      float in q's dtype / fp32) is added to the scaled scores after the softcap
      (``softcap * tanh(s / softcap) + m``, as Gemma 2 and HF's eager attention add their
      mask) and intersects causal and the window. Float entries ``<= MASK_FILL`` (-1e30,
      -inf) mask their key; rows whose every score ends ``<= MASK_FILL / 2`` see nothing:
      ``out = 0``, ``lse = -inf`` (``sink_h`` with sinks), no gradient. The kernels read
      the mask tile by tile, broadcast dims at stride 0; a mask without a query dim (and no
      softcap) is a ``[1, Sk]`` bias row per head added to S in PSUM by a K=1 matmul
      (``add_row_mask``), others are applied as each score tile leaves PSUM. Its gradient
      is not computed (a float mask that requires grad is refused).
    - ``dropout_p`` in [0, 1): ``out = dropout(softmax(S)) V`` with the kept weights scaled
      by ``1 / (1 - p)``; lse stays the undropped softmax's (sinks included). A score is
      kept iff its 16 bits of ``hash32((j >> 1) ^ row_key)`` (low half for even ``j``,
      high half for odd) are ``>= round(p * 2^16)``; the row keys are
      ``dropout_row_keys(dropout_seed, ...)``, from the int64 ``[2]`` (seed, offset)
      tensor, ``b``, ``h`` and ``i`` (:mod:`.counter_hash`, the AdamW step's hash).
      ``dropout_keep`` is the torch mirror; the backward replays the same draw from the
      same seed.
    - The mask and dropout are BHSD-only: the plans refuse them with run-time key bounds
      or packed rows (the varlen ops, which take neither).

The forward kernel, two-pass softmax (the default; K/V resident in SBUF)::

    for each (batch, KV head) group of this core:            # kernel[lnc]: split by core
        load K^T [D, Sk] and V [Sk, D] once                   # shared by the group's heads
        steps = [(query tile, key tile) for every query tile of the group's heads
                 for every key tile it sees]                  # causal: clipped at the diagonal
        for step i (software pipeline, one key tile per stage):
            q^T load              of step i + lead + q_prefetch (its first key tile)
            max pass              of step i + lead: S = q K^T (TensorE, PSUM), row max
                                  on VectorE from PSUM; diagonal tiles scaled and masked
                                  into SBUF (GpSimd) and kept; a tile's last: -max
            exp pass              of step i: S again (TensorE), P = exp(scale S - max) on
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

import math
from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import TARGETS, Target
from neuron_kernels.kernels.counter_hash import (
    HASH_M1,
    HASH_M2,
    KEY_SEED,
    KEY_STEP,
    KEY_TENSOR,
    MASK32,
    as_int32,
    hash32,
    mul32,
)
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
from neuron_kernels.kernels.tiling import split_work, tiled

__all__ = [
    "FWD_SPEC",
    "MAX_HEAD_DIM",
    "SPEC",
    "SUPPORTED_HEAD_DIMS",
    "FlashAttentionConfig",
    "FlashAttentionPlan",
    "attention_reference",
    "bounds_bytes",
    "causal_visible",
    "dead_rows",
    "flash_attention_fwd_kernel",
    "key_bounds",
    "load_bounds",
    "mask_bounds",
    "mask_window",
    "matmul_over_d",
    "plan",
    "resolve_scale",
    "runtime_bounds_mode",
    "tile_visibility",
    "transpose_blocks",
    "validate_attention",
    "visible",
    "window_bounds",
]

OP = "flash_attention"

# The contraction over D (QK^T, and dO V^T in the backward) runs over the partition axis:
# up to two partition tiles of pmax rows each. Every target has the same pmax, so the limit
# is one number for every target.
MAX_HEAD_DIM = 2 * min(t.pmax for t in TARGETS.values())
# Head dims the tests exercise by name; every D in [1, MAX_HEAD_DIM] is accepted.
SUPPORTED_HEAD_DIMS = (64, 80, 96, 128, 192, 256)


def resolve_scale(softmax_scale: float | None, head_dim: int) -> float:
    """The softmax scale in use: ``softmax_scale``, or ``1 / sqrt(head_dim)`` when None."""
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)


def causal_visible(sq: int, sk: int, device=None) -> torch.Tensor:
    """``[Sq, Sk]`` bool: query ``i`` sees key ``j`` iff ``j <= i + (Sk - Sq)`` (bottom-right)."""
    return visible(sq, sk, True, None, device)


def window_bounds(causal: bool, window=None) -> tuple[int, int]:
    """``(left, right)`` keys a query sees before and after its own diagonal, ``-1`` for
    unbounded, with ``causal`` folded in (it bounds ``right`` by 0): the one pair the plans,
    the masks and the reference read. ``window`` is the op's (None: ``(-1, -1)``)."""
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def visible(sq: int, sk: int, causal=False, window=None, device=None) -> torch.Tensor:
    """``[Sq, Sk]`` bool: query ``i`` sees key ``j`` iff
    ``i + (Sk - Sq) - left <= j <= i + (Sk - Sq) + right`` (a side with -1 unbounded; causal
    bounds ``right`` by 0), aligned bottom-right: the reference's mask."""
    left, right = window_bounds(causal, window)
    i = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=device).unsqueeze(0)
    seen = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        seen = seen & (j <= i + right)
    if left >= 0:
        seen = seen & (j >= i - left)
    return seen


def key_bounds(q0: int, n_q: int, sq: int, sk: int, bounds) -> tuple[int, int, int, int]:
    """``(k_start, k_end, a_start, a_end)`` for the query rows ``[q0, q0 + n_q)`` under the
    window ``bounds = (left, right)`` (:func:`window_bounds`): keys in ``[k_start, k_end)``
    are visible to some row, keys in ``[a_start, a_end)`` to every row (empty when
    ``a_start >= a_end``); all clipped to ``[0, Sk]``. ``k_end <= k_start``: no row sees a
    key. The one statement of the window the forward and the backward plan and trace
    their tiles by (:func:`visible` is the reference's)."""
    left, right = bounds
    off = sk - sq
    first, last = q0 + off, q0 + n_q - 1 + off  # the diagonals of the first and last row
    k_start = max(0, first - left) if left >= 0 else 0
    a_start = max(0, last - left) if left >= 0 else 0
    k_end = max(0, min(sk, last + right + 1)) if right >= 0 else sk
    a_end = max(0, min(sk, first + right + 1)) if right >= 0 else sk
    return k_start, k_end, a_start, a_end


def tile_visibility(q0: int, n_q: int, k0: int, n_k: int, sq: int, sk: int, bounds) -> str:
    """How the query rows ``[q0, q0 + n_q)`` see the keys ``[k0, k0 + n_k)`` under the window
    ``bounds``: "none" (no row sees any: the tile is skipped), "all" (every row sees every
    key: no mask) or "some" (a window edge crosses the tile: it is masked). A trace-time
    decision."""
    k_start, k_end, a_start, a_end = key_bounds(q0, n_q, sq, sk, bounds)
    if k0 >= k_end or k0 + n_k <= k_start:
        return "none"
    if a_start <= k0 and k0 + n_k <= a_end:
        return "all"
    return "some"


def dead_rows(q0: int, n_q: int, sq: int, sk: int, bounds) -> int:
    """Leading rows of the query rows ``[q0, q0 + n_q)`` that see no key: those whose last
    visible key ``i + (Sk - Sq) + right`` is before key 0 (a bounded ``right``: causal with
    Sq > Sk, or a window). The left bound never empties a row (``i - left <= i``, and row
    ``i``'s diagonal is below Sk), so such rows are always a prefix."""
    right = bounds[1]
    if right < 0:
        return 0
    return min(n_q, max(0, -(sk - sq + right) - q0))


def validate_attention(
    op_name: str,
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
    seed_required=True,
) -> None:
    """Refuse bad attention input before any work, naming the argument and the value.

    Checks: tensors, rank 4 (BHSD), the head dim agreeing across q/k/v and within
    ``[1, MAX_HEAD_DIM]``, ``H % Hkv == 0``, B of k and v equal to q's, k and v agreeing on
    (B, Hkv, Sk), dtypes (one of :data:`DTYPES`, all equal), one device, ``causal`` a bool,
    ``softmax_scale`` None or a finite float, ``window`` None or two ints each >= -1,
    ``softcap`` a finite float >= 0, ``sinks`` None or a ``[H]`` tensor in float32 or
    q's dtype on q's device, and the mask and dropout (:func:`validate_mask_dropout`;
    ``seed_required=False``: the public op draws a missing seed itself).

    Raises:
        LimitError: with ``op = op_name`` and ``arg`` naming the argument at fault.
    """
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(op_name, arg, "must be a torch.Tensor", type(t).__name__)
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise LimitError(
                op_name, f"{arg} rank", "must be 4 ([B, heads, S, D], BHSD)", t.dim(), limit=4
            )
    b, h, _, d = q.shape
    if k.shape[3] != d:
        raise LimitError(
            op_name, "k.shape[3]", f"must equal q's head dim ({d})", k.shape[3], limit=d
        )
    if v.shape[3] != d:
        raise LimitError(
            op_name, "v.shape[3]", f"must equal q's head dim ({d})", v.shape[3], limit=d
        )
    if not 1 <= d <= MAX_HEAD_DIM:
        raise LimitError(
            op_name,
            "head dim",
            f"must be in [1, {MAX_HEAD_DIM}] (the contraction over D spans at most two "
            "partition tiles)",
            d,
            limit=MAX_HEAD_DIM,
        )
    for arg, t in (("k", k), ("v", v)):
        if t.shape[0] != b:
            raise LimitError(
                op_name, f"{arg}.shape[0]", f"must equal q's batch ({b})", t.shape[0], limit=b
            )
    hkv, sk = k.shape[1], k.shape[2]
    if v.shape[1] != hkv:
        raise LimitError(
            op_name, "v.shape[1]", f"must equal k's KV heads ({hkv})", v.shape[1], limit=hkv
        )
    if v.shape[2] != sk:
        raise LimitError(
            op_name, "v.shape[2]", f"must equal k's sequence length ({sk})", v.shape[2], limit=sk
        )
    if hkv == 0 or h % hkv:
        raise LimitError(
            op_name,
            "k.shape[1]",
            f"must divide q's heads ({h}): GQA/MQA needs H % Hkv == 0",
            hkv,
            limit=h,
        )
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if dtype_name(t) not in DTYPES:
            raise LimitError(
                op_name, f"{arg} dtype", f"must be one of {DTYPES}", dtype_name(t), limit=DTYPES
            )
    for arg, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise LimitError(
                op_name, f"{arg} dtype", f"must equal q's dtype ({dtype_name(q)})", dtype_name(t)
            )
    for arg, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise LimitError(
                op_name, f"{arg} device", f"must equal q's device ({q.device})", str(t.device)
            )
    if not isinstance(causal, bool):
        raise LimitError(op_name, "causal", "must be a bool", repr(causal))
    if softmax_scale is not None and not (
        isinstance(softmax_scale, (int, float))
        and not isinstance(softmax_scale, bool)
        and math.isfinite(softmax_scale)
    ):
        raise LimitError(op_name, "softmax_scale", "must be None or a finite float", softmax_scale)
    _validate_features(op_name, q, window, softcap, sinks)
    validate_mask_dropout(op_name, q, k, attn_mask, dropout_p, dropout_seed, seed_required)


def _validate_features(op_name, q, window, softcap, sinks) -> None:
    """The window, softcap and sinks checks of :func:`validate_attention`."""
    if window is not None:
        if not isinstance(window, (list, tuple)) or len(window) != 2:
            raise LimitError(
                op_name, "window", "must be None or two ints (left, right)", repr(window), limit=2
            )
        for side, w in zip(("left", "right"), window):
            if isinstance(w, bool) or not isinstance(w, (int, torch.SymInt)):
                raise LimitError(op_name, "window", f"{side} must be an int", repr(window))
            if w < -1:
                raise LimitError(
                    op_name,
                    "window",
                    f"{side} must be >= -1 (-1: unbounded)",
                    repr(window),
                    limit=-1,
                )
    if (
        isinstance(softcap, bool)
        or not isinstance(softcap, (int, float))
        or not math.isfinite(softcap)
        or softcap < 0
    ):
        raise LimitError(
            op_name, "softcap", "must be a finite float >= 0 (0: off)", repr(softcap), limit=0.0
        )
    if sinks is None:
        return
    h = q.shape[1]
    if not isinstance(sinks, torch.Tensor):
        raise LimitError(op_name, "sinks", "must be None or a torch.Tensor", type(sinks).__name__)
    if tuple(sinks.shape) != (h,):
        raise LimitError(
            op_name, "sinks shape", f"must be [H] = ({h},)", tuple(sinks.shape), limit=(h,)
        )
    allowed = ("float32", dtype_name(q))
    if dtype_name(sinks) not in allowed:
        raise LimitError(
            op_name, "sinks dtype", "must be float32 or q's dtype", dtype_name(sinks), limit=allowed
        )
    if sinks.device != q.device:
        raise LimitError(
            op_name, "sinks device", f"must equal q's device ({q.device})", str(sinks.device)
        )


def validate_mask_dropout(
    op_name, q, k, attn_mask, dropout_p, dropout_seed, seed_required=True
) -> None:
    """The ``attn_mask``, ``dropout_p`` and ``dropout_seed`` checks of
    :func:`validate_attention`: the mask a tensor of rank 1 to 4 broadcastable to
    ``[B, H, Sq, Sk]`` (each dim 1 or the full size, aligned right as torch broadcasts),
    bool, q's dtype or float32, on q's device; ``dropout_p`` a float in ``[0, 1)``; the
    seed None (refused when ``dropout_p > 0`` and ``seed_required``) or an int64 ``[2]``
    tensor ``(seed, offset)`` on q's device."""
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise LimitError(
                op_name, "attn_mask", "must be None or a torch.Tensor", type(attn_mask).__name__
            )
        if not 1 <= attn_mask.dim() <= 4:
            raise LimitError(
                op_name,
                "attn_mask rank",
                "must be 1 to 4 (broadcastable to [B, H, Sq, Sk])",
                attn_mask.dim(),
                limit=4,
            )
        want = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
        if any(m not in (1, w) for m, w in zip(shape, want)):
            raise LimitError(
                op_name,
                "attn_mask shape",
                f"must broadcast to [B, H, Sq, Sk] = {list(want)} (each dim 1 or that size)",
                tuple(attn_mask.shape),
                limit=want,
            )
        allowed = ("bool", "float32", dtype_name(q))
        if dtype_name(attn_mask) not in allowed:
            raise LimitError(
                op_name,
                "attn_mask dtype",
                "must be bool (True: attend), float32 or q's dtype (added to the scores)",
                dtype_name(attn_mask),
                limit=allowed,
            )
        if attn_mask.device != q.device:
            raise LimitError(
                op_name,
                "attn_mask device",
                f"must equal q's device ({q.device})",
                str(attn_mask.device),
            )
    if (
        isinstance(dropout_p, bool)
        or not isinstance(dropout_p, (int, float))
        or not 0.0 <= dropout_p < 1.0
    ):
        raise LimitError(
            op_name, "dropout_p", "must be a float in [0, 1)", repr(dropout_p), limit=1.0
        )
    if dropout_seed is None:
        if dropout_p > 0 and seed_required:
            raise LimitError(
                op_name,
                "dropout_seed",
                "must be an int64 [2] tensor (seed, offset) when dropout_p > 0",
                None,
            )
        return
    if not isinstance(dropout_seed, torch.Tensor):
        raise LimitError(
            op_name,
            "dropout_seed",
            "must be None or a torch.Tensor",
            type(dropout_seed).__name__,
        )
    if dropout_seed.dtype != torch.int64:
        raise LimitError(
            op_name, "dropout_seed dtype", "must be int64", dtype_name(dropout_seed), limit="int64"
        )
    if tuple(dropout_seed.shape) != (2,):
        raise LimitError(
            op_name,
            "dropout_seed shape",
            "must be [2] (seed, offset)",
            tuple(dropout_seed.shape),
            limit=(2,),
        )
    if dropout_seed.device != q.device:
        raise LimitError(
            op_name,
            "dropout_seed device",
            f"must equal q's device ({q.device})",
            str(dropout_seed.device),
        )


def refuse_mask_grad(op_name, attn_mask) -> None:
    """A float ``attn_mask`` that requires grad is refused (the kernels return no gradient
    for it: dS reduced over its broadcast dims would be one more HBM output per tile)."""
    if attn_mask is not None and attn_mask.requires_grad:
        raise LimitError(
            op_name,
            "attn_mask",
            "must not require grad (its gradient is not computed: pass attn_mask.detach())",
            "a tensor with requires_grad=True",
        )


# Dropout: a score is kept iff its DROPOUT_BITS hashed bits are at least
# dropout_threshold(p) (p applied in steps of 2^-16, as the AdamW rounding's 16 bits); kept
# entries are scaled by 1 / (1 - p). One 32-bit hash serves two neighbouring keys (the low
# half key 2u, the high half key 2u + 1): half the hash work per score.
DROPOUT_BITS = 16


def dropout_threshold(dropout_p: float) -> int:
    """The hashed 16-bit value below which a score is dropped: ``round(p * 2^16)``."""
    return int(round(float(dropout_p) * (1 << DROPOUT_BITS)))


def dropout_row_keys(dropout_seed, b: int, h: int, sq: int) -> torch.Tensor:
    """``[B, H, Sq]`` int32: each query row's dropout key, computed on the seed's device (no
    host sync): ``hash32(i ^ key_bh)`` with ``key_bh`` mixing (seed, offset, b * H + h) as
    the AdamW step mixes (seed, step, tensor) (:mod:`.counter_hash`). The kernels read one
    column of them per query tile and hash in the key index (:func:`dropout_keep`)."""
    dev = dropout_seed.device
    seed, offset = dropout_seed[0] & MASK32, dropout_seed[1] & MASK32
    bh = torch.arange(b * h, dtype=torch.int64, device=dev).reshape(b, h)
    key = mul32(seed, KEY_SEED) + mul32(offset, KEY_STEP) + mul32(bh, KEY_TENSOR)
    key = key & MASK32
    key = (key ^ (key >> 16)) & 0x7FFFFFFF
    i = torch.arange(sq, dtype=torch.int64, device=dev)
    return as_int32(hash32(i.reshape(1, 1, sq) ^ key.unsqueeze(-1)))


def dropout_keep(dropout_seed, dropout_p, b: int, h: int, sq: int, sk: int) -> torch.Tensor:
    """``[B, H, Sq, Sk]`` bool, True where the score is kept: the kernels' draw, in torch:
    ``x = hash32((j >> 1) ^ row key)``, key ``j``'s bits its low 16 (j even) or high 16 (j
    odd), kept iff ``>= dropout_threshold(p)``."""
    rows = dropout_row_keys(dropout_seed, b, h, sq).to(torch.int64) & MASK32
    j = torch.arange(sk, dtype=torch.int64, device=rows.device)
    x = hash32((j >> 1).reshape(1, 1, 1, sk) ^ rows.unsqueeze(-1))
    bits = torch.where((j & 1).bool(), x >> 16, x & 0xFFFF)
    return bits >= dropout_threshold(dropout_p)


def mask_4d(attn_mask) -> torch.Tensor:
    """``attn_mask`` as a 4-d view (size-1 dims prepended), each stride-0 dim narrowed to one
    element: a mask given as an expanded view is read at the size it has in memory."""
    m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    for dim in range(4):
        if m.shape[dim] > 1 and m.stride(dim) == 0:
            m = m.narrow(dim, 0, 1)
    return m


def attention_reference(
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
    upcast=True,
):
    """Plain-torch attention: ``(out [B, H, Sq, D], lse [B, H, Sq] float32)``.

    fp64 when ``upcast`` (both outputs float64), else fp32 math with ``out`` in q's dtype
    and ``lse`` float32 (the op's output dtypes).
    GQA by broadcasting (no repeated K/V), causal and window bottom-right (:func:`visible`),
    ``softcap > 0`` caps the scaled scores to ``softcap * tanh(s / softcap)``, ``sinks``
    adds ``exp(sink_h)`` to each row's softmax denominator (and to its lse). ``attn_mask``
    (broadcast to ``[B, H, Sq, Sk]``): bool False masks a key; a float one is added to the
    (capped) scores, its entries ``<= MASK_FILL`` (-1e30, and -inf) masking their key. A row
    whose every score ends up ``<= MASK_FILL / 2`` sees nothing. ``dropout_p > 0``: the
    normalized weights of the keys :func:`dropout_keep` drops are 0, the others scaled by
    ``1 / (1 - p)``; lse stays the undropped softmax's. Fully masked rows give
    ``out = 0`` and ``lse = sink_h`` (``-inf`` without sinks); differentiable (gradients
    finite on masked rows).
    """
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    groups = h // hkv if hkv else 1
    scale = resolve_scale(softmax_scale, d)
    compute = torch.float64 if upcast else torch.float32
    qc = q.to(compute).reshape(b, hkv, groups, sq, d)
    kc = k.to(compute).unsqueeze(2)  # [B, Hkv, 1, Sk, D]: broadcast over the group
    vc = v.to(compute).unsqueeze(2)
    scores = torch.matmul(qc, kc.transpose(-1, -2)) * scale  # [B, Hkv, G, Sq, Sk]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    left, right = window_bounds(causal, window)
    if left >= 0 or right >= 0:
        scores = scores.masked_fill(~visible(sq, sk, causal, window, q.device), float("-inf"))
    if attn_mask is not None:
        scores = apply_attn_mask(scores, attn_mask, b, hkv, groups, sq, sk)
    row_max = scores.amax(dim=-1, keepdim=True) if sk else scores.new_zeros((*scores.shape[:-1], 1))
    sink = None
    if sinks is not None:
        sink = sinks.to(compute).reshape(1, hkv, groups, 1, 1)
        row_max = torch.maximum(row_max, sink.expand_as(row_max))
    # A shift by a constant leaves softmax unchanged: detach it, and use 0 on masked rows.
    shift = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max).detach()
    weights = torch.exp(scores - shift)  # exactly 0 where masked
    row_sum = weights.sum(dim=-1, keepdim=True)
    if sink is not None:
        row_sum = row_sum + torch.exp(sink - shift)
    safe_sum = torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)
    if dropout_p > 0:
        keep = dropout_keep(dropout_seed, dropout_p, b, h, sq, sk).reshape(weights.shape)
        weights = weights * keep.to(compute) * (1.0 / (1.0 - dropout_p))
    out = torch.matmul(weights, vc) / safe_sum
    lse = (shift + torch.log(row_sum)).squeeze(-1)  # log(0) = -inf on fully masked rows
    out = out.reshape(b, h, sq, d)
    lse = lse.reshape(b, h, sq)
    if not upcast:
        out, lse = out.to(q.dtype), lse.to(torch.float32)
    return out, lse


def apply_attn_mask(scores, attn_mask, b, hkv, groups, sq, sk):
    """``scores [B, Hkv, G, Sq, Sk]`` (scaled, capped, window-masked with -inf) with
    ``attn_mask`` applied as the contract says: bool False and float entries
    ``<= MASK_FILL`` become -inf, other float entries are added; rows whose max is then
    ``<= MASK_FILL / 2`` become all -inf (they see nothing). The reference's and the
    backward reference's one statement of the mask."""
    m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    m = m.expand(b, hkv * groups, sq, sk).reshape(b, hkv, groups, sq, sk)
    if m.dtype == torch.bool:
        scores = scores.masked_fill(~m, float("-inf"))
    else:
        mc = m.to(scores.dtype)
        scores = (scores + mc.clamp(min=MASK_FILL)).masked_fill(mc <= MASK_FILL, float("-inf"))
    dead = scores.amax(dim=-1, keepdim=True) <= MASK_FILL / 2 if sk else None
    if dead is not None:
        scores = scores.masked_fill(dead, float("-inf"))
    return scores


# -- tunables and the tile plan -----------------------------------------------------------

# Two-pass with a softcap: key tiles whose max pass (tanh on ScalarE) is issued at once.
# Modeled: each switch of ScalarE's activation table between tanh and exp costs 1.3 us
# (cost_model act_table_switch_ns, an unpublished, low-confidence figure); in bursts of 16
# the switches cost 2 per 16 key tiles, not 2 per key tile.
MAX_BURST = 16

# Masked scores (already scaled) become this: exp(MASK_FILL - max) is exactly 0 in fp32, and
# unlike -inf it never meets another infinity in `max - max` on a row with no visible key.
MASK_FILL = -1.0e30


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


def score_features(problem: dict) -> dict:
    """The plan fields of the attention mask and dropout in ``problem`` (both plans'):
    ``mask`` ("", "bool", "float"), ``mask_dims`` (which of the mask's B, H, Sq, Sk dims
    are full, from ``mask_dims`` "bhqk" with "1" for a broadcast dim), ``mask_row`` (no
    query dim and no softcap: the mask is added on TensorE, :func:`add_row_mask`),
    ``dropout`` (the threshold, 0 off) and ``inv_keep``."""
    dims = str(problem.get("mask_dims", "1111"))
    p = float(problem.get("dropout_p", 0.0))
    mask = str(problem.get("mask", ""))
    softcap = float(problem.get("softcap", 0.0))
    return {
        "mask": mask,
        "mask_dims": tuple(c != "1" for c in dims),
        "mask_row": bool(mask) and dims[2] == "1" and not softcap,
        "dropout": dropout_threshold(p) if p > 0 else 0,
        "inv_keep": 1.0 / (1.0 - p),
    }


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
    if edge_bias and dead_rows(0, sq, sq, sk, (left, right)) == 0:
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


def refuse_bounds_features(op: str, problem: dict, features: dict) -> None:
    """Run-time key bounds and packed rows (the varlen ops) take no attention mask and no
    dropout: both plans refuse the combination (the varlen ops never ask for it), naming
    the feature. The kernels' mask and dropout read BHSD row indices; a packed batch's
    rows are offsets into the packed sequence, and its bounds already mask by sequence."""
    varlen = "runtime_bounds" if problem.get("runtime_bounds") else ""
    varlen = varlen or ("packed" if problem.get("packed") else "")
    if not varlen:
        return
    if features["mask"]:
        raise LimitError(
            op, "attn_mask", f"is not supported with {varlen} (varlen) attention", "a mask"
        )
    if features["dropout"]:
        raise LimitError(
            op, "dropout_p", f"must be 0 with {varlen} (varlen) attention", problem["dropout_p"]
        )


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


# -- kernel helpers the forward and the backward share -----------------------------------
# Each reads only the fields both plans have (FlashAttentionPlan, FlashAttentionBwdPlan):
# sq, sk, d, d_tile, vector_transpose.


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
    n = plan.q_tile
    ones = nl.ndarray((n, n), dtype=nl.bfloat16, buffer=nl.sbuf, name="edge_ones")
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((n, n), dtype=nl.bfloat16, buffer=nl.sbuf, name="edge_identity")
    nisa.affine_select(
        dst=ident,
        pattern=[[-1, n]],
        channel_multiplier=1,
        on_true_tile=ones,
        on_false_value=0.0,
        cmp_op=nl.equal,
        offset=0,
    )
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
        if tile_visibility(q0, qs, c0, cs, plan.sq, plan.sk, _bounds(plan)) != "all":
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


# -- the NKI kernel ------------------------------------------------------------------------


def _bounds(plan):
    """The plan's window ``(left, right)``, causal folded in."""
    return (plan.left, plan.right)


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
        if tile_visibility(q0, qs, k0, ks, plan.sq, plan.sk, _bounds(plan)) == "some":
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
    elif tile_visibility(q0, qs, k0, ks, plan.sq, plan.sk, _bounds(plan)) == "some":
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
    seen = tile_visibility(q0, qs, k0, ks, plan.sq, plan.sk, _bounds(plan))
    if seen != "all" and plan.edge_bias and _dead_rows(q0, qs, plan) == 0:
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
    return dead_rows(q0, qs, plan.sq, plan.sk, _bounds(plan))


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
    qs = min(plan.q_tile, plan.sq - q0)
    # Keys in [k_start, k_end) are visible to some row of the tile.
    k_start, k_end, _, _ = key_bounds(q0, qs, plan.sq, plan.sk, _bounds(plan))
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
            qs = min(plan.q_tile, plan.sq - q0)
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


# -- the two-pass softmax -------------------------------------------------------------------


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
    qs = min(plan.q_tile, plan.sq - q0)
    bounds = _bounds(plan)
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
        if plan.edge_bias and n_dead == 0:  # edges added in PSUM (add_edge_bias): raw
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
    if plan.edge_bias and qt.n_dead == 0:
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
    seen = tile_visibility(qt.q0, qs, k0, ks, plan.sq, plan.sk, _bounds(plan))
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


# -- op-level glue: problem, launch, inputs ---------------------------------------------------


def mask_problem(attn_mask, dropout_p) -> dict:
    """The problem keys of an attention mask and dropout (both directions'): none for plain
    attention; ``mask`` ("bool"/"float") and ``mask_dims`` (the 4-d mask's dims, "b", "h",
    "q", "k" where full, "1" where broadcast: "b11k" is a padding mask), ``dropout_p``."""
    out = {}
    if attn_mask is not None:
        m = mask_4d(attn_mask)
        out["mask"] = "bool" if m.dtype == torch.bool else "float"
        out["mask_dims"] = "".join(c if n > 1 else "1" for c, n in zip("bhqk", m.shape))
    if dropout_p:
        out["dropout_p"] = float(dropout_p)
    return out


def problem(
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
) -> dict:
    """The sizes that select configs and limits (shape syntax ``BxHxHKVxSQxSKxD``), plus
    ``causal``, the softmax ``scale`` in use (``None``: 1/sqrt(D)), the window's sides
    (``window_left``, ``window_right``; -1 unbounded), ``softcap`` (0: off), whether
    there are ``sinks``, and the mask and dropout (:func:`mask_problem`)."""
    b, h, sq, d = q.shape
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return {
        "b": b,
        "h": h,
        "hkv": k.shape[1],
        "sq": sq,
        "sk": k.shape[2],
        "d": d,
        "causal": bool(causal),
        "scale": softmax_scale,
        "window_left": left,
        "window_right": right,
        "softcap": float(softcap),
        "sinks": sinks is not None,
        **mask_problem(attn_mask, dropout_p),
    }


def kernel_mask(attn_mask):
    """The mask as the kernels read it: 4-d, stride-0 dims narrowed (:func:`mask_4d`),
    contiguous at that size, a bool one viewed as uint8 (no copy); None stays None."""
    if attn_mask is None:
        return None
    m = mask_4d(attn_mask).contiguous()
    return m.view(torch.uint8) if m.dtype == torch.bool else m


def kernel_row_keys(dropout_p, dropout_seed, b, h, sq):
    """Dropout's ``[B, H, Sq, 1]`` int32 row keys for the kernels (None without dropout)."""
    if not dropout_p:
        return None
    return dropout_row_keys(dropout_seed, b, h, sq).reshape(b, h, sq, 1).contiguous()


def _forward_kernels(
    q, k, v, causal, softmax_scale, window, softcap, sinks, features, config, runner, op
):
    """``(out, lse)`` through the forward kernel; empty shapes and Sk = 0 (every row masked)
    never launch it. ``features`` = (attn_mask, dropout_p, dropout_seed)."""
    attn_mask, dropout_p, dropout_seed = features
    b, h, sq, d = q.shape
    sk = k.shape[2]
    if b == 0 or h == 0 or sq == 0 or sk == 0:
        out = torch.zeros((b, h, sq, d), dtype=q.dtype, device=q.device)
        lse = torch.full((b, h, sq), float("-inf"), dtype=torch.float32, device=q.device)
        if sinks is not None:  # a row that sees no key: lse = its head's sink
            lse = sinks.float().reshape(1, h, 1).expand(b, h, sq).contiguous()
        return out, lse
    spec = REGISTRY_BY_NAME[op]
    tiles = spec.check(
        problem(q, k, v, causal, softmax_scale, window, softcap, sinks, *features),
        dtype_name(q),
        config,
        runner.target,
        runner_lnc(runner),
    )
    sink_rows = None
    if sinks is not None:  # each head's sink on every partition row: [H, 128, 1] fp32
        sink_rows = sinks.float().reshape(h, 1, 1).expand(h, tiles.q_tile, 1).contiguous()
    args = (q.contiguous(), k.contiguous(), v.contiguous(), sink_rows, tiles)
    if attn_mask is not None or dropout_p:  # plain attention launches as it always did
        mask, keys = kernel_mask(attn_mask), kernel_row_keys(dropout_p, dropout_seed, b, h, sq)
        args += (None, mask, keys)  # (no kv_bounds)
    out, lse = runner(flash_attention_fwd_kernel[tiles.lnc], *args)
    return out, lse.reshape(b, h, sq)


def run_kernels_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: list[int] | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    *,
    config: FlashAttentionConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, H, Sq, D], lse [B, H, Sq] fp32)`` for BHSD q, k, v."""
    features = (attn_mask, dropout_p, dropout_seed)
    return _forward_kernels(
        q, k, v, causal, softmax_scale, window, softcap, sinks, features, config, runner, FWD_OP
    )


def run_kernels(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: list[int] | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    *,
    config: FlashAttentionConfig,
    runner,
) -> torch.Tensor:
    """``out [B, H, Sq, D]`` for BHSD q, k, v."""
    features = (attn_mask, dropout_p, dropout_seed)
    return _forward_kernels(
        q, k, v, causal, softmax_scale, window, softcap, sinks, features, config, runner, OP
    )[0]


def reference_fwd(
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
    upcast=True,
):
    """``(out, lse)``: :func:`attention_reference`."""
    return attention_reference(
        q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
        dropout_seed, upcast,
    )  # fmt: skip


def reference(
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
    upcast=True,
):
    """``out``: the first output of :func:`attention_reference`."""
    return reference_fwd(
        q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
        dropout_seed, upcast,
    )[0]  # fmt: skip


def _validate(op):
    def validate(
        q,
        k,
        v,
        causal=False,
        softmax_scale=None,
        window=None,
        softcap=0.0,
        sinks=None,
        attn_mask=None,
        dropout_p=0.0,
        dropout_seed=None,
    ) -> None:
        validate_attention(
            op, q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
            dropout_seed, seed_required=op != OP,
        )  # fmt: skip

    validate.__doc__ = f"Refuse bad {op} input before any work (:func:`validate_attention`)."
    return validate


def draw_features(problem: dict, h: int, generator: torch.Generator) -> tuple:
    """``(window, softcap, sinks)`` of ``problem``: ``window_left``/``window_right`` (a
    negative value, as drawn, is -1: unbounded; both unbounded is None), ``softcap`` (a
    negative value, as drawn, is 0: off) and, when ``sinks`` is set, sinks ~ N(0, 2^2)
    fp32 per query head, drawn after every other input (so problems without them draw the
    inputs they always did)."""
    left, right = int(problem.get("window_left", -1)), int(problem.get("window_right", -1))
    left, right = max(-1, left), max(-1, right)
    window = None if (left, right) == (-1, -1) else (left, right)
    softcap = max(0.0, float(problem.get("softcap", 0.0)))
    sinks = torch.randn(h, generator=generator) * 2.0 if problem.get("sinks") else None
    return window, softcap, sinks


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """q, k, v ~ N(0, 1) in ``dtype`` (scores O(1) at the default scale), causal and scale
    from ``problem``, and its window, softcap and sinks (:func:`draw_features`). H is
    rounded down to a multiple of Hkv (at least Hkv), so that any drawn (H, Hkv) is a
    valid GQA problem."""
    b, hkv, sq, sk, d = (problem[x] for x in ("b", "hkv", "sq", "sk", "d"))
    h = max(hkv, problem["h"] - problem["h"] % hkv) if hkv else problem["h"]
    t = getattr(torch, dtype)
    q = torch.randn(b, h, sq, d, generator=generator).to(t)
    k = torch.randn(b, hkv, sk, d, generator=generator).to(t)
    v = torch.randn(b, hkv, sk, d, generator=generator).to(t)
    window, softcap, sinks = draw_features(problem, h, generator)
    causal = bool(problem.get("causal", False))
    extra = draw_mask_dropout(problem, b, h, sq, sk, t, generator)
    return q, k, v, causal, problem.get("scale"), window, softcap, sinks, *extra


def draw_mask_dropout(problem: dict, b, h, sq, sk, dtype, generator) -> tuple:
    """``(attn_mask, dropout_p, dropout_seed)`` of ``problem`` (:func:`mask_problem`), drawn
    after every other input: a bool mask True with probability 0.8, or a float one
    ~ N(0, 2^2) in ``dtype`` with -inf at probability 0.2, at the dims ``mask_dims`` names
    (the others 1); the seed uniform in [0, 2^62)."""
    attn_mask = seed = None
    kind = problem.get("mask", "")
    if kind:
        dims = str(problem.get("mask_dims", "bhqk"))
        shape = [n if c != "1" else 1 for c, n in zip(dims, (b, h, sq, sk))]
        u = torch.rand(shape, generator=generator)
        if kind == "bool":
            attn_mask = u < 0.8
        else:
            z = torch.randn(shape, generator=generator) * 2.0
            attn_mask = torch.where(u < 0.2, torch.full_like(z, float("-inf")), z).to(dtype)
    p = float(problem.get("dropout_p", 0.0))
    if p:
        seed = torch.randint(0, 2**62, (2,), generator=generator, dtype=torch.int64)
    return attn_mask, p, seed


def feature_suffix(problem: dict) -> str:
    """The shape-bucket suffix of the window, softcap and sinks: empty for plain attention
    (so its buckets, and the configs tuned under them, stay as they were); the window by
    its sides in effect (causal folded in: they fix which tiles run), softcap and sinks by
    being on (their values do not change the tiles)."""
    causal = bool(problem.get("causal"))
    window = (problem.get("window_left", -1), problem.get("window_right", -1))
    left, right = window_bounds(causal, window)
    out = ""
    if (left, right) != window_bounds(causal, None):
        out += f"_wl{left}_wr{right}"
    if problem.get("softcap"):
        out += "_softcap"
    if problem.get("sinks"):
        out += "_sinks"
    if problem.get("mask"):
        out += f"_mask{problem['mask']}{problem.get('mask_dims', 'bhqk')}"
    if problem.get("dropout_p"):
        out += "_dropout"
    return out


def shape_bucket(problem: dict) -> str:
    """Sizes rounded up to powers of two (Sq, Sk at least 128), exact H, Hkv and D (they
    fix the kernel's loops), causal, then :func:`feature_suffix`; the scale does not change
    the tiles."""

    def pow2(x: int) -> int:
        return max(128, 1 << (max(1, x) - 1).bit_length())

    return (
        f"b{pow2(problem['b'])}_h{problem['h']}_hkv{problem['hkv']}_sq{pow2(problem['sq'])}"
        f"_sk{pow2(problem['sk'])}_d{problem['d']}_causal{str(bool(problem.get('causal'))).lower()}"
        + feature_suffix(problem)
    )


def kv_group_slice(problem: dict, lnc: int = 1) -> tuple[dict, int]:
    """``lnc`` (batch, KV head) groups and how many such slices the launch runs: the kernel
    runs ``B * Hkv`` groups, each reading only its K/V head and its ``H / Hkv`` query heads;
    at LNC=k the cores take whole groups round robin (:func:`split_groups`), so a slice of
    k groups is one group per core. Where the groups do not divide over the cores (some
    are split by query tiles), the slice is the whole launch (the cost model's
    ``OpSpec.model_slice``)."""
    b, h, hkv = problem["b"], problem["h"], problem["hkv"]
    if (b * hkv) % lnc:
        return problem, 1
    return {**problem, "b": 1, "h": lnc * (h // hkv), "hkv": lnc}, b * hkv // lnc


def _bad_inputs(op):
    def bad_inputs():
        """One bad input per op-boundary limit: (args, the argument the error must name)."""
        f = torch.zeros
        q, kv = f(1, 4, 8, 16), f(1, 2, 8, 16)
        return [
            ((f(4, 8, 16), kv, kv), "q rank"),
            ((q, f(2, 8, 16), kv), "k rank"),
            ((q, kv, f(1, 2, 8)), "v rank"),
            ((q, f(1, 2, 8, 8), kv), "k.shape[3]"),
            ((q, kv, f(1, 2, 8, 8)), "v.shape[3]"),
            ((f(1, 4, 8, 300), f(1, 2, 8, 300), f(1, 2, 8, 300)), "head dim"),
            ((q, f(1, 3, 8, 16), f(1, 3, 8, 16)), "k.shape[1]"),
            ((q, f(2, 2, 8, 16), f(2, 2, 8, 16)), "k.shape[0]"),
            ((q, kv, f(1, 2, 9, 16)), "v.shape[2]"),
            ((q, kv, f(1, 1, 8, 16)), "v.shape[1]"),
            ((q.double(), kv.double(), kv.double()), "q dtype"),
            ((q, kv.bfloat16(), kv), "k dtype"),
            ((q, kv, kv.half()), "v dtype"),
            ((q, kv, f(1, 2, 8, 16, device="meta")), "v device"),
            ((q, kv, kv, False, float("nan")), "softmax_scale"),
            ((q, kv, kv, False, None, [4]), "window"),
            ((q, kv, kv, False, None, [4, 2, 1]), "window"),
            ((q, kv, kv, False, None, [-2, 3]), "window"),
            ((q, kv, kv, True, None, [3, -5]), "window"),
            ((q, kv, kv, False, None, None, -1.0), "softcap"),
            ((q, kv, kv, False, None, None, float("nan")), "softcap"),
            ((q, kv, kv, False, None, None, float("inf")), "softcap"),
            ((q, kv, kv, False, None, None, 0.0, f(3)), "sinks shape"),
            ((q, kv, kv, False, None, None, 0.0, f(4, 1)), "sinks shape"),
            ((q, kv, kv, False, None, None, 0.0, f(4, dtype=torch.bfloat16)), "sinks dtype"),
            ((q, kv, kv, False, None, None, 0.0, f(4, device="meta")), "sinks device"),
            *_bad_mask_dropout((q, kv, kv, False, None, None, 0.0, None), q, 8, op),
        ]

    return bad_inputs


def _bad_mask_dropout(base, q, sk, op):
    """Bad attn_mask / dropout_p / dropout_seed after the 8 arguments ``base``: (args,
    the argument the error must name). The seed is required except by the public op."""
    f = torch.zeros
    b, h, sq, _ = q.shape
    seed = torch.tensor([1, 2])
    bad = [
        ((*base, f(b, h, sq, sk, 1)), "attn_mask rank"),
        ((*base, f(())), "attn_mask rank"),
        ((*base, f(sq, sk + 1)), "attn_mask shape"),
        ((*base, f(2 * b, 1, 1, sk)), "attn_mask shape"),
        ((*base, f(1, h + 1, 1, sk)), "attn_mask shape"),
        ((*base, f(sq, sk, dtype=torch.float64)), "attn_mask dtype"),
        ((*base, f(sq, sk, dtype=torch.int32)), "attn_mask dtype"),
        ((*base, f(sq, sk, dtype=torch.bfloat16)), "attn_mask dtype"),
        ((*base, f(sq, sk, device="meta")), "attn_mask device"),
        ((*base, None, -0.1, seed), "dropout_p"),
        ((*base, None, 1.0, seed), "dropout_p"),
        ((*base, None, float("nan"), seed), "dropout_p"),
        ((*base, None, 0.1, seed.int()), "dropout_seed dtype"),
        ((*base, None, 0.1, seed[:1]), "dropout_seed shape"),
        ((*base, None, 0.1, seed.reshape(1, 2)), "dropout_seed shape"),
        ((*base, None, 0.1, seed.to("meta")), "dropout_seed device"),
    ]
    if op != OP:
        bad.append(((*base, None, 0.1, None), "dropout_seed"))
    return bad


def composite(
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
):
    """The public op as torch runs it: the forward's ``out``; autograd saves its ``lse``
    (and the mask and dropout seed). ``dropout_p > 0`` without a seed draws one on q's
    device from torch's default generator (no host sync; the backward replays it). A
    float ``attn_mask`` that requires grad is refused (:func:`refuse_mask_grad`)."""
    if torch.is_grad_enabled():
        refuse_mask_grad(OP, attn_mask)
    if dropout_p and dropout_seed is None:
        dropout_seed = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=q.device)
    return torch.ops.neuron.flash_attention_fwd(
        q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
        dropout_seed,
    )[0]  # fmt: skip


def _setup_context(
    ctx,
    q,
    k,
    v,
    causal,
    softmax_scale,
    window,
    softcap,
    sinks,
    attn_mask,
    dropout_p,
    dropout_seed,
    output,
):
    refuse_mask_grad(FWD_OP, attn_mask)
    out, lse = output
    ctx.causal, ctx.softmax_scale = causal, softmax_scale
    ctx.window, ctx.softcap = window, softcap
    ctx.has_sinks = sinks is not None
    ctx.dropout_p = dropout_p
    ctx.save_for_backward(q, k, v, out, lse, sinks, attn_mask, dropout_seed)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, grad_lse):
    """dq, dk, dv and dsinks (in sinks' dtype) from the backward op, with the forward's
    saved out and lse (no recomputed forward). ``lse`` is marked non-differentiable."""
    q, k, v, out, lse, sinks, attn_mask, dropout_seed = ctx.saved_tensors
    if q.numel() == 0 or k.shape[2] == 0:  # nothing attended: every gradient is zero
        dsinks = torch.zeros_like(sinks) if ctx.has_sinks else None
        zeros = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        return (*zeros, None, None, None, None, dsinks, None, None, None)
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dsinks = torch.ops.neuron.flash_attention_bwd(
        grad_out.contiguous(),
        q,
        k,
        v,
        out,
        lse,
        ctx.causal,
        ctx.softmax_scale,
        ctx.window,
        ctx.softcap,
        sinks,
        attn_mask,
        ctx.dropout_p,
        dropout_seed,
    )
    dsinks = dsinks.to(sinks.dtype) if ctx.has_sinks else None
    return dq, dk, dv, None, None, None, None, dsinks, None, None, None


_TOLERANCES = {
    # Chosen before the kernel ran. fp32: exact inputs; fp32 sums of <= 256 products per
    # score, fp32 exp and online rescaling over up to a few thousand keys: ~1e-6 relative.
    "float32": Tolerance(2e-5, 2e-5, "fp32 scores, exp and rescaled sums over Sk keys"),
    # bf16/fp16: P is rounded to the input dtype for P V (0.5 ulp per weight, all of one
    # sign in the worst case: |v|max * 2^-9 ~ 4 * 2^-9 for N(0, 1) values), then one
    # rounding of out (0.5 ulp relative). lse stays fp32 and is held to the same bound.
    "bfloat16": Tolerance(1e-2, 2**-7, "P rounded to bf16 for P V, one bf16 rounding of out"),
    "float16": Tolerance(1.5e-3, 2**-10, "P rounded to fp16 for P V, one fp16 rounding of out"),
}

_TEST_PROBLEMS = {
    # causal: drawn as 0/1 and turned into a bool by make_inputs.
    "ranges": {
        "b": (1, 2),
        "h": (1, 4),
        "hkv": (1, 2),
        "sq": (1, 300),
        "sk": (1, 600),
        "d": (1, 256),
        "causal": (0, 1),
        # window sides, softcap and sinks: negative draws are off (-1 unbounded, 0 no cap),
        # so about half the draws leave each feature off.
        "window_left": (-300, 300),
        "window_right": (-300, 300),
        "softcap": (-60, 60),
        "sinks": (0, 1),
    },
    "edges": (1, 127, 128, 129, 513),
    # every config runs here: GQA, remainder tiles, causal with Sq < Sk, D not a power of two
    "probe": {"b": 1, "h": 2, "hkv": 1, "sq": 130, "sk": 260, "d": 72, "causal": True},
    # budgets bind here (trace-only): long K/V blocks of the widest head in SBUF
    "large": {"b": 1, "h": 1, "hkv": 1, "sq": 256, "sk": 8192, "d": 256, "causal": False},
    # empty sizes the op accepts (D = 0 is refused as a head dim; Hkv = 0 cannot divide H)
    "empty": [
        {"b": 0, "h": 2, "hkv": 1, "sq": 130, "sk": 260, "d": 72, "causal": True},
        {"b": 1, "h": 2, "hkv": 1, "sq": 0, "sk": 260, "d": 72, "causal": True},
        {"b": 1, "h": 2, "hkv": 1, "sq": 130, "sk": 0, "d": 72, "causal": False},
    ],
}

_BUDGET_HINTS = {"sbuf": "lower kv_block (K/V rows held in SBUF) or k_tile"}

FWD_OP = "flash_attention_fwd"

FWD_SPEC = register(
    OpSpec(
        name=FWD_OP,
        config=FlashAttentionConfig,
        plan=plan,
        run_kernels=run_kernels_fwd,
        reference=reference_fwd,
        validate=_validate(FWD_OP),
        problem=problem,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs,
        test_problems=_TEST_PROBLEMS,
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice,
        kernels=(flash_attention_fwd_kernel,),
        autograd=(_setup_context, _backward),
        bad_inputs=_bad_inputs(FWD_OP),
        budget_hints=_BUDGET_HINTS,
        description="Flash attention forward, (out, lse); its autograd calls flash_attention_bwd",
    )
)

SPEC = register(
    OpSpec(
        name=OP,
        config=FlashAttentionConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=_validate(OP),
        problem=problem,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs,
        test_problems=_TEST_PROBLEMS,
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice,
        kernels=(flash_attention_fwd_kernel,),
        composite=composite,
        bad_inputs=_bad_inputs(OP),
        budget_hints=_BUDGET_HINTS,
        description="Flash attention (BHSD, GQA, causal bottom-right), composite over "
        "flash_attention_fwd",
    )
)

REGISTRY_BY_NAME = {FWD_OP: FWD_SPEC, OP: SPEC}
