"""`modak report`: the HTML report, checked in a real headless browser (Debian's chromium).

The report's own script records, after the page's load event, each plot's natural size and the share of its
pixels that are not white (drawn through a canvas) in ``<body data-plots=...>``; ``--dump-dom`` prints the DOM
after that handler ran, so a plot that did not decode reads ``0x0``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from modak.api import load as load_job
from modak.bench.harness import measurement_row
from modak.measurements.store import PerfStore
from modak.plan import make_plan
from modak.predict.default import default_predictor
from modak.predict.roofline import RooflinePredictor
from modak.report import data, render_report, write_report
from modak.workload.source import load_analysis, resolve_model

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium is not installed: run `.ci/provision.sh chromium` "
                "(apt-get install -y chromium chromium-driver)")


def dump_dom(page: Path, tmp_path: Path) -> str:
    """The page's DOM after load, as headless Chromium serializes it."""
    profile = tmp_path / f"profile-{page.stem}"
    profile.mkdir()
    process = subprocess.Popen([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                                page.resolve().as_uri()], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the browser's own process group only
        process.communicate()
        pytest.fail(f"chromium did not dump {page} within 60 s")
    assert process.returncode == 0 and "<html" in out, f"chromium failed ({process.returncode}): {err[-2000:]}"
    return out


class Page(HTMLParser):
    """Attributes and texts of the elements the tests look at."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.rows: list[str] = []  # data-name of the ranked table's rows, in order
        self.tags: set[str] = set()
        self.texts: dict[str, str] = {}
        self._capture: str | None = None
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        if tag == "body":
            self.body = values
        if tag == "tr" and "candidate" in values.get("class", "").split():
            self.rows.append(values["data-name"])
        if values.get("id") in ("onnx-path", "model-name"):
            self._capture = values["id"]
            self.texts[self._capture] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "dd":
            self._capture = None

    def handle_data(self, text: str) -> None:
        if self._capture:
            self.texts[self._capture] += text


def plots(page: Page) -> dict[str, tuple[int, int, float]]:
    found = {}
    for item in page.body.get("data-plots", "").split():
        name, size, ink = item.split(":")
        width, height = size.split("x")
        found[name] = (int(width), int(height), float(ink))
    return found


@pytest.mark.slow
def test_cnn_report_renders_in_a_browser(tmp_path: Path) -> None:
    output = tmp_path / "out" / "report.html"
    result = subprocess.run([sys.executable, "-m", "modak", "report", str(CNN), "-o", str(output)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"wrote {output}" in result.stdout
    html = output.read_text()
    # self-contained: every src is a data URI, nothing links out
    assert re.findall(r'\bsrc="([^"]*)"', html) and all(
        s.startswith("data:image/png;base64,") for s in re.findall(r'\bsrc="([^"]*)"', html))
    assert not re.search(r'\b(href|src)="(https?:|//)', html) and "<link" not in html

    page = Page(dump_dom(output, tmp_path))
    rendered = plots(page)
    assert set(rendered) == {"roofline", "trajectory"}, page.body
    for name, (width, height, ink) in rendered.items():
        assert width > 0 and height > 0, f"{name} did not decode in the browser: {page.body}"
        assert ink > 0.02, f"{name} decoded but is blank ({ink:.2%} non-white pixels)"

    # the table lists the plan's candidates, in rank order (the CLI's default predictor, same inputs)
    loaded = load_job(CNN)
    plan = make_plan(loaded, *load_analysis(loaded), default_predictor())
    assert page.rows == [r.candidate.name for r in plan.ranked]
    assert len(page.rows) >= 6

    # the check can fail: a plot that does not decode reads 0x0
    broken = tmp_path / "broken.html"
    broken.write_text(re.sub(r'(id="trajectory" class="plot" src=")[^"]*', r"\1data:image/png;base64,AAAA", html))
    rendered = plots(Page(dump_dom(broken, tmp_path)))
    assert rendered["trajectory"][:2] == (0, 0) and rendered["roofline"][0] > 0


@pytest.mark.slow
def test_report_escapes_paths_and_shows_local_measurements(tmp_path: Path) -> None:
    # Names are restricted, but a model path may carry markup characters.
    cnn_onnx = resolve_model(load_job(CNN)).onnx_path
    folder = tmp_path / "models <i>&"
    folder.mkdir()
    hostile = folder / 'cnn<marquee>x<marquee>"&.onnx'
    shutil.copy(cnn_onnx, hostile)
    for extra in cnn_onnx.parent.glob(f"{cnn_onnx.name}.*"):  # external weight data keeps its recorded name
        shutil.copy(extra, folder / extra.name)
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "apiVersion": "modak/v1", "kind": "Job", "name": "hostile-cnn",
        "target": str(CNN.parent / "target.yaml"), "task": "inference",
        "model": {"onnx": str(hostile.relative_to(tmp_path)), "input_shape": [1, 28, 28], "batch_size": 8},
        "precision": ["fp32"]}))
    loaded = load_job(job)
    source, profile = load_analysis(loaded)
    predictor = RooflinePredictor()
    plan = make_plan(loaded, source, profile, predictor)
    store = tmp_path / "perf.sqlite"
    measured = plan.ranked[1].candidate
    with PerfStore(store) as perf:
        perf.add([measurement_row(plan, measured, {"status": "ok", "step_median_s": 2e-3, "step_p10_s": 1.9e-3,
                                                   "step_p90_s": 2.2e-3, "repeats": 10})])
    output = write_report(plan, predictor, tmp_path / "hostile.html", store)
    html = output.read_text()
    assert "<marquee" not in html and "<i>" not in html
    assert "cnn&lt;marquee&gt;x&lt;marquee&gt;&#34;&amp;" in html

    page = Page(dump_dom(output, tmp_path))
    assert "marquee" not in page.tags and "i" not in page.tags
    assert page.texts["onnx-path"] == str(hostile)  # shown literally, as text
    assert page.texts["model-name"] == hostile.stem
    assert all(w > 0 and h > 0 for w, h, _ in plots(page).values()) and len(plots(page)) == 2
    # the local measurement is on the plot and in the table, at workload FLOPs / measured step
    points = data.measured_points(plan, store)
    assert [p.source for p in points] == ["measured (local store)"]
    assert points[0].gflops == pytest.approx(plan.workload.flops / 2e-3 / 1e9)
    assert 'id="measured"' in html and measured.runtime in html and "local store" in html


@pytest.mark.slow
def test_report_data_follows_the_roofline() -> None:
    loaded = load_job(CNN)
    source, profile = load_analysis(loaded)
    predictor = RooflinePredictor()
    plan = make_plan(loaded, source, profile, predictor)
    roof = data.roof_of(plan)
    assert roof.precision == plan.choice.candidate.precision.value and roof.peaks[0][1] >= roof.peak
    ops, skipped = data.op_points(profile, roof)
    assert len(ops) + skipped == len(profile.ops) and ops
    for op in ops:
        assert op.gflops == pytest.approx(min(roof.peak, op.flops / op.bytes * roof.bandwidth_gbs))
    chosen = data.chosen_point(plan)
    step = plan.choice.prediction.step_seconds
    assert chosen.gflops == pytest.approx(profile.flops / step / 1e9)
    assert chosen.low_gflops < chosen.gflops < chosen.high_gflops
    assert not roof.above(chosen)  # the roofline predictor never beats its own roof

    path = data.trajectory(plan, predictor)
    assert path.seconds < 10 and not path.notes
    assert {p.batch for p in path.points} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert {p.threads for p in path.points} == {1, 2}  # the example target has 2 cores
    job_point = [p for p in path.points if p.is_job]
    assert len(job_point) == 1 and job_point[0].gflops == pytest.approx(chosen.gflops)
    full = sorted((p for p in path.points if p.threads == 2), key=lambda p: p.batch)
    assert all(a.intensity < b.intensity for a, b in zip(full, full[1:]))  # weights amortize over the batch
    assert data.batch_sizes(3) == [1, 2, 3, 4, 8, 12] and len(data.batch_sizes(4096)) <= data.MAX_BATCHES
    assert {1, 4096, 16384} <= set(data.batch_sizes(4096))
    assert data.thread_counts(None, 8) == [None] and data.thread_counts(64, 64)[-1] == 64
    assert len(data.thread_counts(12, 96)) <= data.MAX_THREAD_COUNTS and 12 in data.thread_counts(12, 96)

    # the HTML is deterministic for a fixed time (no dates or random ids in the plots)
    first = render_report(plan, predictor, generated_at=_fixed())
    assert first == render_report(plan, predictor, generated_at=_fixed())


def _fixed():
    import datetime as dt

    return dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
