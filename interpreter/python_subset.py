"""The NKI language's Python subset, checked on the kernel and every function it reaches.

NKI functions "are syntactically valid Python functions ... not all Python constructs and
libraries are supported within a NKI function" (aws-neuron/aws-neuron-sdk
nki/get-started/nki-language-guide.rst, snapshot 81ce03ae, line 55), and "All function calls
are inlined at specialization time" (line 89), so a helper is held to the same subset as the
kernel that calls it. The interpreter runs kernels as Python, which accepts more; this module
refuses the rest before the kernel runs.

The subset is an allow-list: every syntax node of a checked function must appear in
:data:`ACCEPTED` with its evidence, a line of the language guide or, where the guide is
silent, a kernel of aws-neuron/nki-library (snapshot d2ad3a5, NKI 0.6) whose kernel code uses
it, so the compiler accepts it. Constructs in :data:`REFUSED` get a message of their own;
anything else is refused with the guide's general rule. Nested functions are accepted: the
stub's own ``nl.fori_loop`` example defines its loop body as one. Comprehensions and generator
expressions are refused: the guide does not list them and no kernel code of nki-library uses
one (its only list comprehension is in host-side verification, utils/lnc_subscriptable.py).

Enum classes a kernel reaches are accepted when their members allow no other binary
operators than == and != (guide, 'Enumerations': "No other binary operators on enum values are
supported", line 661): an ``IntEnum``/``StrEnum`` or other int/str/float mixin, a ``Flag``, or
an enum defining an operator is refused as a whole, since Python would let ``Level.low + 1``
run where NKI's translated enum has no ``+``. nki-library's kernel code declares plain
``Enum`` classes only (e.g. core/utils/common_types.py).

What "reaches" means here: starting from the kernel, every name a checked function reads
that resolves (closure cell, module global, attribute of a module or class) to a Python
function or class outside the interpreter and outside the Python installation, plus the
functions and NKIObject instances passed as kernel arguments. A function selected at run time
through a value the checker cannot resolve statically (``getattr(obj, name)()``) is not
reached; a lambda used as a kernel has no def to read and is not checked (one inside a
checked function is refused).

Dict keys ("Dictionaries with string-value keys", 'NKI Values' line 154) are checked where
the source fixes them as non-strings (a constant, a negated constant, a tuple): in dict
literals, and in ``d[key] = ...`` / ``d[key] += ...`` / ``d.setdefault(key, ...)`` when every
binding of ``d`` in the function is ``d = {...}`` or ``d = dict(...)``. Not checked: a key
computed at run time (``d[i] = x``), a store into a dict the function did not build (a
parameter, an attribute, a helper's return value), ``dict(...)`` / ``d.update(...)`` with
key-value pairs from elsewhere. Python accepts those; NKI's compiler may not.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import sysconfig
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neuron_kernels.interpreter.errors import NkiValidationError

__all__ = ["ACCEPTED", "REFUSED", "GUIDE", "check_kernel", "violations"]

GUIDE = "nki/get-started/nki-language-guide.rst"
LIBRARY = "aws-neuron/nki-library src/nkilib_src/nkilib/core"

_NOT_ALL = (
    "all NKI functions are syntactically valid Python functions. However, [...] not all "
    "Python constructs and libraries are supported within a NKI function"
)
_VALUES = (
    "The NKI language supports six types of values: [...] None [...] Boolean values [...] "
    "32-bit integer values [...] 32-bit IEEE floating-point values [...] String literals "
    "[...] Tensors. In addition, NKI supports the following container types: Tuples of any "
    "fixed length, Lists of arbitrary length, Dictionaries with string-value keys, Simple "
    "user-defined classes"
)
_CONTROL = (
    "NKI supports basic control flow constructs, including if-statements, for-loops over "
    "ranges, lists or tuples, and while loops"
)
_INLINED = "All function calls are **inlined** at specialization time"
_CLASSES = (
    "When you declare a class for use in a NKI kernel, the class must inherit from NKIObject "
    "and no other classes"
)
_ENUMS = (
    "the NKI compiler will translate the enumeration class E to [an NKIObject class] [...] "
    "Equality in NKI is structural, so no additional code is needed to replicate the "
    "behavior of == and != for objects of type E. No other binary operators on enum values "
    "are supported ('Enumerations', lines 648-661); an enum that also derives from "
    f"int/str/float or Flag breaks the class rule too: {_CLASSES}"
)

# Syntax node -> the evidence that NKI accepts it.
ACCEPTED: dict[type, str] = {
    # The function itself, its parameters, names and calls: the guide's every example.
    # Nested definitions too: AWS's own API docs define the loop body of nl.fori_loop and
    # nl.while_loop as a nested function closing over the kernel's tensors
    # (nki/api/nki/language/__init__.py, fori_loop example: ``def body(i): nisa.dma_copy(
    # dst=temp, ...)`` then ``nl.fori_loop(0, ub_reg, body)``).
    ast.FunctionDef: f"{GUIDE} 'Compilation Model': {_INLINED}; nested: "
    "nki/api/nki/language/__init__.py fori_loop example (def body(i))",
    ast.arguments: f"{GUIDE} 'Composable Kernels' (functions with keyword arguments)",
    ast.arg: f"{GUIDE} 'Composable Kernels'",
    ast.keyword: f"{GUIDE} 'Composable Kernels': tile_fn(dst=result, src=tile)",
    ast.Call: f"{GUIDE} 'Compilation Model': {_INLINED}",
    ast.Name: f"{GUIDE} 'NKI Values'",
    ast.Load: f"{GUIDE} 'NKI Values'",
    ast.Store: f"{GUIDE} 'NKI Values'",
    ast.Attribute: f"{GUIDE} 'Tensor Values': t.shape, t.dtype",
    ast.Subscript: f"{GUIDE} 'Tensor Indexing'",
    ast.Slice: f"{GUIDE} 'Tensor Indexing': start:stop:step",
    ast.Constant: f"{GUIDE} 'NKI Values': {_VALUES}",
    ast.Tuple: f"{GUIDE} 'NKI Values': Tuples of any fixed length",
    ast.List: f"{GUIDE} 'NKI Values': l = [1,2,3]",
    ast.Dict: f"{GUIDE} 'NKI Values': Dictionaries with string-value keys",
    ast.JoinedStr: f'{GUIDE} (first example): print(f"adding tensors of type ...")',
    ast.FormattedValue: f'{GUIDE} (first example): print(f"adding tensors of type ...")',
    # Statements the guide shows.
    ast.Expr: f"{GUIDE} (first example)",
    ast.Assign: f"{GUIDE} 'NKI Values'",
    ast.AugAssign: f"{GUIDE} 'Control Flow': x += 1",
    ast.Return: f"{GUIDE} 'Composable Kernels': return my_relu",
    ast.If: f"{GUIDE} 'Control Flow': {_CONTROL}",
    ast.For: f"{GUIDE} 'Control Flow': {_CONTROL}",
    ast.While: f"{GUIDE} 'Control Flow': {_CONTROL}",
    ast.Assert: f"{GUIDE} (first example): assert a_input.shape == b_input.shape",
    # Expressions on compile-time values: "All Python expressions on compile-time values
    # (integers, booleans, strings, shapes) are evaluated at specialization time".
    ast.BinOp: f"{GUIDE} 'Compilation Model': Python expressions on compile-time values",
    ast.UnaryOp: f"{GUIDE} 'Compilation Model': Python expressions on compile-time values",
    ast.BoolOp: f"{GUIDE} 'Compilation Model': Python expressions on compile-time values",
    ast.Compare: f"{GUIDE} 'Compilation Model': Python expressions on compile-time values",
    # Where the guide is silent: nki-library kernel code that uses the construct.
    ast.IfExp: f"{LIBRARY}/attention/attention_bwd.py validate_inputs",
    ast.AnnAssign: f"{LIBRARY}/router_topk/router_topk.py router_topk (T: int = -1)",
    ast.Pass: f"{LIBRARY}/moe_block/moe_block_tkg.py moe_block_tkg",
    ast.Break: f"{LIBRARY}/attention/attention_tkg.py _compute_qk_matmul",
    ast.Continue: f"{LIBRARY}/attention/attention_bwd.py recompute_qk_softmax",
    ast.Raise: f"{LIBRARY}/topk/rotational_topk.py topk (raise ValueError(...))",
}
for _op in (
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult,
    ast.LShift, ast.RShift, ast.BitOr, ast.BitAnd, ast.BitXor, ast.USub, ast.UAdd, ast.Not,
    ast.Invert, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is,
    ast.IsNot, ast.In, ast.NotIn,
):  # fmt: skip
    ACCEPTED[_op] = ACCEPTED[ast.BinOp]

_NO_AWS = "and no kernel code of nki-library uses one"

# Constructs with a message of their own: (what it is, why it is refused).
REFUSED: dict[type, tuple[str, str]] = {
    ast.Yield: ("a generator (yield)", f"the guide lists no generators {_NO_AWS}"),
    ast.YieldFrom: ("a generator (yield from)", f"the guide lists no generators {_NO_AWS}"),
    ast.Await: ("await", "the guide lists no coroutines"),
    ast.Lambda: ("a lambda", f"the guide's functions are named (def) {_NO_AWS}"),
    ast.AsyncFunctionDef: ("an async function", "the guide lists no coroutines"),
    ast.ClassDef: ("a class defined inside a function", f"{_CLASSES}, declared in Python"),
    ast.ListComp: ("a list comprehension", f"the guide lists none {_NO_AWS}"),
    ast.SetComp: ("a set comprehension", f"NKI has no sets; {_VALUES}"),
    ast.DictComp: ("a dict comprehension", f"the guide lists none {_NO_AWS}"),
    ast.GeneratorExp: ("a generator expression", f"the guide lists none {_NO_AWS}"),
    ast.Try: ("try", f"the guide lists no exception handling {_NO_AWS}"),
    ast.With: ("with", f"the guide lists no context managers {_NO_AWS}"),
    ast.AsyncWith: ("async with", "the guide lists no coroutines"),
    ast.AsyncFor: ("async for", "the guide lists no coroutines"),
    ast.Global: ("global", f"the guide lists no global rebinding {_NO_AWS}"),
    ast.Nonlocal: (
        "nonlocal",
        "the guide lists no rebinding of an enclosing function's names (nested functions "
        f"that read them are accepted: the stub's fori_loop example) {_NO_AWS}",
    ),
    ast.Import: ("import inside a kernel function", f"{_NOT_ALL} (import at module level)"),
    ast.ImportFrom: ("import inside a kernel function", f"{_NOT_ALL} (import at module level)"),
    ast.Set: ("a set", f"NKI has no sets; {_VALUES}"),
    ast.NamedExpr: ("an assignment expression (:=)", f"the guide lists none {_NO_AWS}"),
    ast.Delete: ("del", f"the guide lists none {_NO_AWS} (dict.pop removes a key)"),
    ast.Starred: ("* unpacking", f"the guide lists none {_NO_AWS}"),
}
if hasattr(ast, "TryStar"):
    REFUSED[ast.TryStar] = REFUSED[ast.Try]
if hasattr(ast, "Match"):
    REFUSED[ast.Match] = ("match", f"the guide lists no match statement {_NO_AWS}")


class _Violation:
    """One construct outside the subset: where it is and which rule it breaks."""

    __slots__ = ("what", "where", "why")

    def __init__(self, what: str, where: str, why: str) -> None:
        self.what, self.where, self.why = what, where, why


def _source_tree(fn: types.FunctionType) -> tuple[ast.FunctionDef, str] | None:
    """The function's definition with the file's line numbers, or None without source."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    first = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(first, ast.FunctionDef) or first.name != fn.__name__:
        return None  # a lambda (its source is the enclosing statement) or no single def
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    return tree.body[0], filename


