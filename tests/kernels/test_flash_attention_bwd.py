"""The flash attention backward kernel on the interpreter: gradients against the fp64
autograd of the attention reference, masked rows, GQA sums, large logits, determinism,
causal tile skipping and the plan's budgets.

Tolerances (chosen before the runs, with their reasons):
- against the fp64 *autograd* truth, fp32: the op's declared fp32 tolerance (the closed form
  and autograd agree to ~1e-12 in fp64, so the kernel's fp32 arithmetic is all that counts);
- at bf16/fp16, the issue's bar: the kernel's max error per gradient is at most 2x the max
  error of PyTorch's own ``scaled_dot_product_attention`` backward at the same dtype on the
  same inputs, plus one output ulp at the gradient's largest magnitude (so a gradient that
  PyTorch happens to get almost exact does not demand more than the output format holds).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import flash_attention_bwd as fab
from neuron_kernels.kernels.attention_contract import attention_reference
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.verification import (
    assert_within_tolerance,
    interpreter_runner_for,
    run_kernel,
)

SPEC = fab.SPEC
ULP = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-24}


def _problem(sq, sk, d=32, hkv=1, groups=1, b=1, causal=False):
    return {"b": b, "hkv": hkv, "groups": groups, "sq": sq, "sk": sk, "d": d, "causal": causal}


def _inputs(problem, dtype="float32", seed=0, scale=None, magnitude=1.0):
    gen = torch.Generator().manual_seed(seed)
    dout, q, k, v, _, _, causal, *_ = SPEC.make_inputs(problem, "float32", gen)
    tdt = getattr(torch, dtype)
    q, k = (q * magnitude).to(tdt), (k * magnitude).to(tdt)
    v, dout = v.to(tdt), dout.to(tdt)
    out, lse = attention_reference(q, k, v, causal, scale, upcast=True)
    return dout, q, k, v, out.to(tdt), lse.float(), causal, scale


def _truth(args):
    """fp64 autograd through the attention reference: the gradients the op approximates."""
    dout, q, k, v, _, _, causal, scale = args[:8]
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out, _ = attention_reference(*leaves, causal, scale, upcast=True)
    out.backward(dout.double())
    return tuple(t.grad for t in leaves)


def _torch_sdpa_grads(args):
    """PyTorch's own SDPA backward at the inputs' dtype (explicit bottom-right mask)."""
    dout, q, k, v, _, _, causal, scale = args[:8]
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    sq, sk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        mask = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
    out = F.scaled_dot_product_attention(
        *leaves, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    out.backward(dout)
    return tuple(t.grad for t in leaves)


def _max_err(got, want):
    return (got.double() - want).abs().max().item() if got.numel() else 0.0


def _check_against_truth(args, grads, context=""):
    grads = grads[:3]  # (dq, dk, dv); dsinks is empty without sinks
    truth = _truth(args)
    dtype = args[1].dtype
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert torch.isfinite(g).all(), f"{name} not finite {context}"
    if dtype == torch.float32:
        assert_within_tolerance(grads, truth, SPEC.tolerances["float32"], context)
        return
    ours = [_max_err(g, t) for g, t in zip(grads, truth)]
    theirs = [_max_err(g, t) for g, t in zip(_torch_sdpa_grads(args), truth)]
    for name, mine, pt, t in zip(("dq", "dk", "dv"), ours, theirs, truth):
        floor = ULP[dtype] * t.abs().max().item()
        assert mine <= 2 * pt + floor, (
            f"{name}: error {mine:.3g} > 2 x PyTorch's {pt:.3g} {context}"
        )


# -- gradients against the fp64 autograd truth ---------------------------------------------

SEQS = [(1, 1), (1, 129), (127, 128), (128, 128), (129, 127), (129, 1), (77, 200)]


@pytest.mark.parametrize("sq,sk", SEQS)
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_gradients_match_autograd(sq, sk, causal):
    args = _inputs(_problem(sq, sk, d=24, causal=causal))
    _check_against_truth(args, run_kernel(SPEC, args), f"[sq={sq} sk={sk} causal={causal}]")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("sq,sk,causal", [(129, 200, True), (200, 129, True), (130, 130, False)])
def test_low_precision_error_is_within_twice_pytorchs(dtype, sq, sk, causal):
    args = _inputs(_problem(sq, sk, d=64, hkv=2, groups=2, causal=causal), dtype, seed=3)
    _check_against_truth(args, run_kernel(SPEC, args), f"[{dtype} sq={sq} sk={sk}]")


@pytest.mark.parametrize("d", [64, 80, 96, 128, 192, 256])
def test_head_dims(d):
    """Every head dim the op names, including two contraction chunks over D (> 128)."""
    args = _inputs(_problem(130, 70, d=d, causal=True), "bfloat16", seed=d)
    _check_against_truth(args, run_kernel(SPEC, args), f"[d={d}]")


def test_gqa_and_mqa_sum_over_the_query_heads():
    """dk/dv of a KV head are the sums over its query heads (GQA 4:2 and MQA 6:1, B=2)."""
    for hkv, groups in ((2, 2), (1, 6)):
        args = _inputs(_problem(65, 90, d=16, hkv=hkv, groups=groups, b=2, causal=True), seed=5)
        _check_against_truth(args, run_kernel(SPEC, args), f"[hkv={hkv} groups={groups}]")


def test_fully_masked_rows_get_zero_dq_and_add_nothing():
    """Causal with Sq > Sk: the first Sq - Sk rows see no key (lse = -inf); their dq is
    exactly 0 and dk/dv equal those of the visible rows alone."""
    sq, sk = 300, 40
    args = _inputs(_problem(sq, sk, d=16, groups=2, causal=True), seed=7)
    assert torch.isinf(args[5][:, :, : sq - sk]).all()
    dq, dk, dv, _ = run_kernel(SPEC, args)
    assert (dq[:, :, : sq - sk] == 0).all()
    _check_against_truth(args, (dq, dk, dv), "[masked rows]")
    visible = [a[:, :, sq - sk :] if i in (0, 1, 4, 5) else a for i, a in enumerate(args)]
    _, dk_vis, dv_vis, _ = run_kernel(SPEC, tuple(visible))
    assert_within_tolerance((dk, dv), (dk_vis, dv_vis), SPEC.tolerances["float32"], "[visible]")


def test_large_logits_stay_finite_and_accurate():
    """Scale 10 and q, k entries ~1e2 (logits ~1e6): nothing overflows, and the error is
    within 2x PyTorch's fp32 SDPA error plus the fp32 ulp of the logits the lse carries."""
    args = _inputs(_problem(40, 50, d=16, causal=True), scale=10.0, magnitude=100.0, seed=9)
    grads = run_kernel(SPEC, args)
    truth = _truth(args)
    theirs = _torch_sdpa_grads(args)
    for name, g, t, pt in zip(("dq", "dk", "dv"), grads, truth, theirs):
        assert torch.isfinite(g).all(), name
        assert _max_err(g, t) <= 2 * _max_err(pt, t) + 1e-6 * t.abs().max().item(), name


