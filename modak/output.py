"""What the command line prints: every command's terminal output and ``--json`` document, from the results the API
(:mod:`modak.api`) returns. Tables are :mod:`rich` tables; JSON documents carry the schema envelope
(:func:`modak.documents.document`)."""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from modak.documents import SCHEMA_VERSION, document, encoded

if TYPE_CHECKING:
    from rich.console import Console

    from modak.advise.pack import PackResult
    from modak.advise.whatif import WhatIf
    from modak.api import KernelFiles, ModelEvaluation, ModelFit, Probed
    from modak.build.pipeline import BuildResult
    from modak.build.submit import Submission
    from modak.candidates.enumerate import Candidate
    from modak.integrations.check import CheckResult
    from modak.plan import Plan
    from modak.predict.evaluate import Scores
    from modak.scaling import ScaleAdvice
    from modak.workload.analysis import WorkloadProfile

WIDTH = 160  # columns of the tables when stdout is neither a terminal nor given COLUMNS (CI logs, pipes)


def console(stderr: bool = False) -> Console:
    """A rich console as wide as the terminal (or ``COLUMNS``), else :data:`WIDTH`."""
    from rich.console import Console

    probe = Console(stderr=stderr)
    return Console(width=probe.width if probe.is_terminal or os.environ.get("COLUMNS") else WIDTH, stderr=stderr)


def print_json(data: Any, sort_keys: bool = True) -> None:
    """One JSON document on stdout (``--json``)."""
    print(json.dumps(data, indent=2, sort_keys=sort_keys))


def print_zoo(entries: list[Any]) -> None:
    for entry in entries:
        shapes = ", ".join(f"{k}{list(v)}" for k, v in entry.input_shapes.items())
        print(f"{entry.name:14} {shapes:32} {entry.description}")


def analysis_document(profile: WorkloadProfile) -> dict[str, Any]:
    """``modak analyze --json``: the model's totals and its operators by type (an :class:`AnalysisDocument`)."""
    from modak.documents.analysis import AnalysisDocument, OpType

    return encoded(AnalysisDocument(
        schema_version=SCHEMA_VERSION, model=profile.model_name, task=profile.task.value,  # type: ignore[arg-type]
        batch_size=profile.batch_size, parameters=profile.parameters, flops=profile.flops, bytes=profile.bytes,
        forward_flops=profile.forward_flops, forward_bytes=profile.forward_bytes,
        arithmetic_intensity=profile.arithmetic_intensity,
        op_types={k: OpType(count=c, flops=f, bytes=b) for k, (c, f, b) in profile.by_op_type().items()},
        shapes=profile.shapes_record()))


def print_analysis(profile: WorkloadProfile, as_json: bool) -> None:
    from modak.workload.analysis import format_table

    if as_json:
        print_json(analysis_document(profile), sort_keys=False)
    else:
        console().print(format_table(profile))


def launch_line(candidate: Candidate, result: dict) -> str:
    """One launch as the user reads it: its median, or why it failed, and whether it ran on a busy machine."""
    timing = (f"{result['step_median_s'] * 1e3:.3g} ms" if result.get("status") == "ok"
              else f"{result.get('status')}: {result.get('error')}")
    busy = result.get("busy")
    return (f"{candidate.name}: {timing}" + (f" — CONTENDED ({'; '.join(busy)})" if busy else "")
            + (" (launched again: the first try ran beside other work)" if result.get("retried_after") else ""))


def profile_line(candidate: Candidate, result: dict) -> str:
    """One profiled launch (``modak bench --kernels``): what its kernels add up to against its steps, or why none
    were stored."""
    if result.get("status") != "ok":
        return f"{candidate.name}: no kernel rows: {result.get('error')}"
    return (f"{candidate.name}: {result['kernels']} kernel rows, {result['kernel_s'] * 1e3:.3g} ms in kernels and "
            f"{result['unmapped_s'] * 1e3:.3g} ms outside them, of a {result['profiled_step_s'] * 1e3:.3g} ms "
            f"profiled step (unprofiled {result['step_s'] * 1e3:.3g} ms)")


def print_kernel_files(result: KernelFiles, imported: bool) -> None:
    """``modak kernels import`` / ``export``: each file and its rows."""
    for path, rows in result.files:
        print(f"{'read' if imported else 'wrote'} {rows} rows {'from' if imported else 'to'} {path}")
    if imported:
        print(f"stored in {result.store}")


