"""Where ``modak build --push`` finds registry credentials (tests/test_build.py pushes with them for real)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from modak.build.credentials import find_credentials
from modak.errors import InputError

SECRET = "pw-Kx3-credential-test"


def _auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No credentials anywhere but where a test puts them."""
    for name in ("MODAK_REGISTRY_USERNAME", "MODAK_REGISTRY_PASSWORD", "REGISTRY_AUTH_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    return tmp_path


def _write(path: Path, auths: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": auths}))
    return path


def test_none_configured(home: Path) -> None:
    assert find_credentials("127.0.0.1:5001/ns/image:tag") is None


def test_most_specific_key_of_the_first_file_that_has_one(home: Path) -> None:
    _write(home / "run" / "containers" / "auth.json", {"127.0.0.1:5001/ns/image": _auth("podman-ns", "a"),
                                                       "127.0.0.1:5001": _auth("podman-host", "b"),
                                                       "127.0.0.1": _auth("other-port", "c")})
    _write(home / "docker" / "config.json", {"https://127.0.0.1:5002/v1/": _auth("docker", "d:with:colons")})
    assert find_credentials("127.0.0.1:5001/ns/image:tag").username == "podman-ns"
    assert find_credentials("127.0.0.1:5001/ns/image2:tag").username == "podman-host"
    docker = find_credentials("127.0.0.1:5002/x:y")
    assert (docker.username, docker.password, docker.registry) == ("docker", "d:with:colons", "127.0.0.1:5002")
    assert docker.source == str(home / "docker" / "config.json")
    assert find_credentials("quay.io/a/b:c") is None


def test_environment_first_then_registry_auth_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(home / "config" / "containers" / "auth.json", {"quay.io": _auth("config", "x")})
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_write(home / "override.json", {"quay.io": _auth("override", "y")})))
    assert find_credentials("quay.io/a/b:c").username == "override"
    monkeypatch.setenv("MODAK_REGISTRY_USERNAME", "env")
    monkeypatch.setenv("MODAK_REGISTRY_PASSWORD", SECRET)
    found = find_credentials("quay.io/a/b:c")
    assert (found.username, found.password) == ("env", SECRET)
    assert found.source == "MODAK_REGISTRY_USERNAME/MODAK_REGISTRY_PASSWORD"
    assert SECRET not in repr(found) and found.redact(f"echo {SECRET}") == "echo ***"


def test_half_the_environment_or_a_bad_file_is_an_input_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAK_REGISTRY_USERNAME", "env")
    with pytest.raises(InputError, match="MODAK_REGISTRY_PASSWORD is not set"):
        find_credentials("quay.io/a/b:c")
    monkeypatch.delenv("MODAK_REGISTRY_USERNAME")
    bad = _write(home / "docker" / "config.json", {"quay.io": {"auth": f"{SECRET}!"}})
    with pytest.raises(InputError) as raised:
        find_credentials("quay.io/a/b:c")
    assert str(raised.value) == f"{bad}: auths.quay.io.auth is not base64 of USER:PASSWORD"
    bad.write_text(f'{{"auths": {SECRET}')
    with pytest.raises(InputError, match="cannot read this registry auth file: JSONDecodeError") as raised:
        find_credentials("quay.io/a/b:c")
    assert SECRET not in str(raised.value)
