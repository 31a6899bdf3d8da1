"""Generate every ``torch.library`` facet of an op from its :class:`OpSpec`.

One call, :func:`register_op`, makes ``torch.ops.neuron.<name>``: the custom op (schema
inferred from the type hints of ``spec.run_kernels``), its fake impl (from ``output_shapes``),
its autograd (``spec.autograd``) and its ``neuron``-device kernel. There is no parallel
``autograd.Function``. On a TorchNeuron node the op is made by ``torch_neuronx.nki_op``
instead, so ``torch.compile(backend="neuron")`` captures its kernels (see :func:`_nki_op`).
"""

from __future__ import annotations

import inspect

import torch
from torch._subclasses.fake_tensor import FakeTensor

from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import footprint
from neuron_kernels.kernels.spec import OpSpec, runner_lnc
from neuron_kernels.torch_ops import neuron_device, routing

__all__ = [
    "NAMESPACE",
    "TracedLimitError",
    "register_op",
    "op_signature",
    "registered_through_nki_op",
]

NAMESPACE = "neuron"
_REGISTERED: dict[str, object] = {}
_LIBRARIES: list = []  # torch.library.Library objects of composite ops (kept alive)
_VIA_NKI_OP: set[str] = set()  # ops registered through torch_neuronx.nki_op


def _register_composite(spec: OpSpec, sig: inspect.Signature, bind):
    """``torch.ops.neuron.<name>`` as a CompositeImplicitAutograd op over other neuron ops
    (``spec.composite``): their autograd, fake impls and device routing apply; the input
    check is this op's own, so errors name it."""

    names = list(sig.parameters)

    def composite_impl(*args, **kwargs):
        return spec.composite(*_checked(spec, names, bind, args, kwargs))

    composite_impl.__signature__ = sig
    composite_impl.__name__ = spec.name
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    lib.define(spec.name + torch.library.infer_schema(composite_impl, mutates_args=()))
    lib.impl(spec.name, composite_impl, "CompositeImplicitAutograd")
    _LIBRARIES.append(lib)
    op = getattr(torch.ops, NAMESPACE).__getattr__(spec.name)
    _REGISTERED[spec.name] = op
    return op


def op_signature(spec: OpSpec) -> inspect.Signature:
    """The op's signature: ``spec.run_kernels`` without its ``config`` and ``runner`` parameters."""
    sig = inspect.signature(spec.run_kernels)
    params = [
        p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in sig.parameters.values()
        if p.name not in ("config", "runner")
    ]
    return sig.replace(parameters=params)


def _tensors(args):
    """The tensors among ``args``, also inside tensor-list arguments, in order."""
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, torch.Tensor))
        elif isinstance(a, torch.Tensor):
            out.append(a)
    return out


class TracedLimitError(LimitError, IndexError):
    """A :class:`LimitError` raised while ``torch.compile`` (Dynamo) traces an op on fake
    tensors: the same fields and one-line message, the original as ``__cause__``.

    Dynamo wraps an exception from a fake impl into a many-line ``TorchRuntimeError`` (the
    LimitError only inside its text); since PyTorch 2.13 it re-raises an ``IndexError`` from
    a fake run unwrapped (``torch/_dynamo/utils.py``, ``run_node``), so this subclass of both
    reaches the caller as the LimitError it is (``except LimitError`` and ``ValueError``
    still catch it). On older PyTorch the user sees Dynamo's wrapper, as before."""

    @classmethod
    def of(cls, exc: LimitError) -> TracedLimitError:
        return cls(exc.op, exc.arg, exc.rule, exc.value, limit=exc.limit, hint=exc.hint)


def _check_dense(spec: OpSpec, names: list, args: tuple) -> None:
    """Sparse (or other non-strided) tensors are refused in every mode, before any work: the
    kernels read strided memory, and reference math taking them would make the two CPU
    modes disagree on the same call."""
    for name, value in zip(names, args):
        items = value if isinstance(value, (list, tuple)) else [value]
        for i, t in enumerate(items):
            if isinstance(t, torch.Tensor) and t.layout != torch.strided:
                arg = f"{name}[{i}]" if isinstance(value, (list, tuple)) else name
                raise LimitError(spec.name, arg, "must be a dense (strided) tensor", t.layout)


def _validate_traced(spec: OpSpec, args: tuple) -> None:
    """``spec.validate`` in a fake impl: a refusal is a :class:`TracedLimitError`."""
    try:
        spec.validate(*args)
    except TracedLimitError:
        raise
    except LimitError as exc:
        raise TracedLimitError.of(exc) from exc


def _checked(spec: OpSpec, names: list, bind, args, kwargs) -> tuple:
    """The op's arguments bound in signature order, refused before any work when a tensor is
    not dense or ``spec.validate`` rejects them (under a ``torch.compile`` trace as a
    :class:`TracedLimitError`)."""
    args = bind(args, kwargs)
    _check_dense(spec, names, args)
    if any(isinstance(t, FakeTensor) for t in _tensors(args)):  # traced by torch.compile
        _validate_traced(spec, args)
    else:
        spec.validate(*args)
    return args


