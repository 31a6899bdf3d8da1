"""The NKI Python-subset check (interpreter/python_subset.py) against the language guide.

aws-neuron/aws-neuron-sdk nki/get-started/nki-language-guide.rst (snapshot 81ce03ae) line 55:
"all NKI functions are syntactically valid Python functions. However, ... not all Python
constructs and libraries are supported within a NKI function"; line 89: "All function calls
are **inlined** at specialization time". What this proves: every kernel of ``kernels/`` and
the helpers it reaches stay inside the constructs the guide lists or that nki-library's kernel
code uses; constructs outside are refused before any instruction runs. What only the NKI
compiler can prove: that it accepts every construct on the list in every position.
"""

from __future__ import annotations

import ast
import enum
import importlib

import numpy as np
import pytest

from neuron_kernels.interpreter import nki, run
from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.kernel import Kernel
from neuron_kernels.interpreter.python_subset import ACCEPTED, GUIDE, REFUSED, violations
from neuron_kernels.interpreter.unimplemented import readme_section
from neuron_kernels.kernels import REGISTRY

nl, nisa = nki.language, nki.isa

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def _refused(kernel, *args):
    """The error a kernel gets, checking that no instruction ran before it."""
    with pytest.raises(NkiValidationError) as info:
        run(kernel, args)
    err = info.value
    assert err.op == "nki.jit" and "is outside the NKI language" in err.rule
    assert GUIDE in err.rule and "not all Python constructs" in err.rule  # the guide, quoted
    return err


# -- one kernel per refused construct (each runs fine as plain Python) ------------------------


def _tiles(n):
    yield from range(n)


def k_generator(x):  # the construct flash_attention.forward used before this check
    for _ in _tiles(1):
        out = _copy(x)
    return out


def k_list_comprehension(x):
    outs = [_copy(x) for _ in range(1)]
    return outs[0]


def k_generator_expression(x):
    n = sum(1 for _ in range(1))
    assert n == 1
    return _copy(x)


def k_lambda(x):
    f = lambda: _copy(x)  # noqa: E731
    return f()


def k_try(x):
    try:
        out = _copy(x)
    except ValueError:
        out = None
    return out


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def k_with(x):
    with _Nothing():
        out = _copy(x)
    return out


COUNTER = 0


def k_global(x):
    global COUNTER
    COUNTER += 0
    return _copy(x)


def k_int_dict_key(x):
    d = {0: x}
    return _copy(d[0])


def k_int_key_stored(x):  # issue 27 audit: only dict literals were checked
    d = {}
    d[1] = x
    return _copy(d[1])


def k_negative_key_stored(x):
    d = dict()
    d[-1] = x
    return _copy(x)


def k_tuple_key_stored(x):
    d = {"a": x}
    d[0, 1] = x
    return _copy(x)


def k_none_key_setdefault(x):
    d = {}
    d.setdefault(None, x)
    return _copy(x)


def k_tuple_key_literal(x):
    d = {(0, 1): x}
    return _copy(d[0, 1])


def k_set(x):
    s = {1, 2}
    assert 1 in s
    return _copy(x)


def k_star_call(x):
    args = (x,)
    return _copy(*args)


def k_import(x):
    import math

    assert math.pi > 3
    return _copy(x)


def k_del(x):
    d = {"a": 1}
    del d["a"]
    return _copy(x)


REFUSALS = [
    (k_generator, "a generator (yield from)", "_tiles"),
    (k_list_comprehension, "a list comprehension", "k_list_comprehension"),
    (k_generator_expression, "a generator expression", "k_generator_expression"),
    (k_lambda, "a lambda", "k_lambda"),
    (k_try, "try", "k_try"),
    (k_with, "with", "k_with"),
    (k_global, "global", "k_global"),
    (k_int_dict_key, "a dict key 0", "k_int_dict_key"),
    (k_int_key_stored, "a dict key 1", "k_int_key_stored"),
    (k_negative_key_stored, "a dict key -1", "k_negative_key_stored"),
    (k_tuple_key_stored, "a dict key (0, 1)", "k_tuple_key_stored"),
    (k_none_key_setdefault, "a dict key None", "k_none_key_setdefault"),
    (k_tuple_key_literal, "a dict key (0, 1)", "k_tuple_key_literal"),
    (k_set, "a set", "k_set"),
    (k_star_call, "* unpacking", "k_star_call"),
    (k_import, "import inside a kernel function", "k_import"),
    (k_del, "del", "k_del"),
]


