"""A small Llama-style block whose attention is ``torch.ops.neuron.flash_attention`` trains
on CPU under ``torch.compile(fullgraph=True)`` with the NKI kernels on the interpreter, and
follows the same loss curve as eager reference math."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.torch_ops.nn import scaled_dot_product_attention


class Block(nn.Module):
    """RMSNorm, RoPE, grouped-query causal attention (the neuron op), SwiGLU MLP."""

    def __init__(self, vocab=48, dim=64, heads=4, kv_heads=2, hidden=128):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.attn_norm = nn.RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wkv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.RMSNorm(dim)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.head = nn.Linear(dim, vocab, bias=False)

    def rope(self, x):
        s, half = x.shape[2], self.head_dim // 2
        freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
        angle = torch.arange(s, dtype=torch.float32)[:, None] * freq[None, :]
        cos, sin = angle.cos(), angle.sin()
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, tokens):
        b, s = tokens.shape
        x = self.embed(tokens)
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.wkv(h).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        attn = scaled_dot_product_attention(
            self.rope(q), self.rope(k), v, is_causal=True, enable_gqa=True
        )
        x = x + self.wo(attn.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return self.head(x)


def _train(steps, compiled, mode):
    torch.manual_seed(0)
    model = Block()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 48, (2, 33), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss_fn(inputs, targets):
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    # aot_eager: the whole AOTAutograd path (fake impls, autograd of the custom ops, one
    # graph) without Inductor's C++ build, which alone takes minutes on a loaded 2-core box.
    step_loss = torch.compile(loss_fn, fullgraph=True, backend="aot_eager") if compiled else loss_fn
    losses = []
    with cpu_mode(mode):
        for _ in range(steps):
            opt.zero_grad()
            loss = step_loss(inputs, targets)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_block_trains_under_compile_on_the_interpreter(kernel_launches):
    steps = 4
    losses = _train(steps, compiled=True, mode="interpret")
    eager = _train(steps, compiled=False, mode="reference")
    # Forward and backward attention kernels ran on the interpreter at every step.
    assert len(kernel_launches) >= 2 * steps, kernel_launches
    assert losses[-1] < losses[0] - 0.05, losses
    # fp32 kernels vs fp32 reference math: the same curve to well within a step's change.
    for got, want in zip(losses, eager):
        assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), (losses, eager)
