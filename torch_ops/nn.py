"""Drop-in module-level wrappers over the ``torch.ops.neuron`` ops, so model code swaps one
import: ``from neuron_kernels.torch_ops.nn import scaled_dot_product_attention``."""

from __future__ import annotations

import torch

from neuron_kernels.errors import LimitError

__all__ = ["scaled_dot_product_attention"]

_SDPA = "scaled_dot_product_attention"


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on ``torch.ops.neuron.flash_attention``.

    Same signature and meaning for what it supports: BHSD tensors ``[B, H, L, E]`` and
    ``[B, Hkv, S, E]``, ``is_causal``, ``scale`` (default ``1/sqrt(E)``) and ``enable_gqa``
    (``H`` a multiple of ``Hkv``; without it the head counts must match, as in torch).
    What it cannot do yet raises instead of silently falling back.

    Raises:
        LimitError: an ``attn_mask``; ``dropout_p != 0``; ``is_causal`` with ``L != S``
            (torch aligns that mask top-left, flash attention bottom-right: call
            ``torch.ops.neuron.flash_attention`` for the bottom-right one); query and key
            head counts that differ without ``enable_gqa``; and every input limit of
            ``flash_attention`` (ranks, head dims, dtypes, devices).
    """
    if attn_mask is not None:
        raise LimitError(
            _SDPA,
            "attn_mask",
            "must be None (only is_causal masking is supported)",
            f"a {tuple(attn_mask.shape)} tensor"
            if isinstance(attn_mask, torch.Tensor)
            else repr(attn_mask),
        )
    if dropout_p != 0.0:
        raise LimitError(_SDPA, "dropout_p", "must be 0.0 (dropout is not supported)", dropout_p)
    for arg, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = t.dim() if isinstance(t, torch.Tensor) else type(t).__name__
            raise LimitError(_SDPA, f"{arg} rank", "must be 4 ([B, heads, S, E])", got, limit=4)
    if is_causal and query.shape[2] != key.shape[2]:
        raise LimitError(
            _SDPA,
            "is_causal",
            "needs query and key of one length (torch aligns a causal mask with L != S "
            "top-left; torch.ops.neuron.flash_attention aligns it bottom-right)",
            f"L={query.shape[2]}, S={key.shape[2]}",
        )
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise LimitError(
            _SDPA,
            "key.shape[1]",
            f"must equal query's heads ({query.shape[1]}) unless enable_gqa=True",
            key.shape[1],
        )
    return torch.ops.neuron.flash_attention(query, key, value, bool(is_causal), scale)
