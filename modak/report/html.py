"""Render the report: one self-contained HTML file (plots embedded as PNG data URIs, inline CSS and script).

The template is ``templates/report/report.html.j2``, rendered with autoescaping on: job names, paths and
reasons are data, never markup.
"""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from modak.paths import data_dir, write_atomic
from modak.plan import Plan
from modak.predict.base import Predictor
from modak.report import data
from modak.report.plots import roofline_png, trajectory_png

TEMPLATE = "report.html.j2"


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(data_dir("templates") / "report"), undefined=StrictUndefined,
                      autoescape=True, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["g"] = lambda value, digits=3: f"{value:.{digits}g}"
    env.filters["ms"] = lambda seconds: f"{seconds * 1e3:.3g}"
    return env


def render_report(plan: Plan, predictor: Predictor, store: Path | None = None,
                  generated_at: dt.datetime | None = None) -> str:
    """The report's HTML for ``plan`` (``predictor`` is the one that made the plan; ``store`` the local
    perf store whose measurements of this workload are shown, default ``$MODAK_STORE`` or the user's)."""
    from modak import __version__

    workload, job, target, source = plan.workload, plan.loaded.job, plan.loaded.target, plan.source
    roof = data.roof_of(plan)
    ops, skipped = data.op_points(workload, roof)
    chosen = data.chosen_point(plan)
    measured = data.measured_points(plan, store)
    path = data.trajectory(plan, predictor)
    where = f"{roof.name} ({roof.device}, {'measured' if roof.measured else 'catalog'} ceilings)"
    roofline = roofline_png(roof, ops, chosen, measured,
                            f"{job.name}: {workload.model_name} batch {workload.batch_size} on {target.name}, {where}")
    trajectory = trajectory_png(roof, path, plan.ceilings.cores,
                                f"{path.runtime}: predicted performance across batch sizes and thread counts")
    context: dict[str, Any] = {
        "plan": plan.to_dict(),
        "job": job,
        "target": target,
        "workload": workload,
        "source": {"name": source.name, "onnx_path": str(source.onnx_path), "zoo": source.zoo,
                   "input_shapes": ", ".join(f"{k}{v}" for k, v in source.input_shapes.items())},
        "roof": roof,
        "predictor": predictor.name,
        "op_classes": [{"name": name, "count": g.count, "flops": g.flops, "bytes": g.bytes,
                        "intensity": g.flops / g.bytes if g.bytes else None}
                       for name, g in workload.by_op_class().items()],
        "skipped_ops": skipped,
        "chosen": chosen,
        "ranked": [{"rank": i, "ranked": r, "point": data.predicted_point(plan, i - 1),
                    "settings": " ".join(f"{k}={v}" for k, v in
                                         plan.to_dict()["candidates"][i - 1]["parameters"].items())}
                   for i, r in enumerate(plan.ranked, 1)],
        "measured": measured,
        "trajectory": path,
        "images": {"roofline": _data_uri(roofline), "trajectory": _data_uri(trajectory)},
        "version": __version__,
        "digest": plan.digest(),
        "generated_at": (generated_at or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
    }
    return environment().get_template(TEMPLATE).render(context)


def write_report(plan: Plan, predictor: Predictor, output: Path, store: Path | None = None) -> Path:
    """Render the report and write it to ``output`` atomically."""
    write_atomic(output, render_report(plan, predictor, store), mode=0o644)
    return output


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
