"""Packaging: one import namespace, the README's commands, the CLI entry point, CI."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import neuron_kernels
from neuron_kernels.cli import demo
from neuron_kernels.kernels import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
DIST = "neuron-kernels"


@pytest.fixture(scope="module")
def setuptools_config() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


@pytest.fixture(scope="module")
def mapped_roots(setuptools_config) -> list[str]:
    """Root folders mapped into neuron_kernels.*; none may become a top-level module."""
    return sorted(d for pkg, d in setuptools_config["package-dir"].items() if pkg != d)


def readme_quick_start() -> list[str]:
    """The commands of the README's Quick start code block, one per line."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.DOTALL | re.MULTILINE)
    assert section, "README.md has no '## Quick start' section"
    block = re.search(r"```(?:bash|sh|console)\n(.*?)```", section.group(1), re.DOTALL)
    assert block, "the Quick start section has no bash code block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def ci_test_command() -> str:
    """The line .ci/run runs after its 'README test command' marker."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    marker = next(i for i, line in enumerate(lines) if line.startswith("# README test command"))
    return next(line for line in lines[marker + 1 :] if line and not line.startswith("#"))


def _script(name: str) -> str:
    """A console script installed beside this interpreter."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is not installed beside {sys.executable}"
    return str(path)


def _run(cmd: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``cwd`` (not the repo, whose root would shadow the installed package)."""
    env = {k: v for k, v in {**os.environ, **env}.items() if k != "PYTHONPATH"}
    return subprocess.run(
        cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _python(code: str, *args: str, cwd: Path) -> list:
    """Run ``code`` in a fresh interpreter in ``cwd``; returns its stdout parsed as JSON."""
    result = _run([sys.executable, "-c", code, *args], cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- one namespace ------------------------------------------------------------------------


def test_maps_the_layout_folders_into_the_namespace(setuptools_config, mapped_roots):
    assert setuptools_config["package-dir"]["neuron_kernels.kernels"] == "kernels"
    assert {"kernels", "interpreter", "cost_model", "torch_ops", "autotune"} <= set(mapped_roots)


def test_installed_distribution_has_one_top_level_name(mapped_roots, tmp_path):
    """The installed metadata (read outside the repo, whose egg-info would shadow it)."""
    code = (
        "import importlib.metadata as m, json\n"
        "d = m.distribution('neuron-kernels')\n"
        "print(json.dumps([d.read_text('top_level.txt'), [str(f) for f in d.files or []]]))"
    )
    top_level, files = _python(code, cwd=tmp_path)
    assert top_level is not None and top_level.split() == ["neuron_kernels"]
    assert files, "the installed distribution lists no files"
    for f in files:
        assert Path(f).parts[0] not in mapped_roots, f"installed outside the namespace: {f}"


def test_no_bare_top_level_kernels_module(mapped_roots, tmp_path):
    """Outside the repo, `import kernels` (or another root folder) must not find ours."""
    code = (
        "import importlib.util, json, sys\n"
        "import neuron_kernels.kernels\n"
        "specs = {n: importlib.util.find_spec(n) for n in sys.argv[1:]}\n"
        "print(json.dumps({n: s and (s.origin or str(list(s.submodule_search_locations)))"
        " for n, s in specs.items()}))"
    )
    found = _python(code, *mapped_roots, cwd=tmp_path)
    assert set(found) == set(mapped_roots)
    for name, origin in found.items():
        assert origin is None or str(ROOT) not in origin, (
            f"`import {name}` finds this repo: {origin}"
        )


def test_every_package_folder_is_listed(setuptools_config):
    """A new sub-package must be added to pyproject's `packages`, or a wheel leaves it out."""
    listed = set(setuptools_config["packages"])
    for pkg, folder in setuptools_config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            dotted = ".".join([pkg, *rel.parts])
            assert dotted in listed, f"{init.parent.relative_to(ROOT)} is not listed as {dotted}"


def test_version_matches_the_distribution():
    assert neuron_kernels.__version__ == importlib.metadata.version(DIST)


# -- README and CI ------------------------------------------------------------------------


def test_readme_quick_start_is_install_tune_test():
    install_and_demo, tune, test = readme_quick_start()
    assert "pip install torch==2.13.0" in install_and_demo
    assert '-e ".[test]"' in install_and_demo
    assert install_and_demo.endswith("&& neuron-kernels demo")
    assert tune.startswith("neuron-kernels autotune matmul --shape ")  # the main job
    assert test == "python -m pytest"


def test_ci_runs_the_readme_test_command():
    assert ci_test_command() == readme_quick_start()[-1]


def test_ci_installs_torch_first_and_the_test_extra():
    text = (ROOT / ".ci" / "run").read_text()
    torch_at = text.index("pip install --quiet torch==2.13.0")
    assert torch_at < text.index('pip install --quiet -e ".[test]"')
    assert os.access(ROOT / ".ci" / "run", os.X_OK), ".ci/run must be executable"
    assert "exit 5" in text or '"$status" -eq 5' in text  # no tests ran counts as failure


# Where AWS's docs say the Neuron SDK lives on a Neuron DLAMI (nki/get-started/setup-env.rst:
# the tools in /opt/aws/neuron/bin, the PyTorch venv /opt/aws_neuronx_venv_pytorch_<version>):
# the README's Trn2-node steps name them; they are the node's documented layout, not ours.
DOCUMENTED_NODE_PATHS = ("/opt/aws/neuron/", "/opt/aws_neuronx_venv_pytorch_")


@pytest.mark.parametrize("path", ["README.md", ".ci/run"])
def test_no_machine_absolute_paths(path):
    text = (ROOT / path).read_text()
    for documented in DOCUMENTED_NODE_PATHS:
        text = text.replace(documented, "<documented Neuron DLAMI path>")
    for prefix in ("/work/", "/home/", "/root/", "/opt/", "/Users/"):
        assert prefix not in text, f"{path} names a machine path ({prefix})"


# -- the CLI ------------------------------------------------------------------------------


def test_cli_help(tmp_path):
    result = _run([_script("neuron-kernels"), "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout


# The demo's defaults, whatever the caller's environment says.
DEMO_ENV = {"NEURON_KERNELS_NKI": "interpreter", "NEURON_PLATFORM_TARGET_OVERRIDE": ""}


def test_cli_demo_passes(tmp_path):
    result = _run([_script("neuron-kernels"), "demo"], tmp_path, **DEMO_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "target trn2" in lines[0]
    runs = sum(len(spec.dtypes) for spec in REGISTRY.values())  # every op in each dtype
    assert sum(" PASS" in line for line in lines) == runs
    assert lines[-2].startswith(f"PASS: {runs} of {runs}")
    assert "modeled" in lines[-1] and "not measured" in lines[-1]


def test_cli_demo_other_target_and_bad_option(tmp_path):
    ok = _run([_script("neuron-kernels"), "demo", "--target", "trn3"], tmp_path, **DEMO_ENV)
    assert ok.returncode == 0, ok.stderr
    assert "target trn3" in ok.stdout
    bad = _run([_script("neuron-kernels"), "demo", "--target", "trn9"], tmp_path, **DEMO_ENV)
    assert bad.returncode == 2
    assert "--target trn9: must be one of" in bad.stderr and bad.stderr.count("\n") == 1


def test_demo_returns_nonzero_on_a_mismatch(monkeypatch, capsys):
    """With an impossible tolerance the matmul check fails and main says so."""
    monkeypatch.setattr(demo, "TOLERANCE_SCALE", 0.0)
    args = argparse.Namespace(target="trn2", size="small", seed=0, lnc=None)
    assert demo.main(args) == 1
    out = capsys.readouterr().out
    failed = out.splitlines()[-2]
    assert failed.startswith("FAIL: ") and "matmul float32" in failed


def test_wheel_holds_the_whole_namespace_and_nothing_else(setuptools_config, tmp_path):
    """Build a real (non-editable) wheel from a copy of the tree and list what it installs."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
    )
    shutil.copytree(ROOT, src, ignore=skip)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    result = _run([*cmd, "-q", "-w", str(tmp_path / "dist"), str(src)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("neuron_kernels-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"neuron_kernels"}
    for pkg, folder in setuptools_config["package-dir"].items():
        for py in (src / folder).rglob("*.py"):
            rel = py.relative_to(src / folder).as_posix()
            assert f"{pkg.replace('.', '/')}/{rel}" in names, f"the wheel leaves out {folder}/{rel}"
    for data in (src / "perf_results").rglob("*.json"):
        rel = data.relative_to(src).as_posix()
        assert f"neuron_kernels/{rel}" in names, f"the wheel leaves out {rel}"
