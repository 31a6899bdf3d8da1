"""Smoke checks for a fresh Trn2 node: each check prints one line, PASS or FAIL.

    python examples/trn2_smoke.py --nrtpy-python ~/nrtpy_venv/bin/python [--dtype bfloat16]

Run it from the NKI environment (on a Neuron DLAMI, its PyTorch venv, with TorchNeuron:
torch-neuronx 2.14) with neuron-kernels installed; the nrtpy environment is the one of
neuron-runtime/nrtpy/nrtpy-getting-started.rst (``--nrtpy-python`` or
``NEURON_KERNELS_NRTPY_PYTHON``). Nothing is written into the package: studies and tuned
configs go to a temporary folder. Exit code 0 when every check passes.

Checks:
    hardware tuning: a one-trial hardware study of matmul (compile worker -> NEFF, measure
        worker -> device-side latency on a NeuronCore, correctness gate against the
        reference), whose "hardware" entry the op's config lookup then returns.
    <op> at LNC=2: every op's kernels launched as ``kernel[2]`` (the two physical cores of
        a Trn2 logical core, each taking its share by ``nl.program_id``) on the op's probe
        problem, against its float64 reference, held to the op's tolerance. Skipped (one
        line) where the target or ``NEURON_LOGICAL_NC_CONFIG`` does not launch at LNC=2.
    flash_attention, flash_attention_varlen, rms_norm, matmul, FusedAdamW: the op on the
        ``neuron`` device, eagerly and under ``torch.compile(backend="neuron",
        fullgraph=True)`` (the optimizer step compiled as a function), against the same
        computation in plain torch on CPU in float64, held to the op's declared tolerance
        for the dtype. Without torch-neuronx
        these run on CPU tensors, the kernels on the NKI interpreter, with ``aot_eager``.
    flash_attention window / softcap / sinks / padding mask / dropout: one line each, the
        op eagerly with a causal sliding window (64, 0), a logit softcap of 30, per-head
        attention sinks, a bool ``[B, 1, 1, Sk]`` padding mask or dropout 0.1, its
        output and its gradients (q, k, v, and the sinks) through autograd (the backward
        kernel) against fp64 autograd of the reference on CPU, held to the forward's and
        the backward op's declared tolerances.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

import torch

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.hardware import default_target, launch_lnc
from neuron_kernels.kernels import REGISTRY
from neuron_kernels.kernels.spec import FunctionRunner
from neuron_kernels.torch_ops import cpu_mode, neuron_device, routing
from neuron_kernels.torch_ops.optim import FusedAdamW
from neuron_kernels.verification import copy_args

# Small problems: quick on the interpreter, still several tiles and the GQA/causal paths.
PROBLEMS = {
    "flash_attention": {"b": 1, "h": 2, "hkv": 1, "sq": 256, "sk": 256, "d": 64, "causal": True},
    # 3 causal sequences packed to 300 rows (one cu_seqlens tensor: the band is skipped)
    "flash_attention_varlen": {
        "n": 3,
        "total_q": 300,
        "total_k": 300,
        "h": 2,
        "hkv": 1,
        "d": 64,
        "max_q": 160,
        "max_k": 160,
        "causal": True,
        "same_packing": True,
    },
    "rms_norm": {"rows": 256, "h": 512},
    "matmul": {"m": 256, "k": 512, "n": 512},
}


def _place() -> tuple[str, str]:
    """``(device, compile backend)``: the neuron device and backend on a TorchNeuron node."""
    try:
        importlib.import_module("torch_neuronx")
    except ImportError:
        return "cpu", "aot_eager"
    device_module = getattr(torch, "neuron", None)
    visible = device_module is not None and device_module.is_available()
    return ("neuron" if visible else "cpu"), "neuron"


def _within(got: torch.Tensor, want: torch.Tensor, tol) -> tuple[bool, str]:
    """``|got - want| <= atol + rtol * |want|`` everywhere; the worst ratio to the bound."""
    err = (got.detach().cpu().double() - want.detach().double()).abs()
    bound = tol.atol + tol.rtol * want.detach().double().abs()
    ratio = float((err / bound).max()) if err.numel() else 0.0
    return ratio <= 1.0, f"worst error {ratio:.3f} of the bound (atol {tol.atol}, rtol {tol.rtol})"


def _report(name: str, check) -> bool:
    try:
        ok, detail = check()
    except Exception as exc:  # noqa: BLE001  (a smoke test reports every failure, one line each)
        ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


def _op_check(name: str, dtype: str, device: str, fn):
    spec = REGISTRY[name]
    args = spec.make_inputs(PROBLEMS[name], dtype, torch.Generator().manual_seed(0))
    want = spec.reference(*args, upcast=True)
    on_device = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]

    def check():
        return _within(fn(*on_device), want, spec.tolerances[dtype])

    return check


# The attention features, each on the flash_attention problem above (causal).
FEATURES = {
    "window": {"window_left": 64, "window_right": 0},
    "softcap": {"softcap": 30.0},
    "sinks": {"sinks": True},
    "padding mask": {"mask": "bool", "mask_dims": "b11k"},
    "dropout": {"dropout_p": 0.1},
}


def _feature_check(extra: dict, dtype: str, device: str):
    """flash_attention with one feature, eagerly on ``device``: its output and its
    gradients (q, k, v, sinks) through autograd against fp64 autograd of the reference."""
    spec = REGISTRY["flash_attention"]
    bwd = REGISTRY["flash_attention_bwd"]
    args = spec.make_inputs(
        {**PROBLEMS["flash_attention"], **extra}, dtype, torch.Generator().manual_seed(0)
    )
    weight = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(1))

    def leaves(to):
        """The inputs moved to ``to`` (a dtype or a device), float tensors as autograd
        leaves; the others (a bool mask, the dropout seed) keep their dtype."""
        out = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a = a.detach().to(to).requires_grad_(True)
            elif isinstance(a, torch.Tensor) and not isinstance(to, torch.dtype):
                a = a.to(to)
            out.append(a)
        return out

    def check():
        ref_leaves = leaves(torch.float64)
        ref = spec.reference(*ref_leaves, upcast=True)
        (ref * weight.double()).sum().backward()
        ours = leaves(device)
        window = list(ours[5]) if ours[5] is not None else None
        out = torch.ops.neuron.flash_attention(*ours[:5], window, *ours[6:])
        (out.float() * weight.to(device)).sum().backward()
        results = [_within(out, ref, spec.tolerances[dtype])]
        for got, want in zip(ours, ref_leaves):
            if isinstance(got, torch.Tensor) and got.requires_grad:
                results.append(_within(got.grad, want.grad, bwd.tolerances[dtype]))
        worst = max(results, key=lambda r: float(r[1].split()[2]))
        return all(ok for ok, _ in results), worst[1]

    return check


def _adamw_check(dtype: str, device: str, step):
    """Two steps of FusedAdamW on three params against torch.optim.AdamW in float64 on CPU."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(300,), (17, 5), (64, 64)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(2)]
    hyper = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def run(optimizer_cls, params, stepper):
        opt = optimizer_cls(params, **hyper)
        for g in grads:
            for p, gi in zip(params, g):
                p.grad = gi.to(device=p.device, dtype=p.dtype)
            stepper(opt)
        return [p.detach() for p in params]

    def check():
        ref = run(
            torch.optim.AdamW, [torch.nn.Parameter(p.double()) for p in start], lambda o: o.step()
        )
        params = [torch.nn.Parameter(p.to(getattr(torch, dtype)).to(device)) for p in start]
        got = run(FusedAdamW, params, step)
        tol = REGISTRY["fused_adamw_"].tolerances[dtype]
        results = [_within(g, r, tol) for g, r in zip(got, ref)]
        worst = max(results, key=lambda r: float(r[1].split()[2]))
        return all(ok for ok, _ in results), worst[1]

    return check


