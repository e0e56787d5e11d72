"""Children that take Ctrl-C whatever the test process inherited."""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """``Popen``'s ``preexec_fn`` for a child a test interrupts: SIGINT's default disposition, which Python turns
    into KeyboardInterrupt. A suite started as a background job of a non-interactive shell (``pytest &``) runs
    with SIGINT ignored, and every child would inherit that: the interrupt would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
