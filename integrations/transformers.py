"""Hugging Face ``transformers`` models on the neuron ops, in one line::

    from neuron_kernels.integrations.transformers import apply_neuron_kernels

    swapped = apply_neuron_kernels(model)  # {module name: what it now runs}

Importing this module registers the attention implementation ``"neuron"`` with
``transformers.AttentionInterface`` and its mask function with ``AttentionMaskInterface``,
so ``from_config(..., attn_implementation="neuron")`` and
``model.set_attn_implementation("neuron")`` work for any model written on those interfaces.
:func:`apply_neuron_kernels` does that and also swaps the RMSNorm modules
(:class:`neuron_kernels.torch_ops.nn.RMSNorm`, with the family's casting and offset) and the
SwiGLU MLPs (:class:`SwiGLUMLP`, ``torch.ops.neuron.swiglu``) of the families in
:data:`FAMILIES`.

How a layer reaches ``torch.ops.neuron.flash_attention`` (transformers 4.57's
``masking_utils``): the model asks the mask function registered under its
``attn_implementation`` for each mask type. Ours returns ``None`` for the causal and
sliding-window causal patterns (as ``flash_attention_2``'s does), so no dense mask is ever
built; the layer then calls :func:`neuron_attention_forward` with ``is_causal`` and its own
``sliding_window``/``softcap``/``s_aux``, which become the op's ``causal``, ``window``,
``softcap`` and ``sinks``. A padding mask that masks a token comes back from the mask
function as a bool ``[B, 1, 1, S]`` row of the keys (True: attend), never a dense
``[B, 1, L, S]`` one, and reaches the op as its ``attn_mask`` on top of the layer's flags;
attention dropout in training (``dropout``) becomes the op's ``dropout_p`` (its seed drawn
from torch's default generator, replayed by the backward). ``sliding_window=W`` lets query ``i`` see key ``j`` iff
``i - W < j <= i`` (``sliding_window_overlay`` and ``causal_mask_function``), that is
FlashAttention's ``window=(W - 1, 0)``, bottom-right aligned as the op aligns it, which is
also how a KV cache lines the new queries up with the cached keys. What the op cannot
express yet is refused with one :class:`~neuron_kernels.errors.LimitError` instead of being
dropped: a dense mask with a query dim passed in, packed sequences (``position_ids`` that
restart inside a row), a static cache, chunked attention and extra mask functions. A query
row that sees no key (a left-padded row's pad tokens) gives 0, where eager's softmax over
only masked scores averages V: those are padding positions either way.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

try:
    import transformers
except ImportError:
    raise ImportError(
        "neuron_kernels.integrations.transformers needs Hugging Face transformers: "
        "pip install neuron-kernels[transformers]"
    ) from None

try:
    from transformers.activations import SiLUActivation
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface
except ImportError as _exc:
    raise ImportError(
        "neuron_kernels.integrations.transformers needs transformers>=4.57 (AttentionInterface "
        f"and masking_utils), found transformers {transformers.__version__}: {_exc}"
    ) from None

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.torch_ops.nn import RMSNorm

__all__ = [
    "ATTN_IMPLEMENTATION",
    "FAMILIES",
    "Family",
    "SwiGLUMLP",
    "apply_neuron_kernels",
    "neuron_attention_forward",
    "neuron_attention_mask",
]

ATTN_IMPLEMENTATION = "neuron"
_ATTN = f'attn_implementation="{ATTN_IMPLEMENTATION}"'
_APPLY = "apply_neuron_kernels"


@dataclass(frozen=True)
class Family:
    """What :func:`apply_neuron_kernels` swaps in one model family (``config.model_type``).

    Attributes:
        norm: the family's RMSNorm class name in ``transformers.models.<type>.modeling_<type>``.
        casting_mode: the op's casting mode that rounds as that class does: "llama" (normalize
            in fp32, round to the input dtype, then ``* weight``) or "gemma" (everything in
            fp32, ``weight`` included, one rounding at the end).
        offset: added to the stored weight (Gemma stores ``w - 1`` and multiplies by ``1 + w``).
        mlp: the family's MLP class name.
        gated: True when that MLP is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, swapped
            when its ``act_fn`` is SiLU; False when it is not that shape (gpt-oss's MoE).
        kept: why an MLP that is not that shape is kept (the report's entry for it).
    """

    norm: str
    casting_mode: str
    offset: float
    mlp: str
    gated: bool = True
    kept: str = ""


# Each entry read off the family's modeling file in transformers 4.57.6 (RMSNorm.forward).
FAMILIES = {
    # x.float() normalized, .to(input_dtype), then weight * it
    "llama": Family("LlamaRMSNorm", "llama", 0.0, "LlamaMLP"),
    "mistral": Family("MistralRMSNorm", "llama", 0.0, "MistralMLP"),
    "qwen2": Family("Qwen2RMSNorm", "llama", 0.0, "Qwen2MLP"),
    # the same class for the per-head q_norm / k_norm
    "qwen3": Family("Qwen3RMSNorm", "llama", 0.0, "Qwen3MLP"),
    # output * (1.0 + weight.float()), then .type_as(x); the MLP is GeGLU (gelu_pytorch_tanh)
    # unless hidden_activation is silu
    "gemma2": Family("Gemma2RMSNorm", "gemma", 1.0, "Gemma2MLP"),
    # (weight * hidden_states_fp32).to(input_dtype): fp32 throughout, one rounding
    "gpt_oss": Family(
        "GptOssRMSNorm",
        "gemma",
        0.0,
        "GptOssMLP",
        gated=False,
        kept="a mixture of experts (router, clamped alpha-scaled GLU experts), not one SwiGLU",
    ),
}


def _flash_attention(q, k, v, causal, softmax_scale, **features):
    """The one call into the op (a seam tests wrap to see what reaches it)."""
    return torch.ops.neuron.flash_attention(q, k, v, causal, softmax_scale, **features)


def neuron_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The attention function registered as ``"neuron"``: the signature of transformers'
    ``sdpa_attention_forward`` / ``flash_attention_forward`` (BHSD ``query [B, H, L, D]``,
    ``key``/``value [B, Hkv, S, D]``) returning ``(out [B, L, H, D], None)``.

    ``is_causal`` (a keyword, else ``module.is_causal``, else True) becomes the op's
    ``causal``; ``scaling`` its ``softmax_scale``; ``sliding_window=W`` its
    ``window=(W - 1, 0)`` (``(W - 1, -1)`` without causal, as transformers' overlay alone);
    ``softcap`` (Gemma 2) its ``softcap``; ``s_aux`` (gpt-oss's per-head sinks) its
    ``sinks``; ``attention_mask`` without a query dim (the mask function's ``[B, 1, 1, S]``
    padding mask) its ``attn_mask``; ``dropout`` (training with ``attention_dropout > 0``)
    its ``dropout_p``. GQA goes to the op as is (no repeated K/V).

    Raises:
        LimitError: an ``attention_mask`` with a query dim (a dense mask, e.g. a 4D mask
            passed to the model: the op takes causal and the window from its flags, and a
            mask only on top of them); a ``head_mask``; ``output_attentions=True`` (the
            weights are never formed); ``sliding_window < 1``; and every input limit of
            ``flash_attention`` (its ``attn_mask`` and ``dropout_p`` included).
    """
    if attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[-2] != 1):
        raise LimitError(
            _ATTN,
            "attention_mask",
            "must be None or a [B, 1, 1, S] padding mask (what the neuron mask function "
            "gives): causal and sliding-window layers take their pattern from the op's "
            "flags, so a dense mask with a query dim (e.g. a 4D mask passed to the model) "
            "is not taken",
            f"a {tuple(attention_mask.shape)} tensor",
        )
    if kwargs.get("head_mask") is not None:
        raise LimitError(_ATTN, "head_mask", "must be None", "a tensor")
    if kwargs.get("output_attentions"):
        raise LimitError(
            _ATTN,
            "output_attentions",
            "must be False (the kernel never forms the attention weights; "
            'attn_implementation="eager" returns them)',
            True,
        )
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = bool(is_causal)
    features = {}
    if sliding_window is not None:
        w = int(sliding_window)
        if w < 1:
            raise LimitError(_ATTN, "sliding_window", "must be >= 1", w, limit=1)
        features["window"] = [w - 1, 0 if is_causal else -1]
    if softcap is not None:
        features["softcap"] = float(softcap)
    if s_aux is not None:
        features["sinks"] = s_aux
    if attention_mask is not None:
        features["attn_mask"] = attention_mask
    if dropout:
        features["dropout_p"] = float(dropout)
    out = _flash_attention(query, key, value, is_causal, scaling, **features)
    return out.transpose(1, 2).contiguous(), None


def _visible(q_len: int, kv_len: int, window: int | None, device) -> torch.Tensor:
    """``[q_len, kv_len]`` bool: what the op attends, causal aligned bottom-right (query ``i``
    is key position ``i + kv_len - q_len``), within ``window`` keys when given."""
    i = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)
    j = torch.arange(kv_len, device=device).unsqueeze(0)
    seen = j <= i
    if window is not None:
        seen &= j > i - window
    return seen


