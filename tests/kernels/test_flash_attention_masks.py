"""``attn_mask`` and dropout in the flash attention forward and backward kernels (the
contract in the docstring of ``kernels/attention_contract.py``: "attn_mask", "dropout").

Forward out and lse, and backward dq, dk, dv, on the interpreter against the fp64
references with the same mask and the same dropout draw (the torch mirror
``dropout_keep``), held to the tolerances the ops declare (``FWD.tolerances``,
``BWD.tolerances``: a mask only adds to or removes fp32 scores, and dropout multiplies P by
0 or 1 / (1 - p) before the rounding those tolerances already account for, so their
reasons hold unchanged); rows a mask leaves with no key give out 0, lse -inf and zero
gradients, never NaN; the kernels' dropout bits equal the mirror's exactly.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import TARGETS
from neuron_kernels.kernels import attention_contract as attn_contract
from neuron_kernels.kernels import flash_attention as fa
from neuron_kernels.kernels import flash_attention_bwd as fab
from neuron_kernels.kernels import flash_attention_plan as fa_plan
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.verification import InterpreterRunner, assert_within_tolerance, run_kernel

FWD, BWD = fa.FWD_SPEC, fab.SPEC
SEQS = (1, 100, 128, 129, 200)
# Mask shapes by the dims they keep (the rest 1, or dropped on the left): the full mask,
# a padding mask [B, 1, 1, Sk], a per-head [1, H, Sq, Sk], a 2-d [Sq, Sk], a 1-d [Sk].
MASK_DIMS = ("bhqk", "b11k", "1hqk", "qk", "k")


def _mask(dims, kind, b, h, sq, sk, g, dead_rows=True):
    """A mask over ``dims`` (the other dims 1; "qk" and "k" are 2-d and 1-d): bool True at
    probability 0.7, or float N(0, 2^2) with -inf at probability 0.3; with ``dead_rows``
    (when it has a query dim) row 0 and, if there is one, row Sq - 1 fully masked."""
    sizes = {"b": b, "h": h, "q": sq, "k": sk}
    shape = [sizes.get(c, 1) for c in dims]
    u = torch.rand(shape, generator=g)
    if kind == "bool":
        m = u < 0.7
        if dead_rows and "q" in dims:
            m[..., 0, :] = False
            m[..., sq - 1, :] = False
        return m
    z = torch.randn(shape, generator=g) * 2.0
    m = torch.where(u < 0.3, torch.full_like(z, float("-inf")), z)
    if dead_rows and "q" in dims:
        m[..., 0, :] = float("-inf")
        m[..., sq - 1, :] = torch.finfo(torch.float32).min  # HF's "masked": <= -1e30 masks
    return m


def _qkv(b, h, hkv, sq, sk, d, dtype, g):
    t = getattr(torch, dtype)
    return (
        torch.randn(b, h, sq, d, generator=g).to(t),
        torch.randn(b, hkv, sk, d, generator=g).to(t),
        torch.randn(b, hkv, sk, d, generator=g).to(t),
    )


def _fwd_args(draw, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    b, h, hkv, sq, sk, causal, left, dims, kind, p = draw
    q, k, v = _qkv(b, h, hkv, sq, sk, 16, dtype, g)
    mask = _mask(dims, kind, b, h, sq, sk, g)
    if kind == "float":
        mask = mask.to(q.dtype if seed % 2 else torch.float32)  # q's dtype or fp32
    window = None if left < 0 else (left, -1)
    drop_seed = torch.randint(0, 2**62, (2,), generator=g) if p else None
    return (q, k, v, causal, None, window, 0.0, None, mask, p, drop_seed)


_DRAWS = st.tuples(
    st.sampled_from([1, 2]),  # b
    st.sampled_from([2, 4]),  # h
    st.sampled_from([1, 2]),  # hkv (GQA when < h)
    st.sampled_from(SEQS),
    st.sampled_from(SEQS),
    st.booleans(),  # causal
    st.sampled_from([-1, 0, 64, 129]),  # window left side (-1: none)
    st.sampled_from(MASK_DIMS),
    st.sampled_from(["bool", "float"]),
    st.sampled_from([0.0, 0.0, 0.25]),  # dropout_p
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    draw=_DRAWS,
    softmax=st.sampled_from(["two_pass", "online"]),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_mask_forward_matches_fp64_reference(draw, softmax, dtype, seed):
    """out and lse within FWD's tolerance of the fp64 reference with the same mask (bool
    and float with -inf, every broadcast shape, whole rows masked) and dropout draw,
    combined with causal and a window, GQA, Sq != Sk, both softmaxes."""
    args = _fwd_args(draw, dtype, seed)
    out = run_kernel(FWD, args, fa_plan.FlashAttentionConfig(softmax=softmax))
    ref = FWD.reference(*args, upcast=True)
    assert_within_tolerance(out, ref, FWD.tolerances[dtype], f"[{draw} {softmax} {dtype}]")
    assert not torch.isnan(out[0]).any() and not torch.isnan(out[1]).any()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draw=_DRAWS, dtype=st.sampled_from(["float32", "bfloat16"]), seed=st.integers(0, 2**16))
def test_mask_backward_matches_fp64_reference(draw, dtype, seed):
    """dq, dk, dv within BWD's tolerance of the closed-form fp64 reference with the same
    mask and the same (replayed) dropout draw."""
    fargs = _fwd_args(draw, dtype, seed)
    q = fargs[0]
    out, lse = attn_contract.attention_reference(*fargs, upcast=True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.dtype)
    args = (dout, *fargs[:3], out.to(q.dtype), lse.float(), *fargs[3:])
    grads = run_kernel(BWD, args)
    ref = BWD.reference(*args, upcast=True)
    assert_within_tolerance(grads, ref, BWD.tolerances[dtype], f"[{draw} {dtype}]")


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zeros_and_minus_inf(kind):
    """Rows the mask leaves with no key (bool False, or -inf / fp32 min entries): out = 0,
    lse = -inf, dq = 0 and nothing added to dk/dv (the contract's fully masked rows)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = _qkv(1, 2, 1, 130, 70, 16, "float32", g)
    mask = _mask("b1qk", kind, 1, 2, 130, 70, g)  # rows 0 and 129 fully masked
    args = (q, k, v, False, None, None, 0.0, None, mask)
    out, lse = run_kernel(FWD, args)
    for row in (0, 129):
        assert torch.equal(out[:, :, row], torch.zeros_like(out[:, :, row]))
        assert torch.isneginf(lse[:, :, row]).all()
    assert torch.isfinite(lse[:, :, 1:129]).all()
    dout = torch.randn(q.shape, generator=g)
    dq, dk, dv, _ = run_kernel(BWD, (dout, q, k, v, out, lse, *args[3:]))
    assert (dq[:, :, 0] == 0).all() and (dq[:, :, 129] == 0).all()
    # dk/dv equal those with the dead rows' dout zeroed: they contribute nothing.
    dout0 = dout.clone()
    dout0[:, :, [0, 129]] = 0
    _, dk0, dv0, _ = run_kernel(BWD, (dout0, q, k, v, out, lse, *args[3:]))
    assert torch.equal(dk, dk0) and torch.equal(dv, dv0)


def test_dropout_bits_equal_the_mirror():
    """q = 0 makes every weight 1 / Sk and V = I (Sk = D) puts key j's weight in column j,
    so ``out * Sk * (1 - p)`` is the kernel's keep mask: it equals ``dropout_keep``
    exactly (both softmaxes, rows of several query tiles and heads)."""
    sk = d = 64
    b, h, sq, p = 2, 3, 200, 0.3
    q = torch.zeros(b, h, sq, d)
    v = torch.eye(sk).expand(b, 1, sk, d).contiguous()
    k = torch.randn(b, 1, sk, d)
    seed = torch.tensor([2**40 + 5, 17])
    want = attn_contract.dropout_keep(seed, p, b, h, sq, sk)
    assert 0.6 < want.float().mean() < 0.8  # about 1 - p kept
    for softmax in ("two_pass", "online"):
        config = fa_plan.FlashAttentionConfig(softmax=softmax)
        out, _ = run_kernel(FWD, (q, k, v, False, None, None, 0.0, None, None, p, seed), config)
        torch.testing.assert_close(out * sk * (1 - p), want.float(), atol=1e-5, rtol=0)


def test_dropout_seed_determinism_through_the_op():
    """Through ``torch.ops.neuron.flash_attention`` (no seed: drawn on q's device from
    torch's default generator, saved for the backward): the same torch seed gives
    identical out and gradients, a different one different out; the kernels on the
    interpreter and the reference math draw the same mask (results within tolerance)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = _qkv(1, 2, 1, 70, 90, 16, "float32", g)
    mask = _mask("k", "bool", 1, 2, 70, 90, g)

    def run(torch_seed, mode):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        torch.manual_seed(torch_seed)
        with cpu_mode(mode):
            out = torch.ops.neuron.flash_attention(*leaves, True, None, None, 0.0, None, mask, 0.4)
            out.square().sum().backward()
        return [out.detach()] + [t.grad for t in leaves]

    first, again, other = run(0, "interpret"), run(0, "interpret"), run(1, "interpret")
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.allclose(first[0], other[0])
    reference = run(0, "reference")
    assert_within_tolerance(first[0], reference[0], FWD.tolerances["float32"], "[out]")
    assert_within_tolerance(first[1:], reference[1:], BWD.tolerances["float32"], "[grads]")


def test_mask_is_read_at_its_given_size():
    """A [B, 1, 1, Sk] padding mask reaches the kernels at that size, even when given as an
    expanded view: the broadcast dims are read with stride 0, never materialised."""
    g = torch.Generator().manual_seed(3)
    q, k, v = _qkv(2, 4, 2, 130, 200, 16, "float32", g)
    pad = torch.rand(2, 1, 1, 200, generator=g) < 0.6
    seen = []

    class Recording(InterpreterRunner):
        def __call__(self, kernel, *args, **kwargs):
            seen.append([a for a in args if isinstance(a, torch.Tensor)])
            return super().__call__(kernel, *args, **kwargs)

    expanded = pad.expand(2, 4, 130, 200)
    args = (q, k, v, False, None, None, 0.0, None, expanded)
    out = FWD.run_kernels(*args, config=FWD.config.default(), runner=Recording())
    mask_arg = seen[0][3]
    assert tuple(mask_arg.shape) == (2, 1, 1, 200) and mask_arg.dtype == torch.uint8
    assert_within_tolerance(out, FWD.reference(*args), FWD.tolerances["float32"], "[pad]")


def test_float_mask_requiring_grad_is_refused():
    """The mask's gradient is not computed: a float attn_mask that requires grad is one
    LimitError naming it (README, attention section), before any work."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (t.requires_grad_(True) for t in _qkv(1, 2, 1, 8, 8, 16, "float32", g))
    mask = torch.zeros(8, 8, requires_grad=True)
    with pytest.raises(LimitError) as err:
        torch.ops.neuron.flash_attention(q, k, v, False, None, None, 0.0, None, mask)
    assert err.value.arg == "attn_mask" and err.value.op == "flash_attention"
    with pytest.raises(LimitError) as err:
        torch.ops.neuron.flash_attention_fwd(q, k, v, False, None, None, 0.0, None, mask)
    assert err.value.arg == "attn_mask"
    with torch.no_grad():  # no autograd: nothing to refuse
        torch.ops.neuron.flash_attention(q, k, v, False, None, None, 0.0, None, mask)


def _combined(name, g):
    """Mask and dropout with main's features (sinks, softcap, window) on one problem: 3
    query tiles over 1100 keys (3 key tiles: softcap's max bursts span several)."""
    b, h, hkv, sq, sk = 1, 2, 1, 300, 1100
    q, k, v = _qkv(b, h, hkv, sq, sk, 16, "float32", g)
    sinks = torch.randn(h, generator=g) * 2.0
    bool_mask = _mask("1hqk", "bool", b, h, sq, sk, g)  # rows 0 and Sq - 1 see nothing
    float_mask = _mask("bhqk", "float", b, h, sq, sk, g)
    pad = _mask("b11k", "bool", b, h, sq, sk, g)
    seed = torch.tensor([3, 9])
    no_sink = torch.full((h,), float("-inf"))
    cases = {
        "sinks, bool mask with dead rows": (True, None, 0.0, sinks, bool_mask, 0.0, None),
        "sinks -inf, bool mask with dead rows": (True, None, 0.0, no_sink, bool_mask, 0.0, None),
        "sinks, softcap, float mask": (False, None, 30.0, sinks, float_mask, 0.0, None),
        "softcap, window, bool mask": (True, (200, 0), 20.0, None, bool_mask, 0.0, None),
        "sinks, padding mask, dropout": (True, None, 0.0, sinks, pad, 0.2, seed),
        "sinks, softcap, window, dropout": (True, (300, 0), 30.0, sinks, None, 0.1, seed),
        # above the backward's SOFTPLUS_SOFTCAP_MAX (fp32 64): its t = tanh(y) form
        "softcap 100, window, dropout": (True, (300, 0), 100.0, None, None, 0.1, seed),
    }
    causal, window, softcap, sinks, mask, p, seed = cases[name]
    return (q, k, v, causal, None, window, softcap, sinks, mask, p, seed)


@pytest.mark.parametrize(
    "name",
    [
        "sinks, bool mask with dead rows",
        "sinks -inf, bool mask with dead rows",
        "sinks, softcap, float mask",
        "softcap, window, bool mask",
        "sinks, padding mask, dropout",
        "sinks, softcap, window, dropout",
        "softcap 100, window, dropout",
    ],
)
def test_mask_and_dropout_combine_with_sinks_softcap_and_window(name):
    """The mask and dropout with attention sinks, a softcap and a window (the contract in
    kernels/flash_attention.py: the sink joins every row's denominator; "rows ... see
    nothing: out = 0, lse = -inf (sink_h with sinks)"): forward out and lse in both
    softmaxes and backward dq, dk, dv, dsinks within the ops' tolerances of the fp64
    references, never NaN; with a finite sink a row the mask leaves with no key has lse =
    its sink."""
    args = _combined(name, torch.Generator().manual_seed(5))
    ref = FWD.reference(*args, upcast=True)
    for softmax in ("two_pass", "online"):
        out = run_kernel(FWD, args, fa_plan.FlashAttentionConfig(softmax=softmax))
        assert_within_tolerance(out, ref, FWD.tolerances["float32"], f"[{name} {softmax}]")
        assert not torch.isnan(out[0]).any() and not torch.isnan(out[1]).any()
    sinks, mask = args[7], args[8]
    if mask is not None and mask.shape[2] > 1:  # rows 0 and Sq - 1: no key
        for row in (0, mask.shape[2] - 1):
            assert torch.equal(out[0][:, :, row], torch.zeros_like(out[0][:, :, row]))
            dead_lse = torch.full((2,), float("-inf")) if sinks is None else sinks.float()
            assert torch.equal(out[1][0, :, row], dead_lse)
    q = args[0]
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))
    o, lse = attn_contract.attention_reference(*args, upcast=True)
    bargs = (dout, *args[:3], o.float(), lse.float(), *args[3:])
    grads = run_kernel(BWD, bargs)
    assert grads[3].shape == (0,) if sinks is None else grads[3].shape == sinks.shape
    ref_grads = BWD.reference(*bargs, upcast=True)
    assert_within_tolerance(grads, ref_grads, BWD.tolerances["float32"], f"[{name} bwd]")


