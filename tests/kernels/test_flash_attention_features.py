"""Sliding window, logit softcap and attention sinks in the flash attention forward and
backward kernels (the contract in the docstring of ``kernels/attention_contract.py``).

Forward out and lse, and backward dq, dk, dv (and dsinks), on the interpreter against the
fp64 references, held to the tolerances the ops declare (``FWD_SPEC.tolerances``,
``BWD.tolerances``: their reasons hold here unchanged, since every feature is computed in
fp32 like the scores it changes); the window's fully masked tiles skipped at trace time
(instruction counts against an independent count of the visible tiles).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_kernels.kernels import attention_contract as attn_contract
from neuron_kernels.kernels import flash_attention as fa
from neuron_kernels.kernels import flash_attention_bwd as fab
from neuron_kernels.kernels import flash_attention_bwd_kernel as fab_kernel
from neuron_kernels.kernels import flash_attention_bwd_plan as fab_plan
from neuron_kernels.kernels import flash_attention_plan as fa_plan
from neuron_kernels.verification import assert_within_tolerance, interpreter_runner_for, run_kernel

FWD, BWD = fa.FWD_SPEC, fab.SPEC
# Window sides at the edges the brief names: 0, 1, the tile edges 127/128/129, wider than
# any sequence drawn here, and -1 (unbounded).
SIDES = (-1, 0, 1, 127, 128, 129, 1000)
SEQS = (1, 127, 128, 129, 200, 300)
DTYPES = ("float32", "bfloat16")


def _fwd_problem(sq, sk, causal, left=-1, right=-1, softcap=0.0, sinks=False, h=2, d=32):
    return {
        "b": 1,
        "h": h,
        "hkv": 1,
        "sq": sq,
        "sk": sk,
        "d": d,
        "causal": causal,
        "window_left": left,
        "window_right": right,
        "softcap": softcap,
        "sinks": sinks,
    }


def _bwd_problem(sq, sk, causal, left=-1, right=-1, softcap=0.0, sinks=False, d=32):
    p = _fwd_problem(sq, sk, causal, left, right, softcap, sinks, d=d)
    del p["h"]
    return {**p, "hkv": 1, "groups": 2}


def _check_fwd(problem, dtype, seed=0, config=None):
    args = FWD.make_inputs(problem, dtype, torch.Generator().manual_seed(seed))
    out = run_kernel(FWD, args, config)
    ref = FWD.reference(*args, upcast=True)
    assert_within_tolerance(out, ref, FWD.tolerances[dtype], f"[{problem} {dtype} {config}]")
    return args, out, ref


def _check_bwd(problem, dtype, seed=0, config=None):
    args = BWD.make_inputs(problem, dtype, torch.Generator().manual_seed(seed))
    grads = run_kernel(BWD, args, config)
    ref = BWD.reference(*args, upcast=True)
    assert_within_tolerance(grads, ref, BWD.tolerances[dtype], f"[{problem} {dtype} {config}]")
    return args, grads, ref


# -- sliding window ----------------------------------------------------------------------


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sq=st.sampled_from(SEQS),
    sk=st.sampled_from(SEQS),
    left=st.sampled_from(SIDES),
    right=st.sampled_from(SIDES),
    causal=st.booleans(),
    softmax=st.sampled_from(["two_pass", "online"]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_window_forward_matches_fp64_reference(sq, sk, left, right, causal, softmax, dtype, seed):
    """out and lse within the declared tolerance: both softmaxes, windows at the tile edges,
    wider than S, one side unbounded, with and without causal, Sq != Sk."""
    problem = _fwd_problem(sq, sk, causal, left, right)
    _check_fwd(problem, dtype, seed, fa_plan.FlashAttentionConfig(softmax=softmax))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sq=st.sampled_from(SEQS),
    sk=st.sampled_from(SEQS),
    left=st.sampled_from(SIDES),
    right=st.sampled_from(SIDES),
    causal=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_window_backward_matches_fp64_reference(sq, sk, left, right, causal, dtype, seed):
    """dq, dk, dv within the declared tolerance of the closed-form fp64 reference."""
    _check_bwd(_bwd_problem(sq, sk, causal, left, right), dtype, seed)


def test_window_streamed_kv_blocks():
    """K/V streamed in blocks (Sk > kv_block): the window's blocks start at its first key."""
    config = fa_plan.FlashAttentionConfig(k_tile=128, kv_block=512)
    _check_fwd(_fwd_problem(300, 1100, True, 300, 0), "bfloat16", 1, config)
    _check_fwd(_fwd_problem(260, 1100, False, 129, 200), "float32", 2, config)


