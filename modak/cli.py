"""The ``modak`` command line: it parses the arguments, calls :mod:`modak.api` and prints the result with
:mod:`modak.output`. Errors print as one line; exit codes are documented in modak/errors.py
(docs/reference/limits.md is generated from it)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

from modak.api import PredictorName
from modak.errors import EXIT_FAILURE, EXIT_INTERRUPTED, InputError, ModakError
from modak.paths import refusal
from modak.render.sharing import SHARING_MODES
from modak.spec.names import ENGINE_NAMES

PREDICTOR_HELP = ("default: the kernel model where the runtime's planned kernels are covered, then the learned "
                  "model where measured data covers the runtime, then the roofline; learned: the same without the "
                  "kernel model; roofline: the analytic model alone")


class _DispatchNames:
    """``--dispatch``'s choices (:func:`modak.bench.dispatch.dispatch_names`), read when argparse first asks: the
    bench's modules load only for a command that takes the option (its metavar is a name, so building the parser
    does not list them)."""

    def __iter__(self) -> Iterator[str]:
        from modak.bench.dispatch import dispatch_names

        return iter(dispatch_names())

    def __contains__(self, name: object) -> bool:
        return name in tuple(self)


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
        sub.add_argument("--predictor", choices=get_args(PredictorName), default="default",
                         help=PREDICTOR_HELP)
        sub.add_argument("--store", type=Path, help="local perf store: its measurements are learned from (and "
                         "`bench` adds to it); default $MODAK_STORE or ~/.local/share/modak/perf.sqlite")

    sub = command("schema", _cmd_schema, "print the JSON Schema of the Job and Target specs, or of a document modak "
                                         "prints")
    sub.add_argument("kind", nargs="?", help="only this spec (job, target), or the document NAME "
                     "(modak/schemas/NAME.schema.json: plan, build, bench, ...)")

    sub = command("zoo", _cmd_zoo, "list the reference architectures of the model zoo")

    sub = command("analyze", _cmd_analyze, "per-operator FLOPs and bytes of a job's model")
    job_args(sub)
    sub.add_argument("--json", action="store_true", help="machine-readable output")

    sub = command("plan", _cmd_plan, "rank candidate deployments and pick one")
    job_args(sub)
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")
    sub.add_argument("--top", type=int, default=15, help="rows of the table (default 15; --json lists all)")
    sub.add_argument("--wide", action="store_true", help="every parameter of every row and the roofline's terms "
                     "(default: the parameters that tell the rows apart)")

    sub = command("bench", _cmd_bench, "measure candidate deployments on this machine and store the results")
    job_args(sub)
    sub.add_argument("--candidates", nargs="+", default=["all"], metavar="SEL",
                     help="all (default), top-K by prediction, each-runtime (the predicted best of each runtime and "
                          "precision: the plan corrects the kernel model's other predictions by them), or "
                          "candidate/runtime names")
    protocol_args(sub)
    sub.add_argument("--kernels", action="store_true", help="then profile each candidate measured ok in one launch "
                     "of its own and store its kernel rows (the operator-level model's labels)")
    sub.add_argument("--json", action="store_true", help="print the measured rows as JSON")

    sub = command("tune", _cmd_tune, "measure the plan's shortlist on this target, race it, and record the winner "
                                     "for `modak plan`/`modak build`")
    job_args(sub)
    sub.add_argument("--race-budget", type=float, default=600.0, metavar="SECONDS",
                     help="wall-clock seconds for the whole race (default 600)")
    sub.add_argument("--budget", type=float, dest="race_budget", action=_Deprecated, metavar="SECONDS",
                     help="deprecated alias of --race-budget (in `bench`, --budget is seconds per launch)")
    sub.add_argument("--trials", type=int, default=8, help="candidates raced, at most (default 8)")
    sub.add_argument("--max-rounds", type=int, metavar="N",  # default None: TuneSettings' (importing it is slow)
                     help="rounds of launches, at most (default 8; at least 3, the rounds before a candidate can "
                          "be dropped)")
    sub.add_argument("--dispatch", choices=_DispatchNames(), default="local", metavar="NAME",  # no list: lazy
                     help="%(choices)s: run launches here (local, the default) or as job arrays of that scheduler "
                          "on the target's partition")
    sub.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per launch, at least (1)")
    sub.add_argument("--seed", type=int, default=None, help="seed of the rounds' order (default: random)")
    sub.add_argument("--json", action="store_true", help="print the race as JSON")

    sub = command("probe", _cmd_probe, "measure this machine's ceilings, cache them as target 'local' and "
                                        "optionally write a Target file")
    sub.add_argument("-o", "--output", type=Path, help="Target YAML to write")
    sub.add_argument("--name", default=None, help="target name (default: the host name)")
    sub.add_argument("--quick", action="store_true", help="smaller problem sizes (seconds, less accurate)")
    sub.add_argument("--kernels", action="store_true",
                     help="then measure a sample of the zoo's layers on each installed ONNX runtime as this "
                          "machine's kernel rows (perf store; `modak kernels export` writes them out)")
    sub.add_argument("--budget", type=float, default=None, metavar="MIN",
                     help="--kernels: minutes for the kernel probe, at most (default 15)")
    sub.add_argument("--store", type=Path, help="--kernels: perf store (default $MODAK_STORE or ~/.local/share/modak)")

    sub = command("model", _cmd_model, "fit or evaluate the learned performance model")
    sub.add_argument("action", choices=["fit", "eval"], help="fit: refit and summarize; eval: cross-validate")
    sub.add_argument("--store", type=Path,
                     help="local perf store to include (default: $MODAK_STORE or ~/.local/share/modak)")
    sub.add_argument("--seeds", type=int, default=1,
                     help="eval: fit the models with seeds 0..N-1 and report the spread between them (default 1; "
                          "each seed fits every fold again)")
    sub.add_argument("--machine", metavar="TARGET",
                     help="eval: hold out and score only this target's rows (the others still train)")
    sub.add_argument("--split", metavar="SPLIT",
                     help="eval: only this split, named as its table is (default: each)")
    sub.add_argument("--json", action="store_true", help="eval: print the scores as JSON")

    sub = command("kernels", _cmd_kernels, "import or export the perf store's kernel rows and reconciliations (CSV)")
    actions = sub.add_subparsers(dest="action", required=True, metavar="ACTION")
    action = actions.add_parser("import", help="add CSV files of kernel rows or reconciliations to the perf store")
    action.add_argument("files", type=Path, nargs="+", metavar="FILE", help="kernels-*.csv or reconcile-*.csv")
    action.add_argument("--store", type=Path, help="perf store (default $MODAK_STORE or ~/.local/share/modak)")
    action = actions.add_parser("export", help="write kernels-<machine>.csv and reconcile-<machine>.csv")
    action.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="folder to write to")
    action.add_argument("--machine", metavar="TARGET", help="only this target's rows (default: each target's)")
    action.add_argument("--store", type=Path, help="perf store (default $MODAK_STORE or ~/.local/share/modak)")

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
    sub.add_argument("--engine", choices=ENGINE_NAMES,
                     help="container engine (default: the target's container.engine)")
    sub.add_argument("--push", action="store_true", help="push to the target's registry, pull back, check labels")
    sub.add_argument("--no-smoke", dest="smoke", action="store_false", help="skip the image's self-test")
    sub.add_argument("--submit", action="store_true", help="then submit the job script (see `modak submit`)")
    sub.add_argument("--oci-archive", type=Path, metavar="FILE",
                     help="also save the image as a docker-archive tar (apptainer build x.sif docker-archive://FILE)")
    sub.add_argument("--sif", action="store_true",
                     help="also convert the image into OUT/<job name>.sif with Apptainer (Docker or Podman builds)")
    sub.add_argument("--measure-budget", type=float, metavar="SECONDS",
                     help="where the target is this machine, first race the predicted best of each runtime and "
                          "precision for at most SECONDS and choose the fastest measured (default "
                          "$MODAK_MEASURE_BUDGET or 60; 0: choose by prediction)")
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
    sub.add_argument("--predictor", choices=get_args(PredictorName), default="default",
                     help=PREDICTOR_HELP)
    sub.add_argument("--store", type=Path, help="local perf store the learned model also learns from")
    sub.add_argument("--json", action="store_true", help="stable JSON output (schema_version 1)")
    sub.add_argument("--report", type=Path, metavar="HTML", help="also write an HTML report with the time-vs-cost plot")

    sub = command("pack", _cmd_pack, "co-location advice: which jobs can share a node's cores or a GPU (MPS, MIG, "
                                      "time-slicing), each job's predicted slowdown and the aggregate throughput")
    sub.add_argument("jobs", type=Path, nargs="+", metavar="JOB", help="job specs (YAML), at least two")
    sub.add_argument("--target", "-t", type=Path, required=True, help="the target they would share (YAML or 'local')")
    sub.add_argument("--predictor", choices=get_args(PredictorName), default="default",
                     help=PREDICTOR_HELP)
    sub.add_argument("--store", type=Path, help="local perf store the learned model also learns from")
    sub.add_argument("--modes", nargs="+", default=list(SHARING_MODES), metavar="MODE", choices=list(SHARING_MODES),
                     help=f"ways of sharing allowed (default all): {', '.join(SHARING_MODES)}")
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


class _Deprecated(argparse.Action):
    """An option kept for one release under its old name: it warns on stderr and sets its new name's value."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"modak: warning: {option_string} is deprecated here and will be removed in the next release: use "
              f"{new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _cmd_schema(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_json

    schemas = api.schemas()
    if args.kind is None:
        print_json(schemas, sort_keys=False)
        return 0
    schemas.update(api.document_schemas())
    if args.kind not in schemas:
        raise InputError(f"no schema named {args.kind!r}: {', '.join(schemas)}")
    print_json(schemas[args.kind], sort_keys=False)
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_zoo

    print_zoo(api.zoo())
    return 0


