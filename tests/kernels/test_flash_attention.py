"""Flash attention forward: what is the op's own beyond the contract suite.

Properties against the fp64 reference over GQA shapes, remainder tiles, head dims, causal
both ways, scales and dtypes; fully masked rows; large logits; the error against PyTorch's
own SDPA at the same dtype; causal tile skipping (instruction counts, trace-only); the
plan's budgets against the interpreter's measured peaks.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import TARGETS
from neuron_kernels.kernels import Tolerance
from neuron_kernels.kernels import attention_contract as attn_contract
from neuron_kernels.kernels import flash_attention as fa
from neuron_kernels.kernels import flash_attention_plan as fa_plan
from neuron_kernels.kernels.spec import dtype_name
from neuron_kernels.verification import assert_within_tolerance, interpreter_runner_for, run_kernel

FWD = fa.FWD_SPEC
EDGES = (1, 127, 128, 129, 513)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _inputs(b, h, hkv, sq, sk, d, dtype, seed=0, std=1.0):
    g = torch.Generator().manual_seed(seed)
    t = DTYPES[dtype]
    q = (torch.randn(b, h, sq, d, generator=g) * std).to(t)
    k = (torch.randn(b, hkv, sk, d, generator=g) * std).to(t)
    v = torch.randn(b, hkv, sk, d, generator=g).to(t)
    return q, k, v


def _tolerance(dtype, scale, d):
    """The declared tolerance, written for logits O(1) (the default scale, N(0, 1) inputs),
    widened by the logits' size |scale| * sqrt(D) when a larger scale is drawn: a logit's
    fp32 rounding error, and so the relative error of its weight, grows with its magnitude
    (PyTorch's own fp32 SDPA has the same growth)."""
    tol = FWD.tolerances[dtype]
    f = max(1.0, abs(attn_contract.resolve_scale(scale, d)) * math.sqrt(d))
    return Tolerance(tol.atol * f, tol.rtol * f, f"{tol.reason}, x{f:.3g} for the logit size")


def _check(q, k, v, causal, scale, config=None, context="", strict=False):
    out = run_kernel(FWD, (q, k, v, causal, scale), config)
    ref = attn_contract.attention_reference(q, k, v, causal, scale)
    tol = _tolerance(dtype_name(q), None if strict else scale, q.shape[-1])
    assert_within_tolerance(
        out, ref, tol, f"[{tuple(q.shape)} {tuple(k.shape)} {causal} {scale} {context}]"
    )
    return out, ref


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 2),
    hkv=st.integers(1, 2),
    groups=st.sampled_from([1, 2, 4]),
    sq=st.one_of(st.sampled_from(EDGES), st.integers(1, 600)),
    sk=st.one_of(st.sampled_from(EDGES), st.integers(1, 600)),
    d=st.one_of(
        st.sampled_from(attn_contract.SUPPORTED_HEAD_DIMS),
        st.integers(1, attn_contract.MAX_HEAD_DIM),
    ),
    causal=st.booleans(),
    scale=st.one_of(st.none(), st.floats(-2.0, 2.0, allow_nan=False)),
    dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_forward_matches_fp64_reference(b, hkv, groups, sq, sk, d, causal, scale, dtype, seed):
    """out and lse within the declared tolerance of the fp64 reference, GQA/MQA included."""
    if sq * sk * d * groups * hkv * b > 2**23:  # keep each example interpreter-sized
        sq = min(sq, 129)
    q, k, v = _inputs(b, hkv * groups, hkv, sq, sk, d, dtype, seed)
    _check(q, k, v, causal, scale)


@pytest.mark.parametrize("d", attn_contract.SUPPORTED_HEAD_DIMS)
def test_named_head_dims(d):
    """Every head dim the README names, one and two contraction tiles, in bf16."""
    q, k, v = _inputs(1, 2, 1, 130, 200, d, "bfloat16", seed=d)
    _check(q, k, v, True, None)


@pytest.mark.parametrize("sq,sk", [(64, 300), (300, 64), (129, 1), (1, 129)])
def test_causal_aligns_bottom_right(sq, sk):
    """Sq < Sk: every row sees a prefix ending Sk - Sq past its index. Sq > Sk: the first
    Sq - Sk rows see no key and give exactly out = 0 and lse = -inf (never NaN)."""
    q, k, v = _inputs(1, 2, 1, sq, sk, 32, "float32", seed=sq + sk)
    (out, lse), _ = _check(q, k, v, True, None)
    dead = max(0, sq - sk)
    assert torch.equal(out[:, :, :dead], torch.zeros_like(out[:, :, :dead]))
    assert torch.isneginf(lse[:, :, :dead]).all()
    assert torch.isfinite(lse[:, :, dead:]).all() and torch.isfinite(out).all()
    # Row i sees j <= i + (Sk - Sq): the last row sees every key, as non-causal does.
    full = attn_contract.attention_reference(q, k, v, False, None)[0]
    torch.testing.assert_close(out[:, :, -1].double(), full[:, :, -1], atol=1e-5, rtol=1e-5)


