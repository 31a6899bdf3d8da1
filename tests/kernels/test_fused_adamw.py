"""The fused AdamW kernel: its chunking, its numerics against the fp64 reference over tensor
counts and sizes, skipped steps, device-tensor hyperparameters, engine assignment, budgets
and bad input. The contract suite (tests/contract) adds opcheck, compile and every config."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.fused_adamw_)
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import TARGETS
from neuron_kernels.kernels import fused_adamw
from neuron_kernels.kernels.spec import measure_generator
from neuron_kernels.torch_ops import cpu_mode, routing
from neuron_kernels.verification import assert_within_tolerance, run_kernel

SPEC = fused_adamw.SPEC
SMALL_TILES = fused_adamw.FusedAdamwConfig(
    tile_free=512, in_flight=2
)  # 65,536-element chunks: fast
MUTATED = (0, 2, 3, 4)  # params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs


def _copies(args, dtype=None):
    def copy(a):
        if isinstance(a, torch.Tensor):
            return a.clone() if dtype is None else a.to(dtype)
        if isinstance(a, list):
            return [copy(t) for t in a]
        return a

    return tuple(copy(a) for a in args)


def _updated(args) -> list:
    return [t for i in MUTATED for t in args[i]]


def _inputs(sizes, dtype="float32", seed=0, **change):
    """make_inputs' tensors at the given sizes (one per entry), flags from ``change``."""
    g = torch.Generator().manual_seed(seed)
    base = list(SPEC.make_inputs({"tensors": 1, "numel": 1}, dtype, g))
    dt = getattr(torch, dtype)
    amsgrad = change.get("amsgrad", base[11])
    base[0] = [torch.randn(n, generator=g).to(dt) for n in sizes]
    base[1] = [torch.randn(n, generator=g).to(dt) for n in sizes]
    base[2] = [torch.randn(n, generator=g) * 0.1 for n in sizes]
    base[3] = [torch.randn(n, generator=g) ** 2 * 0.01 for n in sizes]
    base[4] = [v + 0.01 for v in base[3]] if amsgrad else []
    base[5] = [torch.tensor(float(3 + i)) for i in range(len(sizes))]
    names = ["lr", "beta1", "beta2", "weight_decay", "eps", "amsgrad", "maximize", "grad_scale"]
    for i, name in enumerate(names + ["found_inf"], start=6):
        if name in change:
            base[i] = change[name]
    return tuple(base)


def _check(args, config, dtype):
    """Kernel and fp64 reference, each on its own copies; every updated tensor compared."""
    ran, ref = _copies(args), _copies(args, torch.float64)
    run_kernel(SPEC, ran, config)
    SPEC.reference(*ref, upcast=True)
    for i, (got, want) in enumerate(zip(_updated(ran), _updated(ref))):
        assert_within_tolerance(got, want, SPEC.tolerances[dtype], f"[tensor {i} {config}]")


