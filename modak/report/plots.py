"""Roofline figures as PNG bytes (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from modak.image.kernels import OP_CLASSES
from modak.report.data import OpPoint, PerfPoint, Roof, TargetPoint, Trajectory

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SIZE = (11.0, 5.6)  # inches (the legend sits right of the axes)
DPI = 100
_ROOF_COLORS = ("#222222", "#7a7a7a", "#a0a0a0", "#c0c0c0", "#d4d4d4")
_MARKERS = ("D", "s", "^", "v", "P", "X", "h", "<", ">", "p")


def _figure() -> tuple[Figure, Axes]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=SIZE, dpi=DPI, layout="constrained")  # not pyplot: no global backend or state
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _x_range(roof: Roof, intensities: Iterable[float]) -> tuple[float, float]:
    values = [x for x in intensities if x > 0 and math.isfinite(x)]
    values += [peak / roof.bandwidth_gbs for _, peak in roof.peaks]  # every ridge point is on the plot
    lo, hi = min(values), max(values)
    return 10 ** math.floor(math.log10(lo / 2)), 10 ** math.ceil(math.log10(hi * 2))


def _draw_roof(ax: Axes, roof: Roof, xlim: tuple[float, float], faint: bool = False) -> None:
    """One compute roof per precision and the memory-bandwidth slope, labelled."""
    lo, hi = xlim
    top = roof.peaks[0][1]
    alpha = 0.45 if faint else 1.0
    ridge_top = top / roof.bandwidth_gbs
    ax.plot([lo, ridge_top], [lo * roof.bandwidth_gbs, top], color="#1f4e9c", lw=2, alpha=alpha,
            label=f"memory {roof.bandwidth_gbs:.4g} GB/s")
    for i, (precision, peak) in enumerate(roof.peaks):
        ridge = peak / roof.bandwidth_gbs
        chosen = precision == roof.precision
        ax.plot([ridge, hi], [peak, peak], color=_ROOF_COLORS[min(i, len(_ROOF_COLORS) - 1)],
                lw=2.2 if chosen else 1.4, ls="-" if chosen else "--", alpha=alpha,
                label=f"{precision} peak {peak:.4g} GFLOP/s" + (" (chosen precision)" if chosen else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (GFLOP/s)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)


def _y_floor(ax: Axes, values: Iterable[float], roof: Roof, xlim: tuple[float, float]) -> None:
    lows = [v for v in values if v > 0] + [xlim[0] * roof.bandwidth_gbs]
    ax.set_ylim(10 ** math.floor(math.log10(min(lows) / 2)), 10 ** math.ceil(math.log10(roof.peaks[0][1] * 2)))


def roofline_png(roof: Roof, ops: list[OpPoint], chosen: PerfPoint, measured: list[PerfPoint],
                 title: str) -> bytes:
    """The device's roofline with the workload's ops, the chosen candidate's prediction and measurements."""
    figure, ax = _figure()
    xlim = _x_range(roof, [op.intensity for op in ops] + [chosen.intensity])
    _draw_roof(ax, roof, xlim)
    biggest = max((op.flops for op in ops), default=1)
    colors = _class_colors()
    for op_class in sorted({op.op_class for op in ops}, key=_class_order):
        members = [op for op in ops if op.op_class == op_class]
        ax.scatter([op.intensity for op in members], [op.gflops for op in members],
                   s=[25 + 475 * math.sqrt(op.flops / biggest) for op in members], color=colors.get(op_class, "C9"),
                   alpha=0.65, edgecolors="black", linewidths=0.5, zorder=3,
                   label=f"{op_class} ops ({len(members)})")
    for i, runtime in enumerate(sorted({p.runtime for p in measured})):
        runs = [p for p in measured if p.runtime == runtime]
        ax.scatter([p.intensity for p in runs], [p.gflops for p in runs], marker=_MARKERS[i % len(_MARKERS)],
                   s=45, facecolors="none", edgecolors=f"C{i}", linewidths=1.5, zorder=4,
                   label=f"measured: {runtime} ({len(runs)})")
    ax.errorbar([chosen.intensity], [chosen.gflops],
                yerr=[[chosen.gflops - chosen.low_gflops], [chosen.high_gflops - chosen.gflops]],
                fmt="*", color="#d62728", markersize=18, markeredgecolor="black", capsize=5, zorder=5,
                label=f"chosen: {_short(chosen.label)} (predicted, {chosen.source})")
    _y_floor(ax, [op.gflops for op in ops] + [chosen.low_gflops] + [p.gflops for p in measured], roof, xlim)
    ax.set_title(title, fontsize=10)
    figure.legend(loc="outside right upper", fontsize=7.5, framealpha=0.9)
    return _png(figure)


