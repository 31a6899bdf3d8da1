"""Fingerprints of code that ignore what cannot change behaviour (comments, docstrings,
formatting): a stored result keyed by one goes stale only when the code itself changes."""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap

__all__ = ["code_fingerprint"]


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
