"""Shared helpers for the interpreter tests, importable from every folder below this one.

The tests mirror the package: ``instructions/`` holds the tests of
``interpreter/instructions/<x>.py``, ``nki_api/`` those of ``interpreter/nki/`` (not named
``nki``: this folder is on ``sys.path``, where a folder ``nki`` would import as the ``nki``
package). Test modules import ``_compute_helpers`` (this folder) and the NKI stub tables of
``nki_api/test_namespaces.py`` by module name, so both folders go on ``sys.path`` here, before
any test module is imported, whichever test is run alone.
"""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _helpers in (_HERE, _HERE / "nki_api"):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))