def check_hardware_tuning(nrtpy_python: str | None, shape: str, workdir: Path) -> tuple[bool, str]:
    """One hardware trial of matmul at ``shape`` (bf16); (passed, what happened)."""
    from neuron_kernels import tuned_configs
    from neuron_kernels.autotune.backends import BackendUnavailable
    from neuron_kernels.autotune.neff_backend import HardwareBackend
    from neuron_kernels.autotune.objective import make_point
    from neuron_kernels.autotune.study import tune
    from neuron_kernels.kernels.spec import get_spec

    spec = get_spec("matmul")
    try:
        backend = HardwareBackend("trn2", nrtpy_python=nrtpy_python, workdir=workdir / "hw")
    except BackendUnavailable as exc:
        return False, str(exc)
    point = make_point(spec, shape, "bfloat16", backend.lnc)  # tuned at the LNC it runs at
    root = workdir / "perf_results"
    (found,) = tune(
        spec,
        [point],
        target="trn2",
        trials=1,
        storage_url=f"sqlite:///{workdir / 'studies.db'}",
        backend=backend,
        results_root=root,
        warm_start=False,
    )
    if found.best_us is None:
        return False, f"the trial did not complete ({found.failed} failed, {found.pruned} pruned)"
    choice = tuned_configs.lookup(spec, point.problem, "bfloat16", "trn2", root, lnc=backend.lnc)
    if choice.source != "hardware":
        return False, f"the op's lookup returned a {choice.source} config, not the hardware entry"
    hw = choice.entry.get("hardware", {})
    return True, (
        f"{found.best_us:.1f} us device-side median (p99 {choice.entry['metric']['p99_us']:.1f} "
        f"us) on {hw.get('instance_type')} at LNC={hw.get('lnc')}, neuronx-cc "
        f"{hw.get('compiler_version')}"
    )


