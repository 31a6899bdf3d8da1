"""Matmul benchmark (modeled): latency of the default and the shipped tuned config next to
the modeled TensorE floor, with the engine that binds.

    python benchmarks/matmul.py                      # its committed shapes
    python benchmarks/matmul.py --shape 1024x1024x1024 --dtype float32

The generic driver ``benchmarks/op.py`` for the op ``matmul`` (every number modeled).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op import main  # noqa: E402  (benchmarks/op.py, beside this script)

if __name__ == "__main__":
    sys.exit(main(["matmul", *sys.argv[1:]]))