def trajectory_png(roof: Roof, path: Trajectory, cores: int, title: str) -> bytes:
    """The chosen runtime's predicted performance across batch sizes (one line per thread count)."""
    figure, ax = _figure()
    xlim = _x_range(roof, [p.intensity for p in path.points])
    _draw_roof(ax, roof, xlim, faint=True)
    series = sorted({p.threads for p in path.points}, key=lambda t: -1 if t is None else t)
    for i, threads in enumerate(series):
        members = sorted((p for p in path.points if p.threads == threads), key=lambda p: p.batch)
        color = f"C{i}"
        label = "predicted" if threads is None else f"{threads} thread{'s' if threads != 1 else ''}"
        ax.plot([p.intensity for p in members], [p.gflops for p in members], "-o", color=color, lw=1.6,
                markersize=5, zorder=3, label=label)
        if threads is not None and roof.device == "cpu" and cores and threads < cores:
            scaled = roof.peak * threads / cores  # the roofline predictor's compute roof at this thread count
            ax.plot([scaled / roof.bandwidth_gbs, xlim[1]], [scaled, scaled], ":", color=color, lw=1, alpha=0.8)
        if i == len(series) - 1:
            _label_batches(ax, members)
    job = [p for p in path.points if p.is_job]
    if job:
        ax.scatter([job[0].intensity], [job[0].gflops], s=260, facecolors="none", edgecolors="#d62728",
                   linewidths=2, zorder=4, label=f"job's batch and threads (b{job[0].batch})")
    _y_floor(ax, [p.gflops for p in path.points], roof, xlim)
    ax.set_title(title, fontsize=10)
    figure.legend(loc="outside right upper", fontsize=7.5, framealpha=0.9)
    return _png(figure)


def _label_batches(ax: Axes, members: list) -> None:
    """Label points with their batch size, largest batch first, skipping points crowded by a labelled one."""
    labelled: list[tuple[float, float]] = []
    for p in reversed(members):
        here = (math.log10(p.intensity), math.log10(p.gflops))
        if any(math.hypot(here[0] - x, here[1] - y) < 0.1 for x, y in labelled):
            continue
        labelled.append(here)
        ax.annotate(f"b{p.batch}", (p.intensity, p.gflops), textcoords="offset points", xytext=(0, 7),
                    ha="center", fontsize=7)


def _class_colors() -> dict[str, str]:
    return {name: f"C{i % 10}" for i, name in enumerate(OP_CLASSES)}


def _class_order(name: str) -> int:
    return OP_CLASSES.index(name) if name in OP_CLASSES else len(OP_CLASSES)


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def whatif_png(points: list[TargetPoint], unit: str, currency: str | None, title: str) -> bytes:
    """Time against cost per target (intervals as error bars), the Pareto front as a step line; targets without a
    price as ticks along the time axis. Without any price: each target's time as a bar."""
    figure, ax = _figure()
    priced = [p for p in points if p.cost is not None]
    if priced:
        for i, p in enumerate(priced):
            assert p.cost is not None and p.cost_low is not None and p.cost_high is not None
            ax.errorbar([p.time], [p.cost], xerr=[[p.time - p.time_low], [p.time_high - p.time]],
                        yerr=[[p.cost - p.cost_low], [p.cost_high - p.cost]], fmt="o" if p.front else "s",
                        color=f"C{i % 10}", markersize=9 if p.front else 6, capsize=4, zorder=3,
                        label=f"{_short(p.label)}{' (front)' if p.front else ''}")
            ax.annotate(_short(p.label, 28), (p.time, p.cost), textcoords="offset points", xytext=(6, 6), fontsize=8)
        front = sorted(((p.time, p.cost) for p in priced if p.front and p.cost is not None), key=lambda tc: tc[0])
        if len(front) > 1:
            ax.step([time for time, _ in front], [cost for _, cost in front], where="post", color="#d62728", lw=1.5,
                    alpha=0.7, zorder=2, label="Pareto front")
        low = min(p.cost_low for p in priced if p.cost_low is not None)
        for p in (p for p in points if p.cost is None):
            ax.axvline(p.time, color="#888888", ls=":", lw=1)
            ax.annotate(f"{_short(p.label, 28)} (no price)", (p.time, low), rotation=90, fontsize=7, color="#555555",
                        xytext=(3, 0), textcoords="offset points", va="bottom")
        ax.set_xlabel(f"time for {unit} (s)")
        ax.set_ylabel(f"cost for {unit} ({currency})")
        ax.grid(True, alpha=0.3)
    else:
        labels = [_short(p.label, 32) for p in points]
        ax.barh(labels, [p.time for p in points], xerr=[[p.time - p.time_low for p in points],
                                                        [p.time_high - p.time for p in points]],
                color="#1f4e9c", alpha=0.8, capsize=4)
        ax.invert_yaxis()
        ax.set_xlabel(f"time for {unit} (s); no target states a price")
        ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, fontsize=10)
    if priced:
        figure.legend(loc="outside right upper", fontsize=7.5, framealpha=0.9)
    return _png(figure)