def _node_violation(node: ast.AST, func: ast.FunctionDef) -> tuple[str, str] | None:
    """(what, why) when ``node`` is outside the subset, else None."""
    kind = type(node)
    if kind is ast.comprehension:
        return None  # part of a comprehension, refused as a whole
    if node is not func and kind in REFUSED:
        return REFUSED[kind]
    if kind not in ACCEPTED:
        return (f"'{kind.__name__}' syntax", _NOT_ALL)
    if kind is ast.Constant and not isinstance(
        node.value, (type(None), bool, int, float, str, type(Ellipsis))
    ):
        return (f"a {type(node.value).__name__} constant", _VALUES)
    if kind is ast.Dict:
        for key in node.keys:
            if key is None:
                return ("** unpacking in a dict", f"the guide lists none {_NO_AWS}")
            shown = _static_non_string(key)
            if shown is not None:
                return (f"a dict key {shown}", _VALUES)
    if kind is ast.keyword and node.arg is None:
        return ("** unpacking in a call", f"the guide lists none {_NO_AWS}")
    if kind is ast.arguments and (node.vararg or node.kwarg):
        return ("*args / **kwargs parameters", f"the guide lists none {_NO_AWS}")
    return None


def _static_non_string(key: ast.AST) -> str | None:
    """The source of a dict key that is a non-string whatever runs (``1``, ``-1``, ``None``,
    ``(0, 1)``), else None."""
    if isinstance(key, ast.Constant):
        return None if isinstance(key.value, str) else repr(key.value)
    if isinstance(key, ast.UnaryOp) and isinstance(key.operand, ast.Constant):
        return None if isinstance(key.operand.value, str) else ast.unparse(key)
    if isinstance(key, ast.Tuple):
        return ast.unparse(key)
    return None