def test_varlen_plans_refuse_mask_and_dropout():
    """Run-time key bounds and packed rows (the varlen ops' plans) take no mask and no
    dropout: both plans refuse the combination naming the argument (kernels/
    flash_attention.py, "The mask and dropout are BHSD-only")."""
    fwd = {"b": 1, "h": 2, "hkv": 1, "sq": 128, "sk": 128, "d": 16, "causal": True}
    bwd = {"b": 1, "hkv": 1, "groups": 2, "sq": 128, "sk": 128, "d": 16, "causal": True}
    for spec, base in ((FWD, fwd), (BWD, bwd)):
        for varlen in ({"runtime_bounds": True, "packed": True}, {"packed": True}):
            for feature, arg in (({"mask": "bool", "mask_dims": "b11k"}, "attn_mask"),
                                 ({"dropout_p": 0.1}, "dropout_p")):  # fmt: skip
                problem = {**base, **varlen, **feature}
                with pytest.raises(LimitError) as err:
                    spec.plan(problem, "float32", spec.config.default(), TARGETS["trn2"])
                assert err.value.arg == arg and "varlen" in str(err.value)
        spec.plan({**base, "runtime_bounds": True, "packed": True}, "float32",
                  spec.config.default(), TARGETS["trn2"])  # fmt: skip
