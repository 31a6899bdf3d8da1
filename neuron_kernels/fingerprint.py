"""Fingerprints of code that ignore what cannot change behaviour (comments, docstrings,
formatting): a stored result keyed by one goes stale only when the code itself changes."""

from __future__ import annotations

import ast
import hashlib
import inspect
import sys
import textwrap
import types

__all__ = ["code_fingerprint", "kernel_fingerprint"]


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def code_fingerprint(*objects) -> str:
    """sha256 (16 hex digits) of the syntax trees of ``objects`` (modules, functions, classes),
    without comments or docstrings. Line numbers are not part of it."""
    digest = hashlib.sha256()
    for obj in objects:
        source = textwrap.dedent(inspect.getsource(obj))
        tree = _strip_docstrings(ast.parse(source))
        digest.update(ast.dump(tree, annotate_fields=False, include_attributes=False).encode())
    return digest.hexdigest()[:16]


def _python_function(obj):
    """The function inside a kernel object of either backend (``Kernel.fn``, AWS's wrapper)."""
    if isinstance(obj, types.FunctionType):
        return obj
    for attr in ("fn", "func", "__wrapped__", "function"):
        inner = getattr(obj, attr, None)
        if isinstance(inner, types.FunctionType):
            return inner
    return None


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def kernel_fingerprint(roots, packages: tuple[str, ...]) -> str:
    """Fingerprint of what decides the instructions a kernel issues: the code of ``roots``
    (kernels, their plan and host functions), of every function and class they reach by
    global name inside ``packages`` (helpers), and the values of the module-level constants
    they read. Comments, docstrings, and anything the code does not reach (an op's
    tolerances, its tests) are not part of it."""
    seen: dict[int, object] = {}
    constants: dict[str, str] = {}
    todo = [r for r in (_python_function(x) or x for x in roots) if r is not None]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        if isinstance(obj, type):
            codes = [v.__code__ for v in vars(obj).values() if isinstance(v, types.FunctionType)]
            module = sys.modules.get(obj.__module__)
            namespace = vars(module) if module else {}
        else:
            codes, namespace = [obj.__code__], obj.__globals__
        for code in codes:
            for name in sorted(_global_names(code)):
                value = namespace.get(name)
                inner = _python_function(value)
                if inner is not None or isinstance(value, type):
                    target = inner if inner is not None else value
                    if (getattr(target, "__module__", "") or "").startswith(packages):
                        todo.append(target)
                elif isinstance(value, (bool, int, float, str, tuple, frozenset)):
                    constants[f"{getattr(obj, '__module__', '')}.{name}"] = repr(value)
    ordered = sorted(seen.values(), key=lambda o: (o.__module__, o.__qualname__))
    digest = hashlib.sha256(code_fingerprint(*ordered).encode())
    digest.update(repr(sorted(constants.items())).encode())
    return digest.hexdigest()[:16]
