"""Cost-model calibration: AWS's published matmul-tutorial measurements (``published.json``),
the tutorial variants rewritten as NKI kernels (``tutorial_matmul.py``), and the stored table
of modeled vs published latency (``table.json``, ``table.md``).

The kernels live here, beside the numbers they reproduce, because they exist only to produce
that table: they are calibration fixtures, not examples to copy. Regenerate the table with
``neuron-kernels calibrate --write``.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
PUBLISHED_PATH = HERE / "published.json"
TABLE_JSON = HERE / "table.json"
TABLE_MD = HERE / "table.md"

__all__ = ["HERE", "PUBLISHED_PATH", "TABLE_JSON", "TABLE_MD"]
