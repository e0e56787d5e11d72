"""``python -m modak.image.launch [--print] [-- COMMAND ...]``: apply the deployment and run a command.

What the image's entrypoint runs before every command, and what ``modak bench`` starts each candidate with:
it reads the deployment of ``$MODAK_PLAN``, sets its environment for this allocation
(:func:`modak.image.deployment.environment`) and replaces itself with COMMAND. ``--print`` writes the variables
it would set as JSON instead. ``MODAK_VERBOSE=1`` says on stderr what it set.
"""

from __future__ import annotations

import json
import os
import sys

from modak.errors import EXIT_BAD_INPUT, EXIT_CANNOT_EXECUTE, EXIT_OK, EXIT_RUN_FAILED
from modak.image.deployment import PLAN_VARIABLE, DeploymentError, environment, location, policy, read_deployment


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    show = bool(args) and args[0] == "--print"
    if show:
        args = args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not show and not args:
        print("usage: python -m modak.image.launch [--print] [-- COMMAND ...]", file=sys.stderr)
        return EXIT_BAD_INPUT
    plan = location(PLAN_VARIABLE)
    try:
        deployment = read_deployment(plan)
        env = environment(deployment)
    except DeploymentError as exc:
        print(f"modak: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED  # as a failed candidate: the harness records the message
    if show:
        print(json.dumps(env, sort_keys=True))
        return EXIT_OK
    if os.environ.get("MODAK_VERBOSE") == "1":
        print(f"modak: {env['MODAK_CPUS']} CPUs ({env['MODAK_CPUS_FROM']}), threads policy {policy(deployment)}: "
              f"{env['MODAK_THREADS']} "
              f"threads" + (f", LD_PRELOAD={env['LD_PRELOAD']}" if "LD_PRELOAD" in env else ""), file=sys.stderr)
    try:
        os.execvpe(args[0], args, {**os.environ, PLAN_VARIABLE: plan, **env})
    except OSError as exc:
        print(f"modak: cannot run {args[0]!r}: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_EXECUTE


if __name__ == "__main__":
    raise SystemExit(main())
