"""Drop-in module-level wrappers over the ``torch.ops.neuron`` ops, so model code swaps one
import: ``from neuron_kernels.torch_ops.nn import scaled_dot_product_attention``."""

from __future__ import annotations

import math
import numbers

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.kernels.rms_norm import CASTING_MODES
from neuron_kernels.kernels.spec import DTYPES, dtype_name

__all__ = ["RMSNorm", "scaled_dot_product_attention"]

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

    Same signature and meaning: BHSD tensors ``[B, H, L, E]`` and ``[B, Hkv, S, E]``,
    ``attn_mask`` (bool: True attends; float in query's dtype or float32: added to the
    scores; broadcastable to ``[B, H, L, S]``), ``dropout_p`` (the op's counter-hash
    dropout, seeded from torch's default generator: the same statistics as torch's, not
    its random stream), ``is_causal``, ``scale`` (default ``1/sqrt(E)``) and
    ``enable_gqa`` (``H`` a multiple of ``Hkv``; without it the head counts must match, as
    in torch). A row the mask leaves with no key gives zeros, as torch does.

    ``is_causal`` aligns the mask top-left as torch does (query ``i`` sees key ``j`` iff
    ``j <= i``), while the op's ``causal`` aligns bottom-right; it is passed on exactly and
    at no extra cost: ``L == S`` is the op's causal; ``L > S`` is the op's window
    ``(-1, L - S)`` (no causal: the window's right edge is the top-left diagonal);
    ``L < S`` is the op's causal on the first ``L`` keys (keys ``j >= L`` are seen by no
    query), so no mask is materialised either way.

    Raises:
        LimitError: ``attn_mask`` together with ``is_causal`` (torch's docs: "An error is
            thrown if both attn_mask and is_causal are set"); query and key head counts
            that differ without ``enable_gqa``; and every input limit of
            ``flash_attention`` (ranks, head dims, dtypes, devices, the mask's shape and
            dtype, ``dropout_p`` in [0, 1)).
    """
    for arg, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = t.dim() if isinstance(t, torch.Tensor) else type(t).__name__
            raise LimitError(_SDPA, f"{arg} rank", "must be 4 ([B, heads, S, E])", got, limit=4)
    if is_causal and attn_mask is not None:
        raise LimitError(
            _SDPA,
            "attn_mask",
            "must be None when is_causal=True (as torch documents: an error is thrown if "
            "both are set)",
            f"a {tuple(attn_mask.shape)} tensor"
            if isinstance(attn_mask, torch.Tensor)
            else repr(attn_mask),
        )
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise LimitError(
            _SDPA,
            "key.shape[1]",
            f"must equal query's heads ({query.shape[1]}) unless enable_gqa=True",
            key.shape[1],
        )
    causal, window = bool(is_causal), None
    length, keys = query.shape[2], key.shape[2]
    if is_causal and length > keys:  # top-left: j <= i = i + (S - L) + (L - S)
        causal, window = False, [-1, length - keys]
    elif is_causal and length < keys:  # keys j >= L are seen by no query i < L
        key, value = key[:, :, :length], value[:, :, :length]
    return torch.ops.neuron.flash_attention(
        query, key, value, causal, scale, window, 0.0, None, attn_mask, float(dropout_p)
    )


class RMSNorm(torch.nn.Module):
    """Drop-in for :class:`torch.nn.RMSNorm` running ``torch.ops.neuron.rms_norm``.

    ``y = x / sqrt(mean(x^2) + eps) * weight`` over the last ``len(normalized_shape)`` dims
    (flattened into one H for the op). Constructor arguments and the ``weight`` parameter are
    torch's; ``eps=None`` means what it means in torch: the epsilon of the dtype torch computes
    in (``torch.finfo(torch.float32).eps`` for bf16/fp16 inputs, else x's), at each call.
    Torch's RMSNorm computes in fp32, weight included, and casts once: that is the op's
    ``casting_mode="gemma"``, this module's default. Extras, keyword-only: ``casting_mode``
    ("llama" rounds the normalized x to the input dtype before the weight multiply, as
    Llama's reference code does; "none") and ``offset`` (Gemma's 1.0, with the weight then
    initialised to 0, as Gemma stores ``w - 1``).

    Inputs the op does not take (float64) run torch's own ``rms_norm``; a weight of another
    dtype than x is cast to x's dtype for the op (autograd casts its gradient back).
    """

    def __init__(
        self,
        normalized_shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        casting_mode: str = "gemma",
        offset: float = 0.0,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        if casting_mode not in CASTING_MODES:
            raise ValueError(
                f"RMSNorm: casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}"
            )
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.casting_mode = casting_mode
        self.offset = float(offset)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            # The effective scale offset + weight starts at 1.
            torch.nn.init.constant_(self.weight, 1.0 - self.offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = len(self.normalized_shape)
        if tuple(x.shape[x.dim() - k :]) != self.normalized_shape:
            raise LimitError(  # a ValueError too, as torch.nn.RMSNorm's shape errors are
                "RMSNorm",
                "input's last dims",
                f"must be normalized_shape {list(self.normalized_shape)}",
                list(x.shape),
            )
        # torch's eps=None: the epsilon of the dtype it computes in (fp32 for 2-byte inputs).
        opmath = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
        eps = torch.finfo(opmath).eps if self.eps is None else self.eps
        h = math.prod(self.normalized_shape)
        if self.weight is not None:
            weight = self.weight.reshape(h)
        else:
            weight = torch.full((h,), 1.0 - self.offset, dtype=x.dtype, device=x.device)
        if dtype_name(x) not in DTYPES:  # e.g. float64: torch's own op
            w = None if self.weight is None else self.offset + self.weight
            return torch.nn.functional.rms_norm(x, self.normalized_shape, w, eps)
        y = torch.ops.neuron.rms_norm(
            x.reshape(*x.shape[: x.dim() - k], h),
            weight.to(x.dtype),
            float(eps),
            self.offset,
            self.casting_mode,
        )
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        extras = ""
        if self.casting_mode != "gemma" or self.offset:
            extras = f", casting_mode={self.casting_mode!r}, offset={self.offset}"
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}{extras}"
        )
