"""Every ``nki.*``, ``nki.language.*`` and ``nki.isa.*`` attribute the project uses exists in
the official NKI 0.6 API stubs.

The stub names are the tables of ``tests/interpreter/nki_api/test_namespaces.py`` (transcribed from
aws-neuron/aws-neuron-sdk nki/api/nki/__init__.py, nki/api/nki/language/__init__.py and
nki/api/nki/isa/__init__.py at snapshot 81ce03ae; nothing is vendored). This test reads the
source of the whole package and its examples (kernels, runners, backends, the CLI, the
cost model, the calibration fixtures, benchmarks, examples) with ``ast``, finds every name
bound to one of those namespaces (``import nki``, ``import nki.language as nl``,
``from nki import isa``, ``from neuron_kernels.backend import nki, nl, nisa``; a module
attribute chain through the module that re-exports them, ``backend.nki.X`` or
``neuron_kernels.backend.nki.X``; ``importlib.import_module("nki")`` and names assigned
from it; ``from neuron_kernels.interpreter import nki`` and its ``nki.language`` /
``nki.isa`` assigned to other names; ``getattr(nki, "X")``) and checks each attribute read
through it. A call to an API NKI 0.6 does not have (the old
``nki.benchmark``, ``nki.baremetal``, ``nki.profile``) fails here, in CI, instead of on a
Trn2 node.

The interpreter (``interpreter/``) is left out: it *implements* these namespaces, and
``tests/interpreter/nki_api/test_namespaces.py`` holds it to the stubs name by name.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import neuron_kernels  # noqa: F401  (the stub tables import the interpreter through it)

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (
    "neuron_kernels",
    "kernels",
    "torch_ops",
    "autotune",
    "cost_model",
    "perf_results",
    "benchmarks",
    "examples",
)


def _stub_tables():
    path = ROOT / "tests" / "interpreter" / "nki_api" / "test_namespaces.py"
    spec = importlib.util.spec_from_file_location("_nki_stub_tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_T = _stub_tables()
STUB_NAMES = {
    "nki": set(_T.NKI) | set(_T.NKI_SUBMODULES),
    "nki.language": set(_T.LANGUAGE) | set(_T.LANGUAGE_OTHER),
    "nki.isa": set(_T.ISA) | set(_T.ISA_OTHER),
    "nki.collectives": set(_T.COLLECTIVES),
}


# Where the NKI namespaces live under other names: a path through one of these is the
# namespace itself. ``neuron_kernels.backend`` re-exports them (backend.py: ``name, nki, nl,
# nisa = resolve()``); the interpreter's package is what it resolves to off a Trn node.
ALIASES = {
    "neuron_kernels.backend.nki": "nki",
    "neuron_kernels.backend.nl": "nki.language",
    "neuron_kernels.backend.nisa": "nki.isa",
    "neuron_kernels.interpreter.nki": "nki",
}
# Folders that setuptools maps into the package (pyproject ``package-dir``): a relative
# import in ``kernels/x.py`` is relative to ``neuron_kernels.kernels``.
MAPPED = {"neuron_kernels", "kernels", "interpreter", "cost_model", "torch_ops", "autotune"}
MAPPED.add("perf_results")


def _canonical(path: str) -> str | None:
    """``neuron_kernels.backend.nki.jit`` -> ``nki.jit``; None for a path outside NKI."""
    for alias, namespace in ALIASES.items():
        if path == alias or path.startswith(alias + "."):
            return namespace + path[len(alias) :]
    return path if path == "nki" or path.startswith("nki.") else None


def package_of(path: Path) -> str:
    """The package a file's relative imports resolve against, as installed."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = parts[:-1]  # x/y/z.py and x/y/__init__.py are both in package x.y
    if parts and parts[0] in MAPPED - {"neuron_kernels"}:
        parts = ["neuron_kernels", *parts]
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, package: str | None) -> str | None:
    """The module an ``ImportFrom`` names, relative ones resolved against ``package``."""
    if node.level == 0:
        return node.module
    if package is None:
        return None
    base = package.split(".")
    if node.level - 1 > len(base):
        return None
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_call_to(node: ast.AST, *names: str) -> bool:
    """``node`` calls one of ``names`` (a plain name or the last attribute of a chain)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in names


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _bindings(tree: ast.AST, package: str | None = None) -> dict[str, set[str]]:
    """Local name -> the dotted module paths it is bound to, anywhere in the module.

    Every import binds (``import a.b`` binds ``a``; ``import a.b as x`` and ``from a import b
    as x`` bind ``x`` to ``a.b``), and so does an assignment of anything :func:`_paths`
    resolves (``x = importlib.import_module("a.b")``, ``x = a.b``, ``x, y = a.b, a.c``).
    :func:`_canonical` then decides which paths are NKI's, so ``backend.nki`` after ``from
    neuron_kernels import backend`` is ``nki``.
    """
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.partition(".")[0]
                out.setdefault(local, set()).add(alias.name if alias.asname else local)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            for alias in node.names:
                if module and alias.name != "*":
                    out.setdefault(alias.asname or alias.name, set()).add(f"{module}.{alias.name}")
    # aliases: `x = importlib.import_module("nki")`, `lang = nki.language`,
    # `nl, nisa = nki.language, nki.isa`; repeated until no name gains a path (at most a few
    # rounds: an alias of an alias of an alias; `x = x.parent` would grow forever)
    assigns = [
        (t, n.value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
    ]
    pairs = []
    for target, value in assigns:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            pairs += (
                list(zip(target.elts, value.elts)) if len(target.elts) == len(value.elts) else []
            )
        else:
            pairs.append((target, value))
    pairs = [(t.id, v) for t, v in pairs if isinstance(t, ast.Name)]
    changed, rounds = True, 0
    while changed and rounds < 4:
        changed, rounds = False, rounds + 1
        for name, value in pairs:
            paths = _paths(value, out) - out.get(name, set())
            if paths:
                out.setdefault(name, set()).update(paths)
                changed = True
    return out


def _imported(node: ast.AST) -> set[str]:
    """The module ``importlib.import_module("a.b")`` / ``__import__("a.b")`` returns."""
    if _is_call_to(node, "import_module") and node.args:
        name = _const_str(node.args[0])
        return {name} if name else set()
    if _is_call_to(node, "__import__") and node.args:
        name = _const_str(node.args[0])
        return {name.partition(".")[0]} if name else set()
    return set()


def _paths(node: ast.AST, bound: dict[str, set[str]]) -> set[str]:
    """The dotted paths an expression names: a bound name, an attribute chain on one, an
    ``import_module`` call, or ``getattr(x, "name")`` with a constant name."""
    if isinstance(node, ast.Name):
        return bound.get(node.id, set())
    if isinstance(node, ast.Attribute):
        return {f"{p}.{node.attr}" for p in _paths(node.value, bound)}
    if _is_call_to(node, "getattr") and isinstance(node.func, ast.Name) and len(node.args) >= 2:
        name = _const_str(node.args[1])
        return {f"{p}.{name}" for p in _paths(node.args[0], bound)} if name else set()
    return _imported(node)


def _mark_parents(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node


def _outermost(node: ast.AST) -> bool:
    """``node`` is not the base of a longer chain (``a.b`` in ``a.b.c``, ``x`` in
    ``getattr(x, "c")``): only the whole chain is checked."""
    parent = getattr(node, "parent", None)
    if isinstance(parent, ast.Attribute):
        return False
    return not (_is_call_to(parent, "getattr") and parent.args and parent.args[0] is node)


def _use(path: str) -> str | None:
    """The NKI name a use of ``path`` reads (``nki.isa.nc_matmul``; ``nki.benchmark`` for
    ``nki.benchmark.x``), None when it is a namespace itself or not NKI's."""
    qual = _canonical(path)
    if qual is None:
        return None
    namespace, rest = "nki", qual.split(".")[1:]
    while rest and f"{namespace}.{rest[0]}" in STUB_NAMES:
        namespace, rest = f"{namespace}.{rest[0]}", rest[1:]
    return f"{namespace}.{rest[0]}" if rest else None