def test_kernel_matches_its_closed_form_reference_for_every_loop_order_and_transpose():
    """Every valid config gives the closed-form gradients on a causal GQA problem with
    remainders on both axes and two query passes (q_block=4 covers 512 rows)."""
    problem = _problem(600, 200, d=40, hkv=1, groups=2, causal=True)
    args = _inputs(problem, "bfloat16", seed=11)
    ref = SPEC.reference(*args, upcast=True)
    for config in SPEC.config.all_configs():
        if config.q_block != 4 or not SPEC.is_valid(problem, "bfloat16", config, "trn2"):
            continue
        out = run_kernel(SPEC, args, config, target="trn2")
        assert_within_tolerance(out, ref, SPEC.tolerances["bfloat16"], f"[{config}]")


def test_several_key_blocks_and_passes_prefetch_correctly():
    """Key blocks prefetched across several blocks per pass and into the next pass (11 key
    tiles of 64 in blocks of 4, two query passes per query head, two heads, causal Sq < Sk)."""
    problem = _problem(600, 700, d=32, hkv=1, groups=2, causal=True)
    args = _inputs(problem, "float32", seed=19)
    truth = _truth(args)
    for config in (
        SPEC.config(tile_k=64, q_block=4),
        SPEC.config(tile_k=64, q_block=4, kv_block=1, elementwise="balanced"),
        SPEC.config(tile_k=64, q_block=4, loop_order="q_outer"),
    ):
        out = run_kernel(SPEC, args, config)[:3]
        assert_within_tolerance(out, truth, SPEC.tolerances["float32"], f"[{config}]")


