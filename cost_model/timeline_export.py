"""Exports of a modeled profile: Chrome/Perfetto trace JSON and a PNG timeline.

The PNG is written with zlib and struct only (no plotting dependency) and carries its own
5x7 bitmap font, so the picture itself says MODELED. Everything drawn is modeled.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from neuron_kernels.cost_model.schedule import ENGINE_LANES, MODEL_VERSION, UNIT_LABEL

__all__ = ["chrome_trace", "timeline_png", "png_bytes"]


def _lanes(profile):
    """Lane -> [(start ns, end ns, launch, instruction)], offset per launch. An LNC=2
    launch's second core gets its own lanes, named ``core1 <lane>``."""
    lanes: dict[str, list] = {}
    offset = 0.0
    cores = set()
    for li, lp in enumerate(profile.launches):
        tl = lp.timeline
        instrs = lp.run.trace.instructions
        for i, unit in enumerate(tl.unit):
            core = instrs[i].core
            cores.add(core)
            prefix = f"core{core} " if core else ""
            if unit == "dma":
                lane = prefix + "dma " + tl.dma_queue.get(i, "?")
                s, e = tl.start[i], tl.end[i]
            else:
                lane = prefix + unit
                s, e = tl.start[i], tl.start[i] + tl.occupancy[i]
            lanes.setdefault(lane, []).append((offset + s, offset + e, li, i))
        for i, (kind, s, e) in tl.dma_trigger.items():  # DMA triggers hold their engine
            core = instrs[i].core
            lane = (f"core{core} " if core else "") + kind
            lanes.setdefault(lane, []).append((offset + s, offset + e, li, i))
        offset += tl.latency_ns
    order = []
    for core in sorted(cores or {0}):
        prefix = f"core{core} " if core else ""
        order += [prefix + u for u in ENGINE_LANES if prefix + u in lanes]
        order += sorted(k for k in lanes if k.startswith(prefix + "dma "))
    return {k: sorted(lanes[k]) for k in order}


def _split_core(lane: str) -> tuple[str, str]:
    """("core1", "pe") for an LNC=2 second-core lane, ("", lane) otherwise."""
    if lane.startswith("core"):
        core, _, rest = lane.partition(" ")
        return core, rest
    return "", lane


def _chrome_lane_label(lane: str) -> str:
    core, rest = _split_core(lane)
    label = UNIT_LABEL.get(rest, rest.replace("dma ", "DMA queue "))
    return f"{core} {label}" if core else label


def chrome_trace(profile, max_events: int = 400_000) -> dict:
    """The modeled timeline as a Chrome trace document (``chrome://tracing``, ui.perfetto.dev)."""
    lanes = _lanes(profile)
    events = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": 1,
            "args": {
                "name": f"MODELED {profile.target} (cost model v{MODEL_VERSION}; not measured)"
            },
        }
    ]
    for tid, lane in enumerate(lanes, start=1):
        label = _chrome_lane_label(lane)
        events.append(
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": label}}
        )
    dropped = 0
    for tid, (lane, items) in enumerate(lanes.items(), start=1):
        for s, e, li, i in items:
            if len(events) >= max_events:
                dropped += 1
                continue
            lp = profile.launches[li]
            ins = lp.run.trace.instructions[i]
            args = {"index": i, "kernel": lp.kernel, "modeled_end_us": lp.timeline.end[i] / 1e3}
            if "dma " in lane:
                args["modeled_bytes"] = lp.timeline.dma_bytes.get(i, 0)
            events.append(
                {
                    "name": ins.api.rsplit(".", 1)[-1]
                    + (" trigger" if ins.engine == "dma" and "dma " not in lane else ""),
                    "cat": lane,
                    "ph": "X",
                    "pid": 1,
                    "tid": tid,
                    "ts": s / 1e3,
                    "dur": max(e - s, 0.0) / 1e3,
                    "args": args,
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "label": "modeled",
            "note": "times are modeled by the neuron-kernels cost model, not measured on hardware",
            "target": profile.target,
            "modeled_latency_us": profile.latency_ns / 1e3,
            "params_fingerprint": profile.params.fingerprint(),
            "dropped_events": dropped,
        },
    }


# -- PNG ---------------------------------------------------------------------------------------

