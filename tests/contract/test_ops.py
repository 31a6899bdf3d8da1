"""The contract every op in the registry keeps: the same battery, parametrized over the registry.

A new op gets all of these by registering its OpSpec; nothing here names a particular op.

LNC: every kernel splits its work over the cores of a logical NeuronCore (``kernel[lnc]``).
The probe-problem battery (every config, the stored configs) runs at LNC 1 and 2; the
Hypothesis draws run at LNC=2 only (the split's edge cases: fewer work items than cores,
remainder tiles), the at-scale budget check draws the LNC with the target; the torch-level
tests in ``cpu_mode("interpret")`` launch at the op runner's LNC (trn2: 2). The interpreter
runs the two program instances one after the other over shared HBM, so this proves the
split is complete and disjoint in its outputs (a missed or doubled share fails the
reference check) and that LNC=2 keeps LNC=1's numerics; the timing of two real cores
is only a Trn2 run's to prove.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neuron_kernels.torch_ops  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels import tuned_configs
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import TARGETS
from neuron_kernels.interpreter import NkiValidationError
from neuron_kernels.kernels import REGISTRY
from neuron_kernels.torch_ops import cpu_mode, routing
from neuron_kernels.verification import (
    InterpreterRunner,
    assert_within_tolerance,
    copy_args,
    interpreter_runner_for,
    run_kernel,
)

OPS = sorted(REGISTRY)


def _op(spec):
    return getattr(torch.ops.neuron, spec.name)


def _problems(spec):
    """Hypothesis strategy over the op's problem sizes, favouring its edge values."""
    ranges, edges = spec.test_problems["ranges"], spec.test_problems.get("edges", ())
    dims = {}
    for dim, (lo, hi) in ranges.items():
        favoured = [e for e in edges if lo <= e <= hi]
        dims[dim] = (
            st.one_of(st.sampled_from(favoured), st.integers(lo, hi))
            if favoured
            else st.integers(lo, hi)
        )
    return st.fixed_dictionaries(dims)


def _inputs(spec, problem, dtype, seed=0):
    return spec.make_inputs(problem, dtype, torch.Generator().manual_seed(seed))


def _launch_key(value):
    """A hashable key of a kernel argument: a tensor by its dtype, layout and bytes; a
    container by its items; anything else (the plan, an NKIObject with structural equality)
    as itself."""
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        return ("tensor", str(value.dtype), tuple(value.shape), value.stride(), digest)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, *(_launch_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", *((k, _launch_key(v)) for k, v in sorted(value.items())))
    return (type(value).__qualname__, value)


class _SameLaunchRunner(InterpreterRunner):
    """An interpreter runner that runs each distinct launch once: the same kernel function
    on the same grid with byte-identical tensor arguments and an equal plan issues the same
    instructions on the same data (the kernel reads its config only through its plan, and
    the interpreter is deterministic), so a second config whose launches equal an earlier
    config's gets that launch's outputs (copies) instead of a second interpretation. Every
    config still goes through ``spec.check``, its own ``run_kernels`` and the reference
    check; only the repeated interpretation is skipped."""

    def __init__(self, memo: dict, target=None, lnc: int = 1) -> None:
        super().__init__(target, lnc=lnc)
        self.memo = memo

    def __call__(self, kernel, *args, **kwargs):
        fn, grid = getattr(kernel, "fn", kernel), getattr(kernel, "grid", ())
        key = (fn, grid, _launch_key(args), _launch_key(kwargs))
        if key not in self.memo:
            self.memo[key] = super().__call__(kernel, *args, **kwargs)
        (outputs,) = copy_args((self.memo[key],))  # a copy each: callers may write to it
        return outputs


def _reference(spec, args, memo: dict | None):
    """The fp64 reference of ``args``: the outputs, or for an in-place op the tensors it
    updates (on fp64 copies). With ``memo``, computed once per battery (the inputs are the
    same for every config)."""
    if memo is not None and "reference" in memo:
        return memo["reference"]
    if spec.mutates:
        ref = copy_args(args, torch.float64)
        spec.reference(*ref, upcast=True)
        want = spec.mutated_tensors(ref)
    else:
        want = spec.reference(*args, upcast=True)
    if memo is not None:
        memo["reference"] = want
    return want


def _assert_matches_reference(
    spec, args, config, dtype, context, target=None, lnc=1, memo: dict | None = None
):
    """The kernel on the interpreter, launched at LNC ``lnc``, against the fp64 reference:
    the outputs, or for an in-place op every tensor it updates (kernel and reference each
    on their own copies). With ``memo`` (one battery over configs on the same inputs),
    launches equal to one already run reuse its outputs (:class:`_SameLaunchRunner`) and
    the reference is computed once."""
    tol = spec.tolerances[dtype]
    context = f"{context} at LNC={lnc}"

    def run(run_args):
        if memo is None:
            return run_kernel(spec, run_args, config, target=target, lnc=lnc)
        runner = _SameLaunchRunner(memo, target, lnc=lnc)
        return spec.run_kernels(*run_args, config=config, runner=runner)

    if not spec.mutates:
        out = run(args)
        assert_within_tolerance(out, _reference(spec, args, memo), tol, context)
        return
    ran = copy_args(args)
    run(ran)
    got, want = spec.mutated_tensors(ran), _reference(spec, args, memo)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_within_tolerance(g, w, tol, f"{context} [updated tensor {i}]")


@pytest.mark.parametrize("name", OPS)
def test_kernel_agrees_with_reference(name):
    """The NKI kernel on the interpreter, launched at LNC=2 on trn2, matches the fp64
    reference within the declared tolerance."""
    spec = REGISTRY[name]

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problem=_problems(spec), dtype=st.sampled_from(spec.dtypes), seed=st.integers(0, 2**16))
    def check(problem, dtype, seed):
        args = _inputs(spec, problem, dtype, seed)
        config = spec.config.default()
        context = f"[{name} {problem} {dtype} {config}]"
        _assert_matches_reference(spec, args, config, dtype, context, target="trn2", lnc=2)

    check()


