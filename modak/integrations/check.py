"""``modak check``: fail a pipeline when a job's step time regresses against a stored baseline.

The *current* state is the plan of the job as it is now: the chosen candidate and its predicted step time,
plus, with ``--measured FILE`` (the output of ``modak bench --json``), the measured median step time of the
chosen candidate (or of the fastest measured candidate when the choice was not measured).

The *baseline* is a JSON file, one of:

* a baseline written by ``modak check --update`` (``"kind": "modak-check-baseline"``);
* the output of ``modak plan --json`` (predicted time only);
* the output of ``modak check --json`` (its ``current`` part is taken).

Each compared metric regresses when ``current > baseline * (1 + threshold)``; the predicted step time is always
compared, the measured one when both sides have one. Output schema: ``modak/schemas/check.schema.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from modak.documents import SCHEMA_VERSION, encoded, rounded
from modak.documents.check import BASELINE_KIND, BaselineDocument, CheckDocument, ComparisonRow, Snapshot
from modak.errors import InputError
from modak.limits import MAX_JSON_BYTES, read_bounded
from modak.paths import write_atomic

DEFAULT_THRESHOLD = 0.10
PREDICTED = "predicted_step_seconds"
MEASURED = "measured_step_seconds"


@dataclass(frozen=True)
class Comparison:
    metric: str
    baseline: float | None
    current: float | None
    threshold: float

    @property
    def compared(self) -> bool:
        return self.baseline is not None and self.current is not None and self.baseline > 0

    @property
    def change(self) -> float | None:
        """Relative change, ``current / baseline - 1`` (positive: slower)."""
        if not self.compared:
            return None
        assert self.baseline is not None and self.current is not None
        return self.current / self.baseline - 1

    @property
    def limit(self) -> float | None:
        return None if self.baseline is None else self.baseline * (1 + self.threshold)

    @property
    def status(self) -> str:
        change = self.change
        if change is None:
            return "not compared"
        if change > self.threshold:
            return "regressed"
        if change < -self.threshold:
            return "improved"
        return "ok"

    def record(self) -> ComparisonRow:
        """A row of the check's ``comparisons``."""
        change = self.change
        return ComparisonRow(metric=self.metric, baseline=self.baseline,  # type: ignore[arg-type]
                             current=self.current, change=None if change is None else round(change, 6),
                             limit=None if self.limit is None else rounded(self.limit),
                             status=self.status)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CheckResult:
    threshold: float
    baseline_file: str
    current: Snapshot
    baseline: Snapshot | None
    comparisons: tuple[Comparison, ...]
    updated: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def regressed(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.status == "regressed")

    @property
    def verdict(self) -> str:
        """``regression`` (exit code 9 unless ``--update``), ``pass``, or ``updated`` (no comparable baseline)."""
        if self.baseline is None:
            return "updated"
        return "regression" if self.regressed else "pass"

    @property
    def choice_changed(self) -> bool:
        return self.baseline is not None and self.baseline.choice != self.current.choice

    def message(self) -> str:
        """The one-line verdict."""
        job = f"{self.current.job} on {self.current.target}"
        if self.baseline is None:
            return f"UPDATED {job}: new baseline {self.baseline_file} " \
                   f"(predicted {_ms(self.current.predicted_step_seconds)} per step)"
        parts = []
        for c in self.comparisons:
            if c.compared:
                assert c.baseline is not None and c.current is not None and c.change is not None
                parts.append(f"{_label(c.metric)} {_ms(c.baseline)} -> {_ms(c.current)} ({c.change:+.1%})")
        limit = f"threshold {self.threshold:.0%}"
        changed = f"; choice changed to {self.current.choice}" if self.choice_changed else ""
        tail = f" (baseline updated: {self.baseline_file})" if self.updated else ""
        if self.regressed:
            return f"REGRESSION {job}: " + ", ".join(parts) + f" exceeds {limit}{changed}{tail}"
        return f"PASS {job}: " + ", ".join(parts) + f" within {limit}{changed}{tail}"

    def to_dict(self) -> dict[str, Any]:
        """``modak check --json``: a :class:`~modak.documents.check.CheckDocument`."""
        return encoded(CheckDocument(
            schema_version=SCHEMA_VERSION, verdict=self.verdict, message=self.message(),  # type: ignore[arg-type]
            threshold=self.threshold, baseline_file=self.baseline_file, updated=self.updated,
            choice_changed=self.choice_changed, baseline=self.baseline, current=self.current,
            comparisons=[c.record() for c in self.comparisons], notes=list(self.notes)))