def test_two_runs_are_bitwise_equal():
    """Deterministic: the same inputs and config give bitwise identical gradients."""
    args = _inputs(_problem(200, 260, d=32, hkv=2, groups=2, causal=True), "bfloat16", seed=13)
    for config in (
        SPEC.config.default(),
        SPEC.config(loop_order="q_outer", transpose="vector", tile_k=64, q_block=4),
    ):
        first = run_kernel(SPEC, args, config)
        second = run_kernel(SPEC, args, config)
        for a, b in zip(first, second):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), config


def test_causal_skips_about_half_the_instructions():
    """At Sq = Sk = 1024 (8 x 8 tile pairs), causal issues matmuls for the 36 pairs on or
    below the diagonal only, and about half the instructions overall (the per-tile loads
    and stores are not halved): fully masked pairs issue nothing. Trace-only runs."""
    counts, matmuls = {}, {}
    for causal in (False, True):
        args = _inputs(_problem(1024, 1024, d=64, causal=causal), "bfloat16")
        runs = []
        SPEC.run_kernels(
            *args,
            config=SPEC.config.default(),
            runner=interpreter_runner_for("trn2", compute=False, runs=runs),
        )
        counts[causal] = len(runs[0].trace)
        matmuls[causal] = runs[0].trace.count_by_api()["nisa.nc_matmul"]
    assert matmuls[True] * 64 == matmuls[False] * 36, matmuls
    assert 0.5 <= counts[True] / counts[False] <= 0.7, counts


def test_plan_bounds_the_measured_sbuf_and_psum_peaks():
    """The plan's SBUF bytes and PSUM banks bound what the interpreter measures live."""
    for config in (
        SPEC.config.default(),
        SPEC.config(loop_order="q_outer", transpose="dma", tile_k=64, q_block=4),
    ):
        problem = _problem(700, 300, d=160, hkv=1, groups=2, causal=True)
        args = _inputs(problem, "bfloat16")
        runs = []
        SPEC.run_kernels(
            *args, config=config, runner=interpreter_runner_for("trn2", compute=False, runs=runs)
        )
        tiles = SPEC.check(problem, "bfloat16", config, "trn2")
        peak = runs[0].memory[0]
        assert peak.sbuf_bytes <= tiles.sbuf_bytes, (config, peak, tiles.sbuf_bytes)
        assert peak.psum_banks <= tiles.psum_banks, (config, peak, tiles.psum_banks)


def test_check_refuses_over_budget_configs_before_any_kernel_runs():
    """A key sequence whose fp32 dK/dV sums overflow SBUF is refused by spec.check, naming
    the budget; DMA transposes are refused for fp32 and on trn1."""
    big = _problem(128, 65536, d=256)
    with pytest.raises(LimitError) as err:
        SPEC.check(big, "bfloat16", SPEC.config.default(), "trn2")
    assert err.value.arg == "SBUF bytes per partition"
    dma = SPEC.config(transpose="dma")
    for dtype, target in (("float32", "trn2"), ("bfloat16", "trn1")):
        with pytest.raises(LimitError) as err:
            SPEC.check(_problem(128, 128), dtype, dma, target)
        assert err.value.arg == "config transpose"


def test_default_config_budget_at_4096():
    """The default config fits Sq = Sk = 4096, D = 128 (bf16, GQA 4:1) on every target."""
    problem = _problem(4096, 4096, d=128, hkv=8, groups=4)
    for target in ("trn1", "trn2", "trn3"):
        tiles = SPEC.check(problem, "bfloat16", SPEC.config.default(), target)
        assert tiles.sbuf_bytes < 128 * 1024 and tiles.psum_banks <= 7


def test_op_routes_to_the_kernel_and_the_reference():
    """torch.ops.neuron.flash_attention_bwd: interpret mode runs the kernel, reference mode
    the fp32 reference; both agree with the fp64 truth at fp32."""
    args = _inputs(_problem(70, 90, d=16, groups=2, causal=True), seed=17)
    op = torch.ops.neuron.flash_attention_bwd
    with cpu_mode("interpret"):
        kernel = op(*args)
    with cpu_mode("reference"):
        reference = op(*args)
    for grads in (kernel, reference):
        _check_against_truth(args, grads, "[op]")
    for a, b in zip(kernel, run_kernel(SPEC, args)):
        assert torch.equal(a, b)