def _is_dict_builder(value: ast.AST | None, fn: types.FunctionType) -> bool:
    """``{...}`` or a call of the builtin ``dict``."""
    if isinstance(value, ast.Dict):
        return True
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and "dict" not in fn.__globals__
        and "dict" not in fn.__code__.co_varnames
        and "dict" not in fn.__code__.co_freevars
    )


def _non_string_key_stores(
    fn: types.FunctionType, func: ast.FunctionDef
) -> Iterator[tuple[ast.AST, str]]:
    """(node, key) for each statically non-string key stored into a dict the function builds:
    ``d[1] = x``, ``d[-1] += x``, ``d.setdefault(1, x)`` where every binding of ``d`` in the
    function (nested functions included) is ``d = {...}`` or ``d = dict(...)``."""
    dict_targets: set[int] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and _is_dict_builder(node.value, fn):
            dict_targets.update(id(t) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and _is_dict_builder(node.value, fn):
            dict_targets.add(id(node.target))
    bound: dict[str, bool] = {}  # name -> every binding builds a dict
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound[node.id] = bound.get(node.id, True) and id(node) in dict_targets
        elif isinstance(node, ast.arg):
            bound[node.arg] = False
        elif isinstance(node, ast.FunctionDef) and node is not func:
            bound[node.name] = False
    dicts = {name for name, only_dicts in bound.items() if only_dicts}
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in dicts
        ):
            shown = _static_non_string(node.slice)
            if shown is not None:
                yield node, shown
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in dicts
            and node.args
        ):
            shown = _static_non_string(node.args[0])
            if shown is not None:
                yield node, shown


