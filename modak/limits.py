"""Limits on every input file modak reads, so that any input ends in bounded time and memory.

A file beyond a limit is a bad input (exit code 2, ``FILE:LINE: field: message``), never a hang, a memory blow-up
or a Python recursion error. docs/reference/limits.md lists them (generated from this module).

* Job, Target and recipe YAML (:mod:`modak.spec.loader`): the file's size, the nesting depth, the number of nodes
  and the characters of all strings with aliases expanded (a "billion laughs" file is refused, not expanded), and
  the length of one string.
* ONNX models (:func:`modak.workload.analysis.load_model`): the graph file's size (protobuf cannot parse a message
  of 2 GiB or more; larger models keep their weights as external data, which modak does not read) and the number
  of nodes, local functions inlined.
* The one run of an ONNX graph in ONNX Runtime for the shapes shape inference leaves unknown
  (:mod:`modak.workload.shapes`): its time and address space.
* Measurement CSV files (:func:`modak.measurements.store.read_csv`) and kernel CSV files
  (:func:`modak.measurements.kernels.read_kernel_csv`): the file's size (one field is limited to the :mod:`csv`
  module's 128 KiB).
* JSON files (``modak check``): the file's size; nesting too deep for the parser is an input error too.
* The job's application files (:mod:`modak.spec.resolve`): their total size and number, as they are copied into
  the build context.
"""

from __future__ import annotations

from pathlib import Path

from modak.errors import InputError

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

MAX_SPEC_BYTES = 1 * MIB
"""Size of one YAML spec file."""
MAX_YAML_DEPTH = 64
"""Nesting of mappings and sequences in a YAML spec, aliases expanded."""
MAX_YAML_NODES = 10_000
"""Nodes (scalars, mappings, sequences) of a YAML spec, aliases expanded: an alias counts its anchor's nodes
again each time it is used."""
MAX_YAML_CHARS = 1 * MIB
"""Characters of all strings of a YAML spec, aliases expanded."""
MAX_STRING_CHARS = 64 * KIB
"""Characters of one string (key or value) of a YAML spec."""
MAX_ONNX_BYTES = 2 * GIB - 1
"""Size of an ONNX graph file: the largest message protobuf parses."""
MAX_ONNX_NODES = 100_000
"""Nodes of an ONNX graph, its local functions inlined."""
MAX_CSV_BYTES = 64 * MIB
"""Size of a measurement CSV file."""
MAX_JSON_BYTES = 64 * MIB
"""Size of a JSON file modak reads (``modak check``'s baseline and measured results)."""
MAX_APP_BYTES = 1 * GIB
"""Bytes of the job's ``entrypoint.files`` (folders walked, links not followed): all of it is copied into the
build context."""
MAX_APP_FILES = 20_000
"""Files of the job's ``entrypoint.files``, folders walked."""
SHAPE_RUN_SECONDS = 120
"""Wall-clock seconds of the one ONNX Runtime run of a graph for the shapes shape inference leaves unknown
(:mod:`modak.workload.shapes`); beyond it, the shapes it would have given are guessed."""
SHAPE_RUN_MEMORY_BYTES = 32 * GIB
"""Address space of that run's process (``RLIMIT_AS``)."""


def check_size(path: Path, limit: int, what: str) -> None:
    """Raise an :class:`InputError` naming ``path`` when the file there is larger than ``limit`` bytes."""
    try:
        size = path.stat().st_size
    except OSError:
        return  # the reader reports a missing or unreadable file
    if size > limit:
        raise InputError(f"{what} is {size:,} bytes, more than the limit of {limit:,} bytes", path)


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the file at ``path``; more than ``limit`` bytes is an :class:`InputError` naming ``path``.

    Reads at most ``limit + 1`` bytes, so that a device or a file that grows while read cannot exhaust memory.
    Missing, unreadable and folder paths are input errors too.
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except IsADirectoryError:
        raise InputError(f"is a directory, expected {what}", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    if len(data) > limit:
        raise InputError(f"{what} is larger than the limit of {limit:,} bytes", path)
    return data
