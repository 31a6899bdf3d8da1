"""A small Llama-style decoder in plain PyTorch: RMSNorm, rotary embeddings, grouped-query
attention and a SwiGLU MLP.

One setting, ``kernels=True``, moves the attention, the norms, the projections, the MLP's
SwiGLU activation and the optimizer to the library (``torch.ops.neuron.*`` and ``FusedAdamW``); ``kernels=False`` is
the plain PyTorch a user starts from. Both build identical parameters from the same seed.
An op the installed library does not register yet runs its plain PyTorch form on the
kernel path too, and :func:`kernel_pieces` says so: nothing claims a kernel it did not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LlamaConfig", "Llama", "Piece", "kernel_pieces", "make_optimizer"]


@dataclass(frozen=True)
class LlamaConfig:
    """Model sizes. The defaults are tiny so the kernel path trains on the CPU interpreter
    in seconds per step; head_dim 64 is the smallest head dim the attention tests name."""

    vocab_size: int = 256
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 2
    n_kv_heads: int = 1  # GQA: two query heads share one K/V head
    ffn_dim: int = 256
    max_seq_len: int = 128
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def __post_init__(self):
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"dim ({self.dim}) must divide by n_heads ({self.n_heads}) and n_heads by "
                f"n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")


# -- the pieces the setting switches ------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One switchable piece of the model: which function runs it and whether it is a kernel."""

    name: str  # "projections", "norms", "attention", "activation", "optimizer"
    runs: str  # what runs it, e.g. "torch.ops.neuron.matmul" or "torch (reference)"
    kernel: bool  # True when a library kernel op runs this piece
    why: str = ""  # why it is not a kernel, when it is not


def _registered(op: str) -> bool:
    from neuron_kernels.kernels import REGISTRY

    return op in REGISTRY


def _fused_adamw():
    """``FusedAdamW`` when the library has it and its op is registered, else None."""
    if not _registered("fused_adamw_"):
        return None
    try:
        from neuron_kernels.torch_ops.optim import FusedAdamW
    except ImportError:
        return None
    return FusedAdamW


def kernel_pieces(kernels: bool) -> dict[str, Piece]:
    """Which function runs each switchable piece for this setting, in this installation."""
    if not kernels:
        why = "kernels=False: plain PyTorch"
        return {
            "projections": Piece("projections", "torch.matmul", False, why),
            "norms": Piece("norms", "torch (RMSNorm math)", False, why),
            "attention": Piece("attention", "F.scaled_dot_product_attention", False, why),
            "activation": Piece("activation", "F.silu(gate) * up", False, why),
            "optimizer": Piece("optimizer", "torch.optim.AdamW", False, why),
        }
    import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)

    def op_piece(name: str, op: str, fallback: str) -> Piece:
        if _registered(op):
            return Piece(name, f"torch.ops.neuron.{op}", True)
        return Piece(name, fallback, False, f"torch.ops.neuron.{op} is not registered here")

    pieces = {
        "projections": op_piece("projections", "matmul", "torch.matmul"),
        "norms": op_piece("norms", "rms_norm", "torch (RMSNorm math)"),
        "attention": op_piece("attention", "flash_attention", "F.scaled_dot_product_attention"),
        "activation": op_piece("activation", "swiglu", "F.silu(gate) * up"),
    }
    if _fused_adamw() is not None:
        pieces["optimizer"] = Piece("optimizer", "neuron_kernels.torch_ops.optim.FusedAdamW", True)
    else:
        pieces["optimizer"] = Piece(
            "optimizer", "torch.optim.AdamW", False, "FusedAdamW / fused_adamw_ not available here"
        )
    return pieces


def _reference_rms_norm(x, weight, eps):
    """Llama's RMSNorm: normalise in fp32, cast back, then scale by the weight."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def _reference_attention(q, k, v):
    """Causal GQA attention on BHSD tensors in plain PyTorch (K/V heads repeated)."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _reference_swiglu(gate, up):
    return F.silu(gate) * up


@dataclass(frozen=True)
class _Ops:
    """The functions the model calls, chosen once from the pieces."""

    project: Callable  # (x [..., K], w [K, N]) -> [..., N]
    rms_norm: Callable  # (x, weight, eps) -> same shape
    attention: Callable  # (q [B,H,S,D], k, v [B,Hkv,S,D]) -> [B,H,S,D], causal
    swiglu: Callable  # (gate, up [..., F]) -> silu(gate) * up