def print_bench(rows: list[Any], launches: int, path: Any, as_json: bool) -> None:
    from dataclasses import asdict

    if as_json:
        print_json([asdict(r) for r in rows], sort_keys=False)
    ok = sum(r.status == "ok" for r in rows)
    contended = [r for r in rows if r.status == "contended"]
    print(f"{ok}/{len(rows)} candidates measured ({launches} launches each), stored in {path}", file=sys.stderr)
    if contended:
        print(f"modak: {len(contended)} candidate(s) ran on a busy machine even when launched again and are stored "
              "as 'contended' (not used by the model): measure again when the machine is quiet", file=sys.stderr)


def model_evaluation_document(evaluation: ModelEvaluation) -> dict[str, Any]:
    """``modak model eval --json``: an :class:`~modak.documents.evaluation.EvaluationDocument`."""
    from modak.documents import evaluation as doc
    from modak.documents import rounded
    from modak.predict.evaluate import FAMILIES, METRICS, SUBSET_METRICS, grouped, seed_spread

    def value(number: float) -> float | None:
        return None if math.isnan(number) else rounded(number)

    entries = []
    for (split, predictor), runs in grouped(evaluation.scores).items():
        spreads = {field: seed_spread([float(getattr(s, field)) for s in runs]) for field, _, _ in METRICS}
        first = runs[0]
        by_answerer = {part.answerer: doc.AnswererAccuracy(rows=part.rows, **{
            field: value(seed_spread([float(getattr(parts[i], field)) for parts in
                                      (run.by_answerer for run in runs)])[0]) for field in SUBSET_METRICS})
            for i, part in enumerate(first.by_answerer)}
        entries.append(doc.Entry(
            split=split, predictor=predictor,  # type: ignore[arg-type]
            seeds=[s.seed for s in runs if s.seed is not None], rows=first.rows, runs=first.runs,
            uncovered=first.uncovered, answered=dict(first.answered), workloads=first.workloads,
            no_stock=first.no_stock, by_answerer=by_answerer,
            spread={field: [rounded(low), rounded(high)] for field, (_, low, high) in spreads.items()
                    if len(runs) > 1 and not math.isnan(low)},
            **{field: value(mean) for field, (mean, _, _) in spreads.items()}))
    return encoded(doc.EvaluationDocument(
        schema_version=SCHEMA_VERSION, rows=evaluation.rows, models=evaluation.models,
        machines=list(evaluation.machines), machine=evaluation.machine, scored=evaluation.scored,
        families={name: list(models) for name, models in FAMILIES.items()}, entries=entries))


def print_model_evaluation(evaluation: ModelEvaluation, as_json: bool = False) -> None:
    if as_json:
        print_json(model_evaluation_document(evaluation), sort_keys=False)
        return
    print(f"{evaluation.rows} measured rows, {evaluation.models} models, {len(evaluation.machines)} target(s)"
          + (f"; scoring the {evaluation.scored} rows of {evaluation.machine}" if evaluation.machine else ""))
    print_scores(evaluation.scores)


def print_scores(scores: Iterable[Scores]) -> None:
    """Per split, a table of the predictors side by side; a metric over several seeds reads mean [min–max]."""
    from rich.table import Table

    from modak.predict.evaluate import METRICS, SUBSET_METRICS, grouped, seed_spread

    def cell(values: list[float], fmt: str) -> str:
        mean, low, high = seed_spread(values)
        if math.isnan(mean):
            return "-"
        text = format(mean, fmt)
        return text if low == high else f"{text} [{format(low, fmt).rstrip('%')}–{format(high, fmt)}]"

    groups = grouped(scores)
    counts = (("rows", "held-out rows scored"), ("runs", "rows taken as measured (runs)"),
              ("uncovered", "rows not covered"),
              ("workloads", "workloads (>= 2 scored rows)"), ("no_stock", "of them without a stock row"))
    out = console()
    for split in dict.fromkeys(split for split, _ in groups):
        columns = {predictor: runs for (s, predictor), runs in groups.items() if s == split}
        table = Table(title=split, title_justify="left")
        table.add_column("", no_wrap=True)
        for predictor in columns:
            table.add_column(predictor, justify="right")
        for field, label in counts:
            table.add_row(label, *(str(getattr(runs[0], field)) for runs in columns.values()))
        for answerer in dict.fromkeys(name for runs in columns.values() for name, _ in runs[0].answered):
            table.add_row(f"  answered by {answerer}",
                          *(str(dict(runs[0].answered).get(answerer, "-")) for runs in columns.values()))
        for field, label, fmt in METRICS:
            table.add_row(label, *(cell([getattr(s, field) for s in runs], fmt) for runs in columns.values()))
        labels = {field: (label, fmt) for field, label, fmt in METRICS}
        for i, part in enumerate(next(iter(columns.values()))[0].by_answerer):
            for field in SUBSET_METRICS:
                label, fmt = labels[field]
                table.add_row(f"  on the rows {part.answerer} answered: {label}",
                              *(cell([getattr(s.by_answerer[i], field) for s in runs], fmt)
                                for runs in columns.values()))
        out.print(table)
    seeded = {predictor: len(runs) for (_, predictor), runs in groups.items() if len(runs) > 1}
    for predictor, seeds in seeded.items():
        out.print(f"{predictor} over {seeds} seeds: mean [min–max]", highlight=False, markup=False)
    if any(s.one_launch for s in itertools.chain.from_iterable(groups.values())):
        out.print("verdicts on one launch each (protocol 1): a zero-width interval, the test is the point ratio "
                  "<= 1.05", highlight=False)