def _op_checks(dtype: str) -> bool:
    """Every op eager and compiled against CPU; True when all pass."""
    device, backend = _place()
    target = default_target()
    print(
        f"ops: torch {torch.__version__}; device {device}; compile backend {backend}; "
        f"target {target.name}; LNC {launch_lnc(target)}; dtype {dtype}"
    )
    ops = {
        # make_inputs' (q, k, v, causal, scale, window, softcap, sinks, mask, dropout...)
        "flash_attention": lambda q, k, v, causal, scale, *features: (
            torch.ops.neuron.flash_attention(q, k, v, causal, scale, *features)
        ),
        "flash_attention_varlen": lambda q, k, v, cu_q, cu_k, mq, mk, causal, scale: (
            torch.ops.neuron.flash_attention_varlen(
                q, k, v, cu_q, cu_k, mq, mk, causal=causal, softmax_scale=scale
            )
        ),
        "rms_norm": lambda x, w, eps, offset, mode: torch.ops.neuron.rms_norm(
            x, w, eps, offset, mode
        ),
        "matmul": lambda a, b: torch.ops.neuron.matmul(a, b),
    }
    ok = True
    # Without a neuron device the kernels run on the interpreter (CPU tensors' "interpret").
    with cpu_mode("interpret"):
        for name, fn in ops.items():
            compiled = torch.compile(fn, backend=backend, fullgraph=True)
            ok &= _report(f"{name} eager", _op_check(name, dtype, device, fn))
            ok &= _report(f"{name} compiled", _op_check(name, dtype, device, compiled))
        for feature, extra in FEATURES.items():
            ok &= _report(f"flash_attention {feature}", _feature_check(extra, dtype, device))
        ok &= _report("FusedAdamW eager", _adamw_check(dtype, device, lambda o: o.step()))
        ok &= _report(
            "FusedAdamW compiled",
            _adamw_check(dtype, device, lambda o: torch.compile(o.step, backend=backend)()),
        )
    return ok


def _lnc2_check(spec, dtype: str, device: str, runner):
    """One op's kernels at LNC=2 on its probe problem against the fp64 reference: its output,
    or for an in-place op every tensor it updates."""

    def check():
        args = spec.make_inputs(
            spec.test_problems["probe"], dtype, torch.Generator().manual_seed(0)
        )
        moved = tuple(
            a.to(device) if isinstance(a, torch.Tensor) else
            [t.to(device) for t in a] if isinstance(a, list) else a
            for a in args
        )  # fmt: skip
        config = spec.config.default()
        if spec.mutates:
            ran, ref = copy_args(moved), copy_args(args, torch.float64)
            spec.run_kernels(*ran, config=config, runner=runner)
            spec.reference(*ref, upcast=True)
            pairs = list(zip(spec.mutated_tensors(ran), spec.mutated_tensors(ref)))
        else:
            out = spec.run_kernels(*moved, config=config, runner=runner)
            ref = spec.reference(*args, upcast=True)
            outs = out if isinstance(out, (tuple, list)) else [out]
            refs = ref if isinstance(ref, (tuple, list)) else [ref]
            pairs = list(zip(outs, refs))
        results = [_within(got, want, spec.tolerances[dtype]) for got, want in pairs]
        worst = max(results, key=lambda r: float(r[1].split()[2]))
        return all(ok for ok, _ in results), worst[1]

    return check


def _lnc2_checks(dtype: str) -> bool:
    """Every op's kernels launched at LNC=2; True when all pass (or LNC=2 is not launched)."""
    device, _ = _place()
    target = default_target()
    if 2 not in target.lnc_choices or launch_lnc(target) != 2:
        print(f"SKIP ops at LNC=2: {target.name} launches at LNC={launch_lnc(target)} here")
        return True
    if device == "cpu":  # the kernels on the NKI interpreter, two program instances
        runner = FunctionRunner(routing.interpreter_runner, target, 2)
    else:  # the jitted kernels on the node, launched kernel[2]
        runner = FunctionRunner(neuron_device.call_jitted, target, 2)
    ok = True
    for name, spec in sorted(REGISTRY.items()):
        if spec.kernels and dtype in spec.dtypes:
            ok &= _report(f"{name} at LNC=2", _lnc2_check(spec, dtype, device, runner))
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nrtpy-python", default=None, help="the nrtpy environment's python")
    parser.add_argument(
        "--shape", default="1024x1024x1024", help="matmul MxNxK (default %(default)s)"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16"), help="of the op checks"
    )
    args = parser.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="trn2-smoke-") as tmp:
        ok, detail = check_hardware_tuning(args.nrtpy_python, args.shape, Path(tmp))
        failed += not ok
        print(
            f"{'PASS' if ok else 'FAIL'} hardware tuning: matmul {args.shape} bf16, one trial: {detail}"
        )
    failed += not _lnc2_checks(args.dtype)
    failed += not _op_checks(args.dtype)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
