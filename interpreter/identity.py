"""``is`` / ``is not`` in kernels: allowed on trace-time Python values, refused on tensors.

Two sources disagree. The NKI 0.3.0 migration guide (aws-neuron/aws-neuron-sdk
nki/migration/index.rst, "Replace ``is`` / ``is not`` with ``==`` / ``!=``") says the compiler
does not support them; the kernels of aws-neuron/nki-library, which neuronx-cc bundles, use
``x is None`` / ``x is not None`` on optional arguments hundreds of times (its attention and
conv kernels among them). Both agree once the operands are sorted by what they are at trace
time:

- a test against ``None`` is decided while tracing, whatever the other operand (an optional
  tensor argument is either a tensor or None): accepted, as nki-library relies on;
- identity between other trace-time Python values (ints, bools, enums, dtypes, classes):
  accepted, Python semantics;
- identity involving a tensor or a register and anything but None (``a is b`` on two tensors,
  ``t is True``): refused. A device tensor's identity is not a property of its data (two views
  of one allocation are different objects) and ``==`` on tensors is elementwise, so the
  question has no trace-time answer; this is the case the migration guide's rule protects.

The interpreter runs kernels eagerly in Python, where ``is`` cannot be overloaded, so the
kernel function is recompiled once with each ``is`` / ``is not`` routed through
:func:`identity_check`. Line numbers in its errors are the file's. Helpers called from the
kernel run as written (plain Python identity), a documented gap.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from typing import Any

from neuron_kernels.interpreter.errors import NkiValidationError

__all__ = ["identity_check", "with_checked_identity"]

_HELPER = "__nki_identity_check__"


def _is_runtime_value(value: Any) -> bool:
    """Tensors and registers: values only the device knows."""
    from neuron_kernels.interpreter.registers import VirtualRegister
    from neuron_kernels.interpreter.tensor import NkiTensor

    return isinstance(value, (NkiTensor, VirtualRegister))


def identity_check(left: Any, right: Any, negate: bool, where: str) -> bool:
    """``left is right`` (``is not`` when ``negate``), refused on tensors unless against None."""
    if left is not None and right is not None:
        for value in (left, right):
            if _is_runtime_value(value):
                raise NkiValidationError(
                    "nki.jit",
                    f"'{'is not' if negate else 'is'}' at {where}",
                    "must test a trace-time Python value (None, a constant, an enum); a tensor "
                    "or register may only be tested against None (nki/migration/index.rst: "
                    "use == / != for values)",
                    f"{type(left).__name__} {'is not' if negate else 'is'} {type(right).__name__}",
                )
    return (left is not right) if negate else (left is right)


class _RouteIdentity(ast.NodeTransformer):
    """Rewrites ``a is b`` / ``a is not b`` into ``__nki_identity_check__(a, b, negate, where)``."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.chained: list[int] = []

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if not any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            return node
        if len(node.ops) != 1:
            self.chained.append(node.lineno)
            return node
        call = ast.Call(
            func=ast.Name(id=_HELPER, ctx=ast.Load()),
            args=[
                node.left,
                node.comparators[0],
                ast.Constant(isinstance(node.ops[0], ast.IsNot)),
                ast.Constant(f"{self.filename}:{node.lineno}"),
            ],
            keywords=[],
        )
        return ast.copy_location(call, node)


def _source_tree(fn: types.FunctionType) -> tuple[ast.Module, str] | None:
    """The function's AST with the file's line numbers, or None (no source: a lambda, a
    function built at run time)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], ast.FunctionDef) or body[0].name != fn.__name__:
        return None
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    return tree, filename


def _uses_identity(tree: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot)) for o in n.ops)
        for n in ast.walk(tree)
    )


@functools.lru_cache(maxsize=256)
def with_checked_identity(fn: types.FunctionType) -> types.FunctionType:
    """``fn`` recompiled with every ``is`` / ``is not`` checked; ``fn`` itself when it has
    none or no source. Same globals, closure cells, defaults and attributes."""
    found = _source_tree(fn)
    if found is None or not _uses_identity(found[0]):
        return fn
    tree, filename = found
    func = tree.body[0]
    func.decorator_list = []
    router = _RouteIdentity(filename)
    router.visit(func)
    if router.chained:
        raise NkiValidationError(
            "nki.jit",
            f"kernel {fn.__name__!r} at {filename}:{router.chained[0]}",
            "must not chain 'is' with other comparisons (write two comparisons joined by and)",
            "a chained comparison",
        )
    # Wrap in an outer function whose parameters are the helper and the original free
    # variables, so the recompiled body closes over the same names.
    free = list(fn.__code__.co_freevars)
    outer = ast.FunctionDef(
        name="__nki_outer__",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=name) for name in [_HELPER, *free]],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[func, ast.Return(value=ast.Name(id=func.name, ctx=ast.Load()))],
        decorator_list=[],
        returns=None,
    )
    ast.copy_location(outer, func)
    module = ast.fix_missing_locations(ast.Module(body=[outer], type_ignores=[]))
    code = compile(module, filename, "exec")
    outer_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    inner_code = next(
        c
        for c in outer_code.co_consts
        if isinstance(c, types.CodeType) and c.co_name == fn.__name__
    )
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    cells[_HELPER] = types.CellType(identity_check)
    closure = tuple(cells[name] for name in inner_code.co_freevars)
    checked = types.FunctionType(
        inner_code, fn.__globals__, fn.__name__, fn.__defaults__, closure or None
    )
    checked.__kwdefaults__ = fn.__kwdefaults__
    checked.__qualname__ = fn.__qualname__
    checked.__module__ = fn.__module__
    checked.__doc__ = fn.__doc__
    checked.__annotations__ = fn.__annotations__
    checked.__dict__.update(fn.__dict__)
    return checked
