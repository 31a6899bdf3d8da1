"""Varlen (packed) flash attention: the contract in the docstring of
``kernels/flash_attention_varlen.py``.

Forward out and lse and backward dq, dk, dv on the interpreter against the fp64
per-sequence references, held to the tolerances the attention ops declare
(``flash_attention_fwd``'s and ``flash_attention_bwd``'s, which the varlen ops reuse: the
same kernels do the same arithmetic, each row over at most max_seqlen keys); agreement
with each sequence run through ``torch.ops.neuron.flash_attention`` on its own; one traced
kernel per (totals, max_seqlen) whatever the packing; the self-attention band skipped at
trace time; no host read of the boundaries in the op glue; the value checks on CPU only.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neuron_kernels.torch_ops  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import target_from_name
from neuron_kernels.kernels import flash_attention_varlen as fv
from neuron_kernels.kernels.spec import FunctionRunner
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.verification import InterpreterRunner, assert_within_tolerance, run_kernel

FWD, BWD = fv.FWD_SPEC, fv.BWD_SPEC
# Sequence lengths at the edges the contract names: empty, one row, the tile edges.
LENGTHS = (0, 1, 2, 5, 40, 127, 128, 129)


def _cu(lengths) -> torch.Tensor:
    edges = [0]
    for n in lengths:
        edges.append(edges[-1] + n)
    return torch.tensor(edges, dtype=torch.int32)


def _inputs(lq, lk, h, hkv, d, dtype, seed=0, same=False, causal=False):
    """Packed q, k, v ~ N(0, 1) and the packing (one cu_seqlens tensor when ``same``)."""
    g = torch.Generator().manual_seed(seed)
    t = getattr(torch, dtype)
    q = torch.randn(sum(lq), h, d, generator=g).to(t)
    k = torch.randn(sum(lk), hkv, d, generator=g).to(t)
    v = torch.randn(sum(lk), hkv, d, generator=g).to(t)
    cu_q = _cu(lq)
    cu_k = cu_q if same else _cu(lk)
    return q, k, v, cu_q, cu_k, max(lq, default=0), max(lk, default=0), causal, None


def _packings():
    """(q lengths, k lengths, same packing): one to four sequences of edge lengths."""
    lengths = st.lists(st.sampled_from(LENGTHS), min_size=1, max_size=4)
    return lengths.flatmap(
        lambda lq: st.tuples(
            st.just(lq),
            st.lists(st.sampled_from(LENGTHS), min_size=len(lq), max_size=len(lq)),
            st.booleans(),
        )
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    packing=_packings(),
    causal=st.booleans(),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    d=st.sampled_from([16, 40]),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_forward_and_backward_match_the_fp64_reference(packing, causal, heads, d, dtype, seed):
    """Out, lse (``[H, total_q]``, -inf exactly where a row sees no key) and dq, dk, dv
    against the per-sequence fp64 references, within the declared tolerances: zero-length
    and one-row sequences, causal bottom-right per sequence (rows with Lq > Lk see
    nothing), GQA, self-attention packing (one tensor) or separate packings."""
    lq, lk, same = packing
    if same:
        lk = lq
    h, hkv = heads
    args = _inputs(lq, lk, h, hkv, d, dtype, seed, same, causal)
    ctx = f"[{lq} {lk} same={same} causal={causal} {heads} d={d} {dtype}]"
    out, lse = run_kernel(FWD, args)
    ref_out, ref_lse = fv.reference_fwd(*args, upcast=True)
    assert lse.shape == (h, sum(lq)) and lse.dtype == torch.float32
    assert_within_tolerance((out, lse), (ref_out, ref_lse), FWD.tolerances[dtype], ctx)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(out.dtype)
    bwd_args = (dout, *args[:3], ref_out.to(out.dtype), ref_lse.float(), *args[3:])
    grads = run_kernel(BWD, bwd_args)
    want = fv.reference_bwd(*bwd_args, upcast=True)
    assert_within_tolerance(grads, want, BWD.tolerances[dtype], ctx)


@pytest.mark.parametrize(("target", "lnc"), [("trn2", 2), ("trn1", 1)])
def test_lnc2_split_and_the_nc_v2_mask(target, lnc):
    """At LNC=2 (KV groups, and an odd one split by query tiles, over two cores) and on
    trn1 (NeuronCore-v2: no range_select, the iota compare masks instead) the forward and
    backward keep the reference."""
    args = _inputs([3, 0, 130, 60], [70, 9, 0, 60], 6, 3, 24, "float32", causal=True)
    out, lse = run_kernel(FWD, args, target=target, lnc=lnc)
    ref = fv.reference_fwd(*args, upcast=True)
    assert_within_tolerance((out, lse), ref, FWD.tolerances["float32"], f"[{target}]")
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    bwd_args = (dout, *args[:3], ref[0].float(), ref[1].float(), *args[3:])
    grads = run_kernel(BWD, bwd_args, target=target, lnc=lnc)
    want = fv.reference_bwd(*bwd_args, upcast=True)
    assert_within_tolerance(grads, want, BWD.tolerances["float32"], f"[{target}]")


def test_rows_that_see_no_key_give_zero_and_minus_inf():
    """A sequence with no keys, and causal rows before the bottom-right diagonal (Lq > Lk):
    out exactly 0, lse exactly -inf, dq exactly 0 (the contract's fully masked rows)."""
    args = _inputs([4, 6], [0, 2], 2, 1, 16, "float32", causal=True)
    out, lse = run_kernel(FWD, args)
    dead = torch.tensor(
        [1, 1, 1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool
    )  # rows 4..7: t + 2 - 6 < 0
    assert torch.equal(out[dead], torch.zeros_like(out[dead]))
    assert torch.isneginf(lse[:, dead]).all() and torch.isfinite(lse[:, ~dead]).all()
    dout = torch.ones_like(out)
    dq, dk, dv = run_kernel(BWD, (dout, *args[:3], out, lse, *args[3:]))
    assert torch.equal(dq[dead], torch.zeros_like(dq[dead]))


def test_agrees_with_each_sequence_through_the_bhsd_op():
    """The public op on a packing (interpreted kernels) against each sequence run through
    ``torch.ops.neuron.flash_attention`` on its own, and their gradients: the same kernels,
    so within the forward's fp32 tolerance (the key tiles fall differently in the packed
    axis, so the sums are not bitwise equal)."""
    lengths = [5, 130, 1, 64]
    q, k, v, cu, _, m, _, _, _ = _inputs(lengths, lengths, 4, 2, 32, "float32", seed=7)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    seq_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with cpu_mode("interpret"):
        out = torch.ops.neuron.flash_attention_varlen(*leaves, cu, cu, m, m, True)
        pieces = []
        for a, b in zip(cu.tolist(), cu.tolist()[1:]):
            qs, ks, vs = (x[a:b].transpose(0, 1).unsqueeze(0) for x in seq_leaves)
            pieces.append(torch.ops.neuron.flash_attention(qs, ks, vs, True)[0].transpose(0, 1))
        separate = torch.cat(pieces, 0)
    tol = FWD.tolerances["float32"]
    assert_within_tolerance(out, separate, tol, "[out]")
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * w).sum().backward()
    (separate * w).sum().backward()
    for got, want in zip(leaves, seq_leaves):
        assert_within_tolerance(got.grad, want.grad, BWD.tolerances["float32"], "[grad]")


class _Recorder:
    """A runner that records each launch's compile-time key (the kernel, its grid, the
    tensors' shapes and dtypes, every other argument: what ``nki.jit`` specializes on) and
    returns zeros of the kernel's output shapes without running it."""

    def __init__(self, target="trn2", lnc=1):
        self.target, self.lnc, self.keys = target_from_name(target), lnc, []

    def __call__(self, kernel, *args):
        key = [kernel.fn, kernel.grid]
        for a in args:
            is_t = isinstance(a, torch.Tensor)
            key.append((tuple(a.shape), a.dtype) if is_t else a)
        self.keys.append(tuple(key))
        runner = InterpreterRunner(self.target, compute=False, lnc=self.lnc)
        return runner(kernel, *args)


def test_one_trace_per_totals_and_max_seqlen():
    """Two packings with the same totals and max_seqlen (different boundaries, different
    numbers of sequences) launch kernels with identical compile-time keys, forward and
    backward: one traced kernel serves both; the boundaries reach the kernel only as the
    values of a tensor of fixed shape. A different max_seqlen (a different band) is a
    different key."""
    keys = []
    for lengths in ([100, 28, 0, 72, 56], [56, 100, 100], [100, 100, 56]):
        rec = _Recorder()
        q, k, v, cu, _, _, _, _, _ = _inputs(lengths, lengths, 2, 1, 16, "bfloat16")
        out, lse = FWD.run_kernels(q, k, v, cu, cu, 100, 100, True, config=FWD.config(), runner=rec)
        bwd_args = (out, q, k, v, out, lse, cu, cu, 100, 100, True, None)
        BWD.run_kernels(*bwd_args, config=BWD.config(), runner=rec)
        keys.append(rec.keys)
    assert len(keys[0]) == 2 and keys[0] == keys[1] == keys[2]
    rec = _Recorder()
    FWD.run_kernels(q, k, v, cu, cu, 120, 120, True, config=FWD.config(), runner=rec)
    assert rec.keys[0] != keys[0][0]


def _matmuls(args) -> int:
    runs: list = []
    runner = InterpreterRunner("trn2", compute=False, runs=runs)
    FWD.run_kernels(*args, config=FWD.config(), runner=runner)
    return runs[0].trace.count_by_api()["nisa.nc_matmul"]


def test_self_attention_packing_skips_the_band_at_trace_time():
    """8 causal sequences of 128 packed to 1024, one query head, D=64, two-pass forward
    (key tiles of 512 from a query tile's first visible 128-key chunk; every tile masked at
    run time keeps its scores for the exp pass, so S is computed once): with
    ``cu_seqlens_q is cu_seqlens_k`` the query tile at q0 sees keys (q0 - 128, q0 + 128),
    one key tile of 256 keys (128 for the first): S 8 matmuls, P V one per 128-key chunk,
    15: 23. With an equal-valued copy of the boundaries (another tensor: no band) every
    tile is traced: two 512-key tiles per query tile, S 16 and P V 64: 80."""
    lengths = [128] * 8
    q, k, v, cu, _, m, _, _, _ = _inputs(lengths, lengths, 1, 1, 64, "bfloat16")
    banded = _matmuls((q, k, v, cu, cu, m, m, True, None))
    traced_all = _matmuls((q, k, v, cu, cu.clone(), m, m, True, None))
    assert (banded, traced_all) == (8 + 15, 16 + 64), (banded, traced_all)


def test_the_glue_never_reads_the_boundaries():
    """The forward and backward op glue (bounds on the device, launch, dead-row fix-up) run
    on meta tensors, whose values cannot be read: no host sync on a device."""
    lengths = [3, 0, 130]
    args = _inputs(lengths, lengths, 2, 1, 16, "bfloat16", causal=True)
    meta = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    meta = (*meta[:4], meta[3], *meta[5:])  # one packing tensor, as the op keeps it

    def fake_runner(kernel, *kargs):
        plan, bounds = kargs[-2], kargs[-1]
        assert bounds.device.type == "meta" and plan.runtime_bounds and plan.packed
        if len(kargs) == 6:  # the forward: (q, k, v, sinks, plan, bounds) -> out rows, lse
            q = kargs[0]
            return torch.empty_like(q), torch.empty(1, q.shape[2], q.shape[1], 1, device="meta")
        return tuple(torch.empty_like(t) for t in kargs[1:4])  # dq, dk, dv rows

    runner = FunctionRunner(fake_runner, target_from_name("trn2"))
    out, lse = FWD.run_kernels(*meta, config=FWD.config(), runner=runner)
    assert out.device.type == "meta" and tuple(lse.shape) == (2, 133)
    grads = BWD.run_kernels(out, *meta[:3], out, lse, *meta[3:], config=BWD.config(), runner=runner)
    assert [tuple(g.shape) for g in grads] == [tuple(t.shape) for t in meta[:3]]


def test_value_checks_read_cpu_tensors_only():
    """Boundaries that break the contract are refused on CPU (a host read), naming the
    argument; on another device (meta here) they are the caller's contract and pass
    validation (the shape and dtype checks still run)."""
    q, k, v = torch.zeros(7, 2, 8), torch.zeros(5, 1, 8), torch.zeros(5, 1, 8)
    bad = torch.tensor([0, 5, 3], dtype=torch.int32)
    ok = torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(LimitError) as err:
        fv.validate_varlen("op", q, k, v, bad, ok, 7, 5, False, None)
    assert err.value.arg == "cu_seqlens_q values" and "non-decreasing" in str(err.value)
    on_meta = [t.to("meta") for t in (q, k, v, bad, ok)]
    fv.validate_varlen("op", *on_meta, 7, 5, False, None)
    with pytest.raises(LimitError) as err:
        fv.validate_varlen("op", *on_meta[:3], on_meta[3].long(), on_meta[4], 7, 5, False, None)
    assert err.value.arg == "cu_seqlens_q dtype"


def test_kv_block_zero_keeps_kv_resident_when_it_fits():
    """``kv_block=0`` (the default): every key resident and the two-pass softmax where that
    plan fits one core (8 x 1024 packed, D=128 bf16 on trn2), else 4096-key blocks and the
    online softmax (64K keys at D=256 fp32), whose plan fits."""
    target = target_from_name("trn2")
    problem = {**fv._PROBE, "total_q": 8192, "total_k": 8192, "d": 128, "max_q": 1024}
    plan = fv.plan_fwd({**problem, "max_k": 1024}, "bfloat16", FWD.config(), target)
    assert (plan.kv_blocks, plan.softmax) == (1, "two_pass")
    big = {**problem, "total_q": 256, "total_k": 65536, "d": 256, "same_packing": False}
    plan = fv.plan_fwd({**big, "max_k": 65536}, "float32", FWD.config(), target)
    assert (plan.kv_block, plan.softmax) == (fv.RESIDENT_FALLBACK, "online")
    assert plan.sbuf_bytes <= target.sbuf_usable_bytes
