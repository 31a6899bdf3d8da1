"""Cost-model calibration data: AWS's published matmul-tutorial measurements
(``published.json``) and the stored table of modeled vs published latency (``table.json``,
``table.md``) of the tutorial variants, which live with the other kernels
(``neuron_kernels.kernels.calibration.tutorial_matmul``). Data only. Regenerate the table
with ``neuron-kernels calibrate --write``.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
PUBLISHED_PATH = HERE / "published.json"
TABLE_JSON = HERE / "table.json"
TABLE_MD = HERE / "table.md"

__all__ = ["HERE", "PUBLISHED_PATH", "TABLE_JSON", "TABLE_MD"]
