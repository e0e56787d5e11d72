"""Render a plan into a complete build context: Dockerfile, Singularity.def, entrypoint.sh, job.sh, plan.json
and the files the images copy.

Templates live in ``templates/`` (one family per output language) and are never built from spec strings.
Values reach them only through the escaping filters of their family:

* ``sh`` (scripts): :func:`shlex.quote`; newlines stay inside the single quotes, which bash reads verbatim.
* ``sh`` (Dockerfile ``RUN``): the same after :func:`oneline`, since an instruction is one line.
* ``sh`` (definition file): the same after :func:`oneline`, with every ``{{`` / ``}}`` split into ``{''{`` /
  ``}''}`` (the same shell word), because Apptainer substitutes ``{{ name }}`` build arguments anywhere.
* ``text`` (definition file labels, help and comments, which are not shell): :func:`oneline`, with ``{{`` /
  ``}}`` written as ``{ {`` / ``} }``.
* ``dockerfile_str``: a double-quoted Dockerfile string for ENV and LABEL, with ``\\``, ``"`` and ``$``
  escaped, after :func:`oneline`.
* ``json``: a JSON array of strings, the exec form of ENTRYPOINT, CMD and COPY.
* ``word``: a value written bare (scheduler directives, FROM, USER); anything outside a safe alphabet is an
  error, as the spec constrains these values already.

A site can replace any template by one with the same relative path in its own folder (the target's
``container.templates``, then ``$MODAK_TEMPLATES``); modak's stay reachable as ``modak/<path>``, so a site
template can extend the one it replaces and override a block. Site templates get the same filters and values.

Newline policy: a control character cannot live on a Dockerfile line or in a definition file's section
lines, so :func:`oneline` writes it as a visible escape (``\\n``, ``\\t``, ``\\r``, ``\\xNN``). That is
lossy, but nothing modak writes there carries control characters: free text (the command, file names) goes
to scripts and JSON (which escapes them) or stays out of the build files entirely.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import tempfile
from collections.abc import Callable
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader, StrictUndefined, TemplateError

import modak
from modak import schedulers
from modak.errors import InputError
from modak.paths import data_dir
from modak.render.ir import CONTEXT_ENTRIES, BuildDescription, ContextItem
from modak.render.package import build_wheel

OUTPUTS = ("Dockerfile", "Singularity.def", "entrypoint.sh", "job.sh", "plan.json")
SHIPPED = "modak"  # the prefix under which site templates reach modak's own
DOCKERIGNORE = ".dockerignore"  # limits the build context to what modak wrote (not build logs, SIFs, ...)
_EXECUTABLE = frozenset({"entrypoint.sh", "job.sh"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_WORD = re.compile(r"[A-Za-z0-9_.:/@%=+-]+")
_BRACES = re.compile(r"([{}])(?=\1)")


def oneline(value: Any) -> str:
    """``value`` with control characters written as visible escapes, so that it fits on one line."""
    return _CONTROL.sub(lambda m: _ESCAPES.get(m[0], f"\\x{ord(m[0]):02x}"), str(value))


def sh(value: Any) -> str:
    """A shell word for ``value`` (bash and POSIX sh)."""
    return shlex.quote(str(value))


def dockerfile_sh(value: Any) -> str:
    return shlex.quote(oneline(value))


def def_sh(value: Any) -> str:
    """A one-line shell word with no ``{{``/``}}`` (quotes are split between the braces instead)."""
    return _BRACES.sub(r"\1''", shlex.quote(oneline(value)))


def def_text(value: Any) -> str:
    return _BRACES.sub(r"\1 ", oneline(value))


def dockerfile_str(value: Any) -> str:
    """A double-quoted Dockerfile string (ENV, LABEL): no variable expansion, no line break."""
    escaped = oneline(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def json_array(values: Any) -> str:
    return json.dumps([str(v) for v in values])


def word(value: Any) -> str:
    """``value`` unquoted; only for values the spec constrains to a safe alphabet."""
    text = str(value)
    if not _WORD.fullmatch(text):
        raise ValueError(f"refusing to write {text!r} unquoted into a build file")
    return text


_FILTERS: dict[str, dict[str, Callable[[Any], str]]] = {
    "dockerfile": {"sh": dockerfile_sh, "dockerfile_str": dockerfile_str, "json": json_array, "oneline": oneline,
                   "word": word},
    "singularity": {"sh": def_sh, "text": def_text, "word": word},
    "shell": {"sh": sh, "oneline": oneline, "word": word},
}


@cache
def environment(family: str, site: tuple[Path, ...] = ()) -> Environment:
    """The Jinja2 environment of one output language (``dockerfile``, ``singularity`` or ``shell``).

    A template is looked up in the ``site`` folders first, then in modak's; ``modak/<path>`` is always modak's.
    """
    shipped = FileSystemLoader(data_dir("templates"))
    loader = ChoiceLoader([PrefixLoader({SHIPPED: shipped}), FileSystemLoader(site), shipped])
    env = Environment(loader=loader, undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(_FILTERS[family])
    return env


def render_text(ir: BuildDescription, output: str, site: tuple[Path, ...] = ()) -> str:
    """The text of one generated build file (any of :data:`OUTPUTS` but ``plan.json``), with the templates of
    the ``site`` folders in front of modak's; a site template's error is an input error."""
    scheduler = schedulers.scheduler(ir.job.scheduler)
    family, template = {
        "Dockerfile": ("dockerfile", "dockerfile/Dockerfile.j2"),
        "Singularity.def": ("singularity", "singularity/Singularity.def.j2"),
        "entrypoint.sh": ("shell", "entrypoint/entrypoint.sh.j2"),
        "job.sh": ("shell", scheduler.template),
    }[output]
    try:
        return environment(family, site).get_template(template).render(ir=ir, job=ir.job, scheduler=scheduler,
                                                                        version=modak.__version__)
    except (TemplateError, RecursionError) as exc:
        if not site:
            raise
        problem = (f"templates extend each other in a loop (extend modak's own as '{SHIPPED}/<path>')"
                   if isinstance(exc, RecursionError) else exc.message or type(exc).__name__)
        raise InputError(f"site templates {', '.join(map(str, site))}: {problem}",
                         getattr(exc, "filename", None), getattr(exc, "lineno", None)) from None


def render(ir: BuildDescription, out_dir: Path) -> list[Path]:
    """Write the build context ``ir`` describes to ``out_dir``; the generated files, in :data:`OUTPUTS` order.

    Everything is rendered into a temporary sibling folder first; only then are modak's entries of an existing
    ``out_dir`` replaced (other files there are kept), so a failure leaves ``out_dir`` as it was.
    """
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("exists and is not a folder", out_dir)
    texts = {name: render_text(ir, name, ir.templates) for name in OUTPUTS if name != "plan.json"}
    texts["plan.json"] = ir.plan_document
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        staging.chmod(0o755)
        for name, text in texts.items():
            path = staging / name
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755 if name in _EXECUTABLE else 0o644)
        for item in ir.context:
            _copy(item, staging)
        _normalize(build_wheel(staging / Path(ir.runtime_wheel).parent))
        (staging / DOCKERIGNORE).write_text(
            "# Written by modak: the build context is the generated files only.\n*\n"
            + "".join(f"!{name}\n" for name in (*OUTPUTS, *CONTEXT_ENTRIES)))
        _set_times(staging, dict(ir.labels).get("org.opencontainers.image.created", "1970-01-01T00:00:00Z"))
        _install(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out_dir / name for name in OUTPUTS]


def _copy(item: ContextItem, root: Path) -> None:
    """Copy one context item, with modes every user of the image can read (folders and executables 755)."""
    target = root / item.path
    target.parent.mkdir(parents=True, exist_ok=True)
    if item.source.is_dir():
        shutil.copytree(item.source, target, ignore=shutil.ignore_patterns(*item.skip), copy_function=shutil.copy)
        for folder, _, files in os.walk(target):
            os.chmod(folder, 0o755)
            for name in files:
                _normalize(Path(folder, name))
    else:
        shutil.copy(item.source, target)
        _normalize(target)
    for parent in target.relative_to(root).parents:
        (root / parent).chmod(0o755)


def _normalize(path: Path) -> None:
    path.chmod(0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644)


def _set_times(root: Path, created: str) -> None:
    """Give every rendered file the ``created`` label's time: COPY cache keys include file times, so an
    unchanged context then reuses every cached layer, and the image's files get reproducible times."""
    stamp = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    for folder, folders, files in os.walk(root, topdown=False):  # children first: a folder's time is set last
        for entry in (*files, *folders):
            os.utime(Path(folder, entry), (stamp, stamp), follow_symlinks=False)


def _install(staging: Path, out_dir: Path) -> None:
    """Move the rendered entries into ``out_dir``, first moving its old modak entries aside into ``staging``."""
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=".old.", dir=staging))
    new = [entry for entry in staging.iterdir() if entry != old]
    for name in {*OUTPUTS, *CONTEXT_ENTRIES, DOCKERIGNORE}:
        if os.path.lexists(out_dir / name):
            (out_dir / name).rename(old / name)
    for entry in new:
        entry.rename(out_dir / entry.name)