def test_window_gradients_match_autograd_of_the_reference():
    """fp32: the kernel's dq, dk, dv against fp64 autograd through attention_reference."""
    args = BWD.make_inputs(_bwd_problem(200, 260, True, 64, 5), "float32", torch.Generator())
    dout, q, k, v, *_ = args
    grads = run_kernel(BWD, args)[:3]
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out, _ = attn_contract.attention_reference(*leaves, True, None, (64, 5))
    out.backward(dout.double())
    truth = [t.grad for t in leaves]
    assert_within_tolerance(grads, truth, BWD.tolerances["float32"], "[window autograd]")


def test_window_fully_masked_rows():
    """Rows whose window ends before key 0 (Sq > Sk, right bounded) give out = 0, lse = -inf,
    dq = 0; a window of 0 keys either side sees exactly the diagonal key."""
    args, (out, lse), _ = _check_fwd(_fwd_problem(300, 100, False, 3, 5), "float32")
    dead = 300 - 100 - 5  # rows i with i + (Sk - Sq) + 5 < 0
    assert torch.equal(out[:, :, :dead], torch.zeros_like(out[:, :, :dead]))
    assert torch.isneginf(lse[:, :, :dead]).all() and torch.isfinite(lse[:, :, dead:]).all()
    _, (dq, _, _, _), _ = _check_bwd(_bwd_problem(300, 100, False, 3, 5), "float32")
    assert (dq[:, :, :dead] == 0).all()
    q, k, v = args[:3]
    diag = run_kernel(FWD, (q, k, v, False, None, (0, 0)))[0]  # row i sees key i - 200 only
    torch.testing.assert_close(diag[:, :, 200:], v.expand(1, 2, 100, 32))


def _trace(spec, args, config=None):
    runs = []
    spec.run_kernels(
        *args,
        config=config or spec.config.default(),
        runner=interpreter_runner_for("trn2", compute=False, runs=runs),
    )
    return runs[0].trace.count_by_api()


def _visible_tiles(s, left, tile_q, tile_k, align):
    """(query tile, key chunk) pairs some row sees under a causal window of ``left`` keys,
    counted row by row (Sq = Sk = s): key chunks of ``tile_k`` from the first visible key
    rounded down to ``align``."""
    count = 0
    for q0 in range(0, s, tile_q):
        lo = max(0, q0 - left)
        hi = min(s, q0 + tile_q)  # one past the last row's diagonal
        start = lo // align * align
        count += math.ceil((hi - start) / tile_k)
    return count


@pytest.mark.parametrize("softmax", ["two_pass", "online"])
def test_window_skips_masked_tiles_at_trace_time(softmax):
    """Causal window of 256 keys at Sq = Sk = 2048 (16 query tiles, trace-only): the tiles
    no row sees issue nothing. Two passes: P V once per visible 128-key chunk (45, counted
    row by row); per query tile one 384-key span (its keys fit one 512-key tile) whose
    QK^T runs once per pass, plus per pass one bias matmul per 128-key chunk an edge
    crosses (attn_tiles.EdgeBias: the left edge and the diagonal, the diagonal only for the first
    two tiles): 6 per query tile, 4 for the first two. Online (key tiles of 512 from the
    group's first visible chunk): at most the causal count times the visible fraction of
    its keys (45 of 136 chunks) plus one 512-key tile's slack per query tile pair and the
    window's bias matmuls (one per 128-key chunk of a key tile that an edge crosses or
    hides: at most 4 per query tile)."""
    counts = {}
    for left in (256, -1):
        problem = _fwd_problem(2048, 2048, True, left, 0, h=1, d=64)
        args = FWD.make_inputs(problem, "bfloat16", torch.Generator())
        config = fa_plan.FlashAttentionConfig(k_tile=512, softmax=softmax)
        counts[left] = _trace(FWD, args, config)["nisa.nc_matmul"]
    chunks = _visible_tiles(2048, 256, 128, 128, 128)
    assert chunks == 45
    if softmax == "two_pass":
        assert counts[256] == chunks + 14 * 6 + 4 + 4, counts
    else:
        assert counts[256] <= counts[-1] * 45 / 136 + 8 * 4 + 16 * 4, counts


