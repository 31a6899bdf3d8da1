"""The two physical cores of an LNC=2 launch, run in lock-step so one can wait for the other.

NKI 0.6 launches a kernel on a logical NeuronCore with ``kernel[lnc](...)``: at LNC=2 the
body runs once on each of two physical cores that share one HBM stack, each with its own
engines, SBUF and PSUM (aws-neuron-sdk nki/get-started/about/lnc.rst;
about-neuron/arch/neuron-features/logical-neuroncore-config.rst). AWS's simulator runs the
two instances as two threads (nki/guides/nki_simulator.rst).

Here each program instance runs in its own thread, but only one runs at a time, in a fixed
order: core 0 until its next synchronisation point (``nisa.core_barrier``, ``nisa.sendrecv``)
or its end, then core 1 likewise; then the synchronisation happens and the round repeats.
The interleaving is therefore deterministic (the trace lists core 0's segment, then core 1's,
between two synchronisation points), and a core that waits for the other really waits.

Refused, as the hardware would fail or hang on them: one core at a synchronisation point
while the other ended or waits at a different one, and dynamic control flow (loops on
register values) that differs between the cores (lnc.rst: "if you use dynamic control
flow, and this control-flow is different on the different cores, then the behavior is
undefined").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from neuron_kernels.interpreter.errors import NkiValidationError

__all__ = ["CoreRendezvous", "SyncPoint", "run_lock_step"]

_LNC_DOC = "nki/get-started/about/lnc.rst"


class _Aborted(BaseException):
    """Unwinds a parked core's kernel body when the launch failed elsewhere."""


@dataclass
class SyncPoint:
    """Where one core waits: a barrier or a sendrecv, with what the others must match."""

    api: str  # "nisa.core_barrier" or "nisa.sendrecv"
    index: int  # trace index of the instruction
    key: tuple  # what must be equal on every core (api, data storage / pipe_id)
    detail: dict[str, Any] = field(default_factory=dict)
    received: Any = None  # sendrecv: the peer's src values, delivered on resume


class CoreRendezvous:
    """Hands the turn from core to core; the main thread performs each synchronisation."""

    def __init__(self, n_cores: int) -> None:
        self.n = n_cores
        self._resume = [threading.Semaphore(0) for _ in range(n_cores)]
        self._parked = threading.Semaphore(0)
        self._aborted = False
        self.points: dict[int, SyncPoint] = {}

    # -- called by a core (its worker thread) -------------------------------------------
    def arrive(self, core: int, point: SyncPoint) -> SyncPoint:
        """Park ``core`` at ``point`` until every core reached its matching point."""
        self.points[core] = point
        self._parked.release()
        self._resume[core].acquire()
        if self._aborted:
            raise _Aborted
        return point

    # -- called by the main thread -------------------------------------------------------
    def step(self, core: int) -> None:
        """Let ``core`` run until it parks (a synchronisation point, its end or an error)."""
        self._resume[core].release()
        self._parked.acquire()

    def abort(self, waiting: list[int]) -> None:
        self._aborted = True
        for core in waiting:
            self._resume[core].release()


def run_lock_step(n_cores: int, make_instance, run_body, synchronise, check_flow) -> list:
    """Run ``n_cores`` program instances in lock-step; return each core's kernel result.

    Args:
        n_cores: physical cores of the launch (its LNC).
        make_instance: ``core -> ProgramInstance``.
        run_body: ``instance -> result``; runs the kernel body with the instance active.
        synchronise: ``{core: SyncPoint} -> None``; performs one matched synchronisation.
        check_flow: ``[instances] -> None``; refuses dynamic control flow that differs.
    """
    rendezvous = CoreRendezvous(n_cores)
    instances = [make_instance(c) for c in range(n_cores)]
    for sim in instances:
        sim.launch.cores = rendezvous
    outcome: dict[int, tuple[str, Any]] = {}

    def worker(core: int) -> None:
        rendezvous._resume[core].acquire()
        if rendezvous._aborted:
            return
        try:
            outcome[core] = ("end", run_body(instances[core]))
        except _Aborted:
            return
        except BaseException as exc:  # reported to the main thread, re-raised there
            outcome[core] = ("error", exc)
        rendezvous._parked.release()

    threads = [
        threading.Thread(target=worker, args=(c,), name=f"nki-core-{c}", daemon=True)
        for c in range(n_cores)
    ]
    for t in threads:
        t.start()
    live = list(range(n_cores))
    try:
        while live:
            rendezvous.points.clear()
            for core in live:
                rendezvous.step(core)
                if core in outcome and outcome[core][0] == "error":
                    raise outcome[core][1]
            check_flow(instances)
            ended = [c for c in live if c in outcome]
            waiting = [c for c in live if c not in outcome]
            if ended and waiting:
                c = waiting[0]
                point = rendezvous.points[c]
                raise NkiValidationError(
                    point.api,
                    f"core {c}",
                    "must be matched by the same call on every core of the logical core "
                    f"(the other core ended the kernel; both cores run the same program, {_LNC_DOC})",
                    f"core {c} waits at instruction #{point.index} ({point.api})",
                )
            if waiting:
                synchronise({c: rendezvous.points[c] for c in waiting})
            live = waiting
    except BaseException:
        rendezvous.abort(live)
        for t in threads:
            t.join()
        raise
    for t in threads:
        t.join()
    return [outcome[c][1] for c in range(n_cores)]


def check_same_points(points: dict[int, SyncPoint]) -> None:
    """Every core must wait at the same kind of synchronisation with the same key."""
    cores = sorted(points)
    first = points[cores[0]]
    for c in cores[1:]:
        other = points[c]
        if other.key != first.key:
            raise NkiValidationError(
                other.api,
                f"core {c}",
                f"must reach the same synchronisation as core {cores[0]} (the cores run "
                f"the same program, {_LNC_DOC}; the interpreter needs matching calls in the "
                "same order)",
                f"core {cores[0]} at instruction #{first.index} ({first.api} {first.key[1:]}), "
                f"core {c} at instruction #{other.index} ({other.api} {other.key[1:]})",
            )


def check_same_dynamic_flow(instances) -> None:
    """Loops on register values must take the same trip counts on every core (lnc.rst)."""
    base = instances[0]
    sites: dict[str, list[int]] = {}
    for site, trips in base.dynamic_flow:
        sites.setdefault(site, []).append(trips)
    for sim in instances[1:]:
        other: dict[str, list[int]] = {}
        for site, trips in sim.dynamic_flow:
            other.setdefault(site, []).append(trips)
        for site in sites.keys() & other.keys():
            a, b = sites[site], other[site]
            n = min(len(a), len(b))
            for k in range(n):
                if a[k] != b[k]:
                    raise NkiValidationError(
                        "nki.jit",
                        f"dynamic control flow at {site}",
                        f"must be the same on every core of the logical core ({_LNC_DOC}: "
                        "differing dynamic control flow is undefined behaviour)",
                        f"{a[k]} iterations on core {base.core}, {b[k]} on core {sim.core} "
                        f"(occurrence {k + 1})",
                    )
