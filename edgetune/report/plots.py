"""The dashboard's charts, drawn with matplotlib and embedded in the page as PNG data URIs (the
page fetches nothing): a model's tuning curve on a class, and the history's timeline."""

from __future__ import annotations

import base64
import io
from datetime import datetime

from matplotlib.figure import Figure

from edgetune.report.views import HistoryRow
from edgetune.tune.report import CurvePoint, TuningSummary, curve_figure, fastest_runtime

CURVES_KEPT = 256
_drawn_curves: dict[tuple, str] = {}  # by what the curve is drawn from, oldest first
_MARKERS = {"rollout": ("o", "tab:blue"), "regress": ("s", "tab:green"), "status": (".", "tab:gray")}


def curve_png(title: str, summary: TuningSummary) -> str:
    """The tuning curve of a `summary.json` (its early part dashed, its faster runtime's time
    dotted), as a PNG data URI; drawn again only when the summary's curve changed (a served page
    is redrawn on any file's change)."""
    key = (title, summary.curve, summary.early_curve, summary.knee, fastest_runtime(summary.runtimes))
    if key not in _drawn_curves:
        if len(_drawn_curves) >= CURVES_KEPT:
            _drawn_curves.pop(next(iter(_drawn_curves)))
        _drawn_curves[key] = _curve_png(title, summary)
    return _drawn_curves[key]


def _curve_png(title: str, summary: TuningSummary) -> str:
    knee = summary.knee
    knee_point = CurvePoint(knee.trials, knee.latency_s) if knee else None
    return _data_uri(
        curve_figure(
            title, summary.curve_points(), knee_point, summary.early_points(), fastest_runtime(summary.runtimes)
        )
    )


def timeline_png(rows: list[HistoryRow]) -> str | None:
    """Rollouts, regress runs and status checks over time, firmware changes as red lines; None
    without any event."""
    if not rows:
        return None
    figure = Figure(figsize=(9, 2.2))
    axes = figure.subplots()
    for kind, (marker, color) in _MARKERS.items():
        times = [_time(r.time) for r in rows if r.kind == kind]
        axes.plot(times, [kind] * len(times), marker, color=color, linestyle="none")
    for changed in sorted({_time(r.time) for r in rows if r.kind == "firmware"}):
        axes.axvline(changed, color="tab:red", linewidth=1)
    axes.margins(x=0.05, y=0.25)
    axes.set_title("history (red lines: firmware changes)", fontsize="medium")
    axes.grid(True, axis="x", alpha=0.3)
    figure.autofmt_xdate()
    figure.tight_layout()
    return _data_uri(figure)


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")


def _data_uri(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
