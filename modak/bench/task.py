"""One array task of :class:`modak.bench.dispatch.ArrayDispatcher`: ``python -m modak.bench.task SPEC`` runs the
launch that ``SPEC`` describes and writes its result atomically to ``SPEC`` with the suffix ``.result.json``, so
the dispatcher finds a whole result or none."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from modak.bench.dispatch import run_task, task_from_spec
from modak.paths import write_atomic


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m modak.bench.task SPEC.json", file=sys.stderr)
        return 2
    spec = Path(argv[0])
    result = run_task(task_from_spec(json.loads(spec.read_text())))
    write_atomic(spec.with_suffix(".result.json"), json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
