"""Tiled matmul in NKI: ``result[M, N] = lhsT[K, M].T @ rhs[K, N]``, K accumulated in PSUM.

The Tensor Engine contracts over the partition dim of both operands
(``nc_matmul(dst, stationary, moving)`` computes ``stationary.T @ moving``), so the left
operand arrives transposed, ``lhsT [K, M]``. Output tiles are 128 x 512 (stationary free
size x moving free size, one fp32 PSUM bank); K is walked in 128-row tiles whose products
add up in the same PSUM tile. Remainder tiles (M, N, K not multiples of the tile) are
allocated at their real size.

Run it anywhere (the portable interpreter is used when AWS's ``nki`` is not installed)::

    python examples/tiled_matmul.py --m 300 --k 200 --n 700 --dtype bfloat16

It checks the result against NumPy and exits non-zero on a mismatch.
"""

from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np

from neuron_kernels.backend import name as backend_name
from neuron_kernels.backend import nisa, nki, nl

# (atol, rtol) per input dtype, fixed before looking at results: inputs are exact in their
# dtype, products accumulate in fp32 PSUM, and the output is rounded once to the input dtype
# (bf16 keeps 8 significant bits, so 2**-8 relative).
TOLERANCE = {"float32": (1e-4, 1e-4), "bfloat16": (1e-2, 2**-8)}


@nki.jit
def tiled_matmul(lhsT, rhs):
    """``result[M, N] = lhsT.T @ rhs`` for ``lhsT [K, M]`` and ``rhs [K, N]`` in HBM."""
    K, M = lhsT.shape
    K_rhs, N = rhs.shape
    assert K == K_rhs, f"tiled_matmul: rhs.shape[0] must equal lhsT.shape[0] ({K}), got {K_rhs}"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm, name="result")

    tile_k = nl.tile_size.pmax  # 128: contraction per matmul = partitions
    tile_m = nl.tile_size.gemm_stationary_fmax  # 128: stationary free size
    tile_n = nl.tile_size.gemm_moving_fmax  # 512: moving free size (one fp32 PSUM bank)
    n_k = (K + tile_k - 1) // tile_k

    for m0 in range(0, M, tile_m):
        ms = min(tile_m, M - m0)
        for n0 in range(0, N, tile_n):
            ns = min(tile_n, N - n0)
            # A fresh PSUM tile per output tile: the first matmul overwrites, the rest add.
            acc = nl.ndarray((ms, ns), dtype=nl.float32, buffer=nl.psum, name="acc")
            for k in range(n_k):
                k0 = k * tile_k
                ks = min(tile_k, K - k0)
                lhsT_tile = nl.ndarray((ks, ms), dtype=lhsT.dtype, buffer=nl.sbuf, name="lhsT_tile")
                rhs_tile = nl.ndarray((ks, ns), dtype=rhs.dtype, buffer=nl.sbuf, name="rhs_tile")
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k0 : k0 + ks, m0 : m0 + ms])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k0 : k0 + ks, n0 : n0 + ns])
                nisa.nc_matmul(dst=acc, stationary=lhsT_tile, moving=rhs_tile, accumulate=(k > 0))
            # DMA cannot read PSUM: evacuate through a compute engine into SBUF first.
            out_tile = nl.ndarray((ms, ns), dtype=result.dtype, buffer=nl.sbuf, name="out_tile")
            nisa.tensor_copy(dst=out_tile, src=acc)
            nisa.dma_copy(dst=result[m0 : m0 + ms, n0 : n0 + ns], src=out_tile)
    return result


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
        "--m", type=positive_int, default=300, help="rows of the result (default 300)"
    )
    parser.add_argument(
        "--k", type=positive_int, default=200, help="contraction size (default 200)"
    )
    parser.add_argument(
        "--n", type=positive_int, default=700, help="columns of the result (default 700)"
    )
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    np_dtype = np.float32 if args.dtype == "float32" else ml_dtypes.bfloat16
    rng = np.random.default_rng(args.seed)
    lhsT = rng.standard_normal((args.k, args.m), dtype=np.float32).astype(np_dtype)
    rhs = rng.standard_normal((args.k, args.n), dtype=np.float32).astype(np_dtype)

    result = np.asarray(tiled_matmul(lhsT, rhs)).astype(np.float64)
    expected = lhsT.astype(np.float64).T @ rhs.astype(np.float64)

    atol, rtol = TOLERANCE[args.dtype]
    err = np.abs(result - expected)
    ok = result.shape == expected.shape and bool(np.all(err <= atol + rtol * np.abs(expected)))
    print(
        f"tiled_matmul [{args.m}x{args.k}] @ [{args.k}x{args.n}] {args.dtype} on {backend_name}: "
        f"max abs err {err.max():.3g} (atol {atol:g}, rtol {rtol:g}) -> {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
