"""``modak whatif --report``: a self-contained HTML page of the what-if: the time-vs-cost plot with the Pareto front
and the ranked table, in the style of ``modak report`` (``templates/report/whatif.html.j2``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from modak.advise.whatif import WhatIf
from modak.paths import write_atomic
from modak.report.data import TargetPoint
from modak.report.html import _data_uri, environment
from modak.report.plots import whatif_png

TEMPLATE = "whatif.html.j2"


def points(result: WhatIf) -> list[TargetPoint]:
    """The plot's points, one per target, in rank order."""
    return [TargetPoint(o.target, o.time_seconds, o.time_low, o.time_high, o.cost, o.cost_low, o.cost_high,
                        bool(o.pareto)) for o in result.outcomes]


def render_whatif_report(result: WhatIf, generated_at: dt.datetime | None = None) -> str:
    from modak import __version__

    unit = result.basis.describe()
    currency = next((o.currency for o in result.outcomes if o.currency), None)
    plot = whatif_png(points(result), unit, currency,
                      f"{result.job}: predicted time and cost for {unit} on {len(result.outcomes)} targets")
    return environment().get_template(TEMPLATE).render(
        result=result, data=result.to_dict(), unit=unit, currency=currency, image=_data_uri(plot),
        version=__version__,
        generated_at=(generated_at or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds"))


def write_whatif_report(result: WhatIf, output: Path) -> Path:
    """Render the what-if report and write it to ``output`` atomically."""
    write_atomic(output, render_whatif_report(result), mode=0o644)
    return output