# -- the plan -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3 * 128 * 64 + 300), min_size=1, max_size=9),
    tile=st.sampled_from([1, 4, 64]),
    per_launch=st.sampled_from([1, 2, 8]),
)
def test_launches_cover_each_tensor_exactly_once(sizes, tile, per_launch):
    """A tensor of a full chunk or more gets a zero-copy launch of its whole rows; the rest
    is packed, at most ``tensors_per_launch`` segments a launch, each padded to whole rows
    of a width that pads at most 1/8 more (or 1), rows back to back."""
    config = fused_adamw.FusedAdamwConfig(tile_free=tile, tensors_per_launch=per_launch)
    covered = [[] for _ in sizes]
    for launch in fused_adamw.launches(sizes, config, 128):
        if not launch.packed:
            (s,) = launch.segments
            assert s.start == 0 and s.row0 == 0 and launch.cols == tile
            assert s.length == launch.rows * tile and launch.rows >= 128
        else:
            assert 1 <= len(launch.segments) <= per_launch
            padded = sum(-(-s.length // launch.cols) * launch.cols for s in launch.segments)
            real = sum(s.length for s in launch.segments)
            assert launch.cols == 1 or padded * 8 <= real * 9
        row = 0
        for s in launch.segments:
            assert s.row0 == row
            row += -(-s.length // launch.cols)
            covered[s.tensor].append((s.start, s.length))
        assert row == launch.rows
    for n, parts in zip(sizes, covered):
        at = 0
        for start, length in sorted(parts):
            assert start == at and length >= 1
            at += length
        assert at == n


def test_small_tensors_share_full_tiles():
    """64 tensors of 300 elements: one packed launch of 64-wide rows (5 per tensor) in
    three chunks, not 64 tensors' tiles and tails (modeled 18.9 vs 317.5 us, kernels/fused_adamw.py)."""
    (launch,) = fused_adamw.launches([300] * 64, SPEC.config.default(), 128)
    assert launch.packed and launch.cols == 64 and launch.rows == 64 * 5
    tiles = SPEC.check(
        {"tensors": 64, "numel": 300, "rows": launch.rows, "cols": launch.cols},
        "float32", SPEC.config.default(), "trn2",
    )  # fmt: skip
    assert [c for wave in tiles.core_waves[0] for c in wave] == [(0, 128), (128, 128), (256, 64)]


def test_waves_hold_in_flight_chunks_in_order():
    config = fused_adamw.FusedAdamwConfig(tile_free=512, in_flight=3)
    plan = SPEC.check(
        {"tensors": 1, "numel": 1, "rows": 3 * 128 + 5, "cols": 512}, "float32", config, "trn2"
    )
    assert plan.core_waves == ((((0, 128), (128, 128), (256, 128)), ((384, 5),)),)


def test_lnc2_splits_chunks_by_elements_each_core_in_order():
    """At LNC=2 the two full chunks go one to each core, then the 5-row remainder to the
    first of the equally loaded cores (largest item first to the least loaded core); each
    core keeps the LNC=1 order, and together the cores cover every chunk exactly once."""
    config = fused_adamw.FusedAdamwConfig(tile_free=512, in_flight=3)
    problem = {"tensors": 1, "numel": 1, "rows": 2 * 128 + 5, "cols": 512}
    one = SPEC.check(problem, "float32", config, "trn2")
    two = SPEC.check(problem, "float32", config, "trn2", lnc=2)
    assert two.lnc == 2
    assert two.core_waves == ((((0, 128), (256, 5)),), (((128, 128),),))
    flat = [c for core in two.core_waves for wave in core for c in wave]
    assert sorted(flat) == sorted(c for wave in one.core_waves[0] for c in wave)


def test_the_kernel_writes_no_operand_and_a_large_tensor_is_not_copied_in():
    """torch_neuronx.wrap_nki passes only top-level tensors and NKI 0.6 has no operand
    aliasing (torch-neuronx tests/nki/test_nki_v2.py): the kernel returns the new tensors
    and writes none of its operands; the op copies the results back. A tensor of whole
    rows is launched on itself (no pack), small ones packed."""
    from neuron_kernels.verification import InterpreterRunner

    launched = []
    inner = InterpreterRunner(lnc=1)

    class Recording:
        target, lnc = inner.target, 1

        def __call__(self, kernel, *args):
            before = [a.clone() for a in args[:5] if a is not None]
            outs = inner(kernel, *args)
            assert all(
                torch.equal(a, b) for a, b in zip([a for a in args[:5] if a is not None], before)
            )
            launched.append((args[0], outs))
            return outs

    args = _inputs([128 * 512, 300], amsgrad=True)
    p0 = args[0][0]
    before = _copies(args)
    SPEC.run_kernels(*args, config=SMALL_TILES, runner=Recording())
    assert len(launched) == 2
    big, small = launched
    assert big[0].data_ptr() == p0.data_ptr() and len(big[1]) == 4  # p, m, v, vmax
    assert small[0].data_ptr() != args[0][1].data_ptr()
    assert not torch.equal(args[0][0], before[0][0])  # copied back


def test_budget_binds_at_large_tiles():
    """4096-wide tiles with 4 chunks in flight cannot fit; the default fits on every target."""
    big = fused_adamw.FusedAdamwConfig(tile_free=4096, in_flight=4)
    problem = SPEC.test_problems["large"]
    with pytest.raises(LimitError) as err:
        SPEC.check(problem, "float32", big, "trn2")
    assert err.value.arg == "SBUF bytes per partition"
    for target in TARGETS:  # the default runs every flag combination on every target
        for dtype in fused_adamw.PARAM_DTYPES:
            for amsgrad in (False, True):
                for rounding in {False, dtype == "bfloat16"}:
                    flags = dict(amsgrad=amsgrad, rounding=rounding, tensors=64)
                    plan = SPEC.check({**problem, **flags}, dtype, SPEC.config.default(), target)
                    assert plan.sbuf_bytes <= TARGETS[target].sbuf_usable_bytes


# -- numerics ---------------------------------------------------------------------------------


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(
        st.one_of(st.integers(1, 300), st.sampled_from([128, 129, 128 * 512, 128 * 512 + 131])),
        min_size=1,
        max_size=4,
    ),
    dtype=st.sampled_from(fused_adamw.PARAM_DTYPES),
    amsgrad=st.booleans(),
    maximize=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_kernel_matches_reference_over_counts_and_sizes(sizes, dtype, amsgrad, maximize, seed):
    """1 element up to non-multiples of 128 x tile, several tensors per launch."""
    args = _inputs(sizes, dtype, seed, amsgrad=amsgrad, maximize=maximize)
    _check(args, SMALL_TILES, dtype)


@pytest.mark.parametrize("engines", fused_adamw.ENGINE_CHOICES)
def test_low_precision_grads_with_fp32_params(engines):
    """The master-weight call: fp32 params (the master copy), bf16 gradients."""
    args = list(_inputs([300, 129], "float32", amsgrad=True, grad_scale=torch.tensor(64.0)))
    args[1] = [(g * 64).to(torch.bfloat16) for g in args[1]]
    _check(tuple(args), fused_adamw.FusedAdamwConfig(engines=engines), "float32")


@pytest.mark.parametrize("engines", fused_adamw.ENGINE_CHOICES)
@pytest.mark.parametrize("dtype", fused_adamw.PARAM_DTYPES)
def test_found_inf_leaves_every_tensor_bitwise_unchanged(engines, dtype):
    """inf and NaN gradients with found_inf set: params and state keep their bits."""
    args = _inputs([300, 5], dtype, amsgrad=True, found_inf=torch.tensor(1.0))
    args[1][0][3], args[1][0][7], args[1][1][0] = float("inf"), float("nan"), float("-inf")
    before = _copies(args)
    run_kernel(SPEC, args, fused_adamw.FusedAdamwConfig(engines=engines))
    for got, was in zip(_updated(args), _updated(before)):
        assert torch.equal(got.view(torch.int16 if got.itemsize == 2 else torch.int32),
                           was.view(torch.int16 if was.itemsize == 2 else torch.int32))  # fmt: skip
    assert all(s.item() == b.item() for s, b in zip(args[5], before[5]))  # steps untouched


def test_zero_state_and_eps_stay_in_the_activation_ranges():
    """v = m = g = 0 with eps = 0: sqrt and reciprocal inputs stay in their documented
    ranges (the interpreter gives NaN outside them), so the update is the decay alone."""
    zeros = [torch.zeros(200)]
    args = _inputs([200], eps=0.0, amsgrad=False, grad_scale=None)
    args = (args[0], zeros, [torch.zeros(200)], [torch.zeros(200)], [], *args[5:])
    p0 = args[0][0].clone()
    run_kernel(SPEC, args, SPEC.config.default())
    torch.testing.assert_close(args[0][0], p0 * (1 - args[6] * args[9]), rtol=2**-22, atol=0)


# -- device-tensor hyperparameters ----------------------------------------------------------


def test_new_lr_and_step_need_no_new_kernel_build(monkeypatch):
    """A new lr or step count reaches the kernel as data: every call has the same
    compile-time arguments and tensor shapes (NKI's cache key), so one build serves all."""
    keys = set()
    real = routing.interpreter_runner

    def recording(kernel, *args, **kwargs):
        def key(a):
            if isinstance(a, tuple):
                return tuple(key(x) for x in a)
            if isinstance(a, torch.Tensor):
                return (tuple(a.shape), a.dtype)
            return a

        # NKI caches a build per function and launch grid (kernel[lnc] is a new object
        # each call, the same build)
        keys.add((getattr(kernel, "fn", kernel), getattr(kernel, "grid", ()), key(args)))
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(routing, "interpreter_runner", recording)
    args = _inputs([300, 40], amsgrad=False, found_inf=None, grad_scale=None)
    seen = []
    with cpu_mode("interpret"):
        for k, lr in enumerate([1e-3, 3e-3, 5e-4, 2e-2]):
            for s in args[5]:
                s.fill_(k + 1)
            call = (*args[:6], lr, *args[7:])
            torch.ops.neuron.fused_adamw_(*call)
            seen.append(args[0][0].clone())
    assert len(keys) == 1, keys
    assert all(not torch.equal(a, b) for a, b in zip(seen, seen[1:]))  # each call did update


# -- engines ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "engines, expected",
    [("vector", {"vector"}), ("vector_scalar", {"vector", "scalar"}), ("spread", {"vector", "scalar", "gpsimd"})],
)  # fmt: skip
def test_engine_assignment_is_what_the_config_says(engines, expected):
    runs = []
    args = _inputs([128 * 64], amsgrad=True)
    run_kernel(SPEC, args, fused_adamw.FusedAdamwConfig(engines=engines), runs=runs)
    compute = {e for e in runs[0].trace.count_by_engine() if e not in ("dma",)}
    assert compute == expected


# -- bad input and edge cases ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["reference", "interpret"])
def test_bad_input_in_the_middle_leaves_every_tensor_untouched(mode):
    args = list(_inputs([50, 60, 70], amsgrad=True))
    args[3] = [args[3][0], torch.zeros(61), args[3][2]]  # exp_avg_sqs[1] has the wrong shape
    before = _copies(tuple(args))
    with cpu_mode(mode), pytest.raises(LimitError) as err:
        torch.ops.neuron.fused_adamw_(*args)
    assert err.value.arg == "exp_avg_sqs[1] shape" and "(60,)" in str(err.value)
    for got, was in zip(_updated(tuple(args)), _updated(before)):
        assert torch.equal(got, was)


def test_empty_lists_and_empty_tensors_are_no_ops():
    with cpu_mode("interpret"):
        torch.ops.neuron.fused_adamw_(
            [], [], [], [], [], [], 1e-3, 0.9, 0.999, 0.0, 1e-8, False, False
        )
        args = _inputs([0, 9], amsgrad=False)
        before = _copies(args)
        torch.ops.neuron.fused_adamw_(*args)
    assert args[0][0].numel() == 0 and not torch.equal(args[0][1], before[0][1])


# -- stochastic rounding of bf16 params -----------------------------------------------------


def _bf16_inputs(n, seed, zero_update=False, lr=1e-3, wd=0.01):
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(n, generator=g).to(torch.bfloat16), torch.randn(7, generator=g).to(torch.bfloat16)]  # fmt: skip
    like = [torch.zeros(p.shape) for p in params]
    grads = [torch.zeros_like(p) if zero_update else torch.randn(p.shape, generator=g).to(p.dtype) for p in params]  # fmt: skip
    m = like if zero_update else [torch.randn(p.shape, generator=g) * 0.1 for p in params]
    v = [x.clone() for x in like] if zero_update else [torch.rand(p.shape, generator=g) * 0.01 for p in params]  # fmt: skip
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    return (params, grads, m, v, [], steps, lr, 0.9, 0.999, wd, 1e-8, False, False, None, None, seed)  # fmt: skip


def _bits(t):
    return t.view(torch.int16)


def test_stochastic_rounding_is_reproducible_for_a_seed():
    a, b, c = _bf16_inputs(70000, 5), _bf16_inputs(70000, 5), _bf16_inputs(70000, 6)
    for args in (a, b, c):
        run_kernel(SPEC, args, SPEC.config.default())
    assert torch.equal(_bits(a[0][0]), _bits(b[0][0])) and torch.equal(
        _bits(a[0][1]), _bits(b[0][1])
    )
    assert not torch.equal(a[0][0], c[0][0])  # another seed, other bits


def test_stochastic_rounding_draws_the_same_bits_as_the_torch_reference():
    """With a decay-only update the fp32 value before rounding is one multiply in both, so
    the kernel's bf16 bits must equal the reference's exactly: the hash is backend-free."""
    kernel, ref = (
        _bf16_inputs(70000, 11, zero_update=True),
        _bf16_inputs(70000, 11, zero_update=True),
    )
    run_kernel(SPEC, kernel, SPEC.config.default())
    SPEC.reference(*ref, upcast=False)
    for got, want in zip(kernel[0], ref[0]):
        assert torch.equal(_bits(got), _bits(want))


def test_stochastic_rounding_is_unbiased():
    """p = 1.0 decayed by 1e-3: the fp32 value 0.999 lies 74% of a bf16 ulp above 0.99609.
    Round-to-nearest gives 1.0 everywhere (bias 1e-3); the mean of 2^17 stochastic roundings
    must be within 5 standard deviations (ulp * sqrt(q (1 - q) / N)) of 0.999."""
    n = 2**17
    args = list(_bf16_inputs(n, 3, zero_update=True, lr=1e-3, wd=1.0))
    args[0] = [torch.ones(n, dtype=torch.bfloat16), torch.ones(7, dtype=torch.bfloat16)]
    run_kernel(SPEC, tuple(args), SPEC.config.default())
    exact = torch.tensor(1.0, dtype=torch.float32) * torch.tensor(1 - 1e-3, dtype=torch.float32)
    lo, ulp = 255 / 256, 2.0**-8
    q = (exact.item() - lo) / ulp
    bound = 5 * ulp * (q * (1 - q) / n) ** 0.5
    mean = args[0][0].double().mean().item()
    assert set(args[0][0].unique().tolist()) == {lo, 1.0}
    assert abs(mean - exact.item()) <= bound, (mean, exact.item(), bound)
    assert abs(1.0 - exact.item()) > 20 * bound  # the bound does tell rounding modes apart


@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_dma_floor_counts_each_updated_tensor_read_and_written_back(amsgrad):
    """One step reads p, g, m, v (and vmax) and writes p, m, v (and vmax) back: fp32, that
    is 28 bytes per element (36 with amsgrad), the bytes `benchmarks/fused_adamw.py` divides by;
    `host_bytes` (what a run allocates) counts each tensor once."""
    problem = {"tensors": 3, "numel": 1000, "amsgrad": amsgrad, "rounding": False}
    with torch.device("meta"):
        args = fused_adamw.SPEC.make_inputs(problem, "float32", measure_generator())
    elements = sum(p.numel() for p in args[0])
    scalars = sum(t.numel() * 4 for t in args[5]) + 4 + 4  # steps, grad_scale, found_inf
    per_element = 36 if amsgrad else 28
    expected = per_element * elements + scalars
    assert fused_adamw.SPEC.min_traffic_bytes(problem, "float32") == expected
    read_once = (20 if amsgrad else 16) * elements + scalars  # p, g, m, v (and vmax)
    assert fused_adamw.SPEC.host_bytes(problem, "float32") == read_once


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_found_inf_at_step_zero_leaves_every_tensor_unchanged(dtype):
    """Issue 32 item 8: at state_steps == 0, 1 - beta2^0 = 0 made the (ungated) 1/bc2
    coefficient inf and the params NaN; torch leaves every tensor untouched when found_inf
    is set, whatever the step, and so does the kernel now."""
    args = _inputs([300, 5], dtype, found_inf=torch.tensor(1.0))
    for s in args[5]:
        s.zero_()
    ran = _copies(args)
    run_kernel(SPEC, ran)
    for before, after in zip(_updated(args), _updated(ran)):
        assert torch.equal(before, after)


def test_large_gradients_within_the_documented_bound_match_the_reference():
    """The documented limit (README, fused_adamw_): sqrt(v / bc2) must stay <= 2^42 (VectorE
    reciprocal's valid input); |g| = 1e12 at step 1 is inside it and matches torch. The
    tolerance is the op's fp32 one."""
    args = _inputs([300], "float32", grad_scale=None, found_inf=None)
    args[1][0].mul_(1e12)
    for s in args[5]:
        s.fill_(1.0)
    args[2][0].zero_()
    args[3][0].zero_()
    _check(args, SPEC.config.default(), "float32")


def test_bf16_found_inf_under_nki_precise_fp_0_is_one_error_and_changes_nothing(monkeypatch):
    """Issue 32 item 2: the kernel masks a skipped step through the gradient's bits, which
    bf16 stored as fp32 (NKI_PRECISE_FP=0) does not have: one error naming the setting,
    raised before any tensor is written."""
    from neuron_kernels.interpreter.errors import NotImplementedByInterpreter

    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    args = _inputs([300], "bfloat16", found_inf=torch.tensor(0.0))
    ran = _copies(args)
    with (
        cpu_mode("interpret"),
        pytest.raises(NotImplementedByInterpreter, match="NKI_PRECISE_FP=0"),
    ):
        torch.ops.neuron.fused_adamw_(*ran)
    for before, after in zip(_updated(args), _updated(ran)):
        assert torch.equal(before, after)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3 * 128 * 64), min_size=1, max_size=8),
    tile=st.sampled_from([64, 512]),
)
def test_the_budget_check_covers_every_launch_the_op_makes(sizes, tile):
    """A config the budget check accepts for (tensors, numel) fits every launch the op makes
    of tensors up to numel: no launch's rows are wider than the check's."""
    config = fused_adamw.FusedAdamwConfig(tile_free=tile)
    worst = SPEC.check({"tensors": len(sizes), "numel": max(sizes)}, "float32", config, "trn2")
    for launch in fused_adamw.launches(sizes, config, 128):
        assert launch.cols <= worst.cols
