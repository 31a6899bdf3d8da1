"""``--report DIR``: plots of a tuning run as PNG and HTML, with no plotting dependency.

Per shape: the optimization history (each trial's latency and the best so far), the
parameter importances (Optuna's fANOVA evaluator), and parallel coordinates (one line per
measured config, darker = faster); for the run: best vs default per shape. Every chart is
drawn twice from one description: SVG inside ``report.html`` and a PNG per chart
(``cost_model.timeline_export``'s zlib PNG writer and bitmap font). Latencies are labelled by
their source (modeled or hardware).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

from neuron_kernels.cost_model.timeline_export import _text, png_bytes

__all__ = ["write_report"]

W, H, PAD = 720, 360, 60


@dataclass
class Chart:
    """Lines/points/bars in data coordinates, mapped into a W x H frame."""

    title: str
    x_label: str
    y_label: str
    lines: list = field(default_factory=list)  # (xs, ys, rgb, width)
    points: list = field(default_factory=list)  # (xs, ys, rgb)
    bars: list = field(default_factory=list)  # (label, value, rgb)
    x_ticks: list = field(default_factory=list)  # (x, label)

    def bounds(self):
        xs = [x for line in self.lines for x in line[0]] + [x for p in self.points for x in p[0]]
        ys = [y for line in self.lines for y in line[1]] + [y for p in self.points for y in p[1]]
        if self.bars:
            xs += [0, len(self.bars)]
            ys += [0] + [b[1] for b in self.bars]
        x0, x1 = (min(xs), max(xs)) if xs else (0, 1)
        y0, y1 = (min(ys), max(ys)) if ys else (0, 1)
        if x1 == x0:
            x1 = x0 + 1
        if y1 == y0:
            y1 = y0 + 1
        return x0, x1, y0, y1

    def mapper(self):
        x0, x1, y0, y1 = self.bounds()

        def to_px(x, y):
            return (
                PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD),
                H - PAD - (y - y0) / (y1 - y0) * (H - 2 * PAD),
            )

        return to_px, (x0, x1, y0, y1)


def _rgb(c) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


def to_svg(c: Chart) -> str:
    to_px, (x0, x1, y0, y1) = c.mapper()
    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">']
    out.append(f'<rect width="{W}" height="{H}" fill="white"/>')
    out.append(f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{e(c.title)}</text>')
    out.append(
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>'
    )
    out.append(
        f'<text x="{W / 2}" y="{H - 15}" text-anchor="middle" font-size="12">{e(c.x_label)}</text>'
    )
    out.append(f'<text x="12" y="{PAD - 10}" font-size="12">{e(c.y_label)}</text>')
    out.append(f'<text x="4" y="{PAD + 4}" font-size="10">{y1:,.4g}</text>')
    out.append(f'<text x="4" y="{H - PAD}" font-size="10">{y0:,.4g}</text>')
    for x, label in c.x_ticks:
        px, _ = to_px(x, y0)
        out.append(
            f'<text x="{px}" y="{H - PAD + 14}" text-anchor="middle" font-size="10">{e(label)}</text>'
        )
    for xs, ys, rgb, width in c.lines:
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in (to_px(x, y) for x, y in zip(xs, ys)))
        out.append(
            f'<polyline points="{pts}" fill="none" stroke="{_rgb(rgb)}" stroke-width="{width}"/>'
        )
    for xs, ys, rgb in c.points:
        for x, y in zip(xs, ys):
            a, b = to_px(x, y)
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{_rgb(rgb)}"/>')
    for i, (label, value, rgb) in enumerate(c.bars):
        a, b = to_px(i + 0.15, value)
        a2, b0 = to_px(i + 0.85, 0)
        out.append(
            f'<rect x="{a:.1f}" y="{b:.1f}" width="{a2 - a:.1f}" height="{b0 - b:.1f}" fill="{_rgb(rgb)}"/>'
        )
        out.append(
            f'<text x="{(a + a2) / 2:.1f}" y="{b - 3:.1f}" text-anchor="middle" font-size="9">{e(label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def to_png(c: Chart) -> bytes:
    img = np.full((H, W, 3), 255, dtype=np.uint8)
    to_px, (x0, x1, y0, y1) = c.mapper()

    def dot(a, b, rgb, r=1):
        a, b = int(round(a)), int(round(b))
        img[max(0, b - r) : min(H, b + r + 1), max(0, a - r) : min(W, a + r + 1)] = rgb

    def seg(p, q, rgb, r=0):
        n = int(max(abs(q[0] - p[0]), abs(q[1] - p[1]))) + 1
        for t in np.linspace(0, 1, n):
            dot(p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1]), rgb, r)

    seg((PAD, H - PAD), (W - PAD, H - PAD), (0, 0, 0))
    seg((PAD, PAD), (PAD, H - PAD), (0, 0, 0))
    _text(img, PAD, 6, c.title.upper()[:100], scale=1)
    _text(img, W // 2 - 3 * len(c.x_label), H - 20, c.x_label.upper(), scale=1)
    _text(img, 4, PAD - 20, c.y_label.upper(), scale=1)
    _text(img, 4, PAD - 8, f"{y1:.4g}", scale=1)
    _text(img, 4, H - PAD - 8, f"{y0:.4g}", scale=1)
    for xs, ys, rgb, width in c.lines:
        pts = [to_px(x, y) for x, y in zip(xs, ys)]
        for p, q in zip(pts, pts[1:]):
            seg(p, q, rgb, max(0, int(width) // 2))
    for xs, ys, rgb in c.points:
        for x, y in zip(xs, ys):
            dot(*to_px(x, y), rgb, 2)
    for i, (_label, value, rgb) in enumerate(c.bars):
        a, b = to_px(i + 0.15, value)
        a2, b0 = to_px(i + 0.85, 0)
        img[int(b) : int(b0), int(a) : int(a2)] = rgb
    return png_bytes(img)


def _history(study, label: str) -> Chart:
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    xs = [t.number for t in done]
    ys = [t.value for t in done]
    best = list(np.minimum.accumulate(ys)) if ys else []
    return Chart(
        f"optimization history: {study.study_name}",
        "trial",
        f"{label} latency (us)",
        lines=[(xs, best, (200, 40, 40), 2)],
        points=[(xs, ys, (40, 90, 200))],
    )


def _importances(study, label: str) -> Chart:
    try:
        imp = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError, ZeroDivisionError):
        imp = {}
    return Chart(
        "parameter importances (fANOVA, of the " + label + " latency)",
        "parameter",
        "importance",
        bars=[(f"{k} {v:.2f}", v, (60, 140, 90)) for k, v in imp.items()],
    )


def _parallel(study, space: dict) -> Chart:
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    names = list(space)
    values = [t.value for t in done]
    lo, hi = (min(values), max(values)) if values else (0, 1)
    lines = []
    for t in sorted(done, key=lambda t: -t.value):  # fastest drawn last, on top
        ys = [space[n].index(t.params[n]) / max(1, len(space[n]) - 1) for n in names]
        shade = int(220 * (t.value - lo) / (hi - lo or 1))
        lines.append((list(range(len(names))), ys, (shade, shade, 255 - shade // 2), 1))
    return Chart(
        "parallel coordinates (darker = faster)",
        "parameter",
        "choice (first..last)",
        lines=lines,
        x_ticks=list(enumerate(names)),
    )


def _best_vs_default(found, label: str) -> Chart:
    bars = []
    for r in found:
        if r.default_us:
            bars.append((f"{r.point.shape} default", r.default_us, (170, 170, 170)))
        if r.best_us:
            bars.append((f"{r.point.shape} best", r.best_us, (40, 90, 200)))
    return Chart("best vs default per shape", "shape", f"{label} latency (us)", bars=bars)


def write_report(folder, spec, found, storage_url: str) -> list[Path]:
    """Write the charts of ``found`` (the tuner's results) into ``folder``; returns the files."""
    from neuron_kernels.autotune.storage import open_storage

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    storage = open_storage(storage_url)
    label = found[0].source if found else "modeled"
    charts: list[tuple[str, Chart]] = []
    for i, r in enumerate(found):
        study = optuna.load_study(study_name=r.study_name, storage=storage)
        charts += [
            (f"{i}_history", _history(study, label)),
            (f"{i}_importances", _importances(study, label)),
            (f"{i}_parallel", _parallel(study, spec.config.space())),
        ]
    charts.append(("best_vs_default", _best_vs_default(found, label)))
    written = []
    for name, chart in charts:
        path = folder / f"{name}.png"
        path.write_bytes(to_png(chart))
        written.append(path)
    page = folder / "report.html"
    body = "".join(f"<h3>{html.escape(c.title)}</h3>{to_svg(c)}" for _, c in charts)
    page.write_text(
        f"<!doctype html><meta charset=utf-8><title>autotune {spec.name}</title>"
        f"<h1>autotune {html.escape(spec.name)}: {label} latencies</h1>{body}\n"
    )
    written.append(page)
    return written