def snapshot(plan: dict[str, Any], measured: list[dict[str, Any]] | None = None,
             notes: list[str] | None = None) -> Snapshot:
    """The snapshot of a plan (``Plan.to_dict()`` / ``modak plan --json``) and optional bench rows."""
    try:
        choice = next(c for c in plan["candidates"] if c["name"] == plan["choice"])
        value = None
        which = None
        if measured is not None:
            value, which = _measured(plan, choice, measured, notes if notes is not None else [])
        return Snapshot(job=plan["job"], target=plan["target"], choice=choice["name"], runtime=choice["runtime"],
                        device=choice["device"], precision=choice["precision"],
                        parameters=dict(choice["parameters"]), predictor=choice["predictor"],
                        predicted_step_seconds=float(choice["step_seconds"]),
                        predicted_objective_seconds=float(choice["objective_seconds"]),
                        measured_step_seconds=value, measured_candidate=which)
    except (KeyError, TypeError, ValueError, StopIteration) as exc:
        raise InputError(f"not a modak plan (schema_version 1): {type(exc).__name__}: {exc}") from None


def read_measured(path: Path) -> list[dict[str, Any]]:
    """The rows of ``modak bench --json`` output."""
    data = _read_json(path)
    if not isinstance(data, list) or not all(isinstance(r, dict) and "step_median_s" in r for r in data):
        raise InputError("expected the output of `modak bench --json` (a list of measured rows)", path)
    return data


def read_baseline(path: Path) -> Snapshot:
    """A baseline file: ``modak check --update``'s, ``modak plan --json``'s or ``modak check --json``'s output."""
    data = _read_json(path)
    if isinstance(data, dict) and data.get("kind") == BASELINE_KIND:
        body = data
    elif isinstance(data, dict) and isinstance(data.get("current"), dict) and "verdict" in data:
        body = data["current"]
    elif isinstance(data, dict) and "candidates" in data and "choice" in data:
        try:
            return snapshot(data)
        except InputError as exc:
            raise InputError(exc.message, path) from None
    else:
        raise InputError("not a baseline: expected the output of `modak check --update`, `modak plan --json` "
                         "or `modak check --json`", path)
    if data.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"schema_version {data.get('schema_version')!r} is not supported (expected "
                         f"{SCHEMA_VERSION})", path)
    names = set(Snapshot.__struct_fields__)
    missing = sorted(n for n in names - {"measured_step_seconds", "measured_candidate"} if n not in body)
    if missing:
        raise InputError(f"baseline lacks {', '.join(missing)}", path)
    values: dict[str, Any] = {n: body.get(n) for n in names}  # checked below
    for name in (PREDICTED, "predicted_objective_seconds", MEASURED):
        value = values[name]
        if value is None and name == MEASURED:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise InputError(f"{name} must be a number of seconds, not {value!r}", path)
        values[name] = float(value)
    if not isinstance(values["parameters"], dict):
        raise InputError("parameters must be an object", path)
    return Snapshot(**values)


