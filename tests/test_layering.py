"""The import graph points one way: hardware facts at the bottom, then the interpreter, the
cost model and the kernels, then the ops, with the CLIs and the integrations on top.

Two views: every ``neuron_kernels`` import in the source (module level or inside a
function), checked against the layer rules below; and what importing a layer actually
loads, in a fresh subprocess.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = Path(__file__).parent / "stand_in_nki"

# unit -> the units it may import. A unit is a module of the root package or a subpackage.
BOTTOM = {"_version", "errors"}
ALLOWED = {
    "_version": set(),
    "errors": set(),
    "hardware": {"errors"},
    "fingerprint": set(),
    "interpreter": BOTTOM | {"hardware"},
    "cost_model": BOTTOM | {"hardware", "interpreter"},
    "backend": {"interpreter"},
    "kernels": BOTTOM | {"hardware", "backend"},
    "tuned_configs": BOTTOM | {"fingerprint", "kernels"},
    "verification": BOTTOM | {"hardware", "interpreter", "kernels"},
    "torch_ops": BOTTOM | {"hardware", "kernels", "backend", "tuned_configs"},
    "autotune": BOTTOM
    | {"hardware", "fingerprint", "interpreter", "cost_model", "kernels", "verification"}
    | {"tuned_configs", "torch_ops"},
    "perf_results": set(),  # data: tuned configs and the calibration's numbers
    "cli": set(),  # the top: anything
    # other libraries' models on the ops (neuron_kernels.integrations.transformers)
    "integrations": BOTTOM | {"torch_ops"},
    "": {"torch_ops"} | BOTTOM,  # neuron_kernels/__init__.py: the public facade
}
NOT_ON_THE_OPS_PATH = (
    "neuron_kernels.cost_model",
    "neuron_kernels.autotune",  # (the ops read tuned configs from neuron_kernels.tuned_configs)
    "neuron_kernels.cli",
    "neuron_kernels.integrations",
    "optuna",
    "matplotlib",
    "transformers",
)


def _package_dirs() -> dict[str, Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {pkg: ROOT / folder for pkg, folder in config["package-dir"].items()}


def _unit(module: str) -> str:
    parts = module.split(".")[1:]  # drop "neuron_kernels"
    if not parts:
        return ""
    return parts[0]


def _source_modules():
    """(module name, path) of every source file in the distribution."""
    dirs = _package_dirs()
    for pkg, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            inner = [p for p in dirs if p != pkg and p.startswith(pkg + ".")]
            name = ".".join([pkg, *parts])
            if any(name == p or name.startswith(p + ".") for p in inner):
                continue  # a subpackage mapped elsewhere owns it
            yield name, path


def _imports(path: Path, module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level + (path.name == "__init__.py") or None]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found |= {f"{target}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("neuron_kernels")}


def test_every_source_file_belongs_to_a_layer():
    units = {_unit(name) for name, _ in _source_modules()}
    assert units <= set(ALLOWED), units - set(ALLOWED)


def test_imports_point_down():
    bad = []
    for name, path in _source_modules():
        unit = _unit(name)
        if unit == "cli":
            continue
        allowed = ALLOWED[unit] | {unit}
        for imported in _imports(path, name):
            target = _unit(imported)
            if target not in allowed:
                bad.append(
                    f"{path.relative_to(ROOT)}: {unit or 'neuron_kernels'} imports {imported}"
                )
    assert not bad, "\n".join(bad)


def _loaded_after(statement: str, stand_in: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NEURON_KERNELS_NKI")}
    env["NEURON_KERNELS_NKI"] = "auto"
    if stand_in:
        env["PYTHONPATH"] = str(STAND_IN)
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("stand_in", [True, False], ids=["nki-importable", "interpreter"])
def test_a_kernel_module_loads_no_cost_model(stand_in):
    loaded = _loaded_after("import neuron_kernels.kernels.matmul", stand_in)
    assert "neuron_kernels.kernels.matmul" in loaded
    assert not [m for m in loaded if m.startswith(NOT_ON_THE_OPS_PATH)]
    if stand_in:  # on a Trn node the kernels need no interpreter either
        assert not [m for m in loaded if m.startswith("neuron_kernels.interpreter")]


@pytest.mark.parametrize("stand_in", [True, False], ids=["nki-importable", "interpreter"])
def test_importing_the_package_registers_the_ops_and_nothing_above_them(stand_in):
    """``import neuron_kernels`` registers every op and loads no cost model, tuner, CLI or
    optuna; where AWS's nki is importable (a Trn node: the stand-in), no interpreter either;
    here, without nki, only the part of the interpreter the kernel modules bind when they
    load (:data:`INTERPRETER_AT_IMPORT`)."""
    loaded = _loaded_after(
        "import neuron_kernels, torch\nassert torch.ops.neuron.matmul is not None", stand_in
    )
    assert "neuron_kernels.torch_ops" in loaded
    assert not [m for m in loaded if m.startswith(NOT_ON_THE_OPS_PATH)]
    interpreter = {m for m in loaded if m.startswith("neuron_kernels.interpreter")}
    assert interpreter <= (set() if stand_in else INTERPRETER_AT_IMPORT), sorted(interpreter)


# What the kernel modules need of the interpreter when it is their NKI: ``nki.jit`` (a
# wrapper, interpreter/kernel.py) and ``nl.NKIObject`` (the class model), which they use when
# they load (the NKI language guide's "Class Support": records must subclass NKIObject), and
# the ``nki.language`` / ``nki.isa`` shells that load everything else at first use
# (interpreter/deferred.py).
INTERPRETER_AT_IMPORT = {
    f"neuron_kernels.interpreter{m}"
    for m in (
        "",
        ".classes",
        ".deferred",
        ".errors",
        ".kernel",
        ".nki",
        ".nki.isa",
        ".nki.language",
        ".rebind",
    )
}


def test_the_interpreter_loads_at_the_first_launch():
    """Without AWS's nki, ``import neuron_kernels`` registers the ops with the interpreter's
    shells only: no instruction, tensor model or ml_dtypes (1.5 s to import on its own)
    loads until a kernel first runs, and then the same ``nl`` names the real functions."""
    statement = (
        "import neuron_kernels, torch\n"
        "assert 'ml_dtypes' not in sys.modules, 'loaded at import'\n"
        "from neuron_kernels.kernels import REGISTRY\n"
        "from neuron_kernels.verification import InterpreterRunner\n"
        "spec = REGISTRY['swiglu']\n"
        "problem = spec.test_problems['probe']\n"
        "args = spec.make_inputs(problem, 'float32', torch.Generator().manual_seed(0))\n"
        "spec.run_kernels(*args, config=spec.config.default(), runner=InterpreterRunner())\n"
        "from neuron_kernels.backend import nl\n"
        "from neuron_kernels.interpreter.nki import _language\n"
        "assert nl.ndarray is _language.ndarray"
    )
    loaded = _loaded_after(statement, False)
    for module in ("ml_dtypes", "neuron_kernels.interpreter.execution"):
        assert module in loaded, module
    assert "neuron_kernels.interpreter.nki._isa" in loaded


def test_the_interpreter_loads_no_cost_model():
    loaded = _loaded_after("import neuron_kernels.interpreter", False)
    assert not [m for m in loaded if m.startswith(NOT_ON_THE_OPS_PATH)]


def _imported_by_the_command(*argv: str) -> list[str]:
    """Every module ``python -m neuron_kernels.cli *argv`` imports (``-X importtime``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NEURON_KERNELS_NKI")}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "neuron_kernels.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return [line.rsplit("|", 1)[1].strip() for line in lines[1:]]  # (the first is the header)


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_the_command_lists_and_versions_without_loading_the_ops(flag):
    """``neuron-kernels --version`` / ``--help`` start in tens of milliseconds: they import
    neither torch nor a kernel, the interpreter, the cost model or the tuner (the package
    root defers the ops' registration to a subcommand: neuron_kernels.register_ops)."""
    loaded = _imported_by_the_command(flag)
    assert "neuron_kernels.cli" in loaded
    heavy = ("torch", "optuna", "numpy", "neuron_kernels.kernels", "neuron_kernels.interpreter")
    heavy += ("neuron_kernels.cost_model", "neuron_kernels.autotune", "neuron_kernels.torch_ops")
    assert not [m for m in loaded if m.startswith(heavy)], [
        m for m in loaded if m.startswith(heavy)
    ]
