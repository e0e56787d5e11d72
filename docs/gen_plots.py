"""The site's plots, drawn at every build from the measurements the repository stores (a MkDocs hook).

Nothing is fitted or predicted here: each plot reads files under ``perfmodels/`` as they are committed, so a plot
changes only when its data do. :data:`PLOTS` names each one's page path; a page shows one with
``![caption](img/NAME.svg)``.

* ``roofline-MACHINE``: every measured kernel of ``perfmodels/kernels-MACHINE.csv`` (``modak kernels`` rows:
  FLOPs and bytes from the graph, seconds per call from the runtime's profiler) at its arithmetic intensity and
  achieved GFLOP/s, under the machine's measured ceilings (the rows' ``peak_fp32_gflops`` and ``bandwidth_gbs``,
  from ``modak probe``);
* ``accuracy-MACHINE``: ``modak model eval --machine MACHINE --seeds 1 --json`` as stored in
  ``perfmodels/evals/kernels-MACHINE.json``: each predictor's MAPE by split (bars) and its picks' hit rate
  against the measured best (dots).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "perfmodels"
MACHINES = ("ci-zen4-2c", "ci-emeraldrapids-2c")  # the machines with kernel rows and a stored evaluation
FOLDER = "explanation/img"


def roofline(machine: str) -> bytes:
    """The measured kernels of ``machine`` on its roofline (log-log), coloured by op class."""
    import matplotlib.pyplot as plt

    points: dict[str, tuple[list[float], list[float]]] = {}
    peak = bandwidth = 0.0
    with (DATA / f"kernels-{machine}.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            flops, moved, seconds, calls = (float(row[k]) for k in ("flops", "bytes", "seconds", "calls"))
            peak, bandwidth = float(row["peak_fp32_gflops"]), float(row["bandwidth_gbs"])
            if flops > 0 and moved > 0 and seconds > 0 and row["precision"] == "fp32":
                xs, ys = points.setdefault(row["op"], ([], []))
                xs.append(flops / moved)
                ys.append(flops * calls / seconds / 1e9)
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for op, (xs, ys) in sorted(points.items(), key=lambda item: -len(item[1][0])):
        axes.scatter(xs, ys, s=4, alpha=0.5, label=f"{op} ({len(xs)})", rasterized=True)  # thousands of points
    low = min(min(xs) for xs, _ in points.values())
    high = max(max(xs) for xs, _ in points.values())
    ridge = peak / bandwidth
    axes.plot([low, ridge, high], [low * bandwidth, peak, peak], color="black", linewidth=1,
              label=f"ceilings: {bandwidth:g} GB/s, {peak:g} GFLOP/s")
    axes.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="achieved GFLOP/s",
             title=f"{machine}: measured fp32 kernels")
    axes.legend(fontsize=7, markerscale=3, loc="lower right")
    return _svg(figure)


def accuracy(machine: str) -> bytes:
    """The stored evaluation of ``machine``'s rows: MAPE by split and predictor, and the picks' hit rate."""
    import matplotlib.pyplot as plt

    evaluation = json.loads((DATA / "evals" / f"kernels-{machine}.json").read_text())
    entries = evaluation["entries"]
    splits = list(dict.fromkeys(e["split"] for e in entries))
    predictors = list(dict.fromkeys(e["predictor"] for e in entries))
    figure, axes = plt.subplots(figsize=(7, 4.2))
    hits = axes.twinx()
    width = 0.8 / len(predictors)
    for i, predictor in enumerate(predictors):
        scored = {e["split"]: e for e in entries if e["predictor"] == predictor}
        xs = [j + (i - (len(predictors) - 1) / 2) * width for j in range(len(splits))]
        bars = axes.bar(xs, [scored[s]["mape"] * 100 if s in scored else 0 for s in splits], width, label=predictor)
        hits.plot(xs, [scored[s]["hit_rate"] * 100 if s in scored else None for s in splits], "o",
                  color=bars.patches[0].get_facecolor(), markeredgecolor="black")
    axes.set_xticks(range(len(splits)), splits, fontsize=8)
    axes.set(ylabel="MAPE (%, bars)", title=f"{machine}: {evaluation['scored']} held-out rows, "
                                            f"{evaluation['models']} models")
    hits.set(ylabel="picks within the measured best (%, dots)", ylim=(0, 105))
    axes.legend(fontsize=7, loc="upper left")
    return _svg(figure)


PLOTS: dict[str, Callable[[], bytes]] = {
    **{f"{FOLDER}/roofline-{m}.svg": (lambda m=m: roofline(m)) for m in MACHINES},
    **{f"{FOLDER}/accuracy-{m}.svg": (lambda m=m: accuracy(m)) for m in MACHINES},
}


def _svg(figure: Any) -> bytes:
    import matplotlib
    import matplotlib.pyplot as plt

    out = io.BytesIO()
    figure.tight_layout()
    with matplotlib.rc_context({"svg.hashsalt": "modak"}):  # fixed element ids and no build date: the same data,
        figure.savefig(out, format="svg", metadata={"Date": None})  # the same bytes
    plt.close(figure)
    return out.getvalue()


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """Add each of :data:`PLOTS`, drawn now, to the site's files."""
    import matplotlib

    matplotlib.use("Agg")
    from mkdocs.structure.files import File

    for path, draw in PLOTS.items():
        files.append(File.generated(config, path, content=draw()))
    return files
