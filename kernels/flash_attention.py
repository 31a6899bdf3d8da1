"""Flash attention forward on Trainium, the attention contract shared with the backward,
and the ``flash_attention`` / ``flash_attention_fwd`` op declarations.

Layout BHSD, as ``torch.nn.functional.scaled_dot_product_attention`` takes it:
q ``[B, H, Sq, D]``, k and v ``[B, Hkv, Sk, D]`` with ``H % Hkv == 0`` (GQA/MQA: query head
``h`` reads KV head ``h // (H // Hkv)``; nothing is repeated in memory).

The contract both directions keep:
    - ``lse [B, H, Sq]`` float32 is ``log(sum_j exp(scale * q_i . k_j))`` over the unmasked
      ``j`` (natural log, scale included): the one layout the backward consumes.
    - causal with ``Sq != Sk`` aligns to the bottom-right corner (FlashAttention 2): query
      ``i`` sees key ``j`` iff ``j <= i + (Sk - Sq)``. When ``Sq > Sk`` the first
      ``Sq - Sk`` query rows see no key: such fully masked rows give ``out = 0`` and
      ``lse = -inf`` (never NaN).
    - ``softmax_scale=None`` means ``1 / sqrt(D)``.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import TARGETS
from neuron_kernels.kernels.spec import DTYPES, dtype_name

__all__ = [
    "MAX_HEAD_DIM",
    "SUPPORTED_HEAD_DIMS",
    "attention_reference",
    "causal_visible",
    "resolve_scale",
    "validate_attention",
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
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    return j <= i + (sk - sq)


def validate_attention(op_name: str, q, k, v, causal=False, softmax_scale=None) -> None:
    """Refuse bad attention input before any work, naming the argument and the value.

    Checks: tensors, rank 4 (BHSD), the head dim agreeing across q/k/v and within
    ``[1, MAX_HEAD_DIM]``, ``H % Hkv == 0``, B of k and v equal to q's, k and v agreeing on
    (B, Hkv, Sk), dtypes (one of :data:`DTYPES`, all equal), one device, ``causal`` a bool
    and ``softmax_scale`` None or a finite float.

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


def attention_reference(q, k, v, causal=False, softmax_scale=None, upcast=True):
    """Plain-torch attention: ``(out [B, H, Sq, D], lse [B, H, Sq] float32)``.

    fp64 when ``upcast`` (both outputs float64), else fp32 math with ``out`` in q's dtype
    and ``lse`` float32 (the op's output dtypes).
    GQA by broadcasting (no repeated K/V), causal bottom-right, fully masked rows give
    ``out = 0`` and ``lse = -inf``; differentiable (gradients finite on masked rows).
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
    if causal:
        scores = scores.masked_fill(~causal_visible(sq, sk, q.device), float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True) if sk else scores.new_zeros((*scores.shape[:-1], 1))
    # A shift by a constant leaves softmax unchanged: detach it, and use 0 on masked rows.
    shift = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max).detach()
    weights = torch.exp(scores - shift)  # exactly 0 where masked
    row_sum = weights.sum(dim=-1, keepdim=True)
    safe_sum = torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)
    out = torch.matmul(weights, vc) / safe_sum
    lse = (shift + torch.log(row_sum)).squeeze(-1)  # log(0) = -inf on fully masked rows
    out = out.reshape(b, h, sq, d)
    lse = lse.reshape(b, h, sq)
    if not upcast:
        out, lse = out.to(q.dtype), lse.to(torch.float32)
    return out, lse
