"""AWS's matmul tutorial variants, rewritten in NKI 0.6, as cost-model calibration fixtures.

``C[M, N] = lhsT[K, M].T @ rhs[K, N]`` four ways, following the structure (tile sizes, loop
order, what is hoisted, what is blocked) of
  [mm]   aws-neuron/aws-neuron-sdk nki/tutorials/matrix_multiplication.rst @1db4d74e and its
         nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py (Trn1, BF16)
  [kopt] aws-neuron/aws-neuron-sdk nki/guides/tutorials/kernel-optimization.rst (Trn2, FP32)
The code is ours; only the structure is the tutorials'. These are deliberately slow variants:
do not copy them, copy ``neuron_kernels.kernels.matmul``.

Assumptions where the interpreter or NKI 0.6 forced a change (each also in table.md):
* [mm] zero-fills each PSUM accumulator (``nl.zeros(..., buffer=nl.psum)``) and adds with
  ``+=``; NKI 0.6 accumulates with ``accumulate=(k > 0)``, so the 512 PSUM memsets are not
  issued (about 0.2 ms of VectorE on Trn1, hidden behind DMA).
* [mm] allocates the hoisted tiles as one 3-D tensor per loop; here they are separate tiles
  (same bytes, same DMAs).
* [kopt] v4 keeps 2 x 64 rhs tiles of FP32 [128, 512] = 256 KiB per partition, more than the
  224 KiB SBUF: the compiler cannot keep them. The profile's MBU (42.55% of 725 GB/s over
  28.41 ms = 8.8 GB, against 4.6 GB of explicit loads) says it moved what v3 moves, that is,
  rhs reloaded per M tile; ``reload_rhs=True`` makes that reload explicit.
* [kopt] v5 holds 128 + 64 + 32 = 224 KiB per partition of FP32 tiles: all of Trn2's physical
  SBUF, more than the 208 KiB the interpreter allows kernels. Its row is run with the usable
  SBUF raised to the physical size (see ``ROWS``); the hardware run shows ~0.3 GB of extra
  (spill) traffic we do not model.
"""

from __future__ import annotations

from neuron_kernels.backend import nisa, nki, nl

__all__ = ["matmul_tiled", "matmul_hoisted", "matmul_block_free", "matmul_block_all"]

TILE_K = 128  # partition dim: contraction per nc_matmul
TILE_M = 128  # stationary free size
TILE_N = 512  # moving free size: one fp32 PSUM bank


@nki.jit
def matmul_tiled(lhsT, rhs):
    """[mm] "Original tiled" / [kopt] v2: both tiles loaded inside the K loop."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm, name="result")
    for m in range(M // TILE_M):
        for n in range(N // TILE_N):
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum, name="acc")
            for k in range(K // TILE_K):
                lhsT_tile = nl.ndarray(
                    (TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf, name="lhsT_tile"
                )
                rhs_tile = nl.ndarray(
                    (TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf, name="rhs_tile"
                )
                nisa.dma_copy(
                    dst=lhsT_tile,
                    src=lhsT[k * TILE_K : (k + 1) * TILE_K, m * TILE_M : (m + 1) * TILE_M],
                )
                nisa.dma_copy(
                    dst=rhs_tile,
                    src=rhs[k * TILE_K : (k + 1) * TILE_K, n * TILE_N : (n + 1) * TILE_N],
                )
                nisa.nc_matmul(dst=acc, stationary=lhsT_tile, moving=rhs_tile, accumulate=k > 0)
            out = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf, name="out_tile")
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(
                dst=result[m * TILE_M : (m + 1) * TILE_M, n * TILE_N : (n + 1) * TILE_N], src=out
            )
    return result


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """[mm] "Optimization 1" / [kopt] v3: lhsT column loaded per m, rhs column per (m, n)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm, name="result")
    n_k = K // TILE_K
    for m in range(M // TILE_M):
        lhsT_tiles = []
        for k in range(n_k):
            t = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf, name="lhsT_tile")
            nisa.dma_copy(
                dst=t, src=lhsT[k * TILE_K : (k + 1) * TILE_K, m * TILE_M : (m + 1) * TILE_M]
            )
            lhsT_tiles.append(t)
        for n in range(N // TILE_N):
            rhs_tiles = []
            for k in range(n_k):
                t = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf, name="rhs_tile")
                nisa.dma_copy(
                    dst=t, src=rhs[k * TILE_K : (k + 1) * TILE_K, n * TILE_N : (n + 1) * TILE_N]
                )
                rhs_tiles.append(t)
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum, name="acc")
            for k in range(n_k):
                nisa.nc_matmul(
                    dst=acc, stationary=lhsT_tiles[k], moving=rhs_tiles[k], accumulate=k > 0
                )
            out = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf, name="out_tile")
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(
                dst=result[m * TILE_M : (m + 1) * TILE_M, n * TILE_N : (n + 1) * TILE_N], src=out
            )
    return result


def _load_rhs_column(rhs, n_k, col):
    tiles = []
    for k in range(n_k):
        t = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf, name="rhs_tile")
        nisa.dma_copy(
            dst=t, src=rhs[k * TILE_K : (k + 1) * TILE_K, col * TILE_N : (col + 1) * TILE_N]
        )
        tiles.append(t)
    return tiles