def _host_op(spec: OpSpec, sig: inspect.Signature, bind, qualname: str):
    """The op as it is registered without TorchNeuron: a ``torch.library`` custom op whose
    default impl runs reference math (or the interpreted kernel) for CPU tensors, with a
    fake impl from ``output_shapes`` and a neuron-device kernel on PrivateUse1 that calls
    the jitted kernels directly."""

    arg_names = list(sig.parameters)

    def default_impl(*args, **kwargs):
        args = _checked(spec, arg_names, bind, args, kwargs)
        tensors = _tensors(args)
        if not tensors:  # e.g. empty tensor lists: nothing to compute, no device to pick
            return spec.reference(*args, upcast=False)
        device = tensors[0].device
        if routing.kernels_disabled():  # the rollback switch: reference math everywhere
            return spec.reference(*args, upcast=False)
        if device.type == "cpu" and routing.current_cpu_mode() == "interpret":
            footprint.check_fits(spec, args)  # before the interpreter allocates anything
            runner = routing.cpu_runner()
            choice = routing.select_config(spec, args, runner.target, runner_lnc(runner))
            return spec.run_kernels(*args, config=choice.config, runner=runner)
        return spec.reference(*args, upcast=False)

    default_impl.__signature__ = sig
    default_impl.__name__ = spec.name
    default_impl.__doc__ = spec.description
    op = torch.library.custom_op(qualname, default_impl, mutates_args=tuple(spec.mutates))

    def fake_impl(*args, **kwargs):
        args = bind(args, kwargs)
        _validate_traced(spec, args)
        if spec.mutates:  # an in-place op returns nothing
            return None
        return _empty_outputs(spec, args)

    op.register_fake(fake_impl)

    def neuron_impl(*args, **kwargs):
        args = _checked(spec, arg_names, bind, args, kwargs)
        if routing.kernels_disabled():  # the rollback switch holds on the neuron device too
            return spec.reference(*args, upcast=False)
        runner = neuron_device.device_runner()
        choice = routing.select_config(spec, args, runner.target, runner_lnc(runner))
        return spec.run_kernels(*args, config=choice.config, runner=runner)

    op.register_kernel(neuron_device.device_key(), neuron_impl)
    return op


def _empty_outputs(spec: OpSpec, args):
    device = _tensors(args)[0].device
    outs = [
        torch.empty(shape, dtype=dtype, device=device) for shape, dtype in spec.output_shapes(*args)
    ]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _static(value):
    """``value`` with symbolic sizes (a dynamic-shape trace) specialized to their current
    ints: a kernel is compiled for one shape, so the trace guards on it. Other values as is."""
    if isinstance(value, (list, tuple)):
        return type(value)(_static(v) for v in value)
    if isinstance(value, torch.Tensor) and any(not isinstance(d, int) for d in value.shape):
        return value.reshape([int(d) for d in value.shape])
    return value


def _nki_op(spec: OpSpec, sig: inspect.Signature, bind, api):
    """The op on a TorchNeuron node: ``torch_neuronx.nki_op(f"neuron::{name}", body)``.

    The body routes by device. On ``neuron`` tensors (real or fake) it runs the op's kernels,
    each through the ``wrap_nki(kernel)`` built here once, on the LNC launch grid: traced by
    ``torch.compile``, each launch is one kernel-wrapper node whose output shapes the
    wrapper derives itself, so the body is also the op's fake impl, as ``nki_op`` registers
    it. Any other tensors go to the op as it is registered without TorchNeuron (a private
    ``neuron::_host_<name>`` op), so CPU tensors run exactly what they run today and fake
    CPU tensors get its fake impl, never the interpreter.
    """
    nki_op, wrap_nki = api
    host = _host_op(spec, sig, bind, f"{NAMESPACE}::_host_{spec.name}")
    wrapped = {kernel: wrap_nki(kernel) for kernel in spec.kernels}

    arg_names = list(sig.parameters)

    def body(*args, **kwargs):
        args = _checked(spec, arg_names, bind, args, kwargs)
        tensors = _tensors(args)
        if not tensors or not neuron_device.is_neuron(tensors[0]):
            return host(*args)
        if routing.kernels_disabled():  # the rollback switch holds on the neuron device too
            return spec.reference(*args, upcast=False)
        if not spec.mutates:  # an NKI kernel specializes on shapes: guard on them, statically
            args = tuple(_static(a) for a in args)
        runner = neuron_device.wrap_nki_runner(wrapped)
        choice = routing.select_config(spec, args, runner.target, runner_lnc(runner))
        return spec.run_kernels(*args, config=choice.config, runner=runner)

    body.__signature__ = sig
    body.__name__ = spec.name
    body.__doc__ = spec.description
    return nki_op(f"{NAMESPACE}::{spec.name}", body, mutates_args=tuple(spec.mutates))


def register_op(spec: OpSpec):
    """Create ``torch.ops.neuron.<spec.name>`` (idempotent): through ``torch_neuronx.nki_op``
    when TorchNeuron imports and has it, else as a plain ``torch.library`` custom op."""
    if spec.name in _REGISTERED:
        return _REGISTERED[spec.name]
    sig = op_signature(spec)

    def bind(args, kwargs) -> tuple:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    if spec.composite is not None:
        return _register_composite(spec, sig, bind)

    api = neuron_device.nki_op_api()
    if api is not None:
        op = _nki_op(spec, sig, bind, api)
        _VIA_NKI_OP.add(spec.name)
    else:
        op = _host_op(spec, sig, bind, f"{NAMESPACE}::{spec.name}")

    if spec.autograd is not None:
        save, backward = spec.autograd
        names = list(sig.parameters)

        def setup_context(ctx, inputs, output):
            save(ctx, **dict(zip(names, inputs)), output=output)

        op.register_autograd(backward, setup_context=setup_context)

    _REGISTERED[spec.name] = op
    return op


def registered_through_nki_op(name: str) -> bool:
    """True when ``torch.ops.neuron.<name>`` was registered through ``torch_neuronx.nki_op``."""
    return name in _VIA_NKI_OP