def print_model_fit(fit: ModelFit) -> None:
    print(f"fitted on {fit.rows} rows ({fit.local} from the local store) in {fit.seconds:.2f} s; "
          f"and cached as plain arrays for `modak plan` (refit whenever the data change; nothing is pickled)"
          + (f"; {fit.contended} contended row(s) left out (measured beside other work)" if fit.contended else ""))
    for name, count in fit.coverage:
        print(f"  covers {name}: {count} rows")


def print_probe(probed: Probed) -> None:
    from modak.hardware.probe import probe_comment

    print(probe_comment(probed.result), end="")
    print(f"cached as this machine's probe (target 'local', `cpu: local`): {probed.cached}" if probed.cached else
          "not cached as this machine's probe: it did not run alone (see the warning above)")
    if probed.written:
        print(f"wrote {probed.written}")
    if probed.kernels:
        k = probed.kernels
        print(f"kernel probe: {k.layers} of the zoo's {k.drawn_from} layers measured: {k.rows} kernel rows, "
              f"{k.reconciliations} reconciliations stored in {k.store} as machine {', '.join(k.machines) or '-'}")
        for (runtime, kind), error in sorted((k.errors[-1] if k.errors else {}).items()):
            print(f"  {runtime} {kind}: held-out error {error:.0%}")


def print_check(result: CheckResult, as_json: bool) -> None:
    from modak.integrations.check import choice_line, format_table

    if as_json:
        print_json(result.to_dict())
        print(result.message(), file=sys.stderr)
        return
    print(result.message())
    if result.comparisons:
        console().print(format_table(result))
    print(choice_line(result))
    for note in result.notes:
        print(f"note: {note}")


def print_render(plan: Plan, output: Any, rendered: Any, as_json: bool) -> None:
    if as_json:
        from modak.documents.render import RenderDocument

        print_json(encoded(RenderDocument(schema_version=SCHEMA_VERSION, output=str(output),
                                          choice=plan.choice.candidate.name, image=rendered.ir.image.ref,
                                          files=sorted(str(p) for p in rendered.files))), sort_keys=False)
    else:
        print(f"chose {plan.choice.candidate.name}")
        print(f"wrote {len(rendered.files)} files to {output}: " + ", ".join(sorted(p.name for p in rendered.files)))


def print_build(result: BuildResult, as_json: bool) -> None:
    data = result.to_dict()
    if as_json:
        print_json(data)
        return
    print(f"chose {data['choice']['candidate']}")
    print(f"built {data['image']['ref']} ({data['image']['id']}) in {data['seconds'].get('total', 0):.1f} s; "
          f"log {data['build_log']}")
    if data["requirements_lock"]:
        lock = data["requirements_lock"]
        print(f"requirements lock: {lock['packages']} packages, {lock['digest']} ({lock['file']})")
    if data["smoke_test"]:
        smoke = data["smoke_test"]
        print(f"smoke test: {smoke['runtime']}, {smoke['steps']} steps, {smoke['message']}")
        if "serve" in smoke:
            print(f"smoke test: the server answered one infer request in {smoke['serve']['latency_s'] * 1e3:.3g} ms")
    if data["pushed"]:
        print(f"pushed {data['pushed']['ref']} ({data['pushed']['digest']})")
    if data["oci_archive"]:
        print(f"saved {data['oci_archive']}")
    if data["sif"]:
        print(f"converted to {data['sif']}")
    if result.submission:
        print(f"submitted job {result.job_id}; output: {result.submission['output']}")


