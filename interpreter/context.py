"""The explicit state of a kernel launch: target, grid, trace, memory and engine registers.

A :class:`Launch` is one call of a kernel (all its SPMD instances); a :class:`ProgramInstance`
is one program instance inside it. The running instance is held in a ContextVar for the
duration of the kernel body, so ``nl``/``nisa`` calls find it without globals and
nested or concurrent launches stay separate.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from neuron_kernels.hardware import Target
from neuron_kernels.interpreter.trace import Instruction, Trace

if TYPE_CHECKING:
    from neuron_kernels.interpreter.storage import Storage
    from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = ["Launch", "ProgramInstance", "current", "current_or_none", "activate"]

_CURRENT: contextvars.ContextVar[ProgramInstance | None] = contextvars.ContextVar(
    "neuron_kernels_simulation", default=None
)


@dataclass
class Launch:
    """One kernel call: shared across its program instances."""

    target: Target
    grid: tuple[int, ...]
    precise_fp: bool
    trace: Trace
    # shared_hbm allocations by order of allocation, so every instance's k-th
    # nl.ndarray(..., buffer=nl.shared_hbm) is the same tensor (SPMD outputs).
    shared_allocations: list[Storage] = field(default_factory=list)
    next_storage_id: int = 0
    # compute=False runs checks, liveness and the trace but skips the arithmetic: the
    # cost model needs only shapes, and NKI control flow never depends on tensor data.
    compute: bool = True
    # LNC=2: the lock-step runner of the two cores (cores.CoreRendezvous), and the HBM operand
    # views of every instruction (index -> (reads, writes)) for the race check (races.py).
    cores: Any = None
    hbm_views: dict[int, tuple[tuple[NkiTensor, ...], tuple[NkiTensor, ...]]] | None = None
    # PSUM bytes per partition one tile may take (memory._usable_psum_bytes, read once)
    usable_psum_bytes: int | None = None
    # (shape, strides, buffer, engine, write) of compute-engine operands that passed
    # OperandChecks.engine_operand's checks on this launch's target
    operands_passed: set = field(default_factory=set)

    def new_storage_id(self) -> int:
        self.next_storage_id += 1
        return self.next_storage_id


@dataclass
class ProgramInstance:
    """One program instance: its SBUF/PSUM allocations, engine registers and position."""

    launch: Launch
    program_id: tuple[int, ...]
    # Per-lane accumulator registers. Their content at kernel start is undefined on the
    # hardware, so they start as NaN: a reduction chain that never resets shows NaN.
    scalar_regs: np.ndarray = field(default_factory=lambda: np.full(128, np.nan, np.float32))
    vector_regs: np.ndarray = field(default_factory=lambda: np.full(128, np.nan, np.float32))
    on_chip: list[Storage] = field(default_factory=list)
    shared_cursor: int = 0
    # Physical core of the logical core running this instance (its program_id(0) at LNC=2).
    core: int = 0
    # Dynamic control flow taken (call site, trip count): both cores must agree (lnc.rst).
    dynamic_flow: list[tuple[str, int]] = field(default_factory=list)

    @property
    def target(self) -> Target:
        return self.launch.target

    @property
    def precise_fp(self) -> bool:
        return self.launch.precise_fp

    def record(
        self,
        api: str,
        engine: str,
        reads: tuple[NkiTensor, ...] | list[NkiTensor],
        writes: tuple[NkiTensor, ...] | list[NkiTensor],
        name: str | None = None,
        **attrs,
    ) -> Instruction:
        """Append one instruction to the trace and mark the liveness of its operands."""
        return self.record_attrs(api, engine, reads, writes, name, attrs)

    def record_attrs(
        self,
        api: str,
        engine: str,
        reads: tuple[NkiTensor, ...] | list[NkiTensor],
        writes: tuple[NkiTensor, ...] | list[NkiTensor],
        name: str | None,
        attrs: dict,
    ) -> Instruction:
        """:meth:`record` with the attributes as one dict (the instructions' hot path: no
        keyword re-packing); the trace keeps ``attrs`` itself."""
        instructions = self.launch.trace.instructions
        index = len(instructions)
        # _touch of each operand, inlined (per traced operand: the trace's hot loop)
        read_acc, write_acc = [], []
        for tensors, accs in ((reads, read_acc), (writes, write_acc)):
            for t in tensors:
                storage = t._storage
                if storage.first_use < 0:
                    storage.first_use = index
                storage.last_use = index
                acc = t._acc
                accs.append(acc if acc is not None else t._access())
        ins = Instruction(
            index,
            api,
            engine,
            tuple(read_acc),
            tuple(write_acc),
            self.program_id,
            attrs,
            [],
            name,
            self.core,
        )
        instructions.append(ins)
        views = self.launch.hbm_views
        if views is not None:
            hbm_reads = tuple(t for t in reads if t._storage.buffer.is_hbm)
            hbm_writes = tuple(t for t in writes if t._storage.buffer.is_hbm)
            if hbm_reads or hbm_writes:
                views[index] = (hbm_reads, hbm_writes)
        return ins


def current() -> ProgramInstance:
    """The running program instance; an error outside a kernel launch."""
    sim = _CURRENT.get()
    if sim is None:
        from neuron_kernels.interpreter.errors import NkiValidationError

        raise NkiValidationError(
            "nki",
            "call",
            "must happen inside a kernel run by nki.simulate(kernel)(...) or a @nki.jit kernel",
            "a call outside any kernel",
        )
    return sim


def current_or_none() -> ProgramInstance | None:
    return _CURRENT.get()


@contextmanager
def activate(sim: ProgramInstance):
    token = _CURRENT.set(sim)
    try:
        yield sim
    finally:
        _CURRENT.reset(token)