def test_sk_zero_gives_zeros_and_neg_inf():
    q, k, v = _inputs(1, 2, 1, 5, 0, 16, "float32")
    out, lse = torch.ops.neuron.flash_attention_fwd(q, k, v)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_large_logits_do_not_overflow():
    """Scale 10 and values ~1e2 (scores ~1e6): finite, and within the fp32 tolerance."""
    q, k, v = _inputs(1, 2, 1, 130, 260, 64, "float32", seed=3, std=100.0)
    for causal in (False, True):
        # One-hot softmax: held to the declared (unwidened) tolerance.
        (out, lse), _ = _check(q, k, v, causal, 10.0, strict=True)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_negative_and_zero_scale():
    """A negative scale takes the row min; scale 0 is a uniform average over visible keys."""
    q, k, v = _inputs(1, 1, 1, 70, 140, 16, "float32", seed=5)
    for scale in (-0.5, 0.0):
        _check(q, k, v, True, scale)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_error_at_most_twice_pytorch_sdpa(dtype):
    """At the same dtype and inputs, the kernel's max error against fp64 is at most 2x that
    of torch.nn.functional.scaled_dot_product_attention (FlashAttention's own criterion)."""
    q, k, v = _inputs(1, 4, 2, 256, 384, 64, dtype, seed=11)
    for causal in (False, True):
        out = run_kernel(FWD, (q, k, v, causal, None))[0]
        ref = attn_contract.attention_reference(q, k, v, causal, None)[0]
        mask = attn_contract.causal_visible(256, 384) if causal else None
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        ours_err = (out.double() - ref).abs().max().item()
        torch_err = (theirs.double() - ref).abs().max().item()
        assert ours_err <= 2 * torch_err, (dtype, causal, ours_err, torch_err)


@pytest.mark.parametrize(
    "config",
    [
        fa_plan.FlashAttentionConfig(
            k_tile=128, kv_block=512, load_transpose="dma", p_transpose="vector"
        ),
        fa_plan.FlashAttentionConfig(k_tile=256, kv_block=512, load_transpose="strided"),
    ],
    ids=["streamed-dma-vector", "streamed-strided"],
)
def test_streamed_kv_blocks(config):
    """Sk larger than kv_block: K/V streamed per query tile, the online softmax spans blocks."""
    q, k, v = _inputs(1, 2, 1, 150, 1100, 96, "bfloat16", seed=7)
    _check(q, k, v, True, None, config)
    _check(q, k, v, False, 0.3, config)


@pytest.mark.parametrize("softmax", ["two_pass", "online"])
def test_both_softmax_modes_with_resident_kv(softmax):
    """K/V resident: the two-pass and the online softmax both match the reference, causal
    with Sq < Sk (a diagonal crossing key tiles mid-chunk) and GQA with remainder tiles."""
    config = fa_plan.FlashAttentionConfig(softmax=softmax)
    q, k, v = _inputs(1, 4, 2, 200, 777, 96, "bfloat16", seed=3)
    _check(q, k, v, True, None, config)
    _check(q, k, v, False, -0.2, config)


def test_forward_is_deterministic():
    q, k, v = _inputs(1, 2, 1, 130, 260, 64, "bfloat16", seed=1)
    first = run_kernel(FWD, (q, k, v, True, None))
    second = run_kernel(FWD, (q, k, v, True, None))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def _trace(sq, sk, causal, config=None, h=1, d=128):
    runs = []
    args = fa.make_inputs(
        {"b": 1, "h": h, "hkv": 1, "sq": sq, "sk": sk, "d": d, "causal": causal},
        "bfloat16",
        torch.Generator().manual_seed(0),
    )
    FWD.run_kernels(
        *args,
        config=config or FWD.config.default(),
        runner=interpreter_runner_for("trn2", compute=False, runs=runs),
    )
    return runs[0]


def _visible_chunks(sq, sk, k_tile):
    """(key tiles, 128-key chunks, key tiles crossing the diagonal) with a visible key,
    counted independently of the kernel."""
    tiles = chunks = diagonal = 0
    for q0 in range(0, sq, 128):
        last_row = min(sq, q0 + 128) - 1
        horizon = min(sk, last_row + (sk - sq) + 1)  # keys < horizon are visible to some row
        first_horizon = q0 + (sk - sq) + 1  # keys < this are visible to every row
        for k0 in range(0, horizon, k_tile):
            k1 = min(k0 + k_tile, horizon)
            tiles += 1
            chunks += math.ceil((k1 - k0) / 128)
            diagonal += k1 > first_horizon
    return tiles, chunks, diagonal


