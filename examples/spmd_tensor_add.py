"""SPMD tiled tensor add in NKI: ``out = a + b``, the row tiles shared among program instances.

``tensor_add[grid](a, b)`` launches ``grid`` instances of the kernel; each asks for its
index (``nl.program_id(0)``) and the instance count (``nl.num_programs(0)``) and takes every
``grid``-th block of 128 rows. Inputs and the output live in ``nl.shared_hbm``, which all
instances see. NKI 0.6 allows one number in the brackets, the LNC: ``kernel[1]`` anywhere,
``kernel[2]`` on Trn2/Trn3, whose logical NeuronCore is two physical cores sharing one HBM
stack (nki/get-started/about/lnc.rst). The default grid is the launch's LNC
(``NEURON_LOGICAL_NC_CONFIG``, else the target's default: 2 on trn2/trn3, 1 on trn1).

Run it anywhere (the portable interpreter is used when AWS's ``nki`` is not installed)::

    python examples/spmd_tensor_add.py --rows 300 --cols 700 --grid 2

It checks the result against NumPy and exits non-zero on a mismatch.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from neuron_kernels.backend import name as backend_name
from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import default_target, launch_lnc


@nki.jit
def tensor_add(a, b):
    """``a + b`` for two ``[rows, cols]`` HBM tensors of one dtype; returns ``[rows, cols]``."""
    rows, cols = a.shape
    assert tuple(b.shape) == (rows, cols), f"tensor_add: b.shape must be {a.shape}, got {b.shape}"
    out = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.shared_hbm, name="out")

    tile_p = nl.tile_size.pmax  # 128 rows: one per partition
    tile_f = 512  # columns per tile: keeps each SBUF tile small
    n_row_tiles = (rows + tile_p - 1) // tile_p

    # Instance i takes row tiles i, i + grid, i + 2 * grid, ...
    for t in range(nl.program_id(0), n_row_tiles, nl.num_programs(0)):
        r0 = t * tile_p
        rs = min(tile_p, rows - r0)
        for c0 in range(0, cols, tile_f):
            cs = min(tile_f, cols - c0)
            a_tile = nl.ndarray((rs, cs), dtype=a.dtype, buffer=nl.sbuf, name="a_tile")
            b_tile = nl.ndarray((rs, cs), dtype=b.dtype, buffer=nl.sbuf, name="b_tile")
            nisa.dma_copy(dst=a_tile, src=a[r0 : r0 + rs, c0 : c0 + cs])
            nisa.dma_copy(dst=b_tile, src=b[r0 : r0 + rs, c0 : c0 + cs])
            sum_tile = nl.ndarray((rs, cs), dtype=out.dtype, buffer=nl.sbuf, name="sum_tile")
            nisa.tensor_tensor(dst=sum_tile, data1=a_tile, data2=b_tile, op=nl.add)
            nisa.dma_copy(dst=out[r0 : r0 + rs, c0 : c0 + cs], src=sum_tile)
    return out


class OneLineErrors(argparse.ArgumentParser):
    """A bad flag is one line (``--help`` shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """argparse type: sizes and grids are ints >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrors(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=positive_int, default=300, help="default 300 (a remainder tile of 44)"
    )
    parser.add_argument(
        "--cols", type=positive_int, default=700, help="default 700 (a remainder tile of 188)"
    )
    parser.add_argument(
        "--grid",
        type=positive_int,
        default=None,
        help="the LNC: 1, or 2 on trn2/trn3 (default: the launch's LNC)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        target = default_target()
        grid = launch_lnc(target) if args.grid is None else args.grid
    except LimitError as exc:
        parser.error(str(exc))
    if grid not in target.lnc_choices:
        choices = "|".join(map(str, target.lnc_choices))
        parser.error(f"argument --grid: must be an LNC {target.name} has ({choices}), got {grid}")

    rng = np.random.default_rng(args.seed)
    a = rng.standard_normal((args.rows, args.cols), dtype=np.float32)
    b = rng.standard_normal((args.rows, args.cols), dtype=np.float32)

    out = np.asarray(tensor_add[grid](a, b))
    expected = a + b  # fp32 add, rounded once: the Vector Engine result is exact to this

    ok = out.shape == expected.shape and bool(np.array_equal(out, expected))
    err = float(np.max(np.abs(out - expected))) if out.shape == expected.shape else float("inf")
    print(
        f"tensor_add[{grid}] [{args.rows}x{args.cols}] float32 on {backend_name}: "
        f"max abs err {err:.3g} (exact match required) -> {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
