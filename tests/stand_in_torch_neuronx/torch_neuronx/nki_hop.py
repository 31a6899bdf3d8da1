"""The double's ``nki_op``, ``wrap_nki`` and ``nki_kernel_wrapper`` higher-order op.

Each behaviour cites the line of ``torch_neuronx/nki_hop.py`` (or ``nki_kernel.py``) of the
public copy it follows ("hop:N", "kernel:N"). Where the real wrapper compiles the kernel with
neuronx-cc, the double runs it on neuron-kernels' NKI interpreter: output shapes from a
trace-only run (``compute=False``), execution from a full run. The double adds three checks
the real code leaves to the compiler or the runtime, each from AWS's documentation:

* the launch grid against the LNC: ``nki/get-started/about/lnc.rst`` ("its LNC degree must
  match the global graph compilation --lnc degree") and ``compiler/error-codes/EVRF066.rst``
  (the message, and "kernel(...)" without brackets being LNC=1);
* a non-tensor argument holding a tensor is refused (the issue's reading of hop:216-235: such
  an argument is a compile-time constant, never an operand);
* written operands are not seen by the caller: ``tests/nki/test_nki_v2.py`` ("aliasing is not
  supported in NKI V2 yet"), so each execution runs on copies of its tensor operands.

``LAUNCHES`` records ``(kernel label, grid)`` of every execution (the double's only extra
surface, for tests to count launches).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C import DispatchKey
from torch._dynamo import allow_in_graph
from torch._library.custom_ops import custom_op
from torch._library.infer_schema import infer_schema
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    disable_proxy_modes_tracing,
    track_tensor_tree,
)

from torch_neuronx.utils import get_logical_neuron_cores

__all__ = [
    "LAUNCHES",
    "LncMismatch",
    "check_lnc",
    "kernel_label",
    "nki_kernel_wrapper",
    "nki_op",
    "wrap_nki",
]

LAUNCHES: list[tuple[str, tuple[int, ...]]] = []


class LncMismatch(RuntimeError):
    """A kernel launched on an LNC other than the one the graph is compiled for (EVRF066)."""


# -- the kernel table (hop:52-117) -----------------------------------------------------------

_KERNELS: list = []  # index -> the jitted kernel
_FUNC_TO_ID: dict = {}
_ARG_NAMES: dict[int, list[str]] = {}
_CONSTANTS: dict[int, dict[str, Any]] = {}


def _function(nki_kernel):
    """The kernel's Python function: ``.func`` on AWS's jitted kernels (hop:488), ``.fn`` on
    neuron-kernels' interpreter kernels (the only ones this machine has)."""
    fn = getattr(nki_kernel, "func", None) or getattr(nki_kernel, "fn", None)
    if fn is None:
        raise TypeError(f"wrap_nki: {nki_kernel!r} is not a jitted NKI kernel")
    return fn


def _add_kernel(nki_kernel, arg_names: list[str]) -> int:
    fn = _function(nki_kernel)
    if fn in _FUNC_TO_ID:
        return _FUNC_TO_ID[fn]
    idx = len(_KERNELS)
    _KERNELS.append(nki_kernel)
    _FUNC_TO_ID[fn] = idx
    _ARG_NAMES[idx] = arg_names
    return idx


def _kernel_name(idx: int) -> str:
    return _function(_KERNELS[idx]).__name__


def kernel_label(idx: int) -> str:
    """``<module>.<function>`` of a registered kernel (many kernels are named ``forward``)."""
    fn = _function(_KERNELS[idx])
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


def _hashable_form(idx: int, name: str, value):
    """A constant's hashable form, as kernel:132-152 builds it: sequences become tuples,
    dicts sorted item tuples, anything else must be hashable (``err_nki_param_not_hashable``).
    A tensor inside a constant is refused: the double's reading of hop:216-235, where only
    top-level tensors become operands (the real code keys such a tensor by shape and dtype)."""
    if isinstance(value, torch.Tensor):
        raise TypeError(
            f"wrap_nki({_kernel_name(idx)}): argument '{name}' holds a tensor inside a "
            "container; only top-level tensors are kernel operands, every other argument is a "
            "compile-time constant"
        )
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_hashable_form(idx, f"{name}[{i}]", v) for i, v in enumerate(value))
    if isinstance(value, dict):
        return tuple((k, _hashable_form(idx, f"{name}[{k}]", v)) for k, v in sorted(value.items()))
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"wrap_nki({_kernel_name(idx)}): argument '{name}' of type "
            f"{type(value).__name__} is not hashable (err_nki_param_not_hashable)"
        ) from None
    return value


