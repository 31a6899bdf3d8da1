"""Fault injection and a call log shared by the nki and nrtpy doubles (see README.md)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

FAULT_ENV = "NEURON_KERNELS_DOUBLE_FAULT"  # "<kind>[@<n>][,<kind>[@<n>]...]"
STATE_ENV = "NEURON_KERNELS_DOUBLE_STATE"  # a folder: call counters and the log
STAGES = {"compile_crash": "compile", "crash": "load", "hang": "load", "wrong": "call"}


def _state() -> Path | None:
    folder = os.environ.get(STATE_ENV)
    return Path(folder) if folder else None


def log(stage: str, **fields) -> None:
    """Append one JSON line to ``<state>/calls.jsonl`` (what the tests read back)."""
    folder = _state()
    if folder is None:
        return
    fields.update(
        stage=stage,
        pid=os.getpid(),
        visible_cores=os.environ.get("NEURON_RT_VISIBLE_CORES"),
        lnc=os.environ.get("NEURON_LOGICAL_NC_CONFIG"),
    )
    with open(folder / "calls.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")


def _count(stage: str) -> int:
    """1-based number of this call of ``stage`` across every process of the test."""
    folder = _state()
    if folder is None:
        return 1
    n = 1
    while True:
        try:
            os.close(os.open(folder / f"{stage}.{n}", os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            n += 1


def fault(stage: str) -> str | None:
    """The fault to play at this call of ``stage`` (None: behave)."""
    specs = [s.partition("@") for s in os.environ.get(FAULT_ENV, "").split(",") if s]
    mine = [(kind, nth) for kind, _, nth in specs if STAGES.get(kind) == stage]
    if not mine:
        return None
    n = _count(stage)
    for kind, nth in mine:
        if not nth or int(nth) == n:
            return kind
    return None


def hang() -> None:
    """A hung worker: never returns (the tuner must kill it)."""
    folder = _state()
    if folder is not None:
        (folder / "hung.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(60)