def write_baseline(path: Path, current: Snapshot) -> None:
    baseline = BaselineDocument(
        **msgspec.structs.asdict(current), schema_version=SCHEMA_VERSION, kind=BASELINE_KIND,
        written_at=datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z"))
    write_atomic(path, json.dumps(encoded(baseline), indent=2, sort_keys=True) + "\n")


def check(plan: dict[str, Any], baseline_path: Path, threshold: float = DEFAULT_THRESHOLD,
          measured_path: Path | None = None, update: bool = False) -> CheckResult:
    """Compare ``plan`` (and measurements) with the baseline file; with ``update``, write the new baseline."""
    if not threshold >= 0:
        raise InputError(f"--threshold must be 0 or more (a fraction: 0.10 is 10%), not {threshold}")
    notes: list[str] = []
    rows = read_measured(measured_path) if measured_path is not None else None
    current = snapshot(plan, rows, notes)
    baseline: Snapshot | None = None
    if baseline_path.exists():
        baseline = read_baseline(baseline_path)
        if (baseline.job, baseline.target) != (current.job, current.target):
            if not update:
                raise InputError(f"is the baseline of job '{baseline.job}' on target '{baseline.target}', not of "
                                 f"'{current.job}' on '{current.target}' (use --update to replace it)", baseline_path)
            notes.append(f"replaced the baseline of job '{baseline.job}' on target '{baseline.target}'")
            baseline = None
    elif not update:
        raise InputError("no such baseline file: write one with `modak check JOB --baseline FILE --update` "
                         "or `modak plan JOB --json > FILE`", baseline_path)
    comparisons: tuple[Comparison, ...] = ()
    if baseline is not None:
        comparisons = (Comparison(PREDICTED, baseline.predicted_step_seconds, current.predicted_step_seconds,
                                  threshold),
                       Comparison(MEASURED, baseline.measured_step_seconds, current.measured_step_seconds,
                                  threshold))
        if current.measured_step_seconds is not None and baseline.measured_step_seconds is None:
            notes.append("the baseline has no measured step time: only the prediction is compared "
                         "(write one with --update --measured FILE)")
        elif baseline.measured_step_seconds is not None and current.measured_step_seconds is None:
            notes.append("the baseline has a measured step time but no --measured FILE was given: "
                         "only the prediction is compared")
        if (baseline.measured_candidate and current.measured_candidate
                and baseline.measured_candidate != current.measured_candidate):
            notes.append(f"measured candidates differ: baseline {baseline.measured_candidate}, "
                         f"current {current.measured_candidate}")
    if update:
        write_baseline(baseline_path, current)
    return CheckResult(threshold=threshold, baseline_file=str(baseline_path), current=current, baseline=baseline,
                       comparisons=comparisons, updated=update, notes=tuple(notes))


def format_table(result: CheckResult) -> Any:
    """A small rich table: one row per metric, then the choice."""
    from rich.table import Table

    table = Table(show_lines=False)
    for column in ("metric", "baseline", "current", "change", "limit", "status"):
        table.add_column(column, justify="left" if column in ("metric", "status") else "right", overflow="fold")
    for c in result.comparisons:
        if c.metric == MEASURED and c.baseline is None and c.current is None:
            continue
        change = c.change
        table.add_row(_label(c.metric), _ms(c.baseline), _ms(c.current),
                      "-" if change is None else f"{change:+.1%}", _ms(c.limit) if c.compared else "-", c.status)
    return table


def choice_line(result: CheckResult) -> str:
    if result.choice_changed:
        assert result.baseline is not None
        return f"choice changed: {result.baseline.choice} -> {result.current.choice}"
    return f"choice: {result.current.choice}" + (" (unchanged)" if result.baseline else "")


def _measured(plan: dict[str, Any], choice: dict[str, Any], rows: list[dict[str, Any]],
              notes: list[str]) -> tuple[float, str]:
    """The measured median step time of the plan's choice, else of the fastest measured candidate."""
    ok = [r for r in rows if r.get("status") == "ok" and isinstance(r.get("step_median_s"), (int, float))]
    if not ok:
        raise InputError("--measured: no row with status ok and a step time")
    names = {_key(c["runtime"], c["device"], c["precision"], c["parameters"]): c["name"] for c in plan["candidates"]}
    by_name: dict[str, float] = {}
    for row in ok:
        params = row.get("params") or "{}"
        try:
            key = _key(row["runtime"], row["device"], row["precision"],
                       json.loads(params) if isinstance(params, str) else params)
        except (KeyError, ValueError) as exc:
            raise InputError(f"--measured: a row is not a `modak bench --json` row ({exc})") from None
        name = names.get(key, f"{row['runtime']}/{row['device']}/{row['precision']} (not in the plan)")
        by_name[name] = min(float(row["step_median_s"]), by_name.get(name, float("inf")))
    if choice["name"] in by_name:
        return by_name[choice["name"]], choice["name"]
    name = min(by_name, key=lambda n: by_name[n])
    notes.append(f"the chosen candidate was not measured; using the fastest measured one, {name}")
    return by_name[name], name


def _key(runtime: str, device: str, precision: str, parameters: dict[str, Any]) -> str:
    return json.dumps([runtime, device, precision, parameters], sort_keys=True)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_bounded(Path(path), MAX_JSON_BYTES, "a JSON file").decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read: {exc}", path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON: {exc.msg}", path, exc.lineno) from None
    except RecursionError:
        raise InputError("not JSON modak can read: nested too deeply", path) from None


def _label(metric: str) -> str:
    return {PREDICTED: "predicted step", MEASURED: "measured step"}.get(metric, metric)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.4g} ms" if seconds < 1 else f"{seconds:.4g} s"