@pytest.mark.parametrize("kernel, what, where", REFUSALS, ids=[r[0].__name__ for r in REFUSALS])
def test_constructs_outside_the_guide_are_refused_naming_them(kernel, what, where):
    err = _refused(kernel, X)
    assert err.arg.startswith(f"{what} in {where} at ") and "test_python_subset.py:" in err.arg
    assert err.value == kernel.__name__


def test_dicts_with_string_keys_are_accepted():
    """Guide, 'NKI Values': "Dictionaries with string-value keys"."""

    def kernel(x):
        d = dict()
        d["a"] = x
        e = {"b": d["a"], f"c{1}": x}
        return _copy(e["b"])

    np.testing.assert_array_equal(run(kernel, (X,)).outputs, X)


def _store_first(rows, x):
    rows[0] = x  # a parameter: a list here


def k_subscript_stores_that_are_not_dict_keys(x):
    d = {"a": x}
    d = [x]  # d is a list from here: its index is not a dict key
    d[0] = x
    _store_first(d, x)
    e = {}
    e["b"] = x
    e.setdefault("c", x)
    return _copy(e["b"])


def test_only_dict_keys_must_be_strings():
    """Guide 'NKI Values' line 154: "Dictionaries with string-value keys"; lists are indexed
    by ints ("Lists of arbitrary length", line 153). A store is checked as a dict key only
    when the name is bound to nothing but a dict the function builds."""
    assert violations(k_subscript_stores_that_are_not_dict_keys) == []
    out = run(k_subscript_stores_that_are_not_dict_keys, (X,)).outputs
    np.testing.assert_array_equal(out, X)


def _helper_with_comprehension(x):
    return [x for _ in range(1)][0]


def _middle(x):
    return _copy(_helper_with_comprehension(x))


def k_reaches_helper(x):
    return _middle(x)


def test_helpers_are_checked_through_every_call_level():
    """Guide line 89: "All function calls are **inlined**": a helper two calls deep counts."""
    err = _refused(k_reaches_helper, X)
    assert err.arg.startswith("a list comprehension in _helper_with_comprehension at ")


def _tile_fn_with_try(dst, src):
    try:
        nisa.tensor_copy(dst=dst, src=src)
    finally:
        pass


def tiled(x, tile_fn):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    r = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    tile_fn(dst=r, src=t)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_functions_passed_as_arguments_are_checked():
    """Guide, 'Composable Kernels': a function passed to a kernel is inlined at its call."""
    err = _refused(tiled, X, _tile_fn_with_try)
    assert err.arg.startswith("try in _tile_fn_with_try at ")


class Planner(nl.NKIObject):
    rows: int = 2

    def halves(self):
        return [r for r in range(self.rows)]


def k_method(x, plan):
    assert len(plan.halves()) == 2
    return _copy(x)


def test_methods_of_nkiobject_arguments_are_checked():
    """Guide, 'Class Support': instances passed in are rebuilt on the NKI side, methods
    and all."""
    err = _refused(k_method, X, Planner())
    assert err.arg.startswith("a list comprehension in Planner.halves at ")


def test_annotations_and_decorators_are_not_compiled():
    """Parameter annotations and decorators are Python's, evaluated before NKI sees the body;
    a comprehension there does not make the kernel invalid."""

    def kernel(x: [int for _ in range(1)]):  # noqa: F821 (an odd but evaluated annotation)
        return _copy(x)

    np.testing.assert_array_equal(run(kernel, (X,)).outputs, X)


@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_every_kernel_of_the_library_passes(op):
    """Issue 27: "All our kernels pass it", with every helper they reach: those of the op's
    module and those its spec declares (varlen runs the attention modules' kernels)."""
    module = importlib.import_module(REGISTRY[op].run_kernels.__module__)
    kernels = [v for v in vars(module).values() if isinstance(v, Kernel)]
    kernels += [k for k in REGISTRY[op].kernels if k not in kernels]
    assert kernels, op
    for kernel in kernels:
        assert [(v.what, v.where) for v in violations(kernel.fn)] == []


def test_every_syntax_node_is_either_accepted_with_evidence_or_refused():
    """The table is the whole rule: no node type is in both, every acceptance names its
    source (the guide or an nki-library kernel)."""
    assert not (set(ACCEPTED) & (set(REFUSED) - {ast.FunctionDef}))
    for kind, evidence in ACCEPTED.items():
        assert GUIDE in evidence or "nki-library" in evidence, kind
    for kind, (what, why) in REFUSED.items():
        assert what and why, kind


class HostConfig:  # a plain Python class: not an NKI class
    rows = 2


def k_builds_a_plain_class(x):
    assert HostConfig().rows == 2
    return _copy(x)


def test_classes_the_kernel_builds_must_be_nki_classes():
    """Guide, 'Class Support': "the class must inherit from NKIObject and no other
    classes"."""
    err = _refused(k_builds_a_plain_class, X)
    assert err.arg.startswith("a class with other bases than NKIObject (none) in HostConfig")