_FONT = {  # 5x7 glyphs, one 5-bit row per entry, most significant bit on the left
    "0": (14, 17, 19, 21, 25, 17, 14),
    "1": (4, 12, 4, 4, 4, 4, 14),
    "2": (14, 17, 1, 2, 4, 8, 31),
    "3": (31, 2, 4, 2, 1, 17, 14),
    "4": (2, 6, 10, 18, 31, 2, 2),
    "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14),
    "7": (31, 1, 2, 4, 8, 8, 8),
    "8": (14, 17, 17, 14, 17, 17, 14),
    "9": (14, 17, 17, 15, 1, 2, 12),
    "A": (14, 17, 17, 17, 31, 17, 17),
    "B": (30, 17, 17, 30, 17, 17, 30),
    "C": (14, 17, 16, 16, 16, 17, 14),
    "D": (28, 18, 17, 17, 17, 18, 28),
    "E": (31, 16, 16, 30, 16, 16, 31),
    "F": (31, 16, 16, 30, 16, 16, 16),
    "G": (14, 17, 16, 23, 17, 17, 15),
    "H": (17, 17, 17, 31, 17, 17, 17),
    "I": (14, 4, 4, 4, 4, 4, 14),
    "J": (7, 2, 2, 2, 2, 18, 12),
    "K": (17, 18, 20, 24, 20, 18, 17),
    "L": (16, 16, 16, 16, 16, 16, 31),
    "M": (17, 27, 21, 21, 17, 17, 17),
    "N": (17, 17, 25, 21, 19, 17, 17),
    "O": (14, 17, 17, 17, 17, 17, 14),
    "P": (30, 17, 17, 30, 16, 16, 16),
    "Q": (14, 17, 17, 17, 21, 18, 13),
    "R": (30, 17, 17, 30, 20, 18, 17),
    "S": (15, 16, 16, 14, 1, 1, 30),
    "T": (31, 4, 4, 4, 4, 4, 4),
    "U": (17, 17, 17, 17, 17, 17, 14),
    "V": (17, 17, 17, 17, 17, 10, 4),
    "W": (17, 17, 17, 21, 21, 21, 10),
    "X": (17, 17, 10, 4, 10, 17, 17),
    "Y": (17, 17, 17, 10, 4, 4, 4),
    "Z": (31, 1, 2, 4, 8, 16, 31),
    "a": (0, 0, 14, 1, 15, 17, 15),
    "b": (16, 16, 22, 25, 17, 17, 30),
    "c": (0, 0, 14, 16, 16, 17, 14),
    "d": (1, 1, 13, 19, 17, 17, 15),
    "e": (0, 0, 14, 17, 31, 16, 14),
    "f": (6, 9, 8, 28, 8, 8, 8),
    "g": (0, 15, 17, 17, 15, 1, 14),
    "h": (16, 16, 22, 25, 17, 17, 17),
    "i": (4, 0, 12, 4, 4, 4, 14),
    "j": (2, 0, 6, 2, 2, 18, 12),
    "k": (16, 16, 18, 20, 24, 20, 18),
    "l": (12, 4, 4, 4, 4, 4, 14),
    "m": (0, 0, 26, 21, 21, 17, 17),
    "n": (0, 0, 22, 25, 17, 17, 17),
    "o": (0, 0, 14, 17, 17, 17, 14),
    "p": (0, 0, 30, 17, 30, 16, 16),
    "q": (0, 0, 13, 19, 15, 1, 1),
    "r": (0, 0, 22, 25, 16, 16, 16),
    "s": (0, 0, 14, 16, 14, 1, 30),
    "t": (8, 8, 28, 8, 8, 9, 6),
    "u": (0, 0, 17, 17, 17, 19, 13),
    "v": (0, 0, 17, 17, 17, 10, 4),
    "w": (0, 0, 17, 17, 21, 21, 10),
    "x": (0, 0, 17, 10, 4, 10, 17),
    "y": (0, 0, 17, 17, 15, 1, 14),
    "z": (0, 0, 31, 2, 4, 8, 31),
    " ": (0,) * 7,
    ".": (0, 0, 0, 0, 0, 12, 12),
    ":": (0, 12, 12, 0, 12, 12, 0),
    "-": (0, 0, 0, 31, 0, 0, 0),
    "(": (2, 4, 8, 8, 8, 4, 2),
    ")": (8, 4, 2, 2, 2, 4, 8),
    "%": (24, 25, 2, 4, 8, 19, 3),
    "/": (0, 1, 2, 4, 8, 16, 0),
    ",": (0, 0, 0, 0, 12, 4, 8),
    "=": (0, 0, 31, 0, 31, 0, 0),
    "_": (0, 0, 0, 0, 0, 0, 31),
    "+": (0, 4, 4, 31, 4, 4, 0),
    "'": (4, 4, 8, 0, 0, 0, 0),
    ">": (8, 4, 2, 1, 2, 4, 8),
    "<": (2, 4, 8, 16, 8, 4, 2),
}
_COLORS = {
    "pe": (46, 139, 87),
    "dve": (65, 105, 225),
    "act": (230, 140, 30),
    "pool": (148, 80, 180),
    "sp": (120, 120, 120),
    "dge_sp": (160, 160, 100),
    "dge_act": (200, 170, 90),
    "dma": (0, 150, 160),
}


def _text(img: np.ndarray, x: int, y: int, s: str, color=(20, 20, 20), scale: int = 2) -> None:
    for ch in s:
        rows = _FONT.get(ch) or _FONT.get(ch.upper(), _FONT[" "])
        for r, bits in enumerate(rows):
            for c in range(5):
                if bits & (1 << (4 - c)):
                    y0, x0 = y + r * scale, x + c * scale
                    img[y0 : y0 + scale, x0 : x0 + scale] = color
        x += 6 * scale