@pytest.mark.parametrize("softmax", ["two_pass", "online"])
def test_window_edges_are_masked_in_psum(softmax):
    """A causal window's edges are a bias matmul in PSUM (attn_tiles.EdgeBias), not a GpSimd pass
    per tile: at Sq = Sk = 2048 with a window of 256 (16 query tiles, each crossed by two
    edges) the forward issues only the affine_selects that build the identity and the
    bias tiles, one per distinct edge offset pair (2 here: the diagonal's, the left
    edge's, each one select; online, whose 512-key tiles start on the K/V block, also
    the all-masked one of chunks before the window), however long the sequence. With a
    softcap the tanh would squash the bias, so its tiles are masked in SBUF per tile and
    edge as before: 16 diagonals and 14 left edges (the first two tiles have none)."""
    problem = _fwd_problem(2048, 2048, True, 256, 0, h=1, d=64)
    args = FWD.make_inputs(problem, "bfloat16", torch.Generator())
    kv_block = 512 if softmax == "online" else 8192
    config = fa_plan.FlashAttentionConfig(k_tile=512, softmax=softmax, kv_block=kv_block)
    counts = _trace(FWD, args, config)
    assert counts["nisa.affine_select"] == 1 + (2 if softmax == "two_pass" else 3), counts
    capped = _fwd_problem(2048, 2048, True, 256, 0, softcap=30.0, h=1, d=64)
    counts = _trace(FWD, FWD.make_inputs(capped, "bfloat16", torch.Generator()), config)
    assert counts["nisa.affine_select"] == 16 + 14, counts


def test_window_backward_skips_masked_pairs_at_trace_time():
    """The backward issues matmuls for the visible (128 x 128) tile pairs only: under a
    causal window of 256 at S = 1024, 21 pairs (counted row by row) of full attention's 64,
    the same number of matmuls per pair."""
    counts = {}
    for window in (None, (256, 0)):
        left = -1 if window is None else window[0]
        problem = _bwd_problem(1024, 1024, window is not None, left, -1 if window is None else 0)
        problem["groups"] = 1
        args = BWD.make_inputs(problem, "bfloat16", torch.Generator())
        counts[window] = _trace(BWD, args)["nisa.nc_matmul"]
    pairs = _visible_tiles(1024, 256, 128, 128, 128)
    assert counts[(256, 0)] * 64 == counts[None] * pairs, (counts, pairs)


# -- logit softcap -----------------------------------------------------------------------


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sq=st.sampled_from(SEQS),
    sk=st.sampled_from(SEQS),
    softcap=st.sampled_from([1.0, 50.0, 1e6, 0.05]),
    causal=st.booleans(),
    left=st.sampled_from(SIDES),
    softmax=st.sampled_from(["two_pass", "online"]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_softcap_forward_matches_fp64_reference(
    sq, sk, softcap, causal, left, softmax, dtype, seed
):
    """Softcaps small (1.0, 0.05: every score capped hard), typical (50, Gemma 2) and huge
    (1e6: tanh near identity), with and without a window, both softmaxes."""
    problem = _fwd_problem(sq, sk, causal, left, -1, softcap=softcap)
    _check_fwd(problem, dtype, seed, fa_plan.FlashAttentionConfig(softmax=softmax))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sq=st.sampled_from(SEQS),
    sk=st.sampled_from(SEQS),
    softcap=st.sampled_from([1.0, 50.0, 1e6]),
    causal=st.booleans(),
    left=st.sampled_from(SIDES),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_softcap_backward_matches_fp64_reference(sq, sk, softcap, causal, left, dtype, seed):
    """dq, dk, dv with d(capped)/ds = 1 - tanh^2, against the closed-form fp64 reference."""
    _check_bwd(_bwd_problem(sq, sk, causal, left, -1, softcap=softcap), dtype, seed)


def test_softcap_caps_the_scores_and_autograd_agrees():
    """With scores ~1e2 and softcap 1, lse is within log(Sk) + 1 of the softcap (every
    capped score is in [-1, 1]); fp32 gradients through the op (the kernels on the
    interpreter) match fp64 autograd through the reference."""
    from neuron_kernels.torch_ops import cpu_mode

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 70, 16, generator=g) for _ in range(3))
    q = q * 30
    out, lse = run_kernel(FWD, (q, k, v, True, None, None, 1.0))
    assert (lse <= 1.0 + math.log(70) + 1e-4).all() and (lse >= -1.0 - 1e-4).all()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with cpu_mode("interpret"):
        got = torch.ops.neuron.flash_attention(*leaves, True, None, [8, 0], 1.0)
    weight = torch.randn(got.shape, generator=g)
    (got * weight).sum().backward()
    ref_leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = attn_contract.attention_reference(*ref_leaves, True, None, (8, 0), 1.0)[0]
    (ref * weight.double()).sum().backward()
    for a, b in zip(leaves, ref_leaves):
        assert_within_tolerance(a.grad, b.grad, BWD.tolerances["float32"], "[softcap grads]")


