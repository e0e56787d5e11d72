"""``modak whatif --report``: a self-contained HTML page of the what-if (its ``--json`` document): the time-vs-cost
plot with the Pareto front and the ranked table, in the style of ``modak report``
(``templates/report/whatif.html.j2``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from modak.paths import write_atomic
from modak.report.data import TargetPoint
from modak.report.html import _data_uri, environment
from modak.report.plots import whatif_png

TEMPLATE = "whatif.html.j2"


def points(document: dict[str, Any]) -> list[TargetPoint]:
    """The plot's points, one per target of a ``modak whatif --json`` document, in rank order."""
    points = []
    for t in document["targets"]:
        time_low, time_high = t["time_interval_seconds"]
        cost_low, cost_high = t["cost_interval"] or (None, None)
        points.append(TargetPoint(t["target"], t["time_seconds"], time_low, time_high, t["cost"], cost_low, cost_high,
                                  bool(t["pareto"])))
    return points


def basis_words(document: dict[str, Any]) -> str:
    basis = document["basis"]
    return f"the run ({basis['count']} steps)" if basis["kind"] == "run" else f"{basis['count']} {basis['kind']}"


def render_whatif_report(document: dict[str, Any], generated_at: dt.datetime | None = None) -> str:
    """The report's HTML for a ``modak whatif --json`` document."""
    from modak import __version__

    unit = basis_words(document)
    currency = next((t["currency"] for t in document["targets"] if t["currency"]), None)
    plot = whatif_png(points(document), unit, currency,
                      f"{document['job']}: predicted time and cost for {unit} on {len(document['targets'])} targets")
    return environment().get_template(TEMPLATE).render(
        data=document, unit=unit, currency=currency, image=_data_uri(plot), version=__version__,
        generated_at=(generated_at or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"))


def write_whatif_report(document: dict[str, Any], output: Path) -> Path:
    """Render the what-if report and write it to ``output`` atomically."""
    write_atomic(output, render_whatif_report(document), mode=0o644)
    return output