@pytest.mark.parametrize("mode", ["reference", "interpret"])
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, mode):
    spec = REGISTRY[name]
    args = _inputs(spec, spec.test_problems["probe"], "float32")
    with cpu_mode(mode):
        torch.library.opcheck(_op(spec).default, args)


def _grad_leaves(args) -> tuple[list, list]:
    """(op leaves, fp64 reference leaves): each floating-point tensor argument as a fresh
    leaf requiring grad; the other arguments (integer tensors such as varlen's cu_seqlens,
    which have no gradient, and non-tensors) as they are, so two arguments that are one
    tensor stay one tensor."""
    floats = [isinstance(a, torch.Tensor) and a.is_floating_point() for a in args]
    leaves = [a.clone().requires_grad_(True) if f else a for a, f in zip(args, floats)]
    ref = [a.detach().double().requires_grad_(True) if f else a for a, f in zip(args, floats)]
    return leaves, ref


def _has_autograd(spec) -> bool:
    """The op has gradients: its own autograd, or those of the ops it is composed of."""
    return spec.autograd is not None or spec.composite is not None


def _differentiable(out, ref) -> list:
    """(op output, reference output) pairs for the op's differentiable outputs (a
    multi-output op may mark some, such as a saved statistic, non-differentiable)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    return [(o, r) for o, r in zip(outs, refs) if o.requires_grad]


@pytest.mark.parametrize("name", [n for n in OPS if _has_autograd(REGISTRY[n])])
def test_autograd_matches_reference(name):
    """Gradients through the op (interpreted kernels, also in backward) match autograd of
    the fp64 reference within the op's float32 tolerance."""
    spec = REGISTRY[name]
    args = _inputs(spec, spec.test_problems["probe"], "float32")
    leaves, ref_leaves = _grad_leaves(args)
    with cpu_mode("interpret"):
        out = _op(spec)(*leaves)
    loss = ref_loss = 0.0
    for i, (o, r) in enumerate(_differentiable(out, spec.reference(*ref_leaves, upcast=True))):
        weight = torch.randn(o.shape, generator=torch.Generator().manual_seed(1 + i))
        loss = loss + (o * weight).sum()
        ref_loss = ref_loss + (r * weight.double()).sum()
    loss.backward()
    ref_loss.backward()
    for got, want in zip(leaves, ref_leaves):
        if isinstance(got, torch.Tensor) and got.requires_grad:
            assert_within_tolerance(
                got.grad, want.grad, spec.tolerances["float32"], f"[{name} grad]"
            )


def _empty_problems():
    """(op, problem) for each zero-size problem an op accepts: its declared ``"empty"`` list,
    else its probe with each dimension in turn set to 0."""
    for name in OPS:
        spec = REGISTRY[name]
        if not _has_autograd(spec):
            continue
        probe = spec.test_problems["probe"]
        empty = spec.test_problems.get("empty", [{**probe, dim: 0} for dim in probe])
        for problem in empty:
            yield pytest.param(name, problem, id=f"{name}-{'x'.join(map(str, problem.values()))}")