def _scan(source: str, package: str | None = None) -> list[tuple[int, str]]:
    """(line, qualified NKI name) of every NKI name ``source`` reads, through any binding
    form of :func:`_bindings` (``package``: the one relative imports resolve against)."""
    tree = ast.parse(source)
    _mark_parents(tree)
    bound = _bindings(tree, package)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import nki.no_such` names a module NKI lacks
                use = _use(alias.name)
                found |= {(node.lineno, use)} if use else set()
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            if module and _canonical(module) is not None:
                found |= {(node.lineno, f"{_canonical(module)}.{a.name}") for a in node.names}
        elif isinstance(node, (ast.Attribute, ast.Call)) and _outermost(node):
            for path in _paths(node, bound):
                use = _use(path)
                if use:
                    found.add((node.lineno, use))
    return sorted(found)


def missing(source: str, package: str | None = None) -> list[tuple[int, str]]:
    """The uses in ``source`` of names the NKI 0.6 stubs do not define."""
    out = []
    for line, qual in _scan(source, package):
        namespace, _, name = qual.rpartition(".")
        if name not in STUB_NAMES.get(namespace, set()):
            out.append((line, qual))
    return out


def _files():
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


def test_scanner_finds_a_use_the_stubs_lack():
    """The scanner sees through every binding form the project uses (so the package test
    below cannot pass by seeing nothing)."""
    source = (
        "import nki\nimport nki.language as nl\nfrom nki import isa as nisa\n"
        "from neuron_kernels.backend import nki as k, nl as lang\n"
        "def f():\n"
        "    nki.benchmark(warmup=1)(g)\n"
        "    nki.language.add(a, b)\n"
        "    nl.no_such(a)\n"
        "    nisa.nc_matmul(d, s, m)\n"
        "    nisa.engine.vector\n"
        "    k.baremetal(g)\n"
        "    lang.tile_size.pmax\n"
    )
    assert missing(source) == [
        (6, "nki.benchmark"),
        (8, "nki.language.no_such"),
        (11, "nki.baremetal"),
    ]
    assert (7, "nki.language.add") in _scan(source)
    assert (10, "nki.isa.engine") in _scan(source)
    assert (12, "nki.language.tile_size") in _scan(source)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        # the module that re-exports nki/nl/nisa, reached as a module attribute
        pytest.param(
            "from neuron_kernels import backend\n\nbackend.nki.benchmark(warmup=1)(k)\n",
            (3, "nki.benchmark"),
            id="backend module",
        ),
        pytest.param(
            "import neuron_kernels.backend\nx = 1\nneuron_kernels.backend.nki.profile(k)\n",
            (3, "nki.profile"),
            id="backend module, dotted",
        ),
        pytest.param(
            "import neuron_kernels.backend as nb\nnb.nisa.no_such(a)\n",
            (2, "nki.isa.no_such"),
            id="backend module, aliased",
        ),
        pytest.param(
            "from . import backend\nbackend.nl.no_such\n",
            (2, "nki.language.no_such"),
            id="backend module, relative import",
        ),
        # importlib, used directly or through a name
        pytest.param(
            "import importlib\n\n\nimportlib.import_module('nki').benchmark(k)\n",
            (4, "nki.benchmark"),
            id="import_module call",
        ),
        pytest.param(
            "from importlib import import_module\nm = import_module('nki.isa')\nm.no_such()\n",
            (3, "nki.isa.no_such"),
            id="import_module name",
        ),
        # the interpreter's nki package (neuron_kernels/backend.py binds it as nki_mod)
        pytest.param(
            "def f():\n    from neuron_kernels.interpreter import nki as nki_mod\n"
            "    return nki_mod.baremetal(k)\n",
            (3, "nki.baremetal"),
            id="interpreter nki",
        ),
        pytest.param(
            "from neuron_kernels.interpreter import nki\nnl, nisa = nki.language, nki.isa\n"
            "nisa.no_such(d)\n",
            (3, "nki.isa.no_such"),
            id="interpreter nki, namespaces unpacked",
        ),
        pytest.param(
            "import nki\ngetattr(nki, 'benchmark')(k)\n", (2, "nki.benchmark"), id="getattr"
        ),
    ],
)
def test_scanner_sees_module_attribute_importlib_and_interpreter_bindings(source, found):
    """Each way of reaching an NKI namespace that the package uses or could use is checked:
    ``missing`` reports the name NKI 0.6 lacks at its line, so the package test below cannot
    pass by not seeing a use."""
    assert missing(source, package="neuron_kernels") == [found]


def test_scanner_reports_the_uses_that_exist_through_the_new_bindings():
    """A name the stubs define, reached the same ways, is seen (and not reported)."""
    source = (
        "import importlib\nfrom neuron_kernels import backend\n"
        "from neuron_kernels.interpreter import nki as nki_mod\n"
        "backend.nisa.nc_matmul(d, s, m)\n"
        "importlib.import_module('nki.language').ndarray\n"
        "nki_mod.jit\n"
    )
    assert missing(source) == []
    assert _scan(source) == [(4, "nki.isa.nc_matmul"), (5, "nki.language.ndarray"), (6, "nki.jit")]


def test_scanner_ignores_paths_outside_nki():
    """Other modules' attributes (even one named ``nki`` elsewhere) are not NKI's, and a
    self-referencing alias does not loop."""
    source = (
        "import os\nfrom neuron_kernels import verification\nimport importlib\n"
        "os.path.join('a')\ntesting.nki\nimportlib.import_module('torch').no_such\n"
        "p = os.path\np = p.parent\n"
    )
    assert _scan(source) == []


def test_scanner_reads_the_package():
    """The package's kernels do reach NKI through the scanned bindings."""
    seen = set()
    for path in _files():
        seen.update(q for _, q in _scan(path.read_text(), package_of(path)))
    assert {"nki.jit", "nki.isa.nc_matmul", "nki.isa.dma_copy", "nki.language.ndarray"} <= seen


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_nki_attribute_used_exists_in_the_nki_0_6_stubs(path):
    bad = missing(path.read_text(), package_of(path))
    assert not bad, f"{path.relative_to(ROOT)} uses names NKI 0.6 does not define: " + ", ".join(
        f"{q} (line {line})" for line, q in bad
    )