# -- attention sinks ---------------------------------------------------------------------

# Sink values: -inf (no sink), large positive (the sink takes nearly all the weight), and
# drawn ones (N(0, 2^2), make_inputs).
SINK_VALUES = (None, float("-inf"), 30.0, -3.0)


def _with_sinks(args, at, values, spec):
    """``args`` with the sinks (argument ``at``) set to ``values`` (one per head, cycled)
    when given; the backward's out and lse are recomputed by the fp64 reference."""
    args = list(args)
    if values is not None:
        h = args[at].shape[0]
        args[at] = torch.tensor([values[i % len(values)] for i in range(h)])
    if spec is BWD:
        q, k, v = args[1:4]
        out, lse = attn_contract.attention_reference(q, k, v, args[6], None, *args[8:11])
        args[4], args[5] = out.to(q.dtype), lse.float()
    return tuple(args)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sq=st.sampled_from(SEQS),
    sk=st.sampled_from(SEQS),
    sink=st.sampled_from(SINK_VALUES),
    causal=st.booleans(),
    left=st.sampled_from(SIDES),
    softcap=st.sampled_from([0.0, 30.0]),
    softmax=st.sampled_from(["two_pass", "online"]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_sinks_forward_matches_fp64_reference(
    sq, sk, sink, causal, left, softcap, softmax, dtype, seed
):
    """out and lse (which includes the sink) within the declared tolerance, both softmaxes,
    with windows and softcap; sink values -inf, 30 (large) and drawn."""
    problem = _fwd_problem(sq, sk, causal, left, -1, softcap=softcap, sinks=True)
    args = FWD.make_inputs(problem, dtype, torch.Generator().manual_seed(seed))
    args = _with_sinks(args, 7, None if sink is None else (sink, 0.5), FWD)
    out = run_kernel(FWD, args, fa_plan.FlashAttentionConfig(softmax=softmax))
    ref = FWD.reference(*args, upcast=True)
    assert_within_tolerance(out, ref, FWD.tolerances[dtype], f"[{problem} {sink} {softmax}]")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sq=st.sampled_from(SEQS),
    sk=st.sampled_from(SEQS),
    sink=st.sampled_from(SINK_VALUES),
    causal=st.booleans(),
    left=st.sampled_from(SIDES),
    softcap=st.sampled_from([0.0, 30.0]),
    dtype=st.sampled_from(DTYPES),
    lnc=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_sinks_backward_matches_fp64_reference(
    sq, sk, sink, causal, left, softcap, dtype, lnc, seed
):
    """dq, dk, dv and dsinks (the kernel's per-row parts, summed by the op) within the
    declared tolerance, at LNC 1 and 2 (two batches: a head's rows on both cores)."""
    problem = {**_bwd_problem(sq, sk, causal, left, -1, softcap=softcap, sinks=True), "b": 2}
    args = BWD.make_inputs(problem, dtype, torch.Generator().manual_seed(seed))
    args = _with_sinks(args, 10, None if sink is None else (sink, 0.5), BWD)
    grads = run_kernel(BWD, args, target="trn2", lnc=lnc)
    assert torch.isfinite(grads[3]).all()
    ref = BWD.reference(*args, upcast=True)
    assert_within_tolerance(grads, ref, BWD.tolerances[dtype], f"[{problem} {sink} {lnc}]")


def test_sinks_on_fully_masked_rows():
    """Rows that see no key (causal, Sq > Sk): out = 0 and lse = the head's sink (-inf for a
    sink of -inf); their dsinks part is 0, and every dsinks entry is finite."""
    problem = _fwd_problem(300, 100, True, sinks=True)
    args = _with_sinks(
        FWD.make_inputs(problem, "float32", torch.Generator()), 7, (2.5, float("-inf")), FWD
    )
    out, lse = run_kernel(FWD, args)
    assert torch.equal(out[:, :, :200], torch.zeros_like(out[:, :, :200]))
    assert (lse[0, 0, :200] == 2.5).all() and torch.isneginf(lse[0, 1, :200]).all()
    bwd = _with_sinks(
        BWD.make_inputs(_bwd_problem(300, 100, True, sinks=True), "float32", torch.Generator()),
        10,
        (2.5, float("-inf")),
        BWD,
    )
    grads = run_kernel(BWD, bwd)
    assert torch.isfinite(grads[3]).all() and grads[3][1] == 0
    assert_within_tolerance(grads, BWD.reference(*bwd), BWD.tolerances["float32"], "[dead]")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_autograd_through_the_op_gives_the_references_dsinks(dtype):
    """torch.ops.neuron.flash_attention with sinks (the kernels on the interpreter, forward
    and backward): the gradients of q, k, v and the sinks (returned in the sinks' dtype)
    match fp64 autograd through attention_reference, at the op's declared tolerance."""
    from neuron_kernels.torch_ops import cpu_mode

    g = torch.Generator().manual_seed(7)
    t = getattr(torch, dtype)
    q = torch.randn(1, 4, 150, 32, generator=g).to(t)
    k, v = (torch.randn(1, 2, 170, 32, generator=g).to(t) for _ in range(2))
    sinks = (torch.randn(4, generator=g) * 2).to(t)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, sinks)]
    weight = torch.randn(1, 4, 150, 32, generator=g)
    with cpu_mode("interpret"):
        out = torch.ops.neuron.flash_attention(*leaves[:3], True, None, [100, 0], 20.0, leaves[3])
    (out.float() * weight).sum().backward()
    assert leaves[3].grad.dtype == t and leaves[3].grad.shape == (4,)
    ref_leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v, sinks)]
    ref = attn_contract.attention_reference(
        *ref_leaves[:3], True, None, (100, 0), 20.0, ref_leaves[3]
    )[0]
    (ref * weight.double()).sum().backward()
    # The forward's out is rounded to the dtype before the backward reads it (its D): the
    # backward's declared tolerance covers that (it is the contract suite's autograd bar).
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), leaves, ref_leaves):
        assert_within_tolerance(a.grad, b.grad, BWD.tolerances[dtype], f"[{name} {dtype}]")


