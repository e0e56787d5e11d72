"""``local``: the machine modak runs on, described by its own cached probe.

A job's ``target: local`` (or ``--target local``) is a Target made of this host's probe and defaults; a target file's
``cpu: local`` takes its ``cpu`` section (and ``memory``, unless given) from the probe and keeps the site settings
(:func:`modak.spec.loader.load_job` takes :func:`local_sections` as its ``local_machine``).
The probe runs once per host and is cached under ``modak.paths.cache_dir() / "probe"``, keyed by what identifies
the host (name, CPU model and flags, usable CPUs, memory) and the probe's method (a probe of an older method is
measured again); `modak probe` refreshes that entry.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from pathlib import Path
from typing import Any

from modak.hardware.probe import METHOD, ProbeResult, contention_warning, probe, target_sections
from modak.paths import cache_dir, write_atomic


def host_key() -> str:
    """What identifies this host's hardware as this process sees it, hashed."""
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    model = next((line for line in cpuinfo if line.startswith("model name")), "")
    flags = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    memory = next((line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")), "")
    identity = "\n".join([platform.node(), platform.machine(), model, flags, memory,
                          ",".join(map(str, sorted(os.sched_getaffinity(0))))])
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


def cache_path() -> Path:
    """Where this host's probe result, measured by the probe's current method, is cached."""
    return cache_dir() / "probe" / f"{host_key()}.m{METHOD}.json"


def store_probe(result: ProbeResult) -> Path | None:
    """Cache ``result`` as this host's probe and return the file; a probe that did not run alone
    (``result.contention``) is not cached: None."""
    if result.contention:
        return None
    path = cache_path()
    write_atomic(path, result.to_json())
    return path


def local_probe() -> ProbeResult:
    """This host's cached probe, probing it (and saying so on stderr) when there is none."""
    path = cache_path()
    try:
        return ProbeResult.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        pass
    print("modak: target 'local': probing this machine's ceilings once (about 40 s; cached in "
          f"{path.parent}, `modak probe` refreshes it)", file=sys.stderr)
    result = probe()
    if store_probe(result) is None:
        print(f"modak: warning: {contention_warning(result)[0]}", file=sys.stderr)
    return result


def local_sections() -> dict[str, Any]:
    """The ``cpu``, ``memory`` (and ``gpus``) sections describing this host."""
    return target_sections(local_probe())