def print_submission(submission: Submission, as_json: bool) -> None:
    if as_json:
        print_json(document(submission.to_dict()))
        return
    print(f"submitted {submission.script} with {submission.command[0]}: job {submission.job_id}")
    if submission.state:
        print(f"job {submission.job_id} ended: {submission.state}"
              + (f" (exit {submission.exit_code})" if submission.exit_code is not None else ""))
    print(f"output: {submission.output}")


class BuildProgress:
    """The build's progress on stderr. On a terminal: a bar over the build's steps with the current step and its
    latest log line; otherwise one line per phase and per step (CI logs)."""

    def __init__(self) -> None:
        self.console = console(stderr=True)
        self.live = self.console.is_terminal
        self.progress: Any = None
        self.task: Any = None

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _bar(self) -> Any:
        if self.progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("[dim]{task.fields[line]}"),
                                     console=self.console, transient=True)
            self.task = self.progress.add_task("modak build", total=None, line="")
            self.progress.start()
        return self.progress

    def phase(self, text: str) -> None:
        if self.live:
            self._bar().console.print(f"modak: {text}", highlight=False)
            self._bar().update(self.task, description=text[:40], line="", total=None, completed=0)
        else:
            print(f"modak: {text}", file=sys.stderr, flush=True)

    def step(self, step: Any) -> None:
        if self.live:
            self._bar().update(self.task, total=step.total, completed=step.number - 1,
                               description=f"step {step.number}/{step.total}", line=step.instruction[:70])
        else:
            print(f"modak: step {step.number}/{step.total}: {step.instruction[:120]}", file=sys.stderr, flush=True)

    def line(self, text: str) -> None:
        if self.live and text.strip():
            self._bar().update(self.task, line=text.strip()[:70])


def print_scale(advice: ScaleAdvice, as_json: bool) -> None:
    from rich.table import Table

    if as_json:
        print_json(advice.to_dict())
        return
    out = console()
    out.print(f"[bold]{advice.job}[/] on [bold]{advice.target}[/]: data-parallel training of "
              f"{advice.candidate}, batch {advice.batch_size} per worker, min_efficiency "
              f"{advice.min_efficiency:g}")
    table = Table()
    for column in ("workers", "nodes x per node", "step ms", "samples/s", "efficiency", "all-reduce ms",
                   "exposed ms", "comm share", "algorithm"):
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    for point in advice.points:
        mark = "* " if point.workers == advice.chosen.workers else ""
        table.add_row(f"{mark}{point.workers}", f"{point.nodes} x {point.per_node}", f"{point.step_s * 1e3:.4g}",
                      f"{point.samples_per_second(advice.batch_size):.4g}", f"{point.efficiency:.3f}",
                      f"{point.comm_s * 1e3:.3g}", f"{point.exposed_s * 1e3:.3g}", f"{point.comm_share:.0%}",
                      point.algorithm or "")
    out.print(table)
    if advice.fit:
        fitted = Table(title="fit: measured vs predicted", title_justify="left")
        for column in ("workers", "measured ms", "predicted ms", "error"):
            fitted.add_column(column, justify="right")
        for workers, measured, predicted in advice.fit.residuals():
            fitted.add_row(str(workers), f"{measured * 1e3:.4g}", f"{predicted * 1e3:.4g}",
                           f"{predicted / measured - 1:+.1%}")
        out.print(fitted)
    for reason in advice.reasons:
        out.print(f"- {reason}", highlight=False)


def print_tune(result: Any, as_json: bool) -> None:
    from modak.bench.tune import describe, result_dict

    if as_json:
        print_json(document(result_dict(result)), sort_keys=False)
    else:
        print("\n".join(describe(result)))


