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


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"attn_mask": torch.ones(40, 40, dtype=torch.bool)}, "attn_mask"),
        ({"dropout_p": 0.1}, "dropout_p"),
        ({"enable_gqa": False}, "key.shape[1]"),
    ],
)
def test_unsupported_features_raise(kwargs, arg):
    """What the kernel cannot do yet is an error naming it, never a silent fallback."""
    q, k, v = _qkv()
    with pytest.raises(LimitError) as err:
        sdpa(q, k, v, **kwargs)
    assert err.value.op == "scaled_dot_product_attention" and err.value.arg == arg


def test_causal_with_unequal_lengths_raises():
    """torch aligns such a mask top-left, flash attention bottom-right: refuse, don't guess."""
    q, k, v = _qkv(sq=20, sk=40)
    with pytest.raises(LimitError) as err:
        sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert err.value.arg == "is_causal"
    # Without the mask, unequal lengths are fine.
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(sdpa(q, k, v, enable_gqa=True), want, atol=2e-5, rtol=2e-5)


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
