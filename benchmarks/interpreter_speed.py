"""Interpreter speed: a 1024^3 fp32 tiled matmul NKI kernel against ``numpy.matmul``.

Not a test: run it by hand after touching the interpreter's hot paths and compare the
numbers with the ones in the last report::

    python benchmarks/interpreter_speed.py [--size 1024] [--repeat 3] [--profile]

The kernel is the tutorial's tiled matmul from the calibration set (K in PSUM, 128x128
stationary and 128x512 moving tiles, each output tile evacuated with ``tensor_copy`` and
stored with ``dma_copy``), so it exercises every per-instruction path (checks, trace
records, views, dtype conversion, PSUM state).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from neuron_kernels.interpreter import run
from neuron_kernels.kernels.calibration.tutorial_matmul import matmul_tiled as matmul_kernel


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
    print(
        f"instructions          {n_ins}  ({n_ins / t_sim:,.0f}/s with compute, "
        f"{n_ins / t_trace:,.0f}/s without)"
    )
    print(f"max |interpreter - numpy| = {err:.3g}")

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(matmul_kernel, (a_t, b), target=args.target)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
