"""Allocation and on-chip capacity: what a kernel holds alive, checked against the target.

AWS's simulator allocates every tensor independently and checks no capacity. Here each
SBUF/PSUM allocation is live from the first instruction that touches it to the last one
(the interval a compiler's allocator must keep it), and at the end of each program
instance the peak over the trace is compared with the target: usable SBUF bytes per
partition, and PSUM banks (a live PSUM tile holds whole 2 KiB banks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuron_kernels.hardware import usable_psum_banks
from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.storage import MemoryRegion, Storage, contiguous_strides
from neuron_kernels.interpreter.tensor import NkiTensor
from neuron_kernels.interpreter.values import is_int

__all__ = ["allocate", "MemoryPeak", "check_capacity", "normalize_buffer"]


def normalize_buffer(buffer, api: str) -> MemoryRegion:
    if isinstance(buffer, MemoryRegion):
        return buffer
    raise NkiValidationError(
        api,
        "buffer",
        "must be nl.sbuf, nl.psum, nl.hbm/nl.private_hbm or nl.shared_hbm (string names are rejected)",
        repr(buffer),
    )


def allocate(sim, shape, dtype, buffer, name: str = "", api: str = "nl.ndarray") -> NkiTensor:
    """A fresh tensor filled with the NaN / 4 sentinel."""
    if type(buffer) is not MemoryRegion:
        buffer = normalize_buffer(buffer, api)
    dtype = dtypes.normalize(dtype, api)
    info = dtypes.DTYPES[dtype]
    if is_int(shape):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise NkiValidationError(api, "shape", "must be a tuple of positive ints", shape) from None
    for n in shape:
        if type(n) is not int and not is_int(n) or n < 1:
            raise NkiValidationError(
                api, "shape", "must be a non-empty tuple of positive ints", shape
            )
    if not shape:
        raise NkiValidationError(api, "shape", "must be a non-empty tuple of positive ints", shape)
    shape = tuple(map(int, shape))
    target = sim.target
    on_chip = buffer is MemoryRegion.sbuf or buffer is MemoryRegion.psum
    if on_chip:
        if shape[0] > target.pmax:
            raise NkiValidationError(
                api,
                "partition dimension (shape[0])",
                f"must be <= {target.pmax}",
                shape[0],
                limit=target.pmax,
                hint="tile the partition axis into 128-row tiles",
            )
        per_partition = math.prod(shape[1:]) * info.itemsize
        if buffer is MemoryRegion.sbuf:
            cap, what = target.sbuf_usable_bytes, "usable SBUF"
        else:
            cap, what = _usable_psum_bytes(sim.launch), "usable PSUM"
        if per_partition > cap:
            raise NkiValidationError(
                api,
                "bytes per partition",
                f"must be <= {cap} ({target.name} {what} per partition)",
                per_partition,
                limit=cap,
            )
    launch = sim.launch
    if buffer is MemoryRegion.shared_hbm:
        index = sim.shared_cursor
        sim.shared_cursor += 1
        if index < len(launch.shared_allocations):
            storage = launch.shared_allocations[index]
            if storage.shape != shape or storage.dtype != dtype:
                raise NkiValidationError(
                    api,
                    "shared_hbm allocation",
                    f"must match across program instances ({storage.shape}, {storage.dtype})",
                    (shape, dtype),
                )
            return NkiTensor._make(
                storage, shape, contiguous_strides(shape), 0, dtype, storage.name
            )
    uid = launch.new_storage_id()
    storage = Storage(
        uid,
        shape,
        dtype,
        buffer,
        name or f"{_PREFIX[buffer]}{uid}",
        launch.precise_fp,
        compute=launch.compute,
    )
    if buffer is MemoryRegion.shared_hbm:
        launch.shared_allocations.append(storage)
    if on_chip:
        sim.on_chip.append(storage)
    return NkiTensor._make(storage, shape, storage.full_strides, 0, dtype, storage.name)


_PREFIX = {b: b.value for b in MemoryRegion}


def _usable_psum_bytes(launch) -> int:
    """PSUM bytes per partition a tile of this launch may take: the target's usable banks,
    read once per launch (one compile: the compiler reads NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE
    at each compile) instead of once per PSUM allocation."""
    cap = launch.usable_psum_bytes
    if cap is None:
        target = launch.target
        cap = launch.usable_psum_bytes = usable_psum_banks(target) * target.psum_bank_bytes
    return cap


@dataclass(frozen=True)
class MemoryPeak:
    """Peak on-chip use of one program instance (per partition)."""

    sbuf_bytes: int
    sbuf_at: int  # instruction index of the peak, -1 if nothing was live
    psum_bytes: int
    psum_banks: int
    psum_at: int


def _peak(storages, weight):
    events = []
    for s in storages:
        if s.first_use >= 0:
            events.append((s.first_use, 1, s))
            events.append((s.last_use + 1, 0, s))
    events.sort(key=lambda e: (e[0], e[1]))  # frees before allocations at the same index
    live, peak, at, live_set, peak_set = 0, 0, -1, set(), set()
    for index, kind, s in events:
        if kind:
            live += weight(s)
            live_set.add(s)
            if live > peak:
                peak, at, peak_set = live, index, set(live_set)
        else:
            live -= weight(s)
            live_set.discard(s)
    return peak, at, peak_set


def check_capacity(sim) -> MemoryPeak:
    """Raise NkiValidationError if live SBUF bytes or PSUM banks ever exceed the target.

    A tile is live from the first instruction that touches it to the last one. SBUF is
    counted in bytes per partition (every tile spans its free bytes in each partition, as the
    allocator places a tile at one free offset across its partitions); PSUM in whole 2 KiB
    banks per tile, since a matmul accumulation group owns its bank
    (nki/guides/architecture/trainium_inferentia2_arch.rst, "Near-memory accumulation").
    """
    target = sim.target
    sbuf = [s for s in sim.on_chip if s.buffer is MemoryRegion.sbuf]
    psum = [s for s in sim.on_chip if s.buffer is MemoryRegion.psum]
    bank = target.psum_bank_bytes
    sbuf_peak, sbuf_at, sbuf_set = _peak(sbuf, lambda s: s.bytes_per_partition)
    psum_banks, psum_at, psum_set = _peak(psum, lambda s: -(-s.bytes_per_partition // bank))
    psum_bytes, _, _ = _peak(psum, lambda s: s.bytes_per_partition)
    trace = sim.launch.trace.instructions

    def where(at, live, unit):
        api = trace[at].api if 0 <= at < len(trace) else "?"
        top = sorted(live, key=lambda s: (-s.bytes_per_partition, s.uid))[:4]
        tiles = ", ".join(f"{s.name} {s.shape} {s.dtype} ({unit(s)})" for s in top)
        more = f" and {len(live) - len(top)} more" if len(live) > len(top) else ""
        return (
            f"peak at instruction #{at} ({api}) with {len(live)} live tiles; largest: {tiles}{more}"
        )

    if sbuf_peak > target.sbuf_usable_bytes:
        raise NkiValidationError(
            "nki.simulate",
            "live SBUF bytes per partition",
            f"must be <= {target.sbuf_usable_bytes} ({target.name} usable SBUF per partition)",
            sbuf_peak,
            limit=target.sbuf_usable_bytes,
            hint=where(sbuf_at, sbuf_set, lambda s: f"{s.bytes_per_partition} B"),
        )
    n_banks = usable_psum_banks(target)
    if psum_banks > n_banks:
        live_bytes = sum(s.bytes_per_partition for s in psum_set)
        raise NkiValidationError(
            "nki.simulate",
            "live PSUM banks",
            f"must be <= {n_banks} ({bank} B banks per partition on {target.name})",
            psum_banks,
            limit=n_banks,
            hint=f"{psum_banks} banks hold {live_bytes} live bytes per partition; "
            + where(
                psum_at,
                psum_set,
                lambda s: f"{s.bytes_per_partition} B, {-(-s.bytes_per_partition // bank)} bank(s)",
            ),
        )
    return MemoryPeak(sbuf_peak, sbuf_at, psum_bytes, psum_banks, psum_at)