@pytest.mark.parametrize("softmax", ["two_pass", "online"])
def test_causal_skips_masked_tiles_at_trace_time(softmax):
    """At Sq = Sk = 1024, causal issues no instruction for fully masked tiles: TensorE runs
    one QK^T matmul per visible key tile (two passes: twice) plus, on a tile crossing the
    diagonal, one matmul adding the diagonal's bias in PSUM (attn_tiles.EdgeBias: per pass) and
    one P V matmul per visible 128-key chunk (36 of 64 chunks), and the whole trace
    shrinks accordingly (trace-only runs)."""
    config = fa_plan.FlashAttentionConfig(k_tile=128, softmax=softmax)
    counts = {}
    for causal in (False, True):
        run = _trace(1024, 1024, causal, config)
        tiles, chunks, diagonal = _visible_chunks(1024, 1024, 128) if causal else (64, 64, 0)
        passes = 2 if softmax == "two_pass" else 1
        score_matmuls = passes * (tiles + diagonal)
        assert run.trace.count_by_api()["nisa.nc_matmul"] == score_matmuls + chunks
        counts[causal] = len(run.trace)
    ratio = counts[True] / counts[False]
    # 36/64 = 0.56 of the work; per-query-tile loads and closes and the diagonal masks
    # do not shrink (two passes: a larger share of per-query-tile work, so up to 0.70).
    assert 0.5 <= ratio <= 0.70, counts


def test_plan_bounds_the_measured_peaks():
    """The plan's SBUF bytes and PSUM banks bound what the interpreter measures at the
    benchmark's sequence length (one head, trace-only)."""
    plan = fa_plan.plan(
        {"b": 1, "h": 1, "hkv": 1, "sq": 4096, "sk": 4096, "d": 128},
        "bfloat16",
        FWD.config.default(),
        TARGETS["trn2"],
    )
    run = _trace(512, 4096, False)
    peak = run.memory[0]
    assert peak.sbuf_bytes <= plan.sbuf_bytes and peak.psum_banks <= plan.psum_banks, (peak, plan)


def test_check_rejects_what_the_target_lacks():
    with pytest.raises(LimitError) as err:
        FWD.check(
            FWD.test_problems["probe"],
            "float32",
            fa_plan.FlashAttentionConfig(load_transpose="dma"),
            "trn2",
        )
    assert err.value.arg == "config load_transpose"
    with pytest.raises(LimitError):
        FWD.check(
            FWD.test_problems["probe"],
            "bfloat16",
            fa_plan.FlashAttentionConfig(load_transpose="dma"),
            "trn1",
        )


def test_lse_layout_is_the_backwards():
    q, k, v = _inputs(2, 4, 2, 33, 17, 16, "bfloat16")
    out, lse = torch.ops.neuron.flash_attention_fwd(q, k, v, True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 33)


def test_check_rejects_a_config_over_the_psum_budget():
    """Online softmax: four query tiles in lockstep with the key-tile pipeline hold 2 banks
    each plus the transposes': more than the 8 banks, refused before any kernel runs."""
    config = fa_plan.FlashAttentionConfig(q_group=4, softmax="online")
    with pytest.raises(LimitError) as err:
        FWD.check(FWD.test_problems["probe"], "bfloat16", config, "trn2")
    assert err.value.arg == "PSUM banks" and err.value.value == 10


def test_two_pass_transposes_p_by_dma_on_three_of_four_key_tiles():
    """Two passes at Sq = Sk = 2048, D = 128 (16 query tiles x 4 key tiles of 512,
    trace-only): P^T of 3 of every 4 key tiles by one DMA transpose each (48), the 4th key
    tile's 4 chunks on TensorE (64) beside the q^T and K^T load transposes (16 + 16); no
    running max or rescale (no scalar_tensor_tensor), and P V leaves PSUM once per query
    tile (16 ScalarE copies of [128, D] scaled by 1 / l)."""
    run = _trace(2048, 2048, False, fa_plan.FlashAttentionConfig(p_dma_tiles=3))
    counts = run.trace.count_by_api()
    assert counts["nisa.dma_transpose"] == 48
    assert counts["nisa.nc_transpose"] == 64 + 16 + 16
    assert "nisa.scalar_tensor_tensor" not in counts
    evacuations = 0
    for ins in run.trace.instructions:
        if ins.api == "nisa.activation" and ins.attrs.get("op") == "copy":
            src = ins.reads[0]
            evacuations += src.buffer == "psum" and src.elems_per_partition == 128
    assert evacuations == 16
