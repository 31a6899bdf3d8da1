"""The profile API and its exports (the ``neuron-kernels profile`` command: tests/cli/).

Every number a profile prints or stores must be labelled modeled; the exports must describe
the same schedule the report does.
"""

from __future__ import annotations

import json
import re
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest
import torch

from neuron_kernels.cost_model import profile
from neuron_kernels.cost_model.profiler import Profile, Profiler
from neuron_kernels.interpreter import nki
from neuron_kernels.kernels.spec import get_spec

nl, nisa = nki.language, nki.isa
bf16 = ml_dtypes.bfloat16


def small_matmul(a, b):
    """Tiled ``lhsT[K, M].T @ b[K, N]`` (K in PSUM), a small known schedule for the exports."""
    K, M = a.shape
    _, N = b.shape
    out = nl.ndarray((M, N), dtype=a.dtype, buffer=nl.shared_hbm)
    for m in range(M // 128):
        for n in range(N // 512):
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for k in range(K // 128):
                at = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.sbuf)
                bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=at, src=a[k * 128 : (k + 1) * 128, m * 128 : (m + 1) * 128])
                nisa.dma_copy(dst=bt, src=b[k * 128 : (k + 1) * 128, n * 512 : (n + 1) * 512])
                nisa.nc_matmul(dst=acc, stationary=at, moving=bt, accumulate=k > 0)
            o = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=acc)
            nisa.dma_copy(dst=out[m * 128 : (m + 1) * 128, n * 512 : (n + 1) * 512], src=o)
    return out


@pytest.fixture(scope="module")
def report() -> Profile:
    a = np.empty((256, 256), bf16)
    b = np.empty((256, 1024), bf16)
    return profile(small_matmul, target="trn2")(a, b)


def _blocks(text: str):
    block: list[str] = []
    for line in text.splitlines() + [""]:
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []


def test_every_printed_number_is_labelled_modeled(report):
    text = report.text()
    assert "modeled" in text.splitlines()[0].lower()
    for block in _blocks(text):
        if any(re.search(r"\d", line) for line in block):
            assert "modeled" in block[0].lower(), block


def test_report_numbers_are_consistent(report):
    d = report.to_dict()
    assert d["label"] == "modeled"
    assert d["latency_ns"] > 0
    for unit, busy in d["busy_ns"].items():
        assert 0 <= busy <= d["latency_ns"] * (1 + 1e-9), unit
    assert 0 < d["utilization"]["dma"] <= 1 and 0 < d["tensor_utilization"]["hfu"] <= 1
    assert d["flops"]["matmul"] == 2.0 * 256 * 256 * 1024  # 2 M N K, from the trace
    assert d["hbm_bytes"]["write"] == 256 * 1024 * 2
    assert d["instructions"]["by_api"]["nisa.nc_matmul"] == 2 * 2 * 2
    assert d["memory"]["psum_banks"] >= 1 and d["memory"]["sbuf_bytes_per_partition"] > 0
    assert d["critical_engine"] in ("pe", "dve", "act", "pool", "sp", "dma")


def test_chrome_trace_describes_the_modeled_schedule(report, tmp_path):
    path = tmp_path / "trace.json"
    n = report.to_chrome_trace(path)
    doc = json.loads(path.read_text())
    assert len(doc["traceEvents"]) == n
    assert doc["otherData"]["label"] == "modeled"
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    timeline = report.launches[0].timeline
    # one span per instruction, and one per DMA trigger on the engine that issues it
    assert len(spans) == len(report.launches[0].run.trace) + len(timeline.dma_trigger)
    assert sum(e["name"].endswith(" trigger") for e in spans) == len(timeline.dma_trigger)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    last = max(e["ts"] + e["dur"] for e in spans)
    assert last <= report.latency_ns / 1e3 * (1 + 1e-9)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert any("MODELED" in name for name in names)


def test_png_is_a_valid_image_with_drawn_lanes(report, tmp_path):
    path = tmp_path / "timeline.png"
    report.to_png(path, width=800)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 800 and height > 100
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + 3 * width)
    img = (
        np.frombuffer(raw, np.uint8).reshape(height, 1 + 3 * width)[:, 1:].reshape(height, width, 3)
    )
    header = img[:60]
    assert (header < 100).any()  # the MODELED title is drawn
    lanes = img[70:, 230:]
    green = (lanes[..., 1].astype(int) - lanes[..., 0].astype(int)) > 40
    assert green.any()  # TensorE busy time is drawn in its colour