def _annotations_and_decorators(func: ast.FunctionDef) -> set[int]:
    """ids of the nodes Python evaluates but NKI does not compile: decorators (they run
    before NKI sees the function) and annotations."""
    roots: list[ast.AST] = [*func.decorator_list]
    if func.returns is not None:
        roots.append(func.returns)
    for node in ast.walk(func):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def _compiled_nodes(func: ast.FunctionDef) -> Iterator[ast.AST]:
    skip = _annotations_and_decorators(func)
    return (node for node in ast.walk(func) if id(node) not in skip)


@functools.lru_cache(maxsize=1024)
def _own_violations(fn: types.FunctionType) -> tuple[_Violation, ...]:
    found = _source_tree(fn)
    if found is None:
        return ()
    func, filename = found
    out = []
    for node in _compiled_nodes(func):
        problem = _node_violation(node, func)
        if problem is not None:
            line = getattr(node, "lineno", func.lineno)
            where = f"{fn.__qualname__} at {filename}:{line}"
            out.append(_Violation(problem[0], where, problem[1]))
    for node, key in _non_string_key_stores(fn, func):
        where = f"{fn.__qualname__} at {filename}:{node.lineno}"
        out.append(_Violation(f"a dict key {key}", where, _VALUES))
    return tuple(out)


# -- reach: which functions a checked function calls, as NKI would inline them ---------------


def _python_install_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(str(Path(d).resolve()) for d in dirs)


_INSTALL_DIRS = _python_install_dirs()
_INTERPRETER_DIR = str(Path(__file__).resolve().parent)


def _is_user_code(obj: Any) -> bool:
    """A function or class written outside the interpreter and the Python installation."""
    module = getattr(obj, "__module__", None) or ""
    if module.startswith("neuron_kernels.interpreter") or module.split(".")[0] in (
        "nki",
        "builtins",
    ):
        return False
    code = getattr(obj, "__code__", None)
    if code is not None:
        filename = code.co_filename
    else:
        try:
            filename = inspect.getsourcefile(obj) or ""
        except TypeError:
            return False
    if not filename or filename.startswith("<"):
        return False
    resolved = str(Path(filename).resolve())
    if resolved.startswith(_INTERPRETER_DIR):
        return False
    return not any(resolved.startswith(d) for d in _INSTALL_DIRS)


