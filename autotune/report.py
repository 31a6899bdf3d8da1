"""``--report DIR``: plots of a tuning run through Optuna's own visualization.

Per shape: the optimization history, the parameter importances (fANOVA) and parallel
coordinates; for the run: best vs default per shape. Each chart is written as a PNG
(``optuna.visualization.matplotlib``) and all of them on one HTML page
(``optuna.visualization``, plotly, with plotly.js embedded once: the page needs no network).
Both libraries are the optional ``plot`` extra; :func:`missing_plot_libraries` lets the CLI
refuse ``--report`` in one line before any tuning when they are absent. Latencies are
labelled by their source (modeled or hardware).
"""

from __future__ import annotations

import html
import importlib.util
import warnings
from pathlib import Path

__all__ = ["INSTALL_HINT", "missing_plot_libraries", "write_report"]

PLOT_LIBRARIES = ("matplotlib", "plotly")
INSTALL_HINT = "pip install 'neuron-kernels[plot]'"


def missing_plot_libraries() -> list[str]:
    """The plotting libraries ``--report`` needs that are not installed."""
    return [name for name in PLOT_LIBRARIES if importlib.util.find_spec(name) is None]


def _study_charts(study, label: str):
    """(name, plotly figure, matplotlib axes factory) for one study's three Optuna charts."""
    import optuna.visualization as pv
    import optuna.visualization.matplotlib as pm

    target_name = f"{label} latency (us)"
    complete = [t for t in study.trials if t.value is not None]
    charts = [
        (
            "history",
            lambda: pv.plot_optimization_history(study, target_name=target_name),
            lambda: pm.plot_optimization_history(study, target_name=target_name),
        ),
        (
            "parallel",
            lambda: pv.plot_parallel_coordinate(study, target_name=target_name),
            lambda: pm.plot_parallel_coordinate(study, target_name=target_name),
        ),
    ]
    # fANOVA needs at least two completed trials that differ in some parameter.
    if len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
        charts.insert(
            1,
            (
                "importances",
                lambda: pv.plot_param_importances(study, target_name=target_name),
                lambda: pm.plot_param_importances(study, target_name=target_name),
            ),
        )
    return charts


def _best_vs_default(found, label: str):
    """Grouped bars of the default and best latency per shape (no Optuna chart does this)."""
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go

    shapes = [f"{r.point.shape} {r.point.dtype}" for r in found]
    default = [r.default_us for r in found]
    best = [r.best_us for r in found]
    y_title = f"{label} latency (us)"

    fig = go.Figure(
        [go.Bar(name="default", x=shapes, y=default), go.Bar(name="best", x=shapes, y=best)]
    )
    fig.update_layout(title="best vs default per shape", barmode="group", yaxis_title=y_title)

    def axes():
        _, ax = plt.subplots(figsize=(max(6, 1.5 * len(shapes)), 4))
        xs = range(len(shapes))
        ax.bar([x - 0.2 for x in xs], [v or 0 for v in default], 0.4, label="default")
        ax.bar([x + 0.2 for x in xs], [v or 0 for v in best], 0.4, label="best")
        ax.set_xticks(list(xs), shapes, rotation=20, ha="right")
        ax.set_ylabel(y_title)
        ax.set_title("best vs default per shape")
        ax.legend()
        return ax

    return fig, axes


def write_report(folder, spec, found, storage_url: str) -> list[Path]:
    """Write the charts of ``found`` (the tuner's results) into ``folder``; returns the files.

    Raises ``ModuleNotFoundError`` naming :data:`INSTALL_HINT` when the ``plot`` extra is
    missing (the CLI checks first, so a user sees one line, not this)."""
    missing = missing_plot_libraries()
    if missing:
        raise ModuleNotFoundError(f"--report needs {', '.join(missing)}: {INSTALL_HINT}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    from neuron_kernels.autotune.storage import open_storage

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    storage = open_storage(storage_url)
    label = found[0].source if found else "modeled"
    sections: list[tuple[str, object]] = []  # (title, plotly figure)
    written: list[Path] = []

    def save_png(name: str, make_axes) -> None:
        with warnings.catch_warnings():  # Optuna marks its matplotlib charts experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            ax = make_axes()
        path = folder / f"{name}.png"
        ax.figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(ax.figure)
        written.append(path)

    for i, r in enumerate(found):
        study = optuna.load_study(study_name=r.study_name, storage=storage)
        for name, plotly_fig, mpl_axes in _study_charts(study, label):
            save_png(f"{i}_{name}", mpl_axes)
            sections.append((f"{r.point.shape} {r.point.dtype}: {name}", plotly_fig()))
    bars, bar_axes = _best_vs_default(found, label)
    save_png("best_vs_default", bar_axes)
    sections.append(("best vs default per shape", bars))

    parts = [
        f"<h3>{html.escape(title)}</h3>"
        + fig.to_html(full_html=False, include_plotlyjs=(n == 0))  # plotly.js once, inline
        for n, (title, fig) in enumerate(sections)
    ]
    page = folder / "report.html"
    page.write_text(
        f"<!doctype html><meta charset=utf-8><title>autotune {html.escape(spec.name)}</title>"
        f"<h1>autotune {html.escape(spec.name)}: {label} latencies</h1>{''.join(parts)}\n"
    )
    written.append(page)
    return written