def _coverage(spans: list, t0: float, t1: float, width: int) -> np.ndarray:
    """Busy fraction per pixel column of [t0, t1) for a list of (start, end, ...) spans."""
    if not spans:
        return np.zeros(width)
    s = np.sort(np.array([sp[0] for sp in spans], dtype=float))
    e = np.sort(np.array([sp[1] for sp in spans], dtype=float))
    edges = np.linspace(t0, t1, width + 1)

    def busy_until(t):
        ks = np.searchsorted(s, t)
        ke = np.searchsorted(e, t)
        cs = np.concatenate([[0.0], np.cumsum(s)])
        ce = np.concatenate([[0.0], np.cumsum(e)])
        return (t * ks - cs[ks]) - (t * ke - ce[ke])

    f = busy_until(edges)
    return np.clip(np.diff(f) / ((t1 - t0) / width), 0.0, 1.0)


def png_bytes(img: np.ndarray) -> bytes:
    """Encode an [H, W, 3] uint8 image as PNG (8-bit RGB, no interlace)."""
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + tag
            + data
            + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def _lane_label(lane: str) -> str:
    core, lane = _split_core(lane)
    label = "DMA " + lane[4:] if lane.startswith("dma ") else UNIT_LABEL.get(lane, lane)
    return f"{core} {label}" if core else label


def _lane_color(lane: str) -> np.ndarray:
    lane = _split_core(lane)[1]
    return np.array(_COLORS.get("dma" if lane.startswith("dma ") else lane, (90, 90, 90)), float)


def timeline_png(profile, width: int = 1600) -> bytes:
    """A per-lane busy chart of the modeled timeline, as PNG bytes.

    Compute lanes are shaded by the fraction of each pixel's time the engine is busy
    (instructions and the DMA triggers it issues); DMA lanes (one per queue) by whether a
    transfer of that queue is in flight, which says nothing of how many of the DMA engines
    it uses: the report gives engine utilisation."""
    from neuron_kernels.hardware import target_from_name

    lanes = _lanes(profile)
    left, right, top, row_h, gap, bottom = 230, 20, 96, 22, 6, 110
    height = top + len(lanes) * (row_h + gap) + bottom
    img = np.full((height, width, 3), 255, dtype=np.uint8)
    total = max(profile.latency_ns, 1.0)
    kernels = ", ".join(lp.kernel for lp in profile.launches)
    _text(img, 10, 8, f"Modeled timeline: {kernels} on {profile.target}, latency {_fmt(total)}")
    _text(
        img,
        10,
        34,
        f"cost model v{MODEL_VERSION}, params {profile.params.fingerprint()}: modeled, "
        "not a hardware measurement",
        color=(150, 30, 30),
    )
    mem = profile.memory()
    cap = target_from_name(profile.target).sbuf_usable_bytes
    in_flight = mem["sbuf_in_flight_bytes_per_partition"]
    policy = str(profile.params.sbuf_allocator)
    sbuf_line = (
        f"SBUF in flight {in_flight / cap:.1f}x capacity: sbuf_allocator={policy} assumes the "
        "compiler multi-buffers and spills"
        if policy == "unbounded" and in_flight > cap
        else f"SBUF in flight {in_flight / cap:.2f}x capacity (sbuf_allocator={policy})"
    )
    _text(img, 10, 60, sbuf_line, color=(150, 30, 30))
    plot_w = width - left - right
    for r, (lane, spans) in enumerate(lanes.items()):
        y = top + r * (row_h + gap)
        _text(img, 8, y + 4, _lane_label(lane)[:18], scale=2)
        frac = _coverage(spans, 0.0, total, plot_w)
        color = _lane_color(lane)
        row = (255.0 - frac[:, None] * (255.0 - color[None, :])).astype(np.uint8)
        img[y : y + row_h, left : left + plot_w] = row[None, :, :]
        img[y + row_h, left : left + plot_w] = (200, 200, 200)
    # time axis (modeled)
    y_axis = top + len(lanes) * (row_h + gap) + 4
    img[y_axis, left : left + plot_w] = (0, 0, 0)
    for k in range(6):
        x = left + int(k * (plot_w - 1) / 5)
        img[y_axis : y_axis + 6, x] = (0, 0, 0)
        _text(img, min(x, width - 110), y_axis + 10, _fmt(total * k / 5), scale=2)
    _text(img, left, y_axis + 30, "modeled time", color=(150, 30, 30), scale=2)
    # legend: what a shade means, then one swatch per kind of lane drawn
    y_leg = y_axis + 56
    _text(
        img,
        8,
        y_leg,
        "shade: share of the pixel's time busy (DMA rows: a transfer of that queue in flight)",
        scale=2,
    )
    x = 8
    seen = []
    for lane in lanes:
        key = "DMA queue" if "dma " in lane else _lane_label(_split_core(lane)[1])
        if key not in seen:
            seen.append(key)
            img[y_leg + 26 : y_leg + 40, x : x + 14] = _lane_color(lane).astype(np.uint8)
            _text(img, x + 20, y_leg + 27, key, scale=2)
            x += 20 + 12 * len(key) + 24
    return png_bytes(img)


def _fmt(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"
