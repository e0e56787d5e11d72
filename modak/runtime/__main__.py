"""``python -m modak.runtime COMMAND``: the image's ``modak`` command (:mod:`modak.runtime.cli`)."""

from modak.runtime.cli import main

raise SystemExit(main())
