"""Registry credentials for ``modak build --push``, from where Docker and Podman users already keep them.

In this order, the first that has credentials for the image's registry wins:

1. ``MODAK_REGISTRY_USERNAME`` and ``MODAK_REGISTRY_PASSWORD`` (both, or neither): for whatever registry the
   image is pushed to (a CI job's secrets);
2. ``$REGISTRY_AUTH_FILE``; Podman's ``${XDG_RUNTIME_DIR}/containers/auth.json`` (``/run/containers/$UID/auth.json``
   without ``XDG_RUNTIME_DIR``) and ``${XDG_CONFIG_HOME:-~/.config}/containers/auth.json``; Docker's
   ``${DOCKER_CONFIG:-~/.docker}/config.json``. These are what ``podman login`` and ``docker login`` write:
   ``{"auths": {"HOST[/NAMESPACE]": {"auth": base64("USER:PASSWORD")}}}``; the most specific key matching the
   image's repository wins within a file. Credential helpers (``credsStore``, ``credHelpers``) are not consulted.

The password never leaves this module but in the engine's request: :class:`Credentials` does not show it in its
``repr``, and :meth:`Credentials.redact` removes it from any text (an engine's error message) before modak
prints or logs that text.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from modak.errors import InputError

USERNAME_ENV = "MODAK_REGISTRY_USERNAME"
PASSWORD_ENV = "MODAK_REGISTRY_PASSWORD"
DOCKER_HUB = "docker.io"


@dataclass(frozen=True)
class Credentials:
    """A login for one registry, and where it came from (a file or the environment: safe to show)."""

    registry: str
    username: str = field(repr=False)
    password: str = field(repr=False)
    source: str

    def auth_config(self) -> dict[str, str]:
        """The Docker Engine API's auth config (the ``X-Registry-Auth`` header's JSON)."""
        return {"username": self.username, "password": self.password, "serveraddress": self.registry}

    def redact(self, text: str) -> str:
        """``text`` without the password (nor the encodings of it that requests carry)."""
        secrets = {self.password, _b64(f"{self.username}:{self.password}"),
                   _b64(json.dumps(self.auth_config()), urlsafe=True),
                   _b64(json.dumps(self.auth_config()))}
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


def registry_host(ref: str) -> str:
    """The registry part of an image reference (``docker.io`` when it names none)."""
    return _host_and_path(ref)[0]


def _host_and_path(ref: str) -> tuple[str, str]:
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return _hub(first), rest
    return DOCKER_HUB, ref


def _hub(host: str) -> str:
    return DOCKER_HUB if host in ("index.docker.io", "registry-1.docker.io") else host


def auth_files() -> list[Path]:
    """The auth files searched, in order (see the module docstring); missing ones included."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    docker = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    primary = Path(runtime, "containers") if runtime else Path("/run/containers", str(os.getuid()))
    files = [primary / "auth.json", config / "containers" / "auth.json", docker / "config.json"]
    if os.environ.get("REGISTRY_AUTH_FILE"):
        files.insert(0, Path(os.environ["REGISTRY_AUTH_FILE"]))
    return files


def split_ref(ref: str) -> tuple[str, str]:
    """``registry/path/name:tag`` as (repository, tag); a missing tag is ``latest``."""
    repository, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return repository, tag


def find_credentials(ref: str) -> Credentials | None:
    """Credentials for pushing (and pulling) ``ref``, or None when none are configured."""
    host, path = _host_and_path(split_ref(ref.partition("@")[0])[0])
    username, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if username or password:
        if not (username and password):
            missing = PASSWORD_ENV if username else USERNAME_ENV
            raise InputError(f"{USERNAME_ENV} and {PASSWORD_ENV} go together, but {missing} is not set")
        return Credentials(host, username, password, f"{USERNAME_ENV}/{PASSWORD_ENV}")
    for file in auth_files():
        found = _from_file(file, host, f"{host}/{path}")
        if found:
            return found
    return None


def _from_file(path: Path, host: str, repository: str) -> Credentials | None:
    """The entry of auth file ``path`` for ``repository`` on ``host`` with the longest matching key."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read this registry auth file: {type(exc).__name__}", file=path) from None
    auths = data.get("auths") if isinstance(data, dict) else None
    if not isinstance(auths, dict):
        return None
    matching = []
    for key, entry in auths.items():
        name = _normalize(key)
        if isinstance(entry, dict) and entry.get("auth") and (repository == name or repository.startswith(name + "/")):
            matching.append((len(name), key, entry["auth"]))
    if not matching:
        return None
    _, key, encoded = max(matching)
    try:
        username, sep, password = base64.b64decode(str(encoded), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        sep = ""
    if not sep or not username:
        raise InputError(f"auths.{key}.auth is not base64 of USER:PASSWORD", file=path)
    return Credentials(host, username, password, str(path))


def _normalize(key: str) -> str:
    """An auths key as a repository prefix: Docker writes ``https://index.docker.io/v1/``, Podman ``HOST/NS``."""
    key = key.split("://", 1)[-1].rstrip("/")
    key = key[:-3] if key.endswith("/v1") else key
    host, sep, rest = key.partition("/")
    return _hub(host) + sep + rest


def _b64(text: str, urlsafe: bool = False) -> str:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return encode(text.encode()).decode()