def print_whatif(result: WhatIf, as_json: bool) -> None:
    from rich.table import Table

    if as_json:
        print_json(result.to_dict())
        return
    out = console()
    out.print(f"[bold]{result.job}[/] on {len(result.outcomes)} targets, ranked by {result.metric.value}; "
              f"time and cost for {result.basis.describe()}", highlight=False)
    table = Table()
    for column in ("#", "target", "candidate", "cores", "step ms (interval)", "samples/s", "time (interval)",
                   "cost (interval)", "Pareto"):
        table.add_column(column, justify="left" if column in ("target", "candidate", "Pareto") else "right",
                         overflow="fold")
    for o in result.outcomes:
        low, high = o.step_interval
        cost = ("-" if o.cost is None else
                f"{o.cost:.4g} ({o.cost_low:.3g}-{o.cost_high:.3g}) {o.currency}")
        table.add_row(str(o.rank), o.target, o.plan.choice.candidate.name, str(o.plan.ceilings.cores)
                      + (f" +{o.plan.loaded.target.scheduler.co_runners} busy" if o.sharing > 1 else ""),
                      f"{o.step_seconds * 1e3:.3g} ({low * 1e3:.3g}-{high * 1e3:.3g})",
                      f"{o.samples_per_second:.4g}",
                      f"{o.time_seconds:.4g} s ({o.time_low:.3g}-{o.time_high:.3g})", cost,
                      {True: "front", False: "", None: "unpriced"}[o.pareto])
    out.print(table)
    for line in whatif_lines(result):
        out.print(line, highlight=False)


def whatif_lines(result: WhatIf) -> list[str]:
    """The notes and the front of ``modak whatif`` in lines (below its table)."""
    lines = [f"- {note}" for note in result.notes]
    front = result.front
    if front:
        lines.append("- Pareto front (time against cost, fastest first): "
                     + ", ".join(f"{o.target} ({_seconds(o.time_seconds)}, {o.cost:.4g} {o.currency})" for o in front))
    best = result.outcomes[0]
    lines.append(f"- best for {result.metric.value}: {best.target} with {best.plan.choice.candidate.name}")
    return lines


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    if value < 120:
        return f"{value:.3g} s"
    return f"{value / 60:.3g} min" if value < 7200 else f"{value / 3600:.3g} h"


def pack_lines(result: PackResult) -> list[str]:
    """``modak pack``'s advice in lines: per group what shares and how, each job's slowdown, or why the jobs run
    apart."""
    from modak.documents import duration

    lines = []
    for index, group in enumerate(result.groups, 1):
        names = ", ".join(job.label for job in group.jobs)
        if group.chosen is None:
            lines.append(f"group {index} ({names}): run apart: {group.reason}")
            continue
        best = group.chosen
        lines.append(f"group {index} ({names}): share by {best.mode}, aggregate throughput {best.gain:.2f}x "
                     f"running them one after another; memory {best.memory_gb:.3g} of {best.capacity_gb:.3g} GB")
        for p in best.placements:
            assert p.slowdown is not None and p.step_seconds is not None
            limit = f" (limit {p.job.max_slowdown:g}x)" if p.job.max_slowdown else ""
            lines.append(f"  {p.job.label}: {p.share}: {p.plan.choice.candidate.name if p.plan else '-'}; "
                         f"step {duration(p.step_seconds)} vs {duration(p.job.alone_step)} alone: "
                         f"slowdown {p.slowdown:.2f}x{limit}")
        lines.append(f"  {group.reason}")
    return lines + [f"note: {note}" for note in result.notes]


def print_pack(result: PackResult, as_json: bool) -> None:
    if as_json:
        print_json(result.to_dict())
    else:
        for line in pack_lines(result):
            print(line)