def _split(idx, args, arg_names, constant_args_key):
    """``(tensor args, their names, constants key)``: the node keeps only tensors, the
    constants live in the table under their hash (hop:216-235)."""
    if constant_args_key != -1:
        return list(args), list(arg_names), constant_args_key
    tensors, names, constants = [], [], {}
    for name, arg in zip(arg_names, args):
        if isinstance(arg, torch.Tensor):
            tensors.append(arg)
            names.append(name)
        else:
            constants[name] = arg
    key = hash((idx, tuple((n, _hashable_form(idx, n, v)) for n, v in sorted(constants.items()))))
    key = key if key != -1 else -2
    _CONSTANTS[key] = constants
    return tensors, names, key


def _merged(idx, args, arg_names, constant_args_key) -> list:
    """Every kernel argument in signature order (hop:120-137)."""
    given = dict(zip(arg_names, args))
    constants = _CONSTANTS.get(constant_args_key, {})
    return [given[n] if n in given else constants[n] for n in _ARG_NAMES[idx]]


def _launch_lnc(grid) -> int:
    """The kernel's LNC: the one number in its brackets, 1 without brackets (EVRF066)."""
    if len(grid) > 1:
        raise LncMismatch(
            f"launch grid {list(grid)}: the bracket syntax must contain only one number, the "
            "number of cores to use (nki/get-started/about/lnc.rst)"
        )
    return int(grid[0]) if grid else 1


def check_lnc(idx: int, grid) -> None:
    """EVRF066: the kernel's LNC must equal the one the graph is compiled and run with."""
    kernel_lnc, compiler_lnc = _launch_lnc(grid), int(get_logical_neuron_cores())
    if kernel_lnc != compiler_lnc:
        raise LncMismatch(
            f"NCC_EVRF066: NKI kernel '{_kernel_name(idx)}' is configured with LNC={kernel_lnc}, "
            f"but neuronx-cc is using LNC={compiler_lnc}."
        )


def _interpreted(idx, grid):
    kernel = _KERNELS[idx]
    return kernel[tuple(grid)] if grid else kernel


_SHAPES: dict = {}


def _signature_key(idx, name, value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    return ("constant", _hashable_form(idx, name, value))


def _output_types(idx, grid, merged) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The kernel's outputs' shapes and dtypes, from a trace-only interpreter run on zero
    tensors of the operands' shapes (the real wrapper specializes the kernel on meta tensors,
    hop:171-189), cached per specialization as ``dump_config`` is (kernel:102-111)."""
    from neuron_kernels.interpreter.execution import run

    names = _ARG_NAMES[idx]
    key = (idx, tuple(grid), tuple(_signature_key(idx, n, v) for n, v in zip(names, merged)))
    if key not in _SHAPES:
        with torch._subclasses.fake_tensor.unset_fake_temporarily(), disable_proxy_modes_tracing():
            stand_ins = [
                torch.zeros(tuple(v.shape), dtype=v.dtype, device="cpu")
                if isinstance(v, torch.Tensor)
                else v
                for v in merged
            ]
            outputs = run(_interpreted(idx, grid), stand_ins, compute=False).outputs
        single = not isinstance(outputs, (tuple, list))
        outs = [outputs] if single else list(outputs)
        _SHAPES[key] = (single, [(tuple(o.shape), o.dtype) for o in outs])
    return _SHAPES[key]


def _empty_like_outputs(single, types, device):
    outs = tuple(torch.empty(shape, dtype=dtype, device=device) for shape, dtype in types)
    return outs[0] if single else outs


def _device(args) -> torch.device:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return tensors[0].device if tensors else torch.device("cpu")


# -- the higher-order op (hop:140-168) --------------------------------------------------------


class NKIKernelWrapper(HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("nki_kernel_wrapper", cacheable=True)

    def __call__(
        self,
        kernel_idx: int,
        grid,
        backend_config: str,
        operand_output_aliases: dict[int, int],
        args: Sequence[Any],
        arg_names: Sequence[str],
        constant_args_key: int,
    ) -> Any:
        return super().__call__(
            kernel_idx=kernel_idx,
            grid=grid,
            backend_config=backend_config,
            operand_output_aliases=operand_output_aliases,
            args=args,
            arg_names=arg_names,
            constant_args_key=constant_args_key,
        )


nki_kernel_wrapper = NKIKernelWrapper()
nki_kernel_wrapper = allow_in_graph(nki_kernel_wrapper)


@nki_kernel_wrapper.py_impl(DispatchKey.Meta)
def _meta(*, kernel_idx, grid, backend_config, operand_output_aliases, args, arg_names,
          constant_args_key):  # fmt: skip
    """hop:192-213: meta tensors of the kernel's output types."""
    merged = _merged(kernel_idx, args, arg_names, constant_args_key)
    single, types = _output_types(kernel_idx, grid, merged)
    return _empty_like_outputs(single, types, "meta")


