"""Where modak's data catalogs and caches live."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """The shipped data folder ``kind`` (``recipes``, ``templates``, ``perfmodels``).

    A wheel carries them under ``modak/_data``; a source checkout has them at the top level.
    """
    packaged = _PACKAGE / "_data" / kind
    return packaged if packaged.is_dir() else _PACKAGE.parent / kind


def refusal(path: Path) -> str | None:
    """Why the operating system refuses ``path`` (a name too long, a loop of links, no permission, a NUL byte), or
    None: a path that exists, or is only missing, is usable."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    except ValueError as exc:
        return str(exc)
    return None


def cache_dir() -> Path:
    """modak's cache (exported zoo models, ...): ``$MODAK_CACHE`` or ``~/.cache/modak``."""
    base = os.environ.get("MODAK_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "modak"
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_digest(path: Path) -> str:
    """The sha256 of the file at ``path`` (hex), read once per content: the digest is kept in modak's cache under the
    file's resolved path, size, modification time and inode, as Python's bytecode cache tells a changed source, so
    a plan does not hash a 100 MB model again. Raises OSError where the file cannot be read."""
    resolved = Path(path).resolve()
    entry = content_entry(resolved, "digests")
    known = kept_digest(entry)
    if known is not None:
        return known
    with resolved.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    write_atomic(entry, digest)
    return digest


def kept_digest(entry: Path) -> str | None:
    """The sha256 (hex) kept in the cache file ``entry``, None where there is none or it is damaged."""
    try:
        known = entry.read_text()
    except OSError:
        return None
    return known if len(known) == 64 else None


def folder_digest(root: Path, pattern: str = "*") -> str:
    """sha256 of the files below ``root`` that match ``pattern`` (``__pycache__`` left out): their relative names
    and :func:`file_digest`, sorted."""
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file_digest(file).encode())
    return digest.hexdigest()


@functools.cache
def source_identity() -> str:
    """The digest of modak's own source files' names, sizes and modification times (as a changed source is told from
    its bytecode), read once per process: what a cache of something cheap to make again is keyed by, so that any
    change to modak's code makes it again."""
    digest = hashlib.sha256()
    for root, folders, files in os.walk(_PACKAGE):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            status = os.stat(os.path.join(root, name))
            digest.update(f"\0{root}/{name}\0{status.st_size}\0{status.st_mtime_ns}".encode())
    return digest.hexdigest()


def file_identity(path: Path) -> str:
    """What stands for the present content of the file at ``path``: its resolved path, size, modification time and
    inode, as Python's bytecode cache tells a changed source. Raises OSError where the file cannot be read."""
    resolved = Path(path).resolve()
    status = resolved.stat()
    return f"{resolved}\0{status.st_size}\0{status.st_mtime_ns}\0{status.st_ino}"


def content_entry(path: Path, folder: str) -> Path:
    """The file in modak's cache folder ``folder`` that stands for the present content of the file at ``path``
    (:func:`file_identity`). Raises OSError where the file cannot be read."""
    return cache_dir() / folder / hashlib.sha256(file_identity(path).encode()).hexdigest()[:32]


def keep_newest(folder: Path, pattern: str, keep: int) -> None:
    """Remove all but the ``keep`` most recently written files of ``folder`` that match ``pattern`` (a cache's
    bound); a file another process removes meanwhile is passed over."""
    dated = []
    for file in folder.glob(pattern):
        with contextlib.suppress(FileNotFoundError):
            dated.append((file.stat().st_mtime_ns, str(file)))
    for _, old in sorted(dated)[:-keep]:
        Path(old).unlink(missing_ok=True)


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Installed:
    """What the installed distributions declare that modak asks of them: each one's version (by its normalized
    name) and the entry points of modak's groups (``modak.*``: group -> [(name, ``module:attr``)])."""

    versions: dict[str, str]
    entry_points: dict[str, list[tuple[str, str]]]

    def version(self, name: str) -> str | None:
        """The installed version of distribution ``name``, or None where it is not installed."""
        return self.versions.get(_normalized(name))


@functools.cache
def installed() -> Installed:
    """The installed distributions' :class:`Installed`, read once per process. Scanning every distribution's metadata
    costs a warm plan more than its own imports, so the scan is kept in modak's cache under what it read: the
    ``*.dist-info`` and ``*.egg-info`` entries of the import path's folders and their modification times (installing,
    upgrading or removing a distribution makes, remakes or removes its entry; a folder that holds none, such as the
    working directory of ``python -m modak``, keys nothing)."""
    identity = hashlib.sha256(b"installed 1")
    for folder in sys.path:
        identity.update(f"\0{folder}".encode())
        try:
            with os.scandir(folder or ".") as entries:
                for entry in entries:
                    if entry.name.endswith((".dist-info", ".egg-info")):
                        identity.update(f"\0{entry.name}\0{entry.stat().st_mtime_ns}".encode())
        except NotADirectoryError:  # a zip archive on the path
            identity.update(f"\0{os.stat(folder).st_mtime_ns}".encode())
        except OSError:
            identity.update(b"\0-")
    kept = Path("installed") / f"{identity.hexdigest()[:32]}.json"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        data = json.loads((cache_dir() / kept).read_text())
        return Installed(dict(data["versions"]), {group: [(name, value) for name, value in listed]
                                                  for group, listed in data["entry_points"].items()})
    import importlib.metadata

    versions: dict[str, str] = {}
    points: dict[str, list[tuple[str, str]]] = {}
    for dist in importlib.metadata.distributions():
        name = _normalized(dist.metadata["Name"] or "")
        if not name or name in versions:  # the first on the path is the one an import finds
            continue
        versions[name] = dist.version
        for point in dist.entry_points:
            if point.group.startswith("modak."):
                points.setdefault(point.group, []).append((point.name, point.value))
    found = Installed(versions, points)
    with contextlib.suppress(OSError):  # a cache that cannot be written (an image's read-only home) is not kept
        write_atomic(cache_dir() / kept, json.dumps({"versions": versions, "entry_points": points}))
    return found


def _normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()