@nki.jit
def matmul_block_free(lhsT, rhs, tiles_m=2, tiles_n=2, reload_rhs=False):
    """[mm] "Optimization 2" / [kopt] v4: blocks of tiles_m x tiles_n output tiles (256 x 1024).

    ``reload_rhs`` reloads the rhs block per M tile (what the compiler did for FP32 on Trn2,
    where the block does not fit SBUF; see the module docstring).
    """
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm, name="result")
    n_k = K // TILE_K
    for m in range(M // (TILE_M * tiles_m)):
        lhsT_tiles = []
        for bm in range(tiles_m):
            col = []
            for k in range(n_k):
                t = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf, name="lhsT_tile")
                m0 = (m * tiles_m + bm) * TILE_M
                nisa.dma_copy(dst=t, src=lhsT[k * TILE_K : (k + 1) * TILE_K, m0 : m0 + TILE_M])
                col.append(t)
            lhsT_tiles.append(col)
        for n in range(N // (TILE_N * tiles_n)):
            rhs_tiles = None
            if not reload_rhs:
                rhs_tiles = []  # a loop, not a comprehension: the NKI language has none
                for bn in range(tiles_n):
                    rhs_tiles.append(_load_rhs_column(rhs, n_k, n * tiles_n + bn))
            for bm in range(tiles_m):
                for bn in range(tiles_n):
                    rhs_col = (
                        _load_rhs_column(rhs, n_k, n * tiles_n + bn)
                        if reload_rhs
                        else rhs_tiles[bn]
                    )
                    acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum, name="acc")
                    for k in range(n_k):
                        nisa.nc_matmul(
                            dst=acc,
                            stationary=lhsT_tiles[bm][k],
                            moving=rhs_col[k],
                            accumulate=k > 0,
                        )
                    out = nl.ndarray(
                        (TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf, name="out_tile"
                    )
                    nisa.tensor_copy(dst=out, src=acc)
                    m0 = (m * tiles_m + bm) * TILE_M
                    n0 = (n * tiles_n + bn) * TILE_N
                    nisa.dma_copy(dst=result[m0 : m0 + TILE_M, n0 : n0 + TILE_N], src=out)
    return result


@nki.jit
def matmul_block_all(lhsT, rhs, tiles_m=16, tiles_n=2, tiles_k=8):
    """[mm] "Optimization 3" / [kopt] v5: blocks of 2048 x 1024 x 1024, partial sums in SBUF.

    Per N block: zeroed SBUF accumulators for every output tile of the column; per K block the
    rhs block is loaded in [128, BLOCK_N] rows, per M block the lhsT block in [128, BLOCK_M]
    rows; each PSUM result is added into its accumulator on VectorE; finally each output row
    block is packed into [128, BLOCK_N] and stored with one DMA.
    """
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm, name="result")
    block_m, block_n, block_k = TILE_M * tiles_m, TILE_N * tiles_n, TILE_K * tiles_k
    n_bm, n_bn, n_bk = M // block_m, N // block_n, K // block_k
    for n in range(n_bn):
        acc_tiles = []
        for m in range(n_bm):
            rows = []
            for bm in range(tiles_m):
                cols = []
                for bn in range(tiles_n):
                    t = nl.ndarray(
                        (TILE_M, TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf, name="acc_sbuf"
                    )
                    nisa.memset(dst=t, value=0.0)
                    cols.append(t)
                rows.append(cols)
            acc_tiles.append(rows)
        for k in range(n_bk):
            rhs_rows = []
            for bk in range(tiles_k):
                t = nl.ndarray((TILE_K, block_n), dtype=rhs.dtype, buffer=nl.sbuf, name="rhs_rows")
                k0 = (k * tiles_k + bk) * TILE_K
                nisa.dma_copy(dst=t, src=rhs[k0 : k0 + TILE_K, n * block_n : (n + 1) * block_n])
                rhs_rows.append(t)
            for m in range(n_bm):
                lhsT_rows = []
                for bk in range(tiles_k):
                    t = nl.ndarray(
                        (TILE_K, block_m), dtype=lhsT.dtype, buffer=nl.sbuf, name="lhsT_rows"
                    )
                    k0 = (k * tiles_k + bk) * TILE_K
                    nisa.dma_copy(
                        dst=t, src=lhsT[k0 : k0 + TILE_K, m * block_m : (m + 1) * block_m]
                    )
                    lhsT_rows.append(t)
                for bn in range(tiles_n):
                    for bm in range(tiles_m):
                        part = nl.ndarray(
                            (TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum, name="part"
                        )
                        for bk in range(tiles_k):
                            nisa.nc_matmul(
                                dst=part,
                                stationary=lhsT_rows[bk][0:TILE_K, bm * TILE_M : (bm + 1) * TILE_M],
                                moving=rhs_rows[bk][0:TILE_K, bn * TILE_N : (bn + 1) * TILE_N],
                                accumulate=bk > 0,
                            )
                        acc = acc_tiles[m][bm][bn]
                        nisa.tensor_tensor(dst=acc, data1=acc, data2=part, op=nl.add)
        for m in range(n_bm):
            for bm in range(tiles_m):
                packed = nl.ndarray(
                    (TILE_M, block_n), dtype=lhsT.dtype, buffer=nl.sbuf, name="packed"
                )
                for bn in range(tiles_n):
                    nisa.tensor_copy(
                        dst=packed[0:TILE_M, bn * TILE_N : (bn + 1) * TILE_N],
                        src=acc_tiles[m][bm][bn],
                    )
                m0 = (m * tiles_m + bm) * TILE_M
                nisa.dma_copy(
                    dst=result[m0 : m0 + TILE_M, n * block_n : (n + 1) * block_n], src=packed
                )
    return result