def test_profiler_as_op_runner_matches_profiling_the_kernel():
    spec = get_spec("matmul")
    problem = {"m": 256, "n": 512, "k": 256}
    a, b = spec.make_inputs(problem, "bfloat16", torch.Generator().manual_seed(0))
    profiler = Profiler(target="trn2")
    spec.run_kernels(a, b, config=spec.config.default(), runner=profiler)
    via_runner = profiler.report()
    plan = spec.check(problem, "bfloat16", spec.config.default(), profiler.target)
    direct = profile(spec.kernels[0], target="trn2")(a, b, plan)
    assert len(via_runner.launches) == 1
    assert via_runner.latency_ns == pytest.approx(direct.latency_ns, rel=1e-12)


def test_report_surfaces_allocator_fallbacks_and_usable_psum(monkeypatch):
    """alloc_fallbacks reaches the report; PSUM capacity is the usable bank count (7 when a
    bank is reserved for DMA transposes done on the PE, neuron_kernels.hardware)."""
    from neuron_kernels.hardware import PE_TRANSPOSE_DMA_ENV, usable_psum_banks

    spec = get_spec("matmul")
    problem = {"m": 256, "n": 512, "k": 256}
    a, b = spec.make_inputs(problem, "bfloat16", torch.Generator().manual_seed(0))
    profiler = Profiler(target="trn2", sbuf_allocator="lru")
    spec.run_kernels(a, b, config=spec.config.default(), runner=profiler)
    memory = profiler.report().to_dict()["memory"]
    fallbacks = sum(lp.timeline.alloc_fallbacks for lp in profiler.launches)
    assert memory["alloc_fallbacks"] == fallbacks
    assert memory["psum_capacity_banks"] == usable_psum_banks("trn2") == 8
    monkeypatch.setenv(PE_TRANSPOSE_DMA_ENV, "true")
    assert Profiler(target="trn2").report().to_dict()["memory"]["psum_capacity_banks"] == 7


def _matmul_profile(**params):
    spec = get_spec("matmul")
    problem = {"m": 512, "n": 1024, "k": 1024}
    a, b = spec.make_inputs(problem, "bfloat16", torch.Generator().manual_seed(0))
    profiler = Profiler(target="trn2", compute=False, **params)
    spec.run_kernels(a, b, config=spec.config.default(), runner=profiler)
    return profiler.report()


def test_the_picture_shows_dma_triggers_on_gpsimd_and_reads_in_lower_case():
    from neuron_kernels.cost_model.timeline_export import _FONT, _lanes

    report = _matmul_profile()
    lanes = _lanes(report)
    # software-DGE DMAs are triggered on GpSimdE: its busy time has a lane in the picture
    assert "pool" in lanes and report.busy_ns()["pool"] > 0
    busy_drawn = sum(e - s for s, e, *_ in lanes["pool"])
    assert busy_drawn == pytest.approx(report.busy_ns()["pool"], rel=1e-9)
    assert _FONT["m"] != _FONT["M"] and _FONT["s"] != _FONT["S"]  # "ms", not "MS"


def test_the_report_says_how_much_sbuf_the_schedule_holds():
    """Under the default unbounded policy loads may run ahead of capacity, and the report
    says so with the ratio; under lru the schedule stays within usable SBUF."""
    unbounded, lru = _matmul_profile(), _matmul_profile(sbuf_allocator="lru")
    cap = unbounded.to_dict()["memory"]["sbuf_capacity_bytes_per_partition"]
    held = unbounded.to_dict()["memory"]["sbuf_in_flight_bytes_per_partition"]
    assert held > 0
    assert "modeled SBUF in flight" in unbounded.text()
    if held > cap:
        assert "sbuf_allocator=unbounded assumes the compiler multi-buffers" in unbounded.text()
    assert 0 < lru.to_dict()["memory"]["sbuf_in_flight_bytes_per_partition"] <= cap
    assert lru.latency_ns > 0
