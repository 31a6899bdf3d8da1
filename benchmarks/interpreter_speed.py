"""Interpreter speed: a 1024^3 fp32 tiled matmul NKI kernel against ``numpy.matmul``.

Not a test: run it by hand after touching the interpreter's hot paths and compare the
numbers with the ones in the last report::

    python benchmarks/interpreter_speed.py [--size 1024] [--repeat 3] [--profile]

The kernel keeps K in PSUM (128x128 stationary, 128x512 moving tiles), evacuates each
output tile with ``tensor_copy`` and stores it with ``dma_copy``, so it exercises every
per-instruction path (checks, trace records, views, dtype conversion, PSUM state).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from neuron_kernels.simulator import nki, run

nl, nisa = nki.language, nki.isa

TILE_K, TILE_M, TILE_N = 128, 128, 512


def matmul_kernel(a_t, b):
    """``C[M, N] = a_t.T @ b`` for ``a_t [K, M]``, ``b [K, N]`` fp32 in HBM."""
    K, M = a_t.shape
    _, N = b.shape
    c = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm, name="c")
    for m in range(M // TILE_M):
        for n in range(N // TILE_N):
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum, name="acc")
            for k in range(K // TILE_K):
                st = nl.ndarray((TILE_K, TILE_M), dtype=a_t.dtype, buffer=nl.sbuf, name="st")
                mv = nl.ndarray((TILE_K, TILE_N), dtype=b.dtype, buffer=nl.sbuf, name="mv")
                ks = nl.ds(k * TILE_K, TILE_K)
                nisa.dma_copy(dst=st, src=a_t[ks, nl.ds(m * TILE_M, TILE_M)])
                nisa.dma_copy(dst=mv, src=b[ks, nl.ds(n * TILE_N, TILE_N)])
                nisa.nc_matmul(dst=acc, stationary=st, moving=mv, accumulate=k > 0)
            out = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf, name="out")
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=c[nl.ds(m * TILE_M, TILE_M), nl.ds(n * TILE_N, TILE_N)], src=out)
    return c


def _best(fn, repeat):
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="M = N = K (multiple of 512)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--profile", action="store_true", help="print the top cProfile entries")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    s = args.size
    a = rng.standard_normal((s, s), dtype=np.float32)
    b = rng.standard_normal((s, s), dtype=np.float32)
    a_t = np.ascontiguousarray(a.T)

    run(matmul_kernel, (a_t, b), target=args.target)  # warm-up (imports, BLAS threads)
    t_np, expected = _best(lambda: np.matmul(a, b), args.repeat)
    t_sim, res = _best(lambda: run(matmul_kernel, (a_t, b), target=args.target), args.repeat)
    t_trace, res_trace = _best(
        lambda: run(matmul_kernel, (a_t, b), target=args.target, compute=False), args.repeat
    )
    n_ins = len(res.trace)
    err = float(np.max(np.abs(res.outputs - expected)))

    print(f"size {s}^3 fp32, target {args.target}, best of {args.repeat}")
    print(f"numpy.matmul          {t_np * 1e3:9.2f} ms")
    print(f"interpreter           {t_sim * 1e3:9.2f} ms  ({t_sim / t_np:.1f}x numpy)")
    print(f"interpreter no-compute{t_trace * 1e3:9.2f} ms  ({len(res_trace.trace)} instructions)")
    print(f"instructions          {n_ins}  ({n_ins / t_sim:,.0f}/s with compute, "
          f"{n_ins / t_trace:,.0f}/s without)")
    print(f"max |interpreter - numpy| = {err:.3g}")

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(matmul_kernel, (a_t, b), target=args.target)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
