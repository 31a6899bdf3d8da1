"""Every ``nki.*``, ``nki.language.*`` and ``nki.isa.*`` attribute the project uses exists in
the official NKI 0.6 API stubs.

The stub names are the tables of ``tests/interpreter/test_namespaces.py`` (transcribed from
aws-neuron/aws-neuron-sdk nki/api/nki/__init__.py, nki/api/nki/language/__init__.py and
nki/api/nki/isa/__init__.py at snapshot 81ce03ae; nothing is vendored). This test reads the
source of the whole package and its examples (kernels, runners, backends, the CLI, the
cost model, the calibration fixtures, benchmarks, examples) with ``ast``, finds every name
bound to one of those namespaces (``import nki``, ``import nki.language as nl``,
``from nki import isa``, ``from neuron_kernels.backend import nki, nl, nisa``) and checks
each attribute read through it. A call to an API NKI 0.6 does not have (the old
``nki.benchmark``, ``nki.baremetal``, ``nki.profile``) fails here, in CI, instead of on a
Trn2 node.

The interpreter (``interpreter/``) is left out: it *implements* these namespaces, and
``tests/interpreter/test_namespaces.py`` holds it to the stubs name by name.
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
    path = ROOT / "tests" / "interpreter" / "test_namespaces.py"
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


def _bindings(tree: ast.AST) -> dict[str, str]:
    """Local name -> the NKI namespace it is bound to, anywhere in the module."""
    backend_names = {"nki": "nki", "nl": "nki.language", "nisa": "nki.isa"}
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "nki" or alias.name.startswith("nki."):
                    # `import nki.language` binds `nki`; `import nki.isa as nisa` binds nisa
                    out[alias.asname or "nki"] = alias.name if alias.asname else "nki"
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module == "neuron_kernels.backend" and alias.name in backend_names:
                    out[alias.asname or alias.name] = backend_names[alias.name]
                elif node.module == "nki" and f"nki.{alias.name}" in STUB_NAMES:
                    out[alias.asname or alias.name] = f"nki.{alias.name}"
    return out


def _chain(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None when the base is not a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _mark_parents(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node


def _scan(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    _mark_parents(tree)
    bound = _bindings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in STUB_NAMES and node.level == 0:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
            continue
        if not isinstance(node, ast.Attribute) or isinstance(node.parent, ast.Attribute):
            continue  # only the outermost attribute of a chain
        chain = _chain(node)
        if not chain or not bound.get(chain[0]):
            continue
        namespace, rest = bound[chain[0]], chain[1:]
        while rest and f"{namespace}.{rest[0]}" in STUB_NAMES:
            namespace, rest = f"{namespace}.{rest[0]}", rest[1:]
        if rest:
            found.append((node.lineno, f"{namespace}.{rest[0]}"))
    return sorted(set(found))


def missing(source: str) -> list[tuple[int, str]]:
    """The uses in ``source`` of names the NKI 0.6 stubs do not define."""
    out = []
    for line, qual in _scan(source):
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


def test_scanner_reads_the_package():
    """The package's kernels do reach NKI through the scanned bindings."""
    seen = set()
    for path in _files():
        seen.update(q for _, q in _scan(path.read_text()))
    assert {"nki.jit", "nki.isa.nc_matmul", "nki.isa.dma_copy", "nki.language.ndarray"} <= seen


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_nki_attribute_used_exists_in_the_nki_0_6_stubs(path):
    bad = missing(path.read_text())
    assert not bad, f"{path.relative_to(ROOT)} uses names NKI 0.6 does not define: " + ", ".join(
        f"{q} (line {line})" for line, q in bad
    )