def _plan(args: argparse.Namespace) -> Any:
    from modak import api

    return api.plan_job(args.job, args.target, args.predictor, args.store)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_analysis

    print_analysis(api.analyze(args.job, args.target), args.json)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from modak.output import print_json, print_plan

    plan = _plan(args)
    if args.json:
        print_json(plan.to_dict())
    else:
        print_plan(plan, args.top, args.wide)
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_model_evaluation, print_model_fit

    if args.action != "eval" and (args.json or args.split):
        raise InputError(f"{'--json' if args.json else '--split'}: only for `modak model eval`")
    if args.action == "eval":
        print_model_evaluation(api.evaluate_model(args.store, args.seeds, args.machine, args.split), args.json)
    else:
        print_model_fit(api.fit_model(args.store))
    return 0

def _cmd_kernels(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_kernel_files

    if args.action == "import":
        print_kernel_files(api.import_kernels(args.files, args.store), imported=True)
    else:
        print_kernel_files(api.export_kernels(args.output, args.store, args.machine), imported=False)
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
    from modak import api
    from modak.output import print_scale

    if args.max_workers is not None and args.max_workers < 1:
        raise InputError(f"--max-workers {args.max_workers}: give a positive number of workers")
    measured = _measured_points(args.measured)
    print_scale(api.scale(_plan(args), args.max_workers, measured), args.json)
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_render

    plan = _plan(args)
    print_render(plan, args.output, api.render_plan(plan, args.output), args.json)
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from modak import api
    from modak.bench.tune import measure_budget
    from modak.build.pipeline import BuildOptions
    from modak.measurements.store import default_store_path
    from modak.output import BuildProgress, console, launch_line, print_build

    plan = _plan(args)
    if args.measure_budget is not None and not 0 <= args.measure_budget < float("inf"):
        raise InputError("--measure-budget takes seconds, 0 or more (0: choose by prediction)")
    out = console(stderr=True)
    try:
        measured = api.measure_choice(plan, measure_budget() if args.measure_budget is None else args.measure_budget,
                                      args.store, on_launch=lambda c, r: out.print(launch_line(c, r), highlight=False))
    except KeyboardInterrupt:
        print(f"modak: interrupted; the launches measured so far are kept in {args.store or default_store_path()}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if measured.race is not None:
        if measured.race.recorded is not None:
            plan = _plan(args)  # planned again: it chooses the recorded winner
        out.print(f"modak: {measured.summary}", highlight=False)
    options = BuildOptions(engine=args.engine, push=args.push, smoke=args.smoke, oci_archive=args.oci_archive,
                           sif=args.sif)
    with BuildProgress() as progress:
        result = api.build(plan, args.output, options, progress, submit_job=args.submit)
    print_build(result, args.json)
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_submission

    print_submission(api.submit(_plan(args), args.output, args.wait), args.json)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from modak import api
    from modak.bench.harness import KERNEL_STEPS, BenchSettings, select_candidates
    from modak.measurements.store import default_store_path
    from modak.output import console, launch_line, print_bench, profile_line

    settings = BenchSettings(launches=args.launches, min_seconds=args.min_seconds, budget_s=args.budget,
                             seed=args.seed, kernel_steps=KERNEL_STEPS if args.kernels else 0)
    plan = _plan(args)
    total = len(select_candidates(plan, args.candidates)) * settings.launches
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=False) as progress:
        task = progress.add_task("measuring", total=total)

        def report(candidate: Any, result: dict) -> None:
            progress.console.print(launch_line(candidate, result), highlight=False)
            progress.advance(task)

        try:
            rows, path = api.bench(plan, args.candidates, settings, args.store, on_launch=report,
                                   on_profile=lambda c, r: progress.console.print(profile_line(c, r), highlight=False))
        except KeyboardInterrupt:
            print(f"modak: interrupted; the rounds measured so far are kept in {args.store or default_store_path()}",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
    print_bench(rows, settings.launches, path, args.json)
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from modak import api
    from modak.bench.harness import BenchSettings
    from modak.bench.tune import TuneSettings
    from modak.measurements.store import default_store_path
    from modak.output import console, launch_line, print_tune

    rounds = {} if args.max_rounds is None else {"max_rounds": args.max_rounds}
    settings = TuneSettings(budget_s=args.race_budget, trials=args.trials, **rounds,
                            protocol=BenchSettings(min_seconds=args.min_seconds, seed=args.seed))
    plan = _plan(args)
    out = console(stderr=True)

    def round_done(index: int, alive: list[str], dropped: list[str]) -> None:
        out.print(f"round {index}: {len(alive)} left" + (f"; dropped {', '.join(dropped)}" if dropped else ""),
                  highlight=False)

    try:
        result = api.tune(plan, settings, args.dispatch, args.store,
                          on_launch=lambda c, r: out.print(launch_line(c, r), highlight=False), on_round=round_done)
    except KeyboardInterrupt:
        print(f"modak: interrupted; the launches measured so far are kept in {args.store or default_store_path()}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print_tune(result, args.json)
    return 0 if result.winner else EXIT_FAILURE


def _cmd_probe(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_probe

    if args.budget is not None and (not args.kernels or args.budget <= 0):
        raise InputError("--budget takes a positive number of minutes, with --kernels")
    print_probe(api.probe(args.quick, args.name, args.output, args.kernels, args.budget, args.store))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from modak import api
    from modak.errors import EXIT_REGRESSION
    from modak.output import print_check

    result = api.check(_plan(args), args.baseline, args.threshold, args.measured, args.update)
    print_check(result, args.json)
    return EXIT_REGRESSION if result.regressed and not args.update else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from modak import api

    plan = api.report(args.job, args.output, args.target, args.predictor, args.store)
    print(f"chose {plan.choice.candidate.name}")
    print(f"wrote {args.output}")
    return 0


def _cmd_whatif(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_whatif

    result = api.whatif(args.job, args.targets, args.predictor, args.store)
    if args.report:
        api.whatif_report(result, args.report)
    print_whatif(result, args.json)
    if args.report:
        print(f"wrote {args.report}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _cmd_pack(args: argparse.Namespace) -> int:
    from modak import api
    from modak.output import print_pack

    result = api.pack(args.jobs, args.target, args.predictor, args.store, args.modes)
    written = api.render_pack(result, args.render) if args.render else []
    print_pack(result, args.json)
    for folder in written:
        print(f"rendered {folder}", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