def test_wide_window_tiles_split_on_both_edges():
    """k_tile=512 and a window (700, 300) at Sq = Sk = 1100: key tiles split into masked and
    raw runs at both edges (up to 4 extra spans per query tile, within the plan's lead)."""
    config = fa_plan.FlashAttentionConfig(k_tile=512, softmax="two_pass")
    _check_fwd(_fwd_problem(1100, 1100, False, 700, 300, h=1), "float32", 3, config)
    _check_fwd(_fwd_problem(1100, 1100, False, 700, 300, 20.0, h=1), "bfloat16", 4, config)


@pytest.mark.parametrize("spec", [FWD, BWD], ids=["forward", "backward"])
def test_plans_bound_the_measured_peaks_with_every_feature(spec):
    """With a window, softcap (the forward's tanh bursts and the backward's key-block tanh
    tiles) and sinks, the plan's SBUF bytes and PSUM banks bound what the interpreter
    measures (trace-only)."""
    if spec is FWD:
        problem = _fwd_problem(512, 4096, True, 1024, -1, 50.0, True, h=2, d=128)
    else:
        problem = {**_bwd_problem(1024, 1024, True, 300, -1, 50.0, True, d=128), "groups": 2}
    args = spec.make_inputs(problem, "bfloat16", torch.Generator())
    runs = []
    spec.run_kernels(
        *args,
        config=spec.config.default(),
        runner=interpreter_runner_for("trn2", compute=False, runs=runs),
    )
    plan = spec.check(spec.problem(*args), "bfloat16", spec.config.default(), "trn2")
    peak = runs[0].memory[0]
    assert peak.sbuf_bytes <= plan.sbuf_bytes and peak.psum_banks <= plan.psum_banks, (peak, plan)


def test_backward_plan_bounds_the_measured_peaks_of_the_tanh_form():
    """Above SOFTPLUS_SOFTCAP_MAX (bf16 1024) the backward holds a burst of t tiles
    (SOFTCAP_TANH_BURST, kernels/flash_attention_bwd.py): with a window and sinks the plan's
    SBUF bytes and PSUM banks still bound what the interpreter measures (trace-only)."""
    softcap = fab_plan.SOFTPLUS_SOFTCAP_MAX["bfloat16"] * 2
    problem = {**_bwd_problem(1024, 1024, True, 300, -1, softcap, True, d=128), "groups": 2}
    args = BWD.make_inputs(problem, "bfloat16", torch.Generator())
    runs = []
    BWD.run_kernels(
        *args,
        config=BWD.config.default(),
        runner=interpreter_runner_for("trn2", compute=False, runs=runs),
    )
    plan = BWD.check(BWD.problem(*args), "bfloat16", BWD.config.default(), "trn2")
    assert plan.softcap_tanh
    peak = runs[0].memory[0]
    assert peak.sbuf_bytes <= plan.sbuf_bytes and peak.psum_banks <= plan.psum_banks, (peak, plan)


