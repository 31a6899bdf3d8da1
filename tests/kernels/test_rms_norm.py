"""RMSNorm's own tests, beyond the contract suite: Hypothesis over rows, H, dtypes, eps,
offset and casting modes for the forward (y and the saved rstd) and the backward (dx, dw);
gradients through the op against fp64 autograd; a zero row; extreme magnitudes; the
largest H per dtype (trace-only) and the plan's choices."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import rms_norm, rms_norm_bwd
from neuron_kernels.kernels.rms_norm import CASTING_MODES, FWD_SPEC, RmsNormConfig, largest_h
from neuron_kernels.kernels.spec import Tolerance
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.verification import assert_within_tolerance, interpreter_runner_for, run_kernel

BWD_SPEC = rms_norm_bwd.SPEC
DTYPES = ("float32", "bfloat16", "float16")
# rstd is computed in fp32 whatever the input dtype: the fp32 forward tolerance holds it.
RSTD_TOL = FWD_SPEC.tolerances["float32"]

rows_st = st.one_of(st.sampled_from([1, 127, 128, 129, 257, 1000, 2049]), st.integers(1, 400))
h_st = st.one_of(st.sampled_from([1, 3, 511, 513, 600]), st.integers(1, 600))


def _inputs(rows, h, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    x = (torch.randn(rows, h, generator=g) * scale).to(dt)
    w = (1.0 + 0.1 * torch.randn(h, generator=g)).to(dt)
    return x, w


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_st,
    h=h_st,
    dtype=st.sampled_from(DTYPES),
    eps=st.sampled_from([1e-6, 1e-5, 2**-23]),
    offset=st.sampled_from([0.0, 1.0, -0.5]),
    mode=st.sampled_from(CASTING_MODES),
    seed=st.integers(0, 2**16),
)
def test_forward_matches_fp64(rows, h, dtype, eps, offset, mode, seed):
    assume(rows * h <= 300_000)  # thousands of rows with small H, keep each run short
    x, w = _inputs(rows, h, dtype, seed)
    y, rstd = run_kernel(FWD_SPEC, (x, w, eps, offset, mode))
    y_ref, rstd_ref = rms_norm.reference_fwd(x, w, eps, offset, mode, upcast=True)
    ctx = f"[{rows}x{h} {dtype} eps={eps} offset={offset} {mode}]"
    assert_within_tolerance(y, y_ref, FWD_SPEC.tolerances[dtype], ctx)
    assert_within_tolerance(rstd, rstd_ref, RSTD_TOL, ctx + " rstd")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_st,
    h=h_st,
    dtype=st.sampled_from(DTYPES),
    offset=st.sampled_from([0.0, 1.0]),
    mode=st.sampled_from(CASTING_MODES),
    seed=st.integers(0, 2**16),
)
def test_backward_matches_fp64(rows, h, dtype, offset, mode, seed):
    assume(rows * h <= 300_000)
    problem = {"rows": rows, "h": h, "casting_mode": mode, "offset": offset}
    args = rms_norm_bwd.make_inputs(problem, dtype, torch.Generator().manual_seed(seed))
    dx, dw = run_kernel(BWD_SPEC, args)
    dx_ref, dw_ref = rms_norm_bwd.reference(*args, upcast=True)
    tol = BWD_SPEC.tolerances[dtype]
    ctx = f"[{rows}x{h} {dtype} offset={offset} {mode}]"
    assert_within_tolerance(dx, dx_ref, tol, ctx + " dx")
    # dw sums `rows` terms of O(1): its size grows like sqrt(rows), so does the bound.
    scale = max(1.0, rows**0.5)
    assert_within_tolerance(dw, dw_ref, Tolerance(tol.atol * scale, tol.rtol, tol.reason), ctx)


@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.5)])
def test_gradients_through_the_op_match_fp64_autograd(mode, offset):
    """The public op's autograd (forward kernel's saved rstd -> backward kernel) against
    torch autograd of the fp64 reference, rows with a remainder tile, two H chunks."""
    x, w = _inputs(150, 700, "float32", 3)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    dy = torch.randn(150, 700, generator=torch.Generator().manual_seed(4))
    with cpu_mode("interpret"):
        (torch.ops.neuron.rms_norm(xs, ws, 1e-6, offset, mode) * dy).sum().backward()
    (rms_norm.reference(x64, w64, 1e-6, offset, mode, upcast=True) * dy.double()).sum().backward()
    tol = BWD_SPEC.tolerances["float32"]
    assert_within_tolerance(xs.grad, x64.grad, tol, f"[{mode} dx]")
    assert_within_tolerance(
        ws.grad, w64.grad, Tolerance(1e-4, tol.rtol, tol.reason), f"[{mode} dw]"
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_row_gives_zero_output_and_finite_gradients(dtype):
    x, w = _inputs(130, 96, dtype, 5)
    x[7] = 0
    y, rstd = run_kernel(FWD_SPEC, (x, w, 1e-6, 0.0, "llama"))
    assert torch.all(y[7] == 0) and torch.isfinite(y).all()
    assert rstd[7].item() == pytest.approx(1e-6**-0.5, rel=1e-6)  # eps kept rsqrt in range
    dy = torch.randn(130, 96).to(x.dtype)
    dx, dw = run_kernel(BWD_SPEC, (dy, x, w, rstd, 0.0, "llama"))
    assert torch.isfinite(dx).all() and torch.isfinite(dw).all()
    dx_ref, _ = rms_norm_bwd.reference(dy, x, w, rstd, upcast=True)
    assert_within_tolerance(dx, dx_ref, BWD_SPEC.tolerances[dtype], "[zero row dx]")


@pytest.mark.parametrize("scale", [1e-20, 1e4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_and_large_magnitudes_neither_overflow_nor_nan(dtype, scale):
    """x ~ 1e-20 (x^2 underflows fp32's normal range, eps dominates) and x ~ 1e4 (x^2 ~ 1e8):
    finite, and relative to the fp64 reference as accurate as O(1) inputs."""
    x, w = _inputs(129, 200, dtype, 6, scale)
    y, rstd = run_kernel(FWD_SPEC, (x, w, 1e-6, 0.0, "llama"))
    y_ref, _ = rms_norm.reference_fwd(x, w, 1e-6, upcast=True)
    assert torch.isfinite(y).all() and torch.isfinite(rstd).all()
    tol = FWD_SPEC.tolerances[dtype]
    rel = Tolerance(tol.atol * float(y_ref.abs().max()), tol.rtol, tol.reason)
    assert_within_tolerance(y, y_ref, rel, f"[x ~ {scale}]")
    dy = torch.randn(129, 200).to(x.dtype)
    dx, dw = run_kernel(BWD_SPEC, (dy, x, w, rstd, 0.0, "llama"))
    assert torch.isfinite(dx).all() and torch.isfinite(dw).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_largest_h_runs_and_one_more_is_refused(dtype):
    """The largest H per dtype follows from the plan's SBUF budget (hardware.py's usable
    bytes); at that H both kernels run on the interpreter (trace-only) within its capacity
    checks, and H + 1 is refused by the plan with a LimitError naming the SBUF budget."""
    for spec in (FWD_SPEC, BWD_SPEC):
        h = largest_h(spec, dtype, "llama", "trn2")
        problem = {"rows": 130, "h": h, "casting_mode": "llama"}
        spec.check(problem, dtype, spec.config.default(), "trn2")
        with pytest.raises(LimitError) as err:
            spec.check({**problem, "h": h + 1}, dtype, spec.config.default(), "trn2")
        assert err.value.arg == "SBUF bytes per partition"
        args = spec.make_inputs({"rows": 3, "h": h}, dtype, torch.Generator())
        spec.run_kernels(
            *args,
            config=spec.config.default(),
            runner=interpreter_runner_for("trn2", compute=False),
        )


def test_plan_chooses_two_passes_only_when_a_tile_does_not_fit():
    config = RmsNormConfig()
    assert not FWD_SPEC.check({"rows": 128, "h": 8192}, "bfloat16", config, "trn2").two_pass
    assert FWD_SPEC.check({"rows": 128, "h": 65536}, "bfloat16", config, "trn2").two_pass
    psum = rms_norm_bwd.RmsNormBwdConfig(dw_reduce="psum")
    # dw sits in one PSUM bank as [128, ceil(H / 128)] fp32 columns: H <= 128 * 512
    assert BWD_SPEC.check({"rows": 128, "h": 8192}, "bfloat16", psum, "trn2").dw_in_psum
    with pytest.raises(LimitError) as err:
        BWD_SPEC.check({"rows": 128, "h": 128 * 512 + 1}, "bfloat16", psum, "trn2")
    assert err.value.arg == "config dw_reduce"


def test_eps_below_the_rsqrt_range_is_refused_by_name():
    x, w = torch.randn(2, 8), torch.ones(8)
    with pytest.raises(LimitError) as err:
        torch.ops.neuron.rms_norm(x, w, 0.0)
    assert err.value.arg == "eps" and err.value.limit == rms_norm.MIN_EPS == 2.0**-55


@pytest.mark.parametrize("statistics", ["scalar", "scalar_gpsimd", "vector"])
def test_rows_beyond_rsqrt_range_and_overflowing_rows_give_torchs_result(statistics):
    """Issue 32 item 8: fp32 rows scaled by 1e20 (x^2 overflows fp32: torch gives 0) and by
    1e16 (mean square ~1e32, past rsqrt's valid input 2^97 but finite: torch gives the true
    +-w-scaled value) used to be NaN in interpret mode. Now both CPU modes agree: the
    kernel's rstd is rsqrt(ms * 2^-32) * 2^-16, 0 where ms overflowed. The tolerance is the
    op's fp32 one (the scaling is by exact powers of two)."""
    x, w = _inputs(300, 256, "float32", 11)
    x[:100] *= 1e20
    x[100:200] *= 1e16
    config = RmsNormConfig(statistics=statistics)
    y, rstd = run_kernel(FWD_SPEC, (x, w, 1e-6, 0.0, "llama"), config)
    y_ref, rstd_ref = rms_norm.reference_fwd(x, w, 1e-6, 0.0, "llama", upcast=False)
    assert (y[:100] == 0).all() and (y_ref[:100] == 0).all() and (rstd[:100] == 0).all()
    assert_within_tolerance(y, y_ref, FWD_SPEC.tolerances["float32"], f"[{statistics}]")
    with cpu_mode("interpret"):
        assert torch.equal(torch.ops.neuron.rms_norm(x, w)[:100], torch.zeros(100, 256))


@pytest.mark.parametrize("statistics", ["scalar", "scalar_gpsimd", "vector"])
def test_a_row_holding_an_inf(statistics):
    """torch: rstd 0, so NaN at the inf (inf * 0) and 0 elsewhere in the row. The scalar
    statistics paths give exactly that; the vector path (bn_stats: var = inf - inf) makes
    the whole row NaN, its documented limit (README, RMSNorm)."""
    x, w = _inputs(4, 64, "float32", 12)
    x[1, 5] = float("inf")
    y, _ = run_kernel(FWD_SPEC, (x, w, 1e-6, 0.0, "llama"), RmsNormConfig(statistics=statistics))
    y_ref, _ = rms_norm.reference_fwd(x, w, 1e-6, 0.0, "llama", upcast=False)
    others = [0, 2, 3]
    assert_within_tolerance(y[others], y_ref[others], FWD_SPEC.tolerances["float32"])
    if statistics == "vector":
        assert y[1].isnan().all()
    else:
        assert torch.equal(y[1].isnan(), y_ref[1].isnan()) and (y[1][~y[1].isnan()] == 0).all()