def _referenced_names(fn: types.FunctionType) -> list[list[str]]:
    """Dotted names ``a.b.c`` the function reads whose head is not one of its locals."""
    found = _source_tree(fn)
    if found is None:
        return []
    func, _ = found
    local = set(fn.__code__.co_varnames) | set(fn.__code__.co_cellvars)
    for node in ast.walk(func):  # names bound in nested functions are theirs, not globals
        if isinstance(node, ast.arg):
            local.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
        elif isinstance(node, ast.FunctionDef) and node is not func:
            local.add(node.name)
    chains = []
    for node in _compiled_nodes(func):
        chain: list[str] = []
        cur = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name) and isinstance(cur.ctx, ast.Load) and cur.id not in local:
            chains.append([cur.id, *reversed(chain)])
    return chains


def _resolve(fn: types.FunctionType, chain: list[str]) -> Iterator[Any]:
    """The objects a dotted name resolves to, step by step through modules and classes."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    head = chain[0]
    if head in cells:
        try:
            obj = cells[head].cell_contents
        except ValueError:
            return
    elif head in fn.__globals__:
        obj = fn.__globals__[head]
    else:
        return
    yield obj
    for attr in chain[1:]:
        if not isinstance(obj, (types.ModuleType, type)):
            return
        try:
            obj = inspect.getattr_static(obj, attr)
        except AttributeError:
            return
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        yield obj


def _class_methods(cls: type) -> Iterator[types.FunctionType]:
    for klass in cls.__mro__:
        if not _is_user_code(klass):
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                value = value.fget
            if isinstance(value, types.FunctionType) and _is_user_code(value):
                yield value


@functools.lru_cache(maxsize=1024)
def _reached_from(fn: types.FunctionType) -> tuple[Any, ...]:
    """User functions and classes ``fn`` names: what NKI would inline into it."""
    return tuple(
        obj
        for chain in _referenced_names(fn)
        for obj in _resolve(fn, chain)
        if isinstance(obj, (types.FunctionType, type)) and _is_user_code(obj)
    )


def _argument_roots(values) -> Iterator[Any]:
    """Functions, classes and NKIObject classes among the kernel's arguments."""
    from neuron_kernels.interpreter.classes import nki_object_bases

    bases = nki_object_bases()
    for value in values:
        if isinstance(value, (tuple, list)):
            yield from _argument_roots(value)
        elif isinstance(value, dict):
            yield from _argument_roots(value.values())
        elif isinstance(value, types.FunctionType) and _is_user_code(value):
            yield value
        elif isinstance(value, bases) and _is_user_code(type(value)):
            yield type(value)


def violations(fn: types.FunctionType, arguments=()) -> list[_Violation]:
    """Every construct outside the subset in ``fn`` and the functions it reaches, and every
    class it reaches that does not derive from NKIObject alone."""
    from neuron_kernels.interpreter.classes import enum_operators, nki_object_bases

    bases = nki_object_bases()
    todo: list[Any] = [fn, *_argument_roots(arguments)]
    done: set[int] = set()
    out: list[_Violation] = []
    while todo:
        obj = todo.pop()
        if id(obj) in done:
            continue
        done.add(id(obj))
        if isinstance(obj, type):
            if issubclass(obj, BaseException):
                continue  # raised (see ACCEPTED[ast.Raise])
            if issubclass(obj, enum.Enum):  # 'Enumerations': == and != only
                allowed = enum_operators(obj)
                if allowed:
                    others = [b.__qualname__ for b in obj.__mro__[1:] if b is not object]
                    what = (
                        f"an enum allowing other binary operators than == and != "
                        f"({' '.join(allowed)}; bases {', '.join(others)})"
                    )
                    where = f"{obj.__qualname__} ({obj.__module__})"
                    out.append(_Violation(what, where, _ENUMS))
                continue
            other = [
                b.__qualname__
                for b in obj.__mro__[1:]
                if b is not object and not issubclass(b, bases) and b.__module__ != "typing"
            ]
            if not issubclass(obj, bases) or other:
                where = f"{obj.__qualname__} ({obj.__module__})"
                what = f"a class with other bases than NKIObject ({', '.join(other) or 'none'})"
                out.append(_Violation(what, where, _CLASSES))
                continue
            todo.extend(_class_methods(obj))
            continue
        out.extend(_own_violations(obj))
        todo.extend(_reached_from(obj))
    return out


def check_kernel(fn: types.FunctionType, arguments=()) -> None:
    """Refuse, before it runs, a kernel that uses Python outside the NKI subset."""
    found = violations(fn, arguments)
    if not found:
        return
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    raise NkiValidationError(
        "nki.jit",
        f"{first.what} in {first.where}{more}",
        f'is outside the NKI language: {first.why} ({GUIDE}: "{_NOT_ALL}")',
        getattr(fn, "__name__", fn),
    )
