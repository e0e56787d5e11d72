"""The published GPU-sharing points (``perfmodels/published/gpu_sharing.csv``) and the comparison
``benchmarks/published/share_published.py`` makes on them: correctness, not timings."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

import pytest

from modak import api

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "perfmodels" / "published"


@pytest.fixture(scope="module")
def share() -> ModuleType:
    from benchmarks.published import share_published

    return share_published


def test_every_row_carries_its_source_and_quote(share: ModuleType) -> None:
    rows = list(csv.DictReader((FOLDER / "gpu_sharing.csv").open(newline="")))
    readme = (FOLDER / "README.md").read_text()
    roles = {row["point"]: row["role"] for row in rows}
    assert len(rows) >= 15 and len(roles) == len(rows)
    for row in rows:
        assert all(row[k] for k in ("source", "where", "quote", "gpu", "modak_gpu", "mode", "metric", "jobs", "unit",
                                    "alone", "shared", "published", "role")), row["point"]
        assert f"`{row['source']}`" in readme, row["source"]
        assert row["mode"] in {"mig", "mps", "time-slicing"} and row["role"] in {"compare", "calibration", "excluded"}
        point = share.Point(row)
        assert point.published == pytest.approx(float(row["published"]), rel=1e-4)  # computed from alone, shared
        if row["mode"] == "mig":
            assert point.profile.name == row["profile"]
        if row["zoo"]:
            assert row["batch_alone"] and row["modak_precision"]
        if row["calibrate_on"]:
            assert roles[row["calibrate_on"]] == "calibration"
        if row["role"] != "compare" or not row["zoo"] and row["mode"] != "mig":
            assert row["notes"]  # why it is left out, fitted to, or fitted


@pytest.mark.slow
def test_the_comparison_runs_on_every_row(share: ModuleType, tmp_path: Path) -> None:
    points = share.load(FOLDER / "gpu_sharing.csv")
    planner = share.Planner(api.predictor("roofline"), tmp_path)
    compared = 0
    for point in points:
        result = share.modelled(point, planner)
        if result is None:
            assert not point.row["zoo"] and not (point.mode == "mig" and point.metric == "slowdown")
            continue
        compared += 1
        value, utilization = result
        if point.metric == "slice_throughput":
            assert 0 < value <= 1  # a slice is no faster than the whole GPU (or the 7-slice instance)
        elif point.mode == "mig":
            assert value == 1.0  # slices isolate
        else:
            assert 0 < (utilization or 0) <= 1 and value >= 1
    lines: list[str] = []
    within = share.report(points, planner, share.TOLERANCE, lines.append)
    assert 0 <= within <= compared and lines[-1].startswith(f"{within}/{compared} points within 15%")
    held_out = share.calibrated(points, share.TOLERANCE, lines.append)
    assert lines[-1].startswith(f"{held_out}/") and "held-out" in lines[-1]


def test_the_fitted_load_gives_its_calibration_row_back(share: ModuleType) -> None:
    for anchor in (p for p in share.load(FOLDER / "gpu_sharing.csv") if p.row["role"] == "calibration"):
        job = share.fitted(anchor)
        assert share.shared_slowdown("mps", job, anchor.jobs, 0.0) == pytest.approx(anchor.published)
