"""What the attention ops accept and compute, shared by the forward, the backward and the
varlen ops: validation, the fp64 reference, visibility (causal, window), the dropout
stream's torch mirror, the feature and mask problem keys, and the inputs the tests draw.
Nothing here issues an NKI instruction.

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
      time (a window of W keys costs O(S * W) tiles). The forward adds a window edge (and
      the causal diagonal) to the raw scores in PSUM as a bias matmul per 128-key chunk it
      crosses (:class:`EdgeBias`: the identity times a 0 / ``MASK_FILL / scale`` tile);
      with a softcap, a mask kept in SBUF, run-time bounds or rows that see no key, and
      in the backward, the crossed tiles are masked by GpSimd ``affine_select`` instead.
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
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import TARGETS
from neuron_kernels.kernels.counter_hash import (
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
    dtype_name,
    shape_parser,
)

__all__ = [
    "DROPOUT_BITS",
    "MASK_FILL",
    "MAX_HEAD_DIM",
    "OP",
    "SUPPORTED_HEAD_DIMS",
    "apply_attn_mask",
    "attention_reference",
    "causal_visible",
    "dead_rows",
    "draw_features",
    "draw_mask_dropout",
    "dropout_keep",
    "dropout_row_keys",
    "dropout_threshold",
    "feature_shape_parser",
    "feature_suffix",
    "kernel_mask",
    "kernel_row_keys",
    "key_bounds",
    "mask_4d",
    "mask_problem",
    "refuse_bounds_features",
    "refuse_mask_grad",
    "resolve_scale",
    "score_features",
    "tile_visibility",
    "validate_attention",
    "validate_mask_dropout",
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


# Masked scores (already scaled) become this: exp(MASK_FILL - max) is exactly 0 in fp32, and
# unlike -inf it never meets another infinity in `max - max` on a row with no visible key.
MASK_FILL = -1.0e30


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


def feature_shape_parser(op: str, dims: tuple) -> object:
    """The attention ops' ``parse_shape``: ``dims`` as ``x``-separated sizes, then
    ``:causal`` and the features, ``:window=LEFT,RIGHT`` (-1 unbounded), ``:softcap=X``
    (> 0) and ``:sinks``, in any order. So the tuner and ``profile`` reach the shape
    buckets of windowed, capped and sink problems (:func:`feature_suffix`)."""
    base = shape_parser(op, dims, ("causal",))

    def parse_shape(text: str) -> dict:
        sizes, *named = str(text).lower().split(":")
        plain, features = [], {}
        for token in named:
            name, eq, value = token.strip().partition("=")
            if name == "window" and eq:
                sides = value.split(",")
                ok = len(sides) == 2 and all(x.strip().lstrip("-").isdigit() for x in sides)
                if not ok or min(int(x) for x in sides) < -1:
                    raise LimitError(
                        op, "shape flag", "window must be LEFT,RIGHT, ints >= -1", token
                    )
                features["window_left"], features["window_right"] = (int(x) for x in sides)
            elif name == "softcap" and eq:
                try:
                    cap = float(value)
                except ValueError:
                    cap = -1.0
                if not (cap > 0 and math.isfinite(cap)):
                    raise LimitError(op, "shape flag", "softcap must be a finite float > 0", token)
                features["softcap"] = cap
            elif name == "sinks" and not eq:
                features["sinks"] = True
            else:
                plain.append(token)
        problem = base(":".join([sizes, *plain]))
        problem.update(features)
        return problem

    parse_shape.syntax = base.syntax + "[:window=L,R][:softcap=X][:sinks]"
    return parse_shape


def bad_mask_dropout_inputs(base, q, sk, op):
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