@nki_kernel_wrapper.py_impl(DispatchKey.CompositeExplicitAutograd)
def _dense(*, kernel_idx, grid, backend_config, operand_output_aliases, args, arg_names,
           constant_args_key):  # fmt: skip
    """hop:238-274 runs the compiled kernel on neuron tensors; the double runs it on the
    interpreter, on copies of its tensor operands (no aliasing in NKI V2), after the LNC check."""
    from neuron_kernels.interpreter.execution import run

    tensors, names, key = _split(kernel_idx, args, arg_names, constant_args_key)
    check_lnc(kernel_idx, grid)
    merged = _merged(kernel_idx, tensors, names, key)
    operands = [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in merged]
    LAUNCHES.append((kernel_label(kernel_idx), tuple(grid)))
    outputs = run(_interpreted(kernel_idx, grid), operands).outputs
    device = _device(tensors)
    if isinstance(outputs, (tuple, list)):
        return tuple(o.to(device) for o in outputs)
    return outputs.to(device)


@nki_kernel_wrapper.py_impl(FakeTensorMode)
def _fake(mode, *, kernel_idx, grid, backend_config, operand_output_aliases, args, arg_names,
          constant_args_key):  # fmt: skip
    """hop:277-300: fake tensors of the kernel's output types (on the operands' device; the
    real one moves them to ``neuron``)."""
    merged = _merged(kernel_idx, args, arg_names, constant_args_key)
    single, types = _output_types(kernel_idx, grid, merged)
    with mode:
        return _empty_like_outputs(single, types, _device(args))


@nki_kernel_wrapper.py_impl(ProxyTorchDispatchMode)
def _proxy(proxy_mode, *, kernel_idx, grid, backend_config, operand_output_aliases, args,
           arg_names, constant_args_key):  # fmt: skip
    """hop:303-348: one ``nki_kernel_wrapper`` node holding only tensor operands."""
    tensors, names, key = _split(kernel_idx, args, arg_names, constant_args_key)
    node_args = {
        "kernel_idx": kernel_idx,
        "grid": grid,
        "backend_config": backend_config,
        "operand_output_aliases": operand_output_aliases,
        "args": tensors,
        "arg_names": names,
        "constant_args_key": key,
    }
    with disable_proxy_modes_tracing():
        out = nki_kernel_wrapper(**node_args)
    proxy_args = pytree.tree_map(proxy_mode.tracer.unwrap_proxy, node_args)
    out_proxy = proxy_mode.tracer.create_proxy(
        "call_function",
        nki_kernel_wrapper,
        (),
        proxy_args,
        name=_kernel_name(kernel_idx) + "_proxy",
    )
    return track_tensor_tree(out, out_proxy, constant=None, tracer=proxy_mode.tracer)