def common_parameters(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per runtime with two or more of ``rows`` (plan candidates), the parameters all its rows set alike: what the
    plan table states once above the table instead of in every row."""
    by_runtime: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_runtime.setdefault(row["runtime"], []).append(row["parameters"])
    return {runtime: {k: v for k, v in params[0].items() if all(k in p and p[k] == v for p in params)}
            for runtime, params in by_runtime.items() if len(params) > 1}


def print_plan(plan: Plan, top: int, wide: bool = False) -> None:
    """The plan in a terminal: the workload, the ranked candidates and the reasons. Without ``wide``, a row's
    parameters are those that tell it from the other rows of its runtime (the shared ones are stated once above
    the table) and the roofline's terms are left out; ``wide`` shows every parameter and term."""
    from rich.table import Table

    from modak.candidates.candidate import value_key

    data = plan.to_dict()
    wl = data["workload"]
    out = console()
    if wide:
        out.width = max(out.width, WIDTH)
    out.print(f"[bold]{data['job']}[/] on [bold]{data['target']}[/]: {data['task']}, objective "
              f"{data['objective']['metric']}, {wl['model']} batch {wl['batch_size']}, "
              f"{wl['flops_per_step'] / 1e9:.3g} GFLOP and {wl['bytes_per_step'] / 1e6:.4g} MB per step, "
              f"intensity {wl['arithmetic_intensity']:.3g} FLOP/B")
    shown = data["candidates"][:top]
    # Without --wide, what every shown row has alike is said once above the table instead of in each row.
    alike = {} if wide else {key: values.pop() for key in ("device", "precision", "bound", "predictor")
                             if len(values := {row[key] for row in shown}) == 1}
    common = {} if wide else common_parameters(shown)
    if alike:
        out.print("every row below: " + ", ".join(f"{key} {value}" for key, value in alike.items()), highlight=False)
    for runtime, params in common.items():
        if params:
            out.print(f"every {runtime} row below: " + " ".join(f"{k}={value_key(v)}" for k, v in params.items()),
                      highlight=False)
    name_keys = [key for key in ("runtime", "device", "precision") if key not in alike]
    columns = ["#", "/".join(name_keys), "parameters", "step ms (interval)", "compile s", "objective ms",
               *(("compute ms", "memory ms", "overhead ms") if wide else ()),
               *(key for key in ("bound", "predictor") if key not in alike)]
    table = Table(show_lines=False)
    for column in columns:
        left = column in ("/".join(name_keys), "parameters", "bound", "predictor")
        table.add_column(column, justify="left" if left else "right", overflow="fold",
                         no_wrap=not wide and column in ("#", "/".join(name_keys), "step ms (interval)"))
    for row in shown:
        low, high = row["interval_seconds"]
        terms = row["roofline"]
        accuracy = row.get("accuracy")
        figure = (f" ({'top-1' if accuracy['metric'] == 'top1_agreement' else 'rel. error'} {accuracy['value']:.3g})"
                  if accuracy else "") + (" (failed the reference check here)" if row["failed_check"] else "")
        same = common.get(row["runtime"], {})
        terms_cells = (f"{terms['compute_s'] * 1e3:.3g}", f"{terms['memory_s'] * 1e3:.3g}",
                       f"{terms['overhead_s'] * 1e3:.3g}") if wide else ()
        table.add_row(str(row["rank"]), "/".join(row[key] for key in name_keys) + figure,
                      " ".join(f"{k}={value_key(v)}" for k, v in row["parameters"].items() if k not in same),
                      f"{row['step_seconds'] * 1e3:.3g} ({low * 1e3:.3g}-{high * 1e3:.3g})",
                      f"{row['compile_seconds']:.3g}", f"{row['objective_seconds'] * 1e3:.3g}", *terms_cells,
                      *(row[key] for key in ("bound", "predictor") if key not in alike))
    out.print(table)
    if data["batches"]:
        batches = Table(title="batch_size auto: each batch's choice", title_justify="left")
        for column in ("batch", "choice", "objective ms", "samples/s", "memory GB", "excluded by"):
            batches.add_column(column, justify="left" if column in ("choice", "excluded by") else "right",
                               overflow="fold")
        for option in data["batches"]:
            seconds, rate, memory = option["objective_seconds"], option["samples_per_second"], option["memory_gb"]
            batches.add_row(("* " if option["batch_size"] == wl["batch_size"] else "") + str(option["batch_size"]),
                            option["candidate"] or "", "" if seconds is None else f"{seconds * 1e3:.3g}",
                            "" if rate is None else f"{rate:.4g}", "" if memory is None else f"{memory:.3g}",
                            option["excluded"] or "")
        out.print(batches)
    if len(data["candidates"]) > top:
        out.print(f"... {len(data['candidates']) - top} more (--top N or --json)")
    if not wide:
        out.print("(--wide: every parameter of every row, and the roofline's compute, memory and overhead terms)",
                  highlight=False)
    for reason in data["reasons"]:
        out.print(f"- {reason}", highlight=False)
    if not data["tuned"]:
        out.print(f"- worth measuring here: {len(data['worth_tuning'])} candidates (the predicted top 3, those whose "
                  "spread (what the model's trees disagree between) overlaps the leader's, and stock): "
                  "`modak tune` races them and records the winner", highlight=False)
