"""A test-only op with a small tile space and a synthetic latency, and backends for it.

``SyntheticConfig`` has 4 x 3 x 2 = 24 configs; its plan refuses ``tile=8`` with ``depth=3``
(a LimitError, as an op's plan does for a config that cannot run), and its latency has one
known minimum: tile 4, depth 2, order "b".
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import matmul
from neuron_kernels.kernels.spec import TunableConfig, tunable

OPTIMUM = {"tile": 4, "depth": 2, "order": "b"}


@dataclass(frozen=True)
class SyntheticConfig(TunableConfig):
    op_name = "synthetic"
    tile: int = tunable(1, (1, 2, 4, 8), "correctness: a test space")
    depth: int = tunable(1, (1, 2, 3), "correctness: a test space")
    order: str = tunable("a", ("a", "b"), "correctness: a test space")


@dataclass(frozen=True)
class SyntheticPlan:
    lnc: int
    sbuf_bytes: int
    psum_banks: int


def synthetic_plan(problem, dtype, config, target, lnc=1):
    if config.tile == 8 and config.depth == 3:
        raise LimitError("synthetic", "config depth", "must be < 3 when tile is 8", 3, limit=3)
    return SyntheticPlan(lnc=lnc, sbuf_bytes=1024, psum_banks=1)


def synthetic_latency(config) -> float:
    """Separable bowl with its minimum (10 us) at OPTIMUM."""
    tiles = (1, 2, 4, 8)
    return (
        10.0
        + 3.0 * abs(tiles.index(config.tile) - 2)
        + 2.0 * abs(config.depth - 2)
        + (0.0 if config.order == "b" else 1.5)
    )


SPEC = dataclasses.replace(
    matmul.SPEC, name="synthetic", config=SyntheticConfig, plan=synthetic_plan
)


def no_gate(spec, config, dtype, target, lnc=1):
    return None


class SyntheticBackend:
    """Latency from :func:`synthetic_latency`; counts measurements per config. With
    ``hang_at`` (a trial count) it writes ``marker`` and sleeps at that measurement, so a test
    can SIGKILL a worker in the middle of a trial."""

    name = "synthetic"
    source = "modeled"

    def __init__(self, hang_at: int | None = None, marker: Path | None = None) -> None:
        self.calls: list[dict] = []
        self.hang_at, self.marker = hang_at, marker

    def measure(self, spec, problem, dtype, config):
        from neuron_kernels.autotune.backends import Measurement

        self.calls.append(config.to_dict())
        if self.hang_at is not None and len(self.calls) == self.hang_at:
            self.marker.write_text(repr(config.to_dict()))
            time.sleep(600)
        return Measurement(
            synthetic_latency(config), "modeled", floor_us=10.0, floor_engine="TensorE"
        )