@pytest.mark.parametrize("steps", [6, 12])
def test_softcap_backward_at_every_pipeline_depth(steps, monkeypatch):
    """The backward's softcap stage 1 spans 6 loop steps (kernels/flash_attention_bwd_kernel.py
    _softcap_steps: dS 6 steps after S), so stages 2 and 3 trail it by SOFTCAP_STEPS more:
    at the least (6) and the default depth the gradients agree with the reference within the
    declared tolerance, over several key blocks and passes (tile_k 64)."""
    spec = fab.SPEC
    monkeypatch.setattr(fab_plan, "SOFTCAP_STEPS", steps)  # read by the plan (the lags)
    problem = _bwd_problem(600, 700, True, 300, -1, softcap=20.0)
    args = spec.make_inputs(problem, "float32", torch.Generator().manual_seed(8))
    grads = fab.run_kernels(*args, config=spec.config(tile_k=64, q_block=4), runner=_interp())
    assert_within_tolerance(grads, spec.reference(*args), spec.tolerances["float32"], "[steps]")


def test_softcap_backward_softplus_form_at_its_largest_softcap():
    """Up to SOFTPLUS_SOFTCAP_MAX (fp32's) the backward takes ``1 - t`` through softplus and exp, whose
    logits carry an error ~softcap * 2^-22 (kernels/flash_attention_bwd.py, the comment on
    SOFTPLUS_SOFTCAP_MAX): at that softcap, with scores 8x larger than N(0, 1) rows give
    (deep in tanh's bend), fp32 gradients stay within the declared fp32 tolerance; just above
    it the tanh form does too."""
    spec = fab.SPEC
    top = fab_plan.SOFTPLUS_SOFTCAP_MAX["float32"]
    for softcap in (top, top + 1):
        problem = _bwd_problem(200, 300, True, -1, -1, softcap=softcap)
        args = list(spec.make_inputs(problem, "float32", torch.Generator().manual_seed(3)))
        args[1] = args[1] * 8
        out, lse = attn_contract.attention_reference(
            *args[1:4], True, None, None, softcap, None, upcast=True
        )
        args[4], args[5] = out.float(), lse.float()
        grads = fab.run_kernels(*args, config=spec.config.default(), runner=_interp())
        tol = spec.tolerances["float32"]
        assert_within_tolerance(grads, spec.reference(*args), tol, f"[softcap {softcap}]")


@pytest.mark.parametrize("loop_order", ["kv_outer", "q_outer"])
@pytest.mark.parametrize("burst", [1, 5, 64])
def test_softcap_backward_tanh_form_at_every_burst(burst, loop_order, monkeypatch):
    """Above SOFTPLUS_SOFTCAP_MAX the backward makes t = tanh(y) in bursts of up to
    SOFTCAP_TANH_BURST pairs, under kv_outer within one key block (kernels/
    flash_attention_bwd_kernel.py _softcap_steps): per pair (1), in bursts that end mid-block (5)
    and a whole block's (64), under both loop orders, the fp32 gradients agree with the
    reference within the declared tolerance, over several key blocks and passes (tile_k
    64, a window)."""
    spec = fab.SPEC
    for module in (fab_plan, fab_kernel):  # the plan budgets the burst, the kernel runs it
        monkeypatch.setattr(module, "SOFTCAP_TANH_BURST", burst)
    softcap = fab_plan.SOFTPLUS_SOFTCAP_MAX["float32"] * 2
    problem = _bwd_problem(600, 700, True, 300, -1, softcap=softcap)
    args = spec.make_inputs(problem, "float32", torch.Generator().manual_seed(9))
    config = spec.config(tile_k=64, q_block=4, loop_order=loop_order)
    plan = spec.check(spec.problem(*args), "float32", config, "trn2")
    assert plan.softcap_tanh
    grads = fab.run_kernels(*args, config=config, runner=_interp())
    tol = spec.tolerances["float32"]
    assert_within_tolerance(grads, spec.reference(*args), tol, f"[burst {burst} {loop_order}]")


def _interp():
    return interpreter_runner_for("trn2")