def neuron_attention_mask(
    batch_size: int,
    cache_position: torch.Tensor | None = None,
    kv_length: int = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: torch.Tensor | None = None,
    allow_is_causal_skip: bool = True,
    local_size: int | None = None,
    config=None,
    **kwargs,
) -> torch.Tensor | None:
    """The mask function registered as ``"neuron"`` (the keywords of transformers'
    ``sdpa_mask``; the queries are ``cache_position`` in 4.57, ``q_length``/``q_offset`` in
    5.x): ``None``, or with a padding mask that masks a key of this step, that mask as a
    bool ``[B, 1, 1, kv_length]`` row (True: attend), after checking that the pattern asked
    for is one the op computes from its flags (plus that row).

    Checks, in order: the queries are the last of the keys (``cache_position[-1] + 1``, or
    ``q_offset + q_length``, equals ``kv_offset + kv_length``: the op's bottom-right
    alignment; a static cache has empty slots past them); a 2D padding ``attention_mask``
    has a column for every key (``prepare_padding_mask``'s slice; when it marks every
    key, as ``flash_attention_mask`` tests with ``.all()``, no mask is returned);
    ``local_size`` is the config's ``sliding_window`` (chunked attention passes its
    ``attention_chunk_size`` there); and when transformers says the mask may not be plain
    causal (``allow_is_causal_skip=False``: ``position_ids`` given without a cache, which
    it checks for packed sequences, a static cache, extra mask functions) the pattern is
    evaluated once, as ``sdpa_mask`` builds it, and must equal the op's bottom-right
    (sliding-window) causal pattern. That evaluation costs what the sdpa path's mask does,
    once per forward instead of a mask read by every layer.

    Raises:
        LimitError: a static cache, chunked attention, or any other pattern.
    """
    padding_mask = None
    if cache_position is not None:  # transformers 4.x
        q_length = cache_position.shape[0]
        q_end = int(cache_position[-1]) + 1 if q_length else 0
    else:  # 5.x
        q_length = kwargs["q_length"]
        q_end = int(kwargs.get("q_offset", 0)) + q_length
    if q_length and q_end != kv_offset + kv_length:
        raise LimitError(
            _ATTN,
            "kv_length",
            "must end at the last query (the op aligns queries with the last keys): a "
            "static cache's empty slots would be attended (the mask function passes the op "
            "key padding only, never a dense mask with a query dim)",
            f"keys [{kv_offset}, {kv_offset + kv_length}) for queries ending at {q_end}",
        )
    if attention_mask is not None:
        if attention_mask.shape[-1] < kv_offset + kv_length:
            raise LimitError(
                _ATTN,
                "attention_mask",
                f"must have a column for each of the {kv_offset + kv_length} keys",
                attention_mask.shape[-1],
            )
        padding = attention_mask[:, kv_offset : kv_offset + kv_length].bool()
        if not bool(padding.all()):
            padding_mask = padding[:, None, None, :]  # [B, 1, 1, kv_length]: the op's attn_mask
    chunk = getattr(config, "attention_chunk_size", None)
    if local_size is not None and chunk is not None and local_size == chunk:
        raise LimitError(
            _ATTN, "attention_chunk_size", "must be None (chunked attention lands later)", chunk
        )
    if not allow_is_causal_skip:
        if cache_position is not None:  # 5.x passes q_length, q_offset, device in kwargs
            kwargs["cache_position"] = cache_position
        dense = sdpa_mask(
            **kwargs,
            batch_size=batch_size,
            kv_length=kv_length,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=None,  # the pattern alone (the padding is the op's attn_mask)
            allow_is_causal_skip=False,
            local_size=local_size,
            allow_torch_fix=False,
            config=config,
        )
        want = _visible(q_length, kv_length, local_size, dense.device)
        if not bool((dense == want).all()):
            raise LimitError(
                _ATTN,
                "attention pattern",
                "must be causal (or sliding-window causal) over the keys, aligned bottom-"
                "right: packed sequences (position_ids restarting in a row), static caches "
                "and extra mask functions would need a dense mask with a query dim, which "
                "the neuron mask function does not build",
                f"a [{batch_size}, {q_length}, {kv_length}] mask that differs "
                f"from it at {int((dense != want).sum())} positions",
            )
    return padding_mask


