"""``neuron_kernels.torch_ops.nn.scaled_dot_product_attention``: a drop-in for torch's."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.errors import LimitError
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.torch_ops.nn import scaled_dot_product_attention as sdpa

# Documented signature of torch.nn.functional.scaled_dot_product_attention (a builtin, so
# inspect cannot read it from torch itself).
TORCH_PARAMETERS = [
    ("query", inspect.Parameter.empty),
    ("key", inspect.Parameter.empty),
    ("value", inspect.Parameter.empty),
    ("attn_mask", None),
    ("dropout_p", 0.0),
    ("is_causal", False),
    ("scale", None),
    ("enable_gqa", False),
]


def _qkv(h=4, hkv=2, sq=40, sk=40, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, h, sq, d, generator=g).to(dtype),
        torch.randn(2, hkv, sk, d, generator=g).to(dtype),
        torch.randn(2, hkv, sk, d, generator=g).to(dtype),
    )


def test_signature_is_torchs():
    params = inspect.signature(sdpa).parameters
    assert [(n, p.default) for n, p in params.items()] == TORCH_PARAMETERS


@pytest.mark.parametrize("mode", ["reference", "interpret"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_matches_torch(mode, is_causal, scale):
    """Same result as torch's SDPA (GQA through enable_gqa) on both CPU routings, fp32."""
    q, k, v = _qkv(sk=40)
    want = F.scaled_dot_product_attention(
        q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True
    )
    with cpu_mode(mode):
        got = sdpa(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_gradients_match_torch():
    q, k, v = _qkv(h=2, hkv=2, sq=20, sk=33)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    theirs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with cpu_mode("interpret"):
        sdpa(*leaves, scale=0.5).square().sum().backward()
    F.scaled_dot_product_attention(*theirs, scale=0.5).square().sum().backward()
    for got, want in zip(leaves, theirs):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-4, rtol=1e-4)


def test_unsupported_features_raise():
    """Head counts that differ without enable_gqa are an error naming it, never a silent
    fallback; so is attn_mask with is_causal (torch's docs: "An error is thrown if both
    attn_mask and is_causal are set")."""
    q, k, v = _qkv()
    with pytest.raises(LimitError) as err:
        sdpa(q, k, v, enable_gqa=False)
    assert err.value.op == "scaled_dot_product_attention" and err.value.arg == "key.shape[1]"
    with pytest.raises(LimitError) as err:
        sdpa(q, k, v, attn_mask=torch.ones(40, 40, dtype=torch.bool), is_causal=True)
    assert err.value.op == "scaled_dot_product_attention" and err.value.arg == "attn_mask"


@pytest.mark.parametrize("mode", ["reference", "interpret"])
@pytest.mark.parametrize("sq, sk", [(20, 40), (40, 20), (33, 33)])
def test_causal_aligns_top_left_as_torch(mode, sq, sk):
    """is_causal with L != S is torch's top-left mask (query i sees key j iff j <= i),
    through the op's window (L > S) or its causal on the first L keys (L < S)."""
    q, k, v = _qkv(sq=sq, sk=sk)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with cpu_mode(mode):
        got = sdpa(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def _masks(b=2, h=4, sq=40, sk=40, seed=1):
    """bool [L, S] with row 3 fully masked; float [B, 1, 1, S] with -inf entries; bool
    [B, H, L, S] (torch's broadcasting rules, True attends)."""
    g = torch.Generator().manual_seed(seed)
    bool_2d = torch.rand(sq, sk, generator=g) < 0.7
    bool_2d[3] = False
    pad = torch.randn(b, 1, 1, sk, generator=g)
    pad[..., : sk // 4] = float("-inf")
    full = torch.rand(b, h, sq, sk, generator=g) < 0.5
    return {"bool_2d": bool_2d, "float_padding": pad, "bool_full": full}


@pytest.mark.parametrize("name", ["bool_2d", "float_padding", "bool_full"])
@pytest.mark.parametrize("mode", ["reference", "interpret"])
def test_masks_match_torch(name, mode):
    """attn_mask as torch takes it (bool True attends, float added, broadcast), a fully
    masked row included (torch gives zeros there too), GQA, L != S; and the gradients."""
    q, k, v = _qkv(sq=40, sk=48)
    mask = _masks(sq=40, sk=48)[name]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    with cpu_mode(mode):
        got = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    if mode == "interpret" and name == "float_padding":
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        theirs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        with cpu_mode(mode):
            sdpa(*leaves, attn_mask=mask, enable_gqa=True).square().sum().backward()
        F.scaled_dot_product_attention(
            *theirs, attn_mask=mask, enable_gqa=True
        ).square().sum().backward()
        for a, b in zip(leaves, theirs):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["reference", "interpret"])
def test_dropout_statistics_and_determinism(mode):
    """torch's RNG differs, so dropout is held to its statistics: with q = 0 (every weight
    1/S) and V = I, each output entry is 0 or 1 / ((1 - p) S), as in torch's SDPA, and the
    kept fraction is within 5 standard deviations of 1 - p in both; the same torch seed
    gives the same output, another seed another one."""
    b, h, sq, sk, p = 2, 2, 64, 32, 0.25
    q = torch.zeros(b, h, sq, sk)
    k = torch.randn(b, h, sk, sk, generator=torch.Generator().manual_seed(0))
    v = torch.eye(sk).expand(b, h, sk, sk)
    kept = 1.0 / ((1 - p) * sk)
    n = b * h * sq * sk
    sigma = (p * (1 - p) / n) ** 0.5
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        with cpu_mode(mode):
            runs.append(sdpa(q, k, v, dropout_p=p))
    torch.manual_seed(0)
    theirs = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    for out in (runs[0], theirs):
        values = torch.where(out.abs() < kept / 2, torch.zeros_like(out), out)
        torch.testing.assert_close(values, (out > kept / 2).float() * kept, atol=1e-6, rtol=0)
        assert abs((out > kept / 2).float().mean().item() - (1 - p)) < 5 * sigma
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_bad_rank_and_head_dim_name_the_argument():
    q, k, v = _qkv()
    with pytest.raises(LimitError) as err:
        sdpa(q[0], k, v)
    assert err.value.arg == "query rank"
    with pytest.raises(LimitError) as err:
        sdpa(q, k, v[..., :8], enable_gqa=True)
    assert err.value.op == "flash_attention" and err.value.arg == "v.shape[3]"


def test_compiles_fullgraph():
    q, k, v = _qkv()
    fn = torch.compile(lambda *t: sdpa(*t, is_causal=True, enable_gqa=True), fullgraph=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(fn(q, k, v), want, atol=2e-5, rtol=2e-5)
