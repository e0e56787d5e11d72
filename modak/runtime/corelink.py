"""How far apart two of this process's CPUs are now: the round trip of a value between them.

On a VM, the hypervisor moves vCPUs between the host's cores. While two vCPUs sit on distant cores (another core
complex or socket), every hand-over between a runtime's threads waits longer: a launch of many small kernels then
runs slower, while a one-core loop (:func:`modak.runtime.measure.canary_seconds`) runs as fast as ever
(perfmodels/README.md, "The seventeenth round"). The round trip sees it: a value written on one CPU, answered from
the other, through shared memory.
"""

from __future__ import annotations

import math
import mmap
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

ROUND_TRIPS = 5000  # per try
TRIES = 3  # the best try counts: one try may be interrupted
START_TIMEOUT_S = 10.0  # the partner process must answer within this
NEAR_WAIT_S = 300.0  # waiting for the CPUs to come near again (wait_until_near), at most
NEAR_POLL_S = 1.0

# The partner: pinned to its CPU, it answers each value the caller writes (slot 0) in slot 8 (another cache line)
# and says it is ready in slot 16. Fixed code: no input becomes part of it.
_PARTNER = """
import mmap, os, sys
path, trips, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), 192)
v = memoryview(m).cast("q")
v[16] = 1
for i in range(1, trips + 1):
    while v[0] != i:
        pass
    v[8] = i
"""


def round_trip_seconds(cpus: Sequence[int] | None = None, trips: int = ROUND_TRIPS) -> float | None:
    """Seconds of one round trip of a value between the first and the last of ``cpus`` (default: this process's
    CPUs), the best of :data:`TRIES` tries of ``trips``; None with fewer than two CPUs, with a CPU this process may
    not use, or where the partner process does not start. Run it before a runtime starts threads: spinning pools
    hold the CPUs."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
    if len(cpus) < 2:
        return None
    mine = os.sched_getaffinity(0)
    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as file:
        file.write(bytes(192))
        file.flush()
        memory = mmap.mmap(file.fileno(), 192)
        slots = memoryview(memory).cast("q")
        partner = subprocess.Popen([sys.executable, "-c", _PARTNER, file.name, str(trips * TRIES),
                                    str(cpus[-1])], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            os.sched_setaffinity(0, {cpus[0]})
            return _time_round_trips(slots, partner, trips)
        except OSError:  # a CPU this process may not use
            return None
        finally:
            os.sched_setaffinity(0, mine)
            partner.kill()
            partner.wait()
            slots.release()
            memory.close()


def _time_round_trips(slots: memoryview, partner: subprocess.Popen, trips: int) -> float | None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while slots[16] != 1:
        if partner.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.001)
    best = math.inf
    trip = 0
    for _ in range(TRIES):
        start = time.perf_counter()
        for _ in range(trips):
            trip += 1
            slots[0] = trip
            spins = 0
            while slots[8] != trip:
                spins += 1
                if spins > 1_000_000 and (partner.poll() is not None or time.monotonic() > deadline + 60):
                    return None
        best = min(best, (time.perf_counter() - start) / trips)
    return round(best, 10)


def wait_until_near(limit_s: float, timeout_s: float = NEAR_WAIT_S) -> float:
    """Wait until a round trip between this process's CPUs takes at most ``limit_s`` (polled every
    :data:`NEAR_POLL_S`), up to ``timeout_s``; the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        trip = round_trip_seconds()
        if trip is None or trip <= limit_s:
            break
        time.sleep(NEAR_POLL_S)
    return time.monotonic() - start