@nki_kernel_wrapper.py_functionalize_impl
def _functionalize(ctx, kernel_idx, grid, backend_config, operand_output_aliases, args,
                   arg_names, constant_args_key):  # fmt: skip
    """hop:351-394 with no operand/output aliases (NKI V2 has none): unwrap, run, wrap."""
    unwrapped = [ctx.unwrap_tensors(a) if isinstance(a, torch.Tensor) else a for a in args]
    with ctx.redispatch_to_next():
        outputs = nki_kernel_wrapper(
            kernel_idx=kernel_idx,
            grid=grid,
            backend_config=backend_config,
            operand_output_aliases={},
            args=unwrapped,
            arg_names=arg_names,
            constant_args_key=constant_args_key,
        )
    return ctx.wrap_tensors(outputs)


# hop:397-405
nki_kernel_wrapper.fallthrough(DispatchKey.PythonDispatcher)
nki_kernel_wrapper.fallthrough(DispatchKey.PythonTLSSnapshot)
nki_kernel_wrapper.fallthrough(DispatchKey.ADInplaceOrView)
nki_kernel_wrapper.fallthrough(DispatchKey.BackendSelect)
nki_kernel_wrapper.fallthrough(DispatchKey.AutocastCPU)
nki_kernel_wrapper.fallthrough(DispatchKey.AutocastCUDA)
nki_kernel_wrapper.fallthrough(DispatchKey.AutocastPrivateUse1)
nki_kernel_wrapper.fallthrough(DispatchKey.AutogradCUDA)
nki_kernel_wrapper.fallthrough(DispatchKey.AutogradCPU)


# -- wrap_nki and its caller (hop:408-491) ----------------------------------------------------


class NKIHOPCaller:
    def __init__(self, kernel_idx: int, grid, arg_names: list[str], defaults: dict) -> None:
        self.kernel_idx = kernel_idx
        self.grid = [] if grid is None else grid
        self.kernel_arg_names = arg_names
        self.kernel_default_args = defaults

    def __getitem__(self, grid) -> NKIHOPCaller:
        grid = tuple(map(int, grid))  # hop:427: a sequence; kernel[2] is a TypeError here
        return NKIHOPCaller(self.kernel_idx, grid, self.kernel_arg_names, self.kernel_default_args)

    def __call__(self, *args, **kwargs):
        combined = {**dict(zip(self.kernel_arg_names, args)), **kwargs}  # hop:431
        for name in self.kernel_arg_names:
            if name not in combined:
                combined[name] = self.kernel_default_args[name]
        values = tuple(combined[name] for name in self.kernel_arg_names)
        for name, value in zip(self.kernel_arg_names, values):
            if not isinstance(value, torch.Tensor):
                _hashable_form(self.kernel_idx, name, value)
        return nki_kernel_wrapper(
            kernel_idx=self.kernel_idx,
            grid=self.grid,
            backend_config="",
            operand_output_aliases={},
            args=values,
            arg_names=self.kernel_arg_names,
            constant_args_key=-1,
        )


def wrap_nki(nki_kernel, **kwargs) -> NKIHOPCaller:
    """hop:468-491: argument names and defaults from the kernel's signature; the kernel is
    registered once and called through the ``nki_kernel_wrapper`` op."""
    sig = inspect.signature(_function(nki_kernel))
    arg_names = list(sig.parameters)
    defaults = {
        n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty
    }
    return NKIHOPCaller(_add_kernel(nki_kernel, arg_names), [], arg_names, defaults)


def nki_op(name: str, fn=None, mutates_args=()):
    """hop:494-560: a ``custom_op`` whose body is also its fake impl, and which torch.compile
    traces through (a FunctionalTensorMode rule runs the body under the mode)."""

    def dec(fn):
        def backend_fn(*args, **kwargs):
            return fn(*args, **kwargs)

        result = custom_op(
            name,
            backend_fn,
            mutates_args=mutates_args,
            schema=infer_schema(fn, mutates_args=mutates_args),
        )
        result.register_fake(fn)
        from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

        def functional_decomp(mode, op, types, args, kwargs):
            unrecognized = [
                t
                for t in types
                if not issubclass(t, torch._subclasses.FakeTensor)
                and t not in (torch.Tensor, FunctionalTensor)
            ]
            if unrecognized:
                return NotImplemented
            with mode:
                return fn(*args, **kwargs)

        result.register_torch_dispatch(FunctionalTensorMode, functional_decomp)
        return result

    return dec if fn is None else dec(fn)