def k_loop_body(x, bound):
    """The stub's nl.fori_loop example shape: the body is a nested function."""
    out = _copy(x)
    reg = nisa.register_alloc(1)

    def body(i):
        nisa.dma_copy(dst=out, src=x)

    nl.fori_loop(0, reg, body)
    return out


def test_nested_loop_bodies_are_accepted_as_the_stub_example_writes_them():
    """nki/api/nki/language/__init__.py, fori_loop: ``def body(i): ...`` then
    ``nl.fori_loop(0, ub_reg, body)``; its body is still checked."""
    np.testing.assert_array_equal(run(k_loop_body, (X, 1)).outputs, X)


def k_loop_body_with_comprehension(x):
    reg = nisa.register_alloc(1)

    def body(i):
        return [i for _ in range(1)]

    nl.fori_loop(0, reg, body)
    return _copy(x)


def test_nested_bodies_are_checked():
    err = _refused(k_loop_body_with_comprehension, X)
    assert err.arg.startswith("a list comprehension in k_loop_body_with_comprehension at ")


class Level(enum.IntEnum):
    low = 1


class Shade(str, enum.Enum):
    dark = "dark"


class Perm(enum.Flag):
    read = 1
    write = 2


class Mode(enum.Enum):  # the guide's form: a plain Enum
    fast = 1
    exact = 2


def k_int_enum_arithmetic(x):
    assert Level.low + 1 == 2  # runs as Python; NKI's translated enum has no +
    return _copy(x)


def k_str_enum_concatenation(x):
    assert Shade.dark + "er" == "darker"
    return _copy(x)


def k_flag_union(x):
    assert (Perm.read | Perm.write).value == 3
    return _copy(x)


ENUM_REFUSALS = [
    (k_int_enum_arithmetic, "Level", "+ - * / // % ** << >> & | ^ < <= > >=", "IntEnum"),
    (k_str_enum_concatenation, "Shade", "+ * % < <= > >=", "str"),
    (k_flag_union, "Perm", "& | ^", "Flag"),
]


@pytest.mark.parametrize("kernel, cls, ops, base", ENUM_REFUSALS, ids=[r[1] for r in ENUM_REFUSALS])
def test_enums_a_kernel_reaches_allow_only_equality(kernel, cls, ops, base):
    """Guide line 661 ("Enumerations"): "Equality in NKI is structural, so no additional code
    is needed to replicate the behavior of == and != for objects of type E. No other binary
    operators on enum values are supported." An enum class reached by name (not passed as an
    argument) whose members allow another operator is refused, naming the operators."""
    err = _refused(kernel, X)
    what = f"an enum allowing other binary operators than == and != ({ops}; bases "
    assert err.arg.startswith(what), err.arg
    assert f"in {cls} ({__name__})" in err.arg and base in err.arg
    assert "No other binary operators on enum values are supported" in err.rule


def k_plain_enum(x, fast):
    mode = Mode.fast if fast else Mode.exact
    assert mode != Mode.exact or not fast
    if mode == Mode.fast:
        return _copy(x)
    return _copy(x)


def test_plain_enums_a_kernel_reaches_are_accepted():
    """Guide lines 636-644: ``class E(Enum)`` compared with ``==`` in a kernel function."""
    assert violations(k_plain_enum) == []
    np.testing.assert_array_equal(run(k_plain_enum, (X, True)).outputs, X)


def k_nonlocal(x):
    out = _copy(x)
    reg = nisa.register_alloc(1)
    count = 0

    def body(i):
        nonlocal count
        count += 1
        nisa.dma_copy(dst=out, src=x)

    nl.fori_loop(0, reg, body)
    return out


def test_nested_functions_are_accepted_and_only_nonlocal_is_refused():
    """nki/api/nki/language/__init__.py, fori_loop example: ``def body(i): nisa.dma_copy(
    dst=temp, ...)`` closes over the kernel's tensors, so nested functions (closures) are
    NKI; rebinding an enclosing name (``nonlocal``) the guide does not list. The README's
    text, generated from unimplemented.py, must say the same."""
    np.testing.assert_array_equal(run(k_loop_body, (X, 1)).outputs, X)  # a closure, accepted
    err = _refused(k_nonlocal, X)
    assert err.arg.startswith("nonlocal in k_nonlocal at ")  # the nested body is k_nonlocal's
    section = readme_section()
    refused_list = section[section.index("refuses Python") : section.index("...;")]
    assert "closures" not in refused_list and "`nonlocal`" in refused_list
    assert "nested functions are accepted" in section
