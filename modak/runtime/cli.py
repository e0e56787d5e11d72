"""``modak`` inside an image: the commands that run the image's model as its plan decided.

    modak serve [--port 8080]                 Open Inference Protocol (KServe v2) server: the inference default
    modak run --input PATH --output DIR       batch inference over .npy/.npz files, resumable
    modak self-test [--steps 20] [--serve]    the build's smoke test: timed steps against the prediction
    modak measure [--min-seconds S] [--budget S]   what ``modak bench`` runs per launch (JSON on stdout)
    modak measure --profile STEPS             per-kernel times of the runtime's profiler instead (JSON)

Every command reads the deployment the image's entrypoint applied (``$MODAK_PLAN``, ``$MODAK_MODEL``,
``$MODAK_THREADS``; see :mod:`modak.runtime`). Exit codes: 0 done, 2 bad arguments or inputs, 3 the model or the
deployment failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from modak.errors import EXIT_INTERRUPTED


def parser() -> argparse.ArgumentParser:
    from modak.runtime import batch, serve

    main_parser = argparse.ArgumentParser(prog="modak", description="Run this image's model as its plan decided.")
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.configure(commands.add_parser("serve", help="Open Inference Protocol (KServe v2) server"))
    batch.configure(commands.add_parser("run", help="batch inference over .npy/.npz files"))
    test = commands.add_parser("self-test", help="time the deployment against the plan's prediction")
    test.add_argument("--steps", type=int, default=20, help="timed steps after warm-up (default 20)")
    test.add_argument("--serve", action="store_true", help="also start the server and send it one infer request")
    measure = commands.add_parser("measure", help="check against the fp32 reference and time (JSON)")
    measure.add_argument("--min-seconds", type=float, default=1.0, help="seconds of timed steps at least")
    measure.add_argument("--budget", type=float, default=10.0, help="seconds of timed steps at most")
    measure.add_argument("--no-check", action="store_true", help="skip the reference check")
    measure.add_argument("--profile", type=_steps, metavar="STEPS",
                         help="instead of timing, profile STEPS steps with the runtime's own profiler")
    return main_parser


def _steps(text: str) -> int:
    """A positive step count (argparse type)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of steps, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "serve":
            from modak.runtime import serve

            return serve.main(args)
        if args.command == "run":
            from modak.runtime import batch

            return batch.main(args)
        from modak.runtime import measure

        if args.command == "self-test":
            return measure.run_reported(lambda: measure.self_test(args.steps, serve_check=args.serve))
        if args.profile is not None:
            return measure.run_reported(lambda: measure.profile_deployment(args.profile))
        return measure.run_reported(
            lambda: measure.measure_deployment(args.min_seconds, args.budget, not args.no_check))
    except KeyboardInterrupt:
        print("modak: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