@pytest.mark.parametrize("name,problem", list(_empty_problems()))
def test_autograd_with_an_empty_dimension(name, problem):
    """A zero-size dimension gives the reference's (empty or all-zero) output and gradients,
    with the reference's shapes: no kernel launch needs to run, nothing may crash."""
    spec = REGISTRY[name]
    args = _inputs(spec, problem, "float32")
    leaves, ref_leaves = _grad_leaves(args)
    with cpu_mode("interpret"):
        out = _op(spec)(*leaves)
    ref = spec.reference(*ref_leaves, upcast=True)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert [o.shape for o in outs] == [r.shape for r in refs], (outs, refs)
    pairs = _differentiable(out, ref)
    sum((o * torch.ones(o.shape)).sum() for o, _ in pairs).backward()
    sum((r * torch.ones(r.shape, dtype=torch.float64)).sum() for _, r in pairs).backward()
    for got, want in zip(leaves, ref_leaves):
        if isinstance(got, torch.Tensor) and got.requires_grad:
            assert got.grad is not None and got.grad.shape == want.grad.shape, (name, problem)
            torch.testing.assert_close(got.grad, want.grad.float(), rtol=0, atol=0)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r.to(o.dtype), rtol=0, atol=0)


@pytest.mark.parametrize("name", OPS)
def test_compile_fullgraph(name):
    # Every parametrization compiles the same ``fn`` code object: without a reset, Dynamo
    # counts the ops as recompiles of one frame and stops at its limit (8) with the ninth op.
    torch._dynamo.reset()
    spec = REGISTRY[name]
    args = _inputs(spec, spec.test_problems["probe"], "float32")
    op = _op(spec)

    def fn(*xs):
        return op(*xs)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    if spec.mutates:  # an in-place op: compare what each run updated
        eager_args, compiled_args = copy_args(args), copy_args(args)
        assert compiled(*compiled_args) is None and fn(*eager_args) is None
        torch.testing.assert_close(
            spec.mutated_tensors(compiled_args), spec.mutated_tensors(eager_args)
        )
        return
    torch.testing.assert_close(compiled(*args), fn(*args))


@pytest.mark.parametrize("name", [n for n in OPS if REGISTRY[n].bad_inputs is not None])
def test_bad_input_names_the_argument(name, monkeypatch):
    """Each op-boundary limit raises LimitError naming the argument, before any kernel runs."""
    spec = REGISTRY[name]

    def no_kernel(*args, **kwargs):
        raise AssertionError("the kernel ran before the input was validated")

    monkeypatch.setattr(routing, "interpreter_runner", no_kernel)
    cases = spec.bad_inputs()
    assert cases, "an op with bad_inputs must declare at least one case"
    for args, arg_name in cases:
        for mode in ("reference", "interpret"):
            with cpu_mode(mode), pytest.raises(LimitError) as err:
                _op(spec)(*args)
            assert err.value.op == spec.name and err.value.arg == arg_name, str(err.value)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name", OPS)
def test_every_config_is_rejected_or_runs_correctly(name, lnc):
    """On the probe problem every declared config is either refused by spec.check or runs on
    the interpreter, launched at LNC ``lnc``, without a limit error and matches the reference.
    Configs whose launches equal an earlier config's (same plan on the probe problem) reuse
    its interpretation (:class:`_SameLaunchRunner`): rms_norm_bwd's 648 configs are 288
    distinct launches there, AdamW's 144 are 12."""
    spec = REGISTRY[name]
    problem = spec.test_problems["probe"]
    dtype = "bfloat16" if "bfloat16" in spec.dtypes else spec.dtypes[0]
    args = _inputs(spec, problem, dtype)
    memo: dict = {}
    ran = rejected = 0
    for config in spec.config.all_configs():
        try:
            spec.check(problem, dtype, config, "trn2", lnc)
        except LimitError:
            rejected += 1
            continue
        context = f"[{name} {config}]"
        _assert_matches_reference(
            spec, args, config, dtype, context, target="trn2", lnc=lnc, memo=memo
        )
        ran += 1
    assert ran > 0, "no config of the op runs on its probe problem"