AttentionInterface.register(ATTN_IMPLEMENTATION, neuron_attention_forward)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, neuron_attention_mask)


class SwiGLUMLP(torch.nn.Module):
    """``down_proj(swiglu(gate_proj(x), up_proj(x)))`` with ``torch.ops.neuron.swiglu``
    (``silu(gate) * up``, backward included), over the swapped MLP's own ``Linear`` modules
    under the same names, so parameters, state-dict keys and optimizer state carry over."""

    def __init__(
        self, gate_proj: torch.nn.Module, up_proj: torch.nn.Module, down_proj: torch.nn.Module
    ) -> None:
        super().__init__()
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.ops.neuron.swiglu(self.gate_proj(x), self.up_proj(x)))


def _neuron_rms_norm(old: torch.nn.Module, family: Family) -> RMSNorm:
    """An :class:`RMSNorm` holding ``old``'s weight Parameter (the same object) and epsilon."""
    eps = getattr(old, "variance_epsilon", None)
    if eps is None:
        eps = old.eps
    new = RMSNorm(
        tuple(old.weight.shape),
        eps=float(eps),
        casting_mode=family.casting_mode,
        offset=family.offset,
        device="meta",  # its own weight is replaced at once: allocate nothing
    )
    new.weight = old.weight
    return new.train(old.training)


