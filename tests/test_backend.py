"""The NKI backend switch: ``NEURON_KERNELS_NKI=auto|interpreter|nki`` and its errors."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from neuron_kernels import backend
from neuron_kernels.interpreter import nki as interpreter_nki

NKI_INSTALLED = importlib.util.find_spec("nki") is not None
needs_no_nki = pytest.mark.skipif(NKI_INSTALLED, reason="AWS's nki package is installed here")


def _assert_interpreter(resolved):
    name, nki, nl, nisa = resolved
    assert name == "interpreter"
    assert nki is interpreter_nki
    assert nl is interpreter_nki.language
    assert nisa is interpreter_nki.isa


@pytest.mark.parametrize("choice", ["interpreter", " Interpreter ", "INTERPRETER"])
def test_interpreter_is_chosen_by_name(choice):
    _assert_interpreter(backend.resolve(choice))


@needs_no_nki
@pytest.mark.parametrize("choice", ["auto", "", "  "])
def test_auto_falls_back_to_the_interpreter(choice):
    _assert_interpreter(backend.resolve(choice))


@needs_no_nki
def test_nki_without_the_package_names_how_to_install():
    with pytest.raises(ImportError) as info:
        backend.resolve("nki")
    assert isinstance(info.value, backend.BackendError)
    message = str(info.value)
    assert "NEURON_KERNELS_NKI=nki" in message
    assert "pip install 'neuron-kernels[neuron]'" in message
    assert "https://pip.repos.neuron.amazonaws.com" in message


@pytest.mark.parametrize("choice", ["simulator", "cuda", "nki2"])
def test_invalid_choice_lists_the_valid_ones(choice):
    with pytest.raises(backend.BackendError) as info:
        backend.resolve(choice)
    message = str(info.value)
    assert "NEURON_KERNELS_NKI must be one of auto|interpreter|nki" in message
    assert repr(choice) in message


def test_default_reads_the_environment(monkeypatch):
    monkeypatch.setenv(backend.BACKEND_ENV, "interpreter")
    _assert_interpreter(backend.resolve())
    monkeypatch.setenv(backend.BACKEND_ENV, "bogus")
    with pytest.raises(backend.BackendError, match="'bogus'"):
        backend.resolve()


def test_module_exports_the_resolved_backend():
    assert backend.name in ("interpreter", "nki")
    if backend.name == "interpreter":
        assert backend.nl is interpreter_nki.language and backend.nisa is interpreter_nki.isa


def _import_backend(value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, backend.BACKEND_ENV: value}
    code = "from neuron_kernels import backend; print('backend=' + backend.name)"
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_no_nki
def test_environment_variable_is_read_at_import():
    ok = _import_backend("interpreter")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "backend=interpreter"

    missing = _import_backend("nki")
    assert missing.returncode != 0
    assert "BackendError" in missing.stderr
    assert "pip install 'neuron-kernels[neuron]'" in missing.stderr