@pytest.mark.parametrize("name", OPS)
def test_accepted_configs_fit_the_hardware_at_scale(name):
    """Where budgets bind, a config spec.check accepts never breaks an interpreter limit
    (SBUF/PSUM capacity, tile shapes, per core), on every target at each of its LNCs.
    Trace-only runs. Draws spec.check refuses are skipped, so the test counts the draws that
    ran and fails if none did (it would otherwise pass having checked nothing)."""
    spec = REGISTRY[name]
    problem = spec.test_problems["large"]
    configs = list(spec.config.all_configs())
    ran = []  # (config, dtype, target, lnc) of each draw that ran

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        config=st.sampled_from(configs),
        dtype=st.sampled_from(spec.dtypes),
        target=st.sampled_from(["trn1", "trn2", "trn3"]),
        lnc=st.sampled_from([1, 2]),
    )
    def check(config, dtype, target, lnc):
        if lnc not in TARGETS[target].lnc_choices:
            lnc = 1
        if not spec.is_valid(problem, dtype, config, target, lnc):
            return
        args = _inputs(spec, problem, dtype)
        try:
            runner = interpreter_runner_for(target, compute=False, lnc=lnc)
            spec.run_kernels(*args, config=config, runner=runner)
        except NkiValidationError as exc:
            pytest.fail(
                f"spec.check accepted {config} for {problem} {dtype} on {target} at LNC={lnc}, "
                f"but the interpreter refused it: {exc}"
            )
        ran.append((config, dtype, target, lnc))

    check()
    assert ran, f"no drawn config of {name} was accepted on {problem}: the test checked nothing"


def _stored_entries():
    root = tuned_configs.shipped_dir()  # the configs we ship (a user folder is the user's)
    for path in sorted(root.glob("*/*.json")):
        op, target = path.stem, path.parent.name
        if op not in REGISTRY:
            continue
        for entry in tuned_configs.load_entries(path, op, target):
            lnc = tuned_configs.entry_lnc(entry)
            yield pytest.param(
                op,
                target,
                entry,
                id=f"{target}-{op}-{entry['shape_bucket']}-{entry['dtype']}-lnc{lnc}",
            )


@pytest.mark.parametrize("name,target,entry", list(_stored_entries()))
def test_stored_perf_results_replay(name, target, entry):
    """Every tuned config in perf_results/ is for the current kernel, valid, and correct."""
    spec = REGISTRY[name]
    assert entry["kernel_hash"] == tuned_configs.kernel_hash(spec), (
        f"perf_results/{target}/{name}.json holds a config tuned for another kernel version: re-tune it"
    )
    config = spec.config.from_dict(entry["config"])
    problem = spec.test_problems["probe"]
    lnc = tuned_configs.entry_lnc(entry)
    spec.check(problem, entry["dtype"], config, target, lnc)
    args = _inputs(spec, problem, entry["dtype"])
    context = f"[{name} stored {json.dumps(entry['config'])}]"
    _assert_matches_reference(spec, args, config, entry["dtype"], context, target, lnc)


@pytest.mark.parametrize("name,target,entry", list(_stored_entries()))
def test_stored_perf_results_are_reachable(name, target, entry):
    """A call with inputs of the entry's tuned shape runs the entry's config: the bucket it was
    stored under is the one the op computes at call time (non-size keys such as a casting
    mode, amsgrad or causal included), so no shipped entry is dead."""
    spec = REGISTRY[name]
    assert "shape" in entry, f"{name} entry {entry['shape_bucket']} does not say the shape it tuned"
    with torch.device("meta"):
        args = _inputs(spec, spec.parse_shape(entry["shape"]), entry["dtype"])
    tuned_configs._said.clear()
    choice = routing.select_config(spec, args, target, tuned_configs.entry_lnc(entry))
    assert choice.entry == entry, (
        f"perf_results/{target}/{name}.json: a call at {entry['shape']} looks up bucket "
        f"{spec.shape_bucket(spec.problem(*args))!r}, not the entry's {entry['shape_bucket']!r}"
    )


@pytest.mark.parametrize("name", OPS)
def test_spec_declares_everything(name):
    """Tolerances for every dtype with a reason, a labelled reason per default ("modeled: ...",
    "hardware: ..." or "correctness: ..."; tunable() itself refuses, at import, a default off
    its choices and a reason not starting with one of the labels), and the default runs."""
    spec = REGISTRY[name]
    assert set(spec.tolerances) >= set(spec.dtypes)
    for dtype, tol in spec.tolerances.items():
        assert tol.reason and tol.atol >= 0 and tol.rtol >= 0, dtype
    default = spec.config.default()
    for field, why in spec.config.reasons().items():
        assert why.split(":")[0] in ("modeled", "hardware", "correctness"), (field, why)
    for target in ("trn1", "trn2", "trn3"):
        for dtype in spec.dtypes:
            spec.check(
                spec.test_problems["probe"], dtype, default, target
            )  # the default always runs
