"""Instructions between the two cores of a logical core: ``nisa.core_barrier`` and
``nisa.sendrecv``.

Source: aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (core_barrier, sendrecv):
both are "Available only on NeuronCore-v3 or newer" and "only allowed ... when LNC (Logical
NeuronCore) is enabled", between the two cores that share one HBM stack.

* ``core_barrier(data, cores, engine)``: every core of ``cores`` (only ``(0, 1)`` is
  supported) must reach it before any proceeds; ``data`` is the shared-HBM tensor the cores
  synchronise on; the barrier blocks only ``engine``. Here both cores park until the other
  arrives, and the race check (``interpreter/races.py``) orders the accesses of ``data`` by it.
* ``sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id)``: the core sends its SBUF
  ``src`` to ``dst`` of core ``send_to_rank`` while receiving ``recv_from_rank``'s ``src`` into
  its own ``dst``; same dtype, shape and layout; ranks 0 or 1; calls with one ``pipe_id``
  complete together. Here the exchange happens when both cores reached the call; the
  interpreter needs the calls of every pipe in the same order on both cores.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter.cores import SyncPoint, check_same_points
from neuron_kernels.interpreter.enums import dma_engine as DmaEngine
from neuron_kernels.interpreter.enums import engine as Engine
from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.instructions._common import SBUF, OperandChecks
from neuron_kernels.interpreter.storage import MemoryRegion

__all__ = ["core_barrier", "sendrecv", "synchronise"]

_BARRIER_ENGINES = {
    Engine.tensor: "tensor",
    Engine.vector: "vector",
    Engine.scalar: "scalar",
    Engine.gpsimd: "gpsimd",
    Engine.sync: "sync",
}


def _lnc_checks(check: OperandChecks) -> int:
    """NeuronCore-v3+ and a launch at LNC > 1; returns the number of cores."""
    check.needs_nc_version(3)
    n = int(np.prod(check.sim.launch.grid)) if check.sim.launch.grid else 1
    if n < 2:
        check.fail(
            "launch",
            "must be at LNC=2 (kernel[2]): the instruction is only allowed when LNC is enabled",
            f"LNC={n}",
        )
    return n


def _rank(check: OperandChecks, arg: str, value, n: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < n:
        check.fail(arg, f"must be an int in [0, {n}) (a core of the logical core)", value, limit=n)
    return int(value)


def core_barrier(data, cores, engine=Engine.gpsimd, name=None):
    """Wait until both cores of the logical core reach this barrier on ``data``.

    The default engine is GpSimd as in the NKI 0.6 stub (snapshot 81ce03ae); ``unknown``
    ("automatic selection" in later docs) picks GpSimd too."""
    check = OperandChecks("nisa.core_barrier")
    n = _lnc_checks(check)
    data = check.tensor("data", data)
    if data.buffer is not MemoryRegion.shared_hbm:
        check.fail("data", "must be in nl.shared_hbm (the data the cores share)", data.buffer.value)
    if not isinstance(cores, (tuple, list)) or tuple(cores) != tuple(range(n)):
        check.fail("cores", "must be (0, 1): the only supported core set with LNC=2", cores)
    if not isinstance(engine, Engine):
        check.fail("engine", "must be an nisa.engine member", repr(engine))
    if engine is Engine.unknown:
        eng = "gpsimd"
    elif engine in _BARRIER_ENGINES:
        eng = _BARRIER_ENGINES[engine]
    else:
        check.fail("engine", "must be a compute or sync engine (it executes the barrier)", engine)
    storage = data._storage.uid
    handle = check.record(
        eng, [data], [data], name, barrier_storage=storage, cores=tuple(cores), lnc_sync=True
    )
    sim = check.sim
    point = SyncPoint(
        "nisa.core_barrier", handle._ins.index, ("nisa.core_barrier", data._storage.name)
    )
    sim.launch.cores.arrive(sim.core, point)
    return handle


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=DmaEngine.dma, name=None):
    """Send SBUF ``src`` to core ``send_to_rank``'s ``dst``; receive ``recv_from_rank``'s.

    ``dma_engine`` (NKI 0.6 stub, snapshot 81ce03ae) picks the DMA or the GpSimd DMA."""
    check = OperandChecks("nisa.sendrecv")
    n = _lnc_checks(check)
    src = check.tensor("src", src)
    dst = check.tensor("dst", dst)
    check.buffer("src", src, SBUF)
    check.buffer("dst", dst, SBUF)
    check.partitions("src", src)
    check.partitions("dst", dst)
    check.access_pattern("src", src)
    check.access_pattern("dst", dst)
    if dst.dtype != src.dtype:
        check.fail("dst dtype", f"must equal src's ({src.dtype})", dst.dtype, limit=src.dtype)
    if tuple(dst.shape) != tuple(src.shape):
        check.fail("dst shape", f"must equal src's {tuple(src.shape)}", tuple(dst.shape))
    send_to = _rank(check, "send_to_rank", send_to_rank, n)
    recv_from = _rank(check, "recv_from_rank", recv_from_rank, n)
    if isinstance(pipe_id, bool) or not isinstance(pipe_id, (int, np.integer)) or pipe_id < 0:
        check.fail("pipe_id", "must be a non-negative compile-time int", pipe_id)
    if not isinstance(dma_engine, DmaEngine):
        check.fail("dma_engine", "must be an nisa.dma_engine member", repr(dma_engine))
    handle = check.record(
        "dma",
        [src],
        [dst],
        name,
        sendrecv=True,
        send_to_rank=send_to,
        recv_from_rank=recv_from,
        pipe_id=int(pipe_id),
        dma_engine=dma_engine.name,
        lnc_sync=True,
    )
    sim = check.sim
    point = SyncPoint(
        "nisa.sendrecv",
        handle._ins.index,
        ("nisa.sendrecv", int(pipe_id)),
        {"src": src, "dst": dst, "send_to": send_to, "recv_from": recv_from},
    )
    sim.launch.cores.arrive(sim.core, point)
    if point.received is not None:
        dst._write(point.received, raw=True)
    else:
        dst._storage.written = True
    return handle


def synchronise(points: dict[int, SyncPoint], compute: bool) -> None:
    """Complete one matched synchronisation of every core (the lock-step runner calls it)."""
    check_same_points(points)
    first = points[min(points)]
    if first.api != "nisa.sendrecv":
        return
    for core, point in points.items():
        to = point.detail["send_to"]
        peer = points[to]
        if peer.detail["recv_from"] != core:
            raise NkiValidationError(
                "nisa.sendrecv",
                f"core {to} recv_from_rank",
                f"must be {core}: core {core} sends to core {to} on pipe {first.key[1]}",
                peer.detail["recv_from"],
            )
        src, dst = point.detail["src"], peer.detail["dst"]
        if (src.dtype, tuple(src.shape)) != (dst.dtype, tuple(dst.shape)):
            raise NkiValidationError(
                "nisa.sendrecv",
                f"core {to} dst",
                f"must match core {core}'s src ({src.dtype} {tuple(src.shape)})",
                f"{dst.dtype} {tuple(dst.shape)}",
            )
    if not compute:
        return
    sent = {core: np.array(p.detail["src"]._read_raw(), copy=True) for core, p in points.items()}
    for core, point in points.items():
        points[point.detail["send_to"]].received = sent[core]
