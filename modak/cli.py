"""The ``modak`` command line. Errors print as one line; exit codes are documented in the README."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from modak.documents import document
from modak.errors import EXIT_FAILURE, EXIT_INTERRUPTED, InputError, ModakError
from modak.paths import refusal


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _check_paths(args)
        return args.handler(args) or 0
    except ModakError as exc:
        print(f"modak: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("modak: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in modak: one line unless asked for the traceback
        if os.environ.get("MODAK_DEBUG"):
            raise
        print(f"modak: internal error: {type(exc).__name__}: {exc} (set MODAK_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return EXIT_FAILURE


def _check_paths(args: argparse.Namespace) -> None:
    """A path argument the operating system refuses (:func:`modak.paths.refusal`) is bad input."""
    for name, value in vars(args).items():
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, Path) and (reason := refusal(path)):
                raise InputError(f"cannot use this path: {reason}", path, field=name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modak", description="Plan, render and build tuned containers for "
                                     "deep-learning jobs.")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int | None], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    def protocol_args(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--launches", type=int, default=3,
                         help="launches per candidate, in interleaved rounds of random order (default 3)")
        sub.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per launch, at least (1)")
        sub.add_argument("--budget", type=float, default=10.0, help="timed seconds per launch, at most (10)")
        sub.add_argument("--seed", type=int, default=None, help="seed of the rounds' order (default: random)")

    def job_args(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("job", type=Path, help="job spec (YAML)")
        sub.add_argument("--target", "-t", type=Path, help="target spec (YAML), or 'local' for this machine (its "
                                                           "cached probe); overrides the job's 'target'")
        sub.add_argument("--predictor", choices=["default", "roofline"], default="default",
                         help="default: learned model where measured data covers the runtime, else roofline")
        sub.add_argument("--store", type=Path, help="local perf store: its measurements are learned from (and "
                         "`bench` adds to it); default $MODAK_STORE or ~/.local/share/modak/perf.sqlite")

    sub = command("schema", _cmd_schema, "print the JSON Schema of the Job and Target specs")
    sub.add_argument("kind", nargs="?", choices=["job", "target"], help="only this spec")

    sub = command("zoo", _cmd_zoo, "list the reference architectures of the model zoo")

    sub = command("analyze", _cmd_analyze, "per-operator FLOPs and bytes of a job's model")
    job_args(sub)
    sub.add_argument("--json", action="store_true", help="machine-readable output")

    sub = command("plan", _cmd_plan, "rank candidate deployments and pick one")
    job_args(sub)
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")
    sub.add_argument("--top", type=int, default=15, help="rows of the table (default 15; --json lists all)")

    sub = command("bench", _cmd_bench, "measure candidate deployments on this machine and store the results")
    job_args(sub)
    sub.add_argument("--candidates", nargs="+", default=["all"], metavar="SEL",
                     help="all (default), top-K by prediction, or candidate/runtime names")
    protocol_args(sub)
    sub.add_argument("--json", action="store_true", help="print the measured rows as JSON")

    sub = command("tune", _cmd_tune, "measure the plan's shortlist on this target, race it, and record the winner "
                                     "for `modak plan`/`modak build`")
    job_args(sub)
    sub.add_argument("--budget", type=float, default=600.0, help="wall-clock seconds for the race (default 600)")
    sub.add_argument("--trials", type=int, default=8, help="candidates raced, at most (default 8)")
    sub.add_argument("--dispatch", choices=["local", "slurm"], default="local",
                     help="run launches here (default) or as Slurm job arrays on the target's partition")
    sub.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per launch, at least (1)")
    sub.add_argument("--seed", type=int, default=None, help="seed of the rounds' order (default: random)")
    sub.add_argument("--json", action="store_true", help="print the race as JSON")

    sub = command("probe", _cmd_probe, "measure this machine's ceilings, cache them as target 'local' and "
                                        "optionally write a Target file")
    sub.add_argument("-o", "--output", type=Path, help="Target YAML to write")
    sub.add_argument("--name", default=None, help="target name (default: the host name)")
    sub.add_argument("--quick", action="store_true", help="smaller problem sizes (seconds, less accurate)")

    sub = command("model", _cmd_model, "fit or evaluate the learned performance model")
    sub.add_argument("action", choices=["fit", "eval"], help="fit: refit and summarize; eval: cross-validate")
    sub.add_argument("--store", type=Path, help="local perf store to include (default: $MODAK_STORE or ~/.local/share/modak)")
    sub.add_argument("--seeds", type=int, default=3,
                     help="eval: fit the learned model with seeds 0..N-1 and report the spread (default 3)")
    sub.add_argument("--machine", metavar="TARGET",
                     help="eval: hold out and score only this target's rows (the others still train)")

    sub = command("scale", _cmd_scale, "predict data-parallel training on 1..N workers (step time, throughput, "
                                        "efficiency) and the largest N that keeps the job's min_efficiency")
    job_args(sub)
    sub.add_argument("--max-workers", type=int, metavar="N",
                     help="most workers to consider (default: scaling.max_workers, else all the target has)")
    sub.add_argument("--measured", nargs="+", default=[], metavar="N=SECONDS",
                     help="measured seconds per step with N workers (e.g. 1=0.210 2=0.236): the model fits its "
                          "bandwidth, overlap and latency to them, as far as the points determine them")
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")

    sub = command("render", _cmd_render, "write Dockerfile, Singularity.def, entrypoint, job script and plan")
    job_args(sub)
    sub.add_argument("-o", "--output", type=Path, required=True, help="output folder (a build context)")
    sub.add_argument("--json", action="store_true", help="print what was written as JSON")

    sub = command("build", _cmd_build, "render, build, label, smoke-test and optionally push and submit the image")
    job_args(sub)
    sub.add_argument("-o", "--output", type=Path, help="output folder (default out/<job name>)")
    sub.add_argument("--engine", choices=["docker", "podman", "apptainer"],
                     help="container engine (default: the target's container.engine)")
    sub.add_argument("--push", action="store_true", help="push to the target's registry, pull back, check labels")
    sub.add_argument("--no-smoke", dest="smoke", action="store_false", help="skip the image's self-test")
    sub.add_argument("--submit", action="store_true", help="then submit the job script (see `modak submit`)")
    sub.add_argument("--oci-archive", type=Path, metavar="FILE",
                     help="also save the image as a docker-archive tar (apptainer build x.sif docker-archive://FILE)")
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")

    sub = command("submit", _cmd_submit, "render the job and submit its job script (sbatch, qsub or bash)")
    job_args(sub)
    sub.add_argument("-o", "--output", type=Path, help="output folder (default out/<job name>)")
    sub.add_argument("--wait", nargs="?", type=float, const=3600.0, default=None, metavar="SECONDS",
                     help="wait for the job to end (at most SECONDS, default 3600)")
    sub.add_argument("--json", action="store_true", help="print the submission as JSON")

    sub = command("check", _cmd_check, "fail (exit 9) when the job's step time regressed against a baseline")
    job_args(sub)
    sub.add_argument("--baseline", type=Path, required=True, metavar="FILE",
                     help="baseline JSON: written by --update, or the output of `modak plan --json`")
    sub.add_argument("--threshold", type=float, default=0.10,
                     help="allowed slowdown as a fraction (default 0.10: 10%%)")
    sub.add_argument("--measured", type=Path, metavar="FILE",
                     help="`modak bench --json` output: also compare the measured step time")
    sub.add_argument("--update", action="store_true", help="write the current state as the new baseline (exit 0)")
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")

    sub = command("whatif", _cmd_whatif, "plan the job on several targets: best candidate, predicted step, time to "
                                          "solution and cost on each, ranked, with the Pareto front of time vs cost")
    sub.add_argument("job", type=Path, help="job spec (YAML); its own 'target' is replaced by each of --targets")
    sub.add_argument("--targets", type=Path, nargs="+", required=True, metavar="TARGET", help="target specs (YAML)")
    sub.add_argument("--predictor", choices=["default", "roofline"], default="default",
                     help="default: learned model where measured data covers the runtime, else roofline")
    sub.add_argument("--store", type=Path, help="local perf store the learned model also learns from")
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")
    sub.add_argument("--report", type=Path, metavar="HTML", help="also write an HTML report with the time-vs-cost plot")

    sub = command("pack", _cmd_pack, "co-location advice: which jobs can share a node's cores or a GPU (MPS, MIG, "
                                      "time-slicing), each job's predicted slowdown and the aggregate throughput")
    sub.add_argument("jobs", type=Path, nargs="+", metavar="JOB", help="job specs (YAML), at least two")
    sub.add_argument("--target", "-t", type=Path, required=True, help="the target they would share (YAML or 'local')")
    sub.add_argument("--predictor", choices=["default", "roofline"], default="default",
                     help="default: learned model where measured data covers the runtime, else roofline")
    sub.add_argument("--store", type=Path, help="local perf store the learned model also learns from")
    sub.add_argument("--modes", nargs="+", default=["cores", "time-slicing", "mps", "mig"], metavar="MODE",
                     choices=["cores", "time-slicing", "mps", "mig"],
                     help="ways of sharing allowed (default all): cores (disjoint core sets), time-slicing, mps, mig")
    sub.add_argument("--render", type=Path, metavar="DIR",
                     help="render every job into DIR/<job>/ with its share (core set, MPS or MIG settings in job.sh) "
                          "and write DIR/pack.json")
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")

    sub = command("report", _cmd_report, "write a self-contained HTML report: rooflines, trajectory, ranked table")
    job_args(sub)
    sub.add_argument("-o", "--output", type=Path, required=True, help="HTML file to write")
    return parser


def _version() -> str:
    from modak import __version__

    return f"modak {__version__}"


def _cmd_schema(args: argparse.Namespace) -> int:
    from modak.spec.models import Job, Target

    schemas = {"job": Job.model_json_schema(), "target": Target.model_json_schema()}
    print(json.dumps(schemas[args.kind] if args.kind else schemas, indent=2))
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from modak.image.zoo import ZOO

    for entry in ZOO.values():
        shapes = ", ".join(f"{k}{list(v)}" for k, v in entry.input_shapes.items())
        print(f"{entry.name:14} {shapes:32} {entry.description}")
    return 0


def _plan(args: argparse.Namespace, predictor: Any = None) -> Any:
    from modak import api

    return api.plan_job(args.job, args.target, args.predictor, args.store, using=predictor)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from modak import api
    from modak.workload.analysis import format_table
    from modak.workload.source import load_analysis

    _, profile = load_analysis(api.load(args.job, args.target))
    if args.json:
        print(json.dumps({
            "model": profile.model_name, "task": profile.task.value, "batch_size": profile.batch_size,
            "parameters": profile.parameters, "flops": profile.flops, "bytes": profile.bytes,
            "forward_flops": profile.forward_flops, "forward_bytes": profile.forward_bytes,
            "arithmetic_intensity": profile.arithmetic_intensity,
            "op_types": {k: {"count": c, "flops": f, "bytes": b} for k, (c, f, b) in profile.by_op_type().items()},
        }, indent=2))
    else:
        _console().print(format_table(profile))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    plan = _plan(args)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, sort_keys=True))
    else:
        _print_plan(plan, args.top)
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    import time

    from modak.predict.evaluate import evaluate, format_scores
    from modak.predict.training import ok_rows, training_set
    from modak.predict.learned import LearnedPredictor

    data = training_set(args.store)
    rows, weights = data.load()
    usable = ok_rows(rows)
    if not usable:
        raise InputError("no measured rows: ship perfmodels/*.csv or run `modak bench` first")
    if args.action == "eval":
        machines = sorted({r.machine for r in usable})
        if args.machine is not None and args.machine not in machines:
            raise InputError(f"--machine {args.machine}: no measured rows of that target (there are: "
                             f"{', '.join(machines)})")
        scored = [r for r in usable if args.machine in (None, r.machine)]
        print(f"{len(usable)} measured rows, {len({r.model for r in usable})} models, {len(machines)} target(s)"
              + (f"; scoring the {len(scored)} rows of {args.machine}" if args.machine else ""))
        print(format_scores(evaluate(usable, args.seeds, machine=args.machine)))
        return 0
    start = time.perf_counter()
    model = LearnedPredictor.cached(data, refit=True)
    seconds = time.perf_counter() - start
    used = {id(r) for r in usable}
    local = sum(w > 1 for w, r in zip(weights, rows) if id(r) in used)
    contended = sum(r.status == "contended" for r in rows)
    print(f"fitted on {model.rows} rows ({local} from the local store) in {seconds:.2f} s; "
          f"and cached as plain arrays for `modak plan` (refit whenever the data change; nothing is pickled)"
          + (f"; {contended} contended row(s) left out (measured beside other work)" if contended else ""))
    for runtime, device, precision in sorted(model.coverage):
        count = sum((r.runtime, r.device, r.precision) == (runtime, device, precision) for r in usable)
        print(f"  covers {runtime}/{device}/{precision}: {count} rows")
    return 0


def _measured_points(values: list[str]) -> dict[int, float]:
    points: dict[int, float] = {}
    for value in values:
        workers, _, seconds = value.partition("=")
        try:
            count, step = int(workers), float(seconds)
        except ValueError:
            count, step = 0, 0.0
        if count < 1 or not step > 0 or step == float("inf"):
            raise InputError(f"--measured {value}: give WORKERS=SECONDS, e.g. 2=0.236 (a positive whole number of "
                             "workers and seconds per step)")
        points[count] = step
    return points


def _cmd_scale(args: argparse.Namespace) -> int:
    from modak.scaling import advise

    if args.max_workers is not None and args.max_workers < 1:
        raise InputError(f"--max-workers {args.max_workers}: give a positive number of workers")
    measured = _measured_points(args.measured)
    plan = _plan(args)
    advice = advise(plan, max_workers=args.max_workers, measured=measured,
                    single_node=plan.loaded.target.scheduler.kind == "none")
    if args.json:
        print(json.dumps(advice.to_dict(), indent=2, sort_keys=True))
    else:
        _print_scale(advice)
    return 0


def _print_scale(advice: Any) -> None:
    from rich.table import Table

    console = _console()
    console.print(f"[bold]{advice.job}[/] on [bold]{advice.target}[/]: data-parallel training of "
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
    console.print(table)
    if advice.fit:
        fitted = Table(title="fit: measured vs predicted", title_justify="left")
        for column in ("workers", "measured ms", "predicted ms", "error"):
            fitted.add_column(column, justify="right")
        for workers, measured, predicted in advice.fit.residuals():
            fitted.add_row(str(workers), f"{measured * 1e3:.4g}", f"{predicted * 1e3:.4g}",
                           f"{predicted / measured - 1:+.1%}")
        console.print(fitted)
    for reason in advice.reasons:
        console.print(f"- {reason}", highlight=False)


def _cmd_render(args: argparse.Namespace) -> int:
    from modak import api

    plan = _plan(args)
    rendered = api.render_plan(plan, args.output)
    if args.json:
        print(json.dumps(document({"output": str(args.output), "choice": plan.choice.candidate.name,
                                       "image": rendered.ir.image.ref,
                                       "files": sorted(str(p) for p in rendered.files)}), indent=2))
    else:
        print(f"chose {plan.choice.candidate.name}")
        print(f"wrote {len(rendered.files)} files to {args.output}: "
              + ", ".join(sorted(p.name for p in rendered.files)))
    return 0


class _BuildProgress:
    """The build's progress on stderr. On a terminal: a bar over the build's steps with the current step and its
    latest log line; otherwise one line per phase and per step (CI logs)."""

    def __init__(self) -> None:
        self.console = _console(stderr=True)
        self.live = self.console.is_terminal
        self.progress: Any = None
        self.task: Any = None

    def __enter__(self) -> _BuildProgress:
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


def _cmd_build(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from modak import api
    from modak.build.pipeline import BuildOptions
    from modak.build.submit import submit

    plan = _plan(args)
    out_dir = args.output or api.default_output(plan)
    options = BuildOptions(engine=args.engine, push=args.push, smoke=args.smoke, oci_archive=args.oci_archive)
    with _BuildProgress() as progress:
        result = api.build(plan, out_dir, options, progress)
    if args.submit:
        job = result.ir.job
        submission = submit(out_dir / "job.sh", job.scheduler, job.log_file)
        result = replace(result, job_id=submission.job_id, submission=submission.to_dict())
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return 0
    data = result.to_dict()
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
    if result.submission:
        print(f"submitted job {result.job_id}; output: {result.submission['output']}")
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    from modak import api

    submission = api.submit(_plan(args), args.output, args.wait)
    if args.json:
        print(json.dumps(document(submission.to_dict()), indent=2, sort_keys=True))
    else:
        print(f"submitted {submission.script} with {submission.command[0]}: job {submission.job_id}")
        if submission.state:
            print(f"job {submission.job_id} ended: {submission.state}"
                  + (f" (exit {submission.exit_code})" if submission.exit_code is not None else ""))
        print(f"output: {submission.output}")
    return 0


def _settings(args: argparse.Namespace, launches: int | None = None) -> Any:
    from modak.bench.harness import BenchSettings

    return BenchSettings(launches=launches or args.launches, min_seconds=args.min_seconds, budget_s=args.budget,
                         seed=args.seed)


def _launch_line(candidate: Any, result: dict) -> str:
    """One launch as the user reads it: its median, or why it failed, and whether it ran on a busy machine."""
    timing = (f"{result['step_median_s'] * 1e3:.3g} ms" if result.get("status") == "ok"
              else f"{result.get('status')}: {result.get('error')}")
    busy = result.get("busy")
    return (f"{candidate.name}: {timing}" + (f" — CONTENDED ({'; '.join(busy)})" if busy else "")
            + (" (launched again: the first try ran beside other work)" if result.get("retried_after") else ""))


def _cmd_bench(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from modak import api
    from modak.bench.harness import select_candidates
    from modak.measurements.store import default_store_path

    settings = _settings(args)
    plan = _plan(args)
    total = len(select_candidates(plan, args.candidates)) * settings.launches
    rows: list[Any] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_console(stderr=True), transient=False) as progress:
        task = progress.add_task("measuring", total=total)

        def report(candidate: Any, result: dict) -> None:
            progress.console.print(_launch_line(candidate, result), highlight=False)
            progress.advance(task)

        try:
            rows, path = api.bench(plan, args.candidates, settings, args.store, on_launch=report)
        except KeyboardInterrupt:
            print(f"modak: interrupted; the rounds measured so far are kept in {args.store or default_store_path()}",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    ok = sum(r.status == "ok" for r in rows)
    contended = [r for r in rows if r.status == "contended"]
    print(f"{ok}/{len(rows)} candidates measured ({settings.launches} launches each), stored in {path}",
          file=sys.stderr)
    if contended:
        print(f"modak: {len(contended)} candidate(s) ran on a busy machine even when launched again and are stored "
              "as 'contended' (not used by the model): measure again when the machine is quiet", file=sys.stderr)
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from modak.bench import dispatch
    from modak.bench.harness import BenchSettings
    from modak.bench.tune import TuneSettings, describe, result_dict, tune
    from modak.measurements.store import PerfStore

    settings = TuneSettings(budget_s=args.budget, trials=args.trials,
                            protocol=BenchSettings(min_seconds=args.min_seconds, seed=args.seed))
    plan = _plan(args)
    dispatcher = (dispatch.SlurmDispatcher(partition=plan.loaded.target.scheduler.partition)
                  if args.dispatch == "slurm" else dispatch.LocalDispatcher())
    console = _console(stderr=True)

    def round_done(index: int, alive: list[str], dropped: list[str]) -> None:
        console.print(f"round {index}: {len(alive)} left" + (f"; dropped {', '.join(dropped)}" if dropped else ""),
                      highlight=False)

    with PerfStore(args.store) as perf:
        try:
            result = tune(plan, perf, settings, dispatcher,
                          on_launch=lambda c, r: console.print(_launch_line(c, r), highlight=False),
                          on_round=round_done)
        except KeyboardInterrupt:
            print(f"modak: interrupted; the launches measured so far are kept in {perf.path}", file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(document(result_dict(result)), indent=2))
    else:
        print("\n".join(describe(result)))
    return 0 if result.winner else EXIT_FAILURE


def _cmd_probe(args: argparse.Namespace) -> int:
    import platform

    import yaml

    from modak.hardware.local import store_probe
    from modak.hardware.probe import probe, probe_comment, to_target
    from modak.paths import write_atomic
    from modak.spec.models import Target

    result = probe(quick=args.quick)
    name = args.name or "".join(c if c.isalnum() or c in "._-" else "-" for c in platform.node()) or "this-machine"
    document = to_target(result, name)
    Target.model_validate(document)  # what we write must load
    print(probe_comment(result), end="")
    cached = store_probe(result)
    print(f"cached as this machine's probe (target 'local', `cpu: local`): {cached}" if cached else
          "not cached as this machine's probe: it did not run alone (see the warning above)")
    if args.output:
        write_atomic(args.output, probe_comment(result) + yaml.safe_dump(document, sort_keys=False))
        print(f"wrote {args.output}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from modak.errors import EXIT_REGRESSION
    from modak.integrations.check import check, choice_line, format_table

    plan = _plan(args)
    result = check(plan.to_dict(), args.baseline, args.threshold, args.measured, args.update)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        print(result.message(), file=sys.stderr)
    else:
        print(result.message())
        if result.comparisons:
            _console().print(format_table(result))
        print(choice_line(result))
        for note in result.notes:
            print(f"note: {note}")
    return EXIT_REGRESSION if result.regressed and not args.update else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from modak import api
    from modak.report import write_report

    # The report re-predicts the chosen candidate at other batches and threads: it needs the plan's predictor.
    predictor = api.predictor(args.predictor, args.store)
    plan = _plan(args, predictor)
    write_report(plan, predictor, args.output, args.store)
    print(f"chose {plan.choice.candidate.name}")
    print(f"wrote {args.output}")
    return 0


def _cmd_whatif(args: argparse.Namespace) -> int:
    from rich.table import Table

    from modak import api
    from modak.advise.whatif import describe, whatif

    result = whatif(args.job, args.targets, api.predictor(args.predictor, args.store), args.store)
    if args.report:
        from modak.report.whatif import write_whatif_report

        write_whatif_report(result.to_dict(), args.report)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        if args.report:
            print(f"wrote {args.report}", file=sys.stderr)
        return 0
    console = _console()
    basis = result.basis.describe()
    console.print(f"[bold]{result.job}[/] on {len(result.outcomes)} targets, ranked by {result.metric.value}; "
                  f"time and cost for {basis}", highlight=False)
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
    console.print(table)
    for line in describe(result):
        console.print(line, highlight=False)
    if args.report:
        print(f"wrote {args.report}")
    return 0


def _cmd_pack(args: argparse.Namespace) -> int:
    from modak import api
    from modak.advise.pack import pack, render_pack

    result = pack(args.jobs, args.target, api.predictor(args.predictor, args.store), args.store, args.modes)
    written = render_pack(result, args.render) if args.render else []
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        for line in result.describe():
            print(line)
    for folder in written:
        print(f"rendered {folder}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _short(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(width=max(160, Console().width), stderr=stderr)


def _print_plan(plan: Any, top: int) -> None:
    from rich.table import Table

    data = plan.to_dict()
    wl = data["workload"]
    console = _console()
    console.print(f"[bold]{data['job']}[/] on [bold]{data['target']}[/]: {data['task']}, objective "
                  f"{data['objective']['metric']}, {wl['model']} batch {wl['batch_size']}, "
                  f"{wl['flops_per_step'] / 1e9:.3g} GFLOP and {wl['bytes_per_step'] / 1e6:.4g} MB per step, "
                  f"intensity {wl['arithmetic_intensity']:.3g} FLOP/B")
    table = Table(show_lines=False)
    for column in ("#", "runtime/device/precision", "parameters", "step ms (interval)", "compile s",
                   "objective ms", "compute ms", "memory ms", "overhead ms", "bound", "predictor"):
        left = column in ("runtime/device/precision", "parameters", "bound", "predictor")
        table.add_column(column, justify="left" if left else "right", overflow="fold")
    for row in data["candidates"][:top]:
        low, high = row["interval_seconds"]
        terms = row["roofline"]
        accuracy = row.get("accuracy")
        figure = (f" ({'top-1' if accuracy['metric'] == 'top1_agreement' else 'rel. error'} {accuracy['value']:.3g})"
                  if accuracy else "") + (" (failed the reference check here)" if row["failed_check"] else "")
        table.add_row(str(row["rank"]), f"{row['runtime']}/{row['device']}/{row['precision']}{figure}",
                      " ".join(f"{k}={_short(v)}" for k, v in row["parameters"].items()),
                      f"{row['step_seconds'] * 1e3:.3g} ({low * 1e3:.3g}-{high * 1e3:.3g})",
                      f"{row['compile_seconds']:.3g}", f"{row['objective_seconds'] * 1e3:.3g}",
                      f"{terms['compute_s'] * 1e3:.3g}", f"{terms['memory_s'] * 1e3:.3g}",
                      f"{terms['overhead_s'] * 1e3:.3g}", row["bound"], row["predictor"])
    console.print(table)
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
        console.print(batches)
    if len(data["candidates"]) > top:
        console.print(f"... {len(data['candidates']) - top} more (--top N or --json)")
    for reason in data["reasons"]:
        console.print(f"- {reason}", highlight=False)
    if not data["tuned"]:
        console.print(f"- worth measuring here: {len(data['worth_tuning'])} candidates (the predicted top 3, those whose "
                      "spread (what the model's trees disagree between) overlaps the leader's, and stock): "
                      "`modak tune` races them and records the winner", highlight=False)


if __name__ == "__main__":
    raise SystemExit(main())