def _ops(pieces: dict[str, Piece]) -> _Ops:
    project, rms_norm, attention = torch.matmul, _reference_rms_norm, _reference_attention
    swiglu = _reference_swiglu
    if pieces["projections"].kernel:
        project = lambda x, w: torch.ops.neuron.matmul(x.contiguous(), w)
    if pieces["norms"].kernel:
        rms_norm = lambda x, w, eps: torch.ops.neuron.rms_norm(x.contiguous(), w, eps)
    if pieces["attention"].kernel:
        attention = lambda q, k, v: torch.ops.neuron.flash_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), causal=True
        )
    if pieces["activation"].kernel:
        swiglu = lambda gate, up: torch.ops.neuron.swiglu(gate.contiguous(), up.contiguous())
    return _Ops(project, rms_norm, attention, swiglu)


# -- the model -----------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: _Ops):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self._ops = eps, ops

    def forward(self, x):
        return self._ops.rms_norm(x, self.weight, self.eps)


def _rotary_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[max_seq_len, head_dim]`` for rotate-half rotary embeddings."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) / half)
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, ops: _Ops, gen: torch.Generator):
        super().__init__()
        self.cfg, self._ops = cfg, ops
        qkv_out = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self.wqkv = _weight(cfg.dim, qkv_out, cfg.init_std, gen)  # q, k and v in one matmul
        self.wo = _weight(cfg.n_heads * cfg.head_dim, cfg.dim, cfg.init_std, gen)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, s, _ = x.shape
        qkv = self._ops.project(x, self.wqkv)
        kv_width = cfg.n_kv_heads * cfg.head_dim
        q, k, v = qkv.split([cfg.n_heads * cfg.head_dim, kv_width, kv_width], dim=-1)
        q = q.view(b, s, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = self._ops.attention(q, k, v)  # [b, heads, s, head_dim]
        return self._ops.project(out.transpose(1, 2).reshape(b, s, -1), self.wo)


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig, ops: _Ops, gen: torch.Generator):
        super().__init__()
        self._ops, self.ffn_dim = ops, cfg.ffn_dim
        self.w_gate_up = _weight(cfg.dim, 2 * cfg.ffn_dim, cfg.init_std, gen)  # one matmul
        self.w_down = _weight(cfg.ffn_dim, cfg.dim, cfg.init_std, gen)

    def forward(self, x):
        gate, up = self._ops.project(x, self.w_gate_up).split(self.ffn_dim, dim=-1)
        return self._ops.project(self._ops.swiglu(gate, up), self.w_down)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, ops: _Ops, gen: torch.Generator):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, ops)
        self.attn = Attention(cfg, ops, gen)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps, ops)
        self.mlp = SwiGLU(cfg, ops, gen)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


def _weight(fan_in: int, fan_out: int, std: float, gen: torch.Generator) -> nn.Parameter:
    """A ``[in, out]`` projection weight (the layout ``x @ w`` and ``neuron.matmul`` take)."""
    return nn.Parameter(torch.randn(fan_in, fan_out, generator=gen) * std)


class Llama(nn.Module):
    """Token ids ``[B, S]`` -> next-token logits ``[B, S, vocab_size]``.

    Parameters are drawn from a generator seeded with ``seed``, in one fixed order, so the
    plain and the kernel model start bit-identical.
    """

    def __init__(self, cfg: LlamaConfig, kernels: bool = False, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.pieces = kernel_pieces(kernels)
        ops = _ops(self.pieces)
        self._ops = ops
        gen = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(cfg.vocab_size, cfg.dim, generator=gen) * 1.0)
        self.blocks = nn.ModuleList(Block(cfg, ops, gen) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, ops)
        self.w_out = _weight(cfg.dim, cfg.vocab_size, 1 / math.sqrt(cfg.dim), gen)
        cos, sin = _rotary_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        s = tokens.shape[1]
        if s > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {s} exceeds max_seq_len {self.cfg.max_seq_len}")
        x = F.embedding(tokens, self.embed)
        cos, sin = self.cos[:s], self.sin[:s]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self._ops.project(self.norm(x), self.w_out)


def make_optimizer(model: Llama, lr: float, weight_decay: float):
    """AdamW for the plain model; ``FusedAdamW`` (a drop-in) when the setting chose kernels."""
    params = list(model.parameters())
    kwargs = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    if model.pieces["optimizer"].kernel:
        return _fused_adamw()(params, **kwargs)
    return torch.optim.AdamW(params, **kwargs)