def _is_silu(act) -> bool:
    return isinstance(act, (torch.nn.SiLU, SiLUActivation))


def _attention_features(module: torch.nn.Module, config) -> str:
    """What a layer's attention passes the op, read off the module as its forward does."""
    feats = ["causal" if getattr(module, "is_causal", True) else "non-causal"]
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
    if kv_heads and kv_heads != heads:
        feats.append(f"GQA {heads}/{kv_heads}")
    if hasattr(module, "sliding_window"):  # Qwen2, Qwen3, Gemma 2, gpt-oss: per layer
        window = module.sliding_window
    else:  # Mistral passes config.sliding_window to every layer
        window = getattr(config, "sliding_window", None)
    if window is not None:
        feats.append(f"window ({window - 1}, 0)")
    if getattr(module, "attn_logit_softcapping", None) is not None:
        feats.append(f"softcap {module.attn_logit_softcapping}")
    if getattr(module, "sinks", None) is not None:
        feats.append("sinks")
    return f"flash_attention ({', '.join(feats)})"


def apply_neuron_kernels(
    model: torch.nn.Module, *, attention: bool = True, rms_norm: bool = True, swiglu: bool = True
) -> dict[str, str]:
    """Put the neuron ops into a ``transformers`` model of a family in :data:`FAMILIES`, in
    place, and return ``{module name: what it now runs}`` for every module it swapped, and
    ``"kept: <why>"`` for each MLP it leaves (with ``swiglu=True``).

    - ``attention``: ``model.set_attn_implementation("neuron")``
      (:func:`neuron_attention_forward`); one entry per attention module, with the op's
      features for that layer (causal, GQA, window, softcap, sinks).
    - ``rms_norm``: each of the family's RMSNorm modules becomes a
      :class:`neuron_kernels.torch_ops.nn.RMSNorm` with its casting mode and offset, its
      epsilon, and the very same ``weight`` Parameter (optimizers and state dicts keep it).
    - ``swiglu``: each of the family's gated MLPs whose ``act_fn`` is SiLU becomes a
      :class:`SwiGLUMLP` over its own projections. Not swapped: gpt-oss's MoE MLP
      (``GptOssMLP``: a router and clamped, alpha-scaled GLU experts) and Gemma 2's GeGLU
      MLP (``gelu_pytorch_tanh``), unless its ``hidden_activation`` is silu.

    Raises:
        LimitError: a ``model.config.model_type`` outside :data:`FAMILIES` (any model
            written on ``AttentionInterface`` still takes ``attn_implementation="neuron"``
            alone), or transformers keeping another attention implementation.
    """
    config = model.config
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None:
        raise LimitError(
            _APPLY,
            "model.config.model_type",
            f"must be one of {sorted(FAMILIES)}",
            repr(model_type),
            limit=sorted(FAMILIES),
            hint='model.set_attn_implementation("neuron") gives the attention alone to any '
            "model built on transformers' AttentionInterface",
        )
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    norm_cls = getattr(modeling, family.norm)
    mlp_cls = getattr(modeling, family.mlp)

    swapped: dict[str, str] = {}
    replacements: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        if rms_norm and type(module) is norm_cls:
            new = _neuron_rms_norm(module, family)
            replacements.append((name, new))
            swapped[name] = (
                f"RMSNorm: rms_norm (casting {family.casting_mode}, offset {family.offset})"
            )
        elif swiglu and type(module) is mlp_cls:
            act = getattr(module, "act_fn", None)
            if family.gated and _is_silu(act):
                replacements.append(
                    (name, SwiGLUMLP(module.gate_proj, module.up_proj, module.down_proj))
                )
                swapped[name] = "SwiGLU MLP: swiglu"
            elif family.gated:
                swapped[name] = f"kept: act_fn {type(act).__name__} is not SiLU"
            else:
                swapped[name] = f"kept: {family.kept}"
    for name, new in replacements:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)

    if attention:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        if model.config._attn_implementation != ATTN_IMPLEMENTATION:
            raise LimitError(
                _APPLY,
                "attention",
                f"needs a model that can switch to attn_implementation={ATTN_IMPLEMENTATION!r}",
                repr(model.config._attn_implementation),
            )
        for name, module in model.named_modules():
            if type(module).__name__.endswith("Attention") and hasattr(module, "is_causal"):
                swapped[name] = f"attention: {_attention_features(module, config)}"
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return dict(sorted(swapped.items(), key=lambda item: order.get(item[0], -1)))
