"""Allocation limits and on-chip capacity over live intervals (interpreter/memory.py).

A tile is live from the first instruction touching it to the last; the peak of live SBUF
bytes per partition must stay within the target's usable SBUF (tile_size.sbuf_fmax_bytes:
trn1 180224, trn2 212984, trn3 245752) and live PSUM tiles within the 8 banks of 2 KiB
(7 with NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true on trn2+). Sources (aws-neuron/aws-neuron-sdk):
nki/api/nki/language/__init__.py (``_TileSize``), nki/api/nki.language.tile_size.rst,
nki/guides/architecture/trainium2_arch.rst.
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa

OUT = np.zeros((1, 1), np.float32)


def finish(x):
    out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
    if nl.program_id(0) == 0:  # one writer: at LNC=2 both cores writing out would race
        nisa.dma_copy(dst=out, src=x)
    return out


def live_tiles(n, cols, *, buffer=nl.sbuf, dtype=nl.float32, together=True):
    """n tiles of (128, cols); all live at once (together) or one after the other."""

    def kernel(x):
        tiles = []
        for i in range(n):
            t = nl.ndarray((128, cols), dtype, buffer=buffer, name=f"tile{i}")
            nisa.memset(dst=t, value=1.0)
            if not together:
                nisa.tensor_copy(dst=t, src=t)  # last use now
            tiles.append(t)
        if together:
            for t in tiles:  # every tile is used again after all were written
                nisa.tensor_copy(dst=t, src=t)
        return finish(x)

    return kernel


def test_sbuf_overflow_names_live_bytes_limit_and_where():
    with pytest.raises(NkiValidationError) as info:
        run(live_tiles(3, 20000), (OUT,), target="trn2")
    err = info.value
    assert (err.op, err.arg, err.value, err.limit) == (
        "nki.simulate",
        "live SBUF bytes per partition",
        240000,
        212984,
    )
    msg = str(err)
    assert "must be <= 212984" in msg and "got 240000" in msg
    assert "peak at instruction #2 (nisa.memset) with 3 live tiles" in msg  # the third memset
    assert "tile0 (128, 20000) float32 (80000 B)" in msg


def test_sequential_tiles_do_not_overflow():
    r = run(live_tiles(3, 20000, together=False), (OUT,), target="trn2")
    assert r.memory[0].sbuf_bytes == 80000


def test_tiles_reallocated_in_a_loop_reuse_the_space():
    def kernel(x):
        acc = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for _ in range(50):
            big = nl.ndarray((128, 40000), nl.float32, buffer=nl.sbuf)  # 160000 B each
            nisa.memset(dst=big, value=1.0)
            nisa.tensor_copy(dst=acc, src=big[:, 0:1])
            ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            nisa.memset(dst=ps, value=0.0)
            nisa.tensor_copy(dst=acc, src=ps[:, 0:1])
        return finish(acc[0:1, :])

    r = run(kernel, (OUT,), target="trn2")
    assert r.memory[0].sbuf_bytes == 160004
    assert r.memory[0].psum_banks == 1


@pytest.mark.parametrize("target, ok", [("trn1", False), ("trn2", True), ("trn3", True)])
def test_capacity_follows_the_target(target, ok):
    kernel = live_tiles(2, 24000)  # 192000 B per partition
    if ok:
        assert run(kernel, (OUT,), target=target).memory[0].sbuf_bytes == 192000
    else:
        with pytest.raises(NkiValidationError) as info:
            run(kernel, (OUT,), target=target)
        assert info.value.limit == 180224


def test_psum_bank_overflow():
    run(live_tiles(8, 512, buffer=nl.psum), (OUT,))
    with pytest.raises(NkiValidationError) as info:
        run(live_tiles(9, 512, buffer=nl.psum), (OUT,))
    err = info.value
    assert (err.op, err.arg, err.value, err.limit) == ("nki.simulate", "live PSUM banks", 9, 8)
    assert "9 banks hold 18432 live bytes per partition" in str(err)
    assert "must be <= 8" in str(err)


def test_a_psum_tile_holds_whole_banks():
    run(live_tiles(8, 100, buffer=nl.psum), (OUT,))  # 400 B each, one bank each
    with pytest.raises(NkiValidationError) as info:
        run(live_tiles(9, 100, buffer=nl.psum), (OUT,))
    assert info.value.value == 9
    with pytest.raises(NkiValidationError) as info:
        run(live_tiles(5, 513, buffer=nl.psum), (OUT,))  # 2052 B: two banks each
    assert info.value.value == 10


def test_pe_transpose_dma_reserves_a_bank(monkeypatch):
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
    with pytest.raises(NkiValidationError) as info:
        run(live_tiles(8, 512, buffer=nl.psum), (OUT,), target="trn2")
    assert info.value.limit == 7

    def banks(x):
        out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=float(nl.tile_size.psum_num_banks))
        nisa.dma_copy(dst=out, src=t)
        return out

    assert run(banks, (OUT,), target="trn2").outputs[0, 0] == 7
    assert run(banks, (OUT,), target="trn1").outputs[0, 0] == 8  # trn2+ only
    run(live_tiles(8, 512, buffer=nl.psum), (OUT,), target="trn1")


def test_untouched_tiles_take_no_space():
    def kernel(x):
        for _ in range(10):
            nl.ndarray((128, 50000), nl.float32, buffer=nl.sbuf)  # never used
        return finish(x)

    assert run(kernel, (OUT,)).memory[0].sbuf_bytes == 0


def test_each_program_instance_has_its_own_on_chip_memory():
    kernel = live_tiles(2, 25000)  # 200000 B: fits trn2 once, not twice
    r = run(nki.jit(kernel)[2], (OUT,), target="trn2")
    assert [p.sbuf_bytes for p in r.memory] == [200000, 200000]


@pytest.mark.parametrize(
    "shape, dtype, buffer, arg, limit",
    [
        ((129, 4), nl.float32, nl.sbuf, "partition dimension (shape[0])", 128),
        ((129, 4), nl.float32, nl.psum, "partition dimension (shape[0])", 128),
        ((128, 53247), nl.float32, nl.sbuf, "bytes per partition", 212984),
        ((128, 4097), nl.float32, nl.psum, "bytes per partition", 16384),
        ((128, 8193), nl.bfloat16, nl.psum, "bytes per partition", 16384),
        ((128, 0), nl.float32, nl.sbuf, "shape", None),
        ((), nl.float32, nl.sbuf, "shape", None),
        ((4, 2.0), nl.float32, nl.sbuf, "shape", None),
        ((4, 4), nl.float32, "sbuf", "buffer", None),
        ((4, 4), "float64", nl.sbuf, "dtype", None),
    ],
)
def test_allocation_limits(shape, dtype, buffer, arg, limit):
    def kernel(x):
        nl.ndarray(shape, dtype, buffer=buffer)

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (OUT,), target="trn2")
    err = info.value
    assert (err.op, err.arg, err.limit) == ("nl.ndarray", arg, limit)
    if limit is not None:
        assert f"must be <= {limit}" in str(err)


def test_largest_tiles_that_fit():
    def kernel(x):
        a = nl.ndarray((128, 53246), nl.float32, buffer=nl.sbuf)  # 212984 B: all usable SBUF
        p = nl.ndarray((128, 4096), nl.float32, buffer=nl.psum)  # 16 KiB: all 8 banks
        nisa.memset(dst=a[:, 0:4], value=0.0)
        nisa.memset(dst=p[:, 0:4], value=0.0)
        return finish(x)

    peak = run(kernel, (OUT,), target="trn2").memory[0]
    assert (peak.sbuf_bytes, peak.psum_bytes, peak.psum_banks) == (212984, 16384, 8)


def test_capacity_checks_hold_without_compute():
    with pytest.raises(NkiValidationError) as info:
        run(live_tiles(3, 20000), (OUT,), target="trn2", compute=False)
    assert info.value.value == 240000
    full = run(live_tiles(3, 20000, together=False), (OUT,))
    traced = run(live_tiles(3, 20000, together=False), (OUT,), compute=False)
    assert traced.memory == full.memory


def test_calls_outside_a_kernel_are_rejected():
    with pytest.raises(NkiValidationError) as info:
        nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    assert (info.value.op, info.value.arg) == ("nki", "call")


def test_explicit_addresses_are_validated_then_ignored():
    def kernel(x):
        t = nl.ndarray((64, 512), nl.float32, buffer=nl.psum, address=(0, 2 * 2048))  # bank 2
        s = nl.ndarray((64, 16), nl.float32, buffer=nl.sbuf, address=(64, 1024))
        nisa.memset(dst=t, value=1.0)
        nisa.memset(dst=s, value=2.0)
        nisa.tensor_copy(dst=s[:, 0:1], src=t[:, 0:1])
        return finish(s[0:1, 0:1])

    assert run(kernel, (OUT,)).outputs[0, 0] == 1.0


@pytest.mark.parametrize(
    "shape, buffer, address, arg, limit",
    [
        ((64, 512), nl.psum, (0, 1024), "address free_offset", 2048),  # not a bank start
        ((64, 512), nl.psum, (0, 8 * 2048), "address free_offset", 14336),  # past the 8 banks
        ((64, 16), nl.sbuf, (65, 0), "address partition_offset", 64),
        ((64, 16), nl.sbuf, (0, 212984 - 63), "address free_offset", 212920),
        ((64, 16), nl.sbuf, (0,), "address", None),
        ((64, 16), nl.sbuf, (0, -4), "address", None),
        ((64, 16), nl.shared_hbm, (0, 0), "address", None),
    ],
)
def test_address_limits(shape, buffer, address, arg, limit):
    def kernel(x):
        nl.ndarray(shape, nl.float32, buffer=buffer, address=address)

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (OUT,), target="trn2")
    assert (info.value.op, info.value.arg, info.value.limit) == ("nl.ndarray", arg, limit)


def test_shared_hbm_allocations_must_match_across_programs():
    def kernel(x):
        n = 2 + nl.program_id(0)  # a different shape in each program
        nl.ndarray((n, 4), nl.float32, buffer=nl.shared_hbm)

    with pytest.raises(NkiValidationError) as info:
        run(nki.jit(kernel)[2], (OUT,))
    assert (info.value.op, info.value.arg) == ("nl.ndarray", "shared_hbm allocation")
    assert "must match across program instances" in str(info.value)
