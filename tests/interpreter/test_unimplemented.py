"""The table of unimplemented NKI 0.6 APIs (interpreter/unimplemented.py) against the
namespaces and the README.

The stub names come from nki_api/test_namespaces.py, transcribed from aws-neuron/aws-neuron-sdk
nki/api/nki/{__init__,isa/__init__,language/__init__}.py (snapshot 81ce03ae). What this
proves: every stub API the interpreter refuses is in the table with a reason, every table
entry is refused with that reason in the error, and the README's "Where the interpreter
differs from AWS's simulator" section is the text generated from the table.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from pathlib import Path

import numpy as np
import pytest
from test_namespaces import ISA, ISA_OTHER, LANGUAGE, LANGUAGE_OTHER, TENSOR

from neuron_kernels.interpreter import nki, run
from neuron_kernels.interpreter.operators import Operator
from neuron_kernels.interpreter.unimplemented import UNIMPLEMENTED, readme_section

nl, nisa = nki.language, nki.isa
README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Where the interpreter differs from AWS's simulator\n\n"


def _call_with_placeholders(obj):
    """Call ``obj`` with None for every required parameter: an API that refuses every call
    raises NotImplementedError before it looks at them."""
    if isinstance(obj, Operator):
        return obj()
    required = [
        p
        for p in inspect.signature(obj).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return obj(*[None] * len(required))


def _refuses(module, name, function=True) -> bool:
    """Whether the interpreter refuses ``name``: on access, or (a stub function) on any
    call."""
    try:
        obj = getattr(module, name)
    except NotImplementedError:
        return True
    if not function or module is nl.NkiTensor:
        return False
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            _call_with_placeholders(obj)
    except NotImplementedError:
        return True
    except Exception:  # implemented: placeholder arguments fail its checks instead
        return False
    return False


def _packed_dtype_refused(dtype) -> bool:
    def kernel():
        nl.ndarray((1, 4), dtype, buffer=nl.sbuf)

    try:
        run(kernel, ())
    except NotImplementedError:
        return True
    return False


def test_every_refused_stub_api_is_in_the_table():
    refused = [f"nki.isa.{n}" for n in ISA if _refuses(nisa, n)]
    refused += [f"nki.isa.{n}" for n in ISA_OTHER if _refuses(nisa, n, function=False)]
    refused += [f"nki.language.{n}" for n in LANGUAGE if _refuses(nl, n)]
    refused += [f"nki.language.{n}" for n in LANGUAGE_OTHER if _refuses(nl, n, function=False)]
    refused += [f"nki.language.NkiTensor.{n}" for n in TENSOR if _refuses(nl.NkiTensor, n)]
    refused += [
        f"nki.language.{n} tensors"
        for n in LANGUAGE_OTHER
        if n.endswith("_x4") and _packed_dtype_refused(getattr(nl, n))
    ]
    if not hasattr(nki, "collectives"):
        refused.append("nki.collectives")
    assert refused, "the interpreter implements every stub API: the table must be empty"
    assert sorted(set(refused) - set(UNIMPLEMENTED)) == []


@pytest.mark.parametrize("name", sorted(n for n in UNIMPLEMENTED if n.count(".") == 2))
def test_every_table_entry_is_refused_with_its_reason(name):
    _, space, attr = name.split(".")
    module = {"isa": nisa, "language": nl}[space]
    with pytest.raises(NotImplementedError) as info:
        _call_with_placeholders(getattr(module, attr))
    assert name.split(".", 1)[1].split(".")[-1] in str(info.value)
    assert UNIMPLEMENTED[name] in str(info.value)


def test_readme_section_is_generated_from_the_table():
    text = README.read_text()
    start = text.index(SECTION) + len(SECTION)
    end = text.index("\n## ", start) + 1
    assert text[start:end] == readme_section() + "\n", (
        "regenerate: README section = neuron_kernels.interpreter.unimplemented.readme_section()"
    )


def test_every_reason_is_said():
    for name, why in UNIMPLEMENTED.items():
        assert len(why) > 20, name
    assert np.isfinite(len(UNIMPLEMENTED))
