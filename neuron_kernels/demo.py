"""``neuron-kernels demo``: run two small NKI kernels on the interpreter and check them.

The embedded default: a tiled matmul (K accumulated in PSUM) and an SPMD tiled add, on
fixed-seed inputs, each compared with NumPy in float64. Prints one line per kernel (max
error, tolerance, PASS/FAIL, instruction count, target) and returns non-zero on a failure.
The kernels are copies of ``examples/tiled_matmul.py`` and ``examples/spmd_tensor_add.py``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from neuron_kernels import backend
from neuron_kernels.backend import nisa, nki, nl

__all__ = ["SIZES", "add_arguments", "main", "run_checks"]

# --size presets: matmul (M, K, N) and add (rows, cols). Every dimension leaves a remainder tile.
SIZES = {
    "small": {"matmul": (300, 200, 700), "add": (300, 700)},
    "medium": {"matmul": (700, 600, 1100), "add": (1000, 1100)},
}
# float32 tolerances, fixed before looking at results: matmul inputs are exact, products
# accumulate in fp32 PSUM; the add is one fp32 rounding, as NumPy's, so it must match exactly.
MATMUL_TOL = (1e-4, 1e-4)  # (atol, rtol)
ADD_TOL = (0.0, 0.0)
SPMD_GRID = 2  # as LNC=2 on Trn2


@nki.jit
def tiled_matmul(lhsT, rhs):
    """``lhsT[K, M].T @ rhs[K, N]``: 128 x 512 output tiles, K summed in one PSUM tile."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm, name="result")
    tile_k = nl.tile_size.pmax  # contraction per matmul: the partitions
    tile_m = nl.tile_size.gemm_stationary_fmax  # 128
    tile_n = nl.tile_size.gemm_moving_fmax  # 512: one fp32 PSUM bank
    n_k = (K + tile_k - 1) // tile_k
    for m0 in range(0, M, tile_m):
        ms = min(tile_m, M - m0)
        for n0 in range(0, N, tile_n):
            ns = min(tile_n, N - n0)
            acc = nl.ndarray((ms, ns), dtype=nl.float32, buffer=nl.psum, name="acc")
            for k in range(n_k):
                k0 = k * tile_k
                ks = min(tile_k, K - k0)
                lhsT_tile = nl.ndarray((ks, ms), dtype=lhsT.dtype, buffer=nl.sbuf, name="lhsT_tile")
                rhs_tile = nl.ndarray((ks, ns), dtype=rhs.dtype, buffer=nl.sbuf, name="rhs_tile")
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k0 : k0 + ks, m0 : m0 + ms])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k0 : k0 + ks, n0 : n0 + ns])
                nisa.nc_matmul(dst=acc, stationary=lhsT_tile, moving=rhs_tile, accumulate=(k > 0))
            out_tile = nl.ndarray((ms, ns), dtype=result.dtype, buffer=nl.sbuf, name="out_tile")
            nisa.tensor_copy(dst=out_tile, src=acc)  # DMA cannot read PSUM
            nisa.dma_copy(dst=result[m0 : m0 + ms, n0 : n0 + ns], src=out_tile)
    return result


@nki.jit
def tensor_add(a, b):
    """``a + b`` for ``[rows, cols]`` tensors; program ``i`` of the grid takes row tiles i, i+grid, ..."""
    rows, cols = a.shape
    out = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.shared_hbm, name="out")
    tile_p, tile_f = nl.tile_size.pmax, 512
    for t in range(nl.program_id(0), (rows + tile_p - 1) // tile_p, nl.num_programs(0)):
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


@dataclass(frozen=True)
class Check:
    """The outcome of one kernel run against its NumPy reference."""

    kernel: str
    shape: str
    max_abs_err: float
    atol: float
    rtol: float
    passed: bool
    instructions: int
    target: str


def _check(kernel, args, expected, tol, label, shape, target) -> Check:
    from neuron_kernels.simulator import run

    r = run(kernel, args, target=target)
    out = np.asarray(r.outputs, dtype=np.float64)
    atol, rtol = tol
    if out.shape != expected.shape:
        err, ok = float("inf"), False
    else:
        diff = np.abs(out - expected)  # NaN (unwritten memory) fails the <= test below
        err = float(np.max(diff))
        ok = bool(np.all(diff <= atol + rtol * np.abs(expected)))
    return Check(label, shape, err, atol, rtol, ok, len(r.trace), r.target.name)


def run_checks(target: str = "trn2", size: str = "small", seed: int = 0) -> list[Check]:
    """Run both demo kernels on the interpreter for ``target``; returns one :class:`Check` each."""
    rng = np.random.default_rng(seed)
    m, k, n = SIZES[size]["matmul"]
    lhsT = rng.standard_normal((k, m), dtype=np.float32)
    rhs = rng.standard_normal((k, n), dtype=np.float32)
    expected = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    mm = _check(
        tiled_matmul,
        (lhsT, rhs),
        expected,
        MATMUL_TOL,
        "tiled_matmul",
        f"M={m} K={k} N={n} fp32",
        target,
    )

    rows, cols = SIZES[size]["add"]
    a = rng.standard_normal((rows, cols), dtype=np.float32)
    b = rng.standard_normal((rows, cols), dtype=np.float32)
    add = _check(
        tensor_add[SPMD_GRID],
        (a, b),
        (a + b).astype(np.float64),
        ADD_TOL,
        f"tensor_add[{SPMD_GRID}]",
        f"{rows}x{cols} fp32",
        target,
    )
    return [mm, add]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        choices=("trn1", "trn2", "trn3"),
        default=None,
        help="NeuronCore generation to model (default: NEURON_PLATFORM_TARGET_OVERRIDE, else trn2)",
    )
    parser.add_argument(
        "--size", choices=sorted(SIZES), default="small", help="input size preset (default small)"
    )
    parser.add_argument("--seed", type=int, default=0, help="NumPy seed of the inputs (default 0)")


def main(args: argparse.Namespace) -> int:
    if backend.name != "interpreter":
        print(
            f"neuron-kernels demo runs on the interpreter, but the NKI backend is "
            f"{backend.name!r}; rerun with {backend.BACKEND_ENV}=interpreter"
        )
        return 2
    from neuron_kernels.simulator import default_target

    target = args.target or default_target().name
    print(
        f"neuron-kernels demo: NKI kernels on the portable interpreter (target {target}, "
        f"size {args.size}, seed {args.seed}), checked against NumPy float64"
    )
    checks = run_checks(target=target, size=args.size, seed=args.seed)
    print(
        f"  {'kernel':<14} {'shape':<24} {'max abs err':>11}  {'tolerance':<23} {'instructions':>12}  result"
    )
    for c in checks:
        tol = "exact" if c.atol == c.rtol == 0 else f"atol {c.atol:g} rtol {c.rtol:g}"
        print(
            f"  {c.kernel:<14} {c.shape:<24} {c.max_abs_err:>11.3g}  {tol:<23} {c.instructions:>12}  "
            f"{'PASS' if c.passed else 'FAIL'}"
        )
    failed = [c.kernel for c in checks if not c.passed]
    print(
        "FAIL: " + ", ".join(failed)
        if failed
        else f"PASS: {len(checks)} of {len(checks)} kernels match NumPy"
    )
    return 1 if failed else 0
