"""Docker, and Podman's Docker-compatible service (``podman system service``), through the Docker Engine API (the
``docker`` SDK). The endpoint is ``DOCKER_HOST`` when set; otherwise Docker's default socket for ``docker`` and
:data:`PODMAN_SOCKET` for ``podman``."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from modak.build.credentials import Credentials, split_ref
from modak.build.engines.base import ENGINES, BuildLog, Engine, ImageInfo, RunResult, shorten
from modak.errors import BuildFailed, EngineUnavailable, ModakError, PushFailed

PODMAN_SOCKET = "unix:///run/modak/podman.sock"
START_HINT = {
    "podman": "start Podman's Docker-compatible service with `.ci/provision.sh podman_service` "
              "(or `podman system service --time=0 unix:///run/modak/podman.sock &`) or point DOCKER_HOST at one",
    "docker": "start Docker with `systemctl start docker` or point DOCKER_HOST at a running daemon",
}
_BUILT = re.compile(r"^Successfully built ([0-9a-f]{12,64})\s*$")
_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


WAIT_POLL_S = 0.25  # how often a run's container is inspected until it exits


def _exit_code(container: Any, timeout: float) -> int | None:
    """The exit code of a started ``container``, inspected every :data:`WAIT_POLL_S` until it exits; None when it
    still runs after ``timeout`` seconds. Not the engine's wait endpoint: Podman's (before 4.5) spins a core of
    the host until the container exits (containers/podman#18150), which took about one of two cores from what
    the smoke test measures in it (its step 2-8x slower)."""
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        state = container.attrs.get("State") or {}
        if not state.get("Running") and container.status not in ("created", "running", "restarting"):
            return int(state.get("ExitCode", 1))
        if time.monotonic() >= deadline:
            return None
        time.sleep(WAIT_POLL_S)


@ENGINES.register("docker", "podman")
class DockerEngine(Engine):
    """Docker, or Podman's Docker-compatible service, through the Docker Engine API."""

    def __init__(self, name: str = "podman", base_url: str | None = None, timeout: int = 600) -> None:
        self.name = name
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or (PODMAN_SOCKET if name == "podman" else None)
        self.timeout = timeout
        self._client: Any = None

    def endpoint(self) -> str:
        return self.base_url or "unix:///var/run/docker.sock"

    @property
    def client(self) -> Any:
        if self._client is None:
            self.check()
        return self._client

    def check(self) -> None:
        if self._client is not None:
            return
        try:
            import docker
        except ImportError as exc:
            raise EngineUnavailable(f"the docker Python SDK is not installed ({exc}): pip install 'docker>=7'") \
                from None
        try:
            client = docker.DockerClient(base_url=self.endpoint(), timeout=self.timeout)
            client.ping()
        except Exception as exc:  # DockerException, requests' ConnectionError, ...
            raise EngineUnavailable(f"{self.name} engine not reachable at {self.endpoint()} "
                                    f"({shorten(_reason(exc), 200)}); {START_HINT[self.name]}") from None
        self._client = client

    def build(self, context: Path, log: BuildLog, no_cache: bool = False) -> str:
        """Build ``context/Dockerfile``, streaming the engine's log (the SDK's low-level build: the
        high-level one returns only when the build is over)."""
        import docker

        log.note(f"building {context} with {self.name} at {self.endpoint()}")
        image_id = None
        try:
            stream = self.client.api.build(path=str(context), dockerfile="Dockerfile", rm=True, forcerm=True,
                                           decode=True, pull=False, nocache=no_cache)
            for chunk in stream:
                image_id = self._chunk(chunk, log) or image_id
        except BuildFailed:
            raise
        except docker.errors.DockerException as exc:
            raise log.failure(_reason(exc)) from None
        except OSError as exc:  # the connection broke (requests' errors are OSErrors)
            raise log.failure(f"lost the connection to {self.name}: {_reason(exc)}") from None
        if not image_id:
            raise log.failure("the engine ended the build without naming an image")
        info = self.inspect(image_id)
        if info is None:
            raise log.failure(f"the engine reported image {image_id}, which does not exist")
        log.note(f"built image {info.id}")
        return info.id

    @staticmethod
    def _chunk(chunk: Mapping[str, Any], log: BuildLog) -> str | None:
        """Log one decoded chunk of the build stream; the image id when the chunk names it."""
        if "error" in chunk or "errorDetail" in chunk:
            message = chunk.get("error") or (chunk.get("errorDetail") or {}).get("message") or json.dumps(chunk)
            log.write(f"{message}\n")
            raise log.failure(str(message).strip())
        image_id = None
        if isinstance(chunk.get("aux"), Mapping) and chunk["aux"].get("ID"):
            image_id = str(chunk["aux"]["ID"])
        text = chunk.get("stream")
        if text is None and chunk.get("status"):
            text = f"{chunk['status']} {chunk.get('progress', '')}".rstrip() + "\n"
        if text:
            log.write(text)
            for line in text.splitlines():
                match = _BUILT.match(line)
                if match and not image_id:
                    image_id = match[1]
        return image_id

    def tag(self, image: str, ref: str) -> None:
        repository, tag = split_ref(ref)
        if not self.client.images.get(image).tag(repository, tag, force=True):
            raise ModakError(f"{self.name} did not tag {image} as {ref}")

    def inspect(self, ref: str) -> ImageInfo | None:
        import docker

        try:
            data = self.client.images.get(ref).attrs
        except docker.errors.NotFound:  # ImageNotFound included
            return None
        config = data.get("Config") or {}
        return ImageInfo(id=data["Id"], tags=tuple(data.get("RepoTags") or ()), labels=config.get("Labels") or {},
                         size=data.get("Size"), repo_digests=tuple(data.get("RepoDigests") or ()))

    def run(self, image: str, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 600, gpus: int = 0, network: bool = False) -> RunResult:
        """A container with no network (``network_mode="none"``) unless ``network``, and a device request for
        all GPUs when ``gpus``: the run happens on the build host, which may have fewer GPUs than the target."""
        import docker

        options: dict[str, Any] = {"environment": dict(env or {}), "detach": True}
        if not network:
            options["network_mode"] = "none"
        if gpus:
            options["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        container = self.client.containers.create(image, list(command) if command is not None else None, **options)
        try:
            container.start()
            code = _exit_code(container, timeout)
            timed_out = code is None
            if code is None:
                code = 124
                container.kill()
                container.wait(timeout=30)
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            return RunResult(code, stdout, stderr, timed_out)
        finally:
            container.remove(force=True)

    def read_file(self, image: str, path: str) -> bytes | None:
        import docker

        container = self.client.containers.create(image, ["true"], network_mode="none")
        try:
            stream, _ = container.get_archive(path)
            data = b"".join(stream)
        except docker.errors.NotFound:
            return None
        finally:
            container.remove(force=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            member = next((m for m in archive.getmembers() if m.isfile()), None)
            handle = archive.extractfile(member) if member else None
            return handle.read() if handle else None

    def add_layer(self, image: str, labels: Mapping[str, str], files: Mapping[str, Path], log: BuildLog) -> str:
        """A second tiny stage, ``FROM image`` with COPY and LABEL lines only: cheap, and cached when unchanged."""
        from modak.render.render import dockerfile_str, json_array

        with tempfile.TemporaryDirectory(prefix="modak-stage.") as folder:
            root = Path(folder)
            lines = [f"FROM {image}"]
            for index, (destination, source) in enumerate(sorted(files.items())):
                name = f"file{index}"
                (shutil.copytree if source.is_dir() else shutil.copy)(source, root / name)
                lines.append(f"COPY --chown=1000:1000 {json_array([name, destination])}")
            if labels:
                lines.append("LABEL " + " ".join(f"{key}={dockerfile_str(value)}" for key, value in labels.items()))
            (root / "Dockerfile").write_text("\n".join(lines) + "\n")
            return self.build(root, log)

    def insecure(self, ref: str) -> bool:
        """Whether ``ref``'s registry is on loopback, which Docker treats as plain HTTP by default.

        Podman needs to be told (``tlsVerify=false``) unless its registries.conf marks the registry insecure,
        and its service reads registries.conf only once, when it starts.
        """
        host = ref.split("/", 1)[0] if "/" in ref else ""
        hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return hostname in ("localhost", "[::1]") or hostname.startswith("127.")

    def _post_stream(self, path: str, params: Mapping[str, str],
                     headers: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """POST ``path`` (under the service's URL) and decode the JSON lines it streams back.

        For what the SDK has no parameter for (Podman's ``tlsVerify``): the SDK's client is a ``requests``
        session, so this is its public ``post``, with the SDK's error for an HTTP error status.
        """
        import docker
        import requests

        api = self.client.api
        response = api.post(f"{api.base_url}{path}", params=dict(params), headers=dict(headers or {}), stream=True,
                            timeout=self.timeout)
        try:
            response.raise_for_status()
        except requests.HTTPError as exc:
            raise docker.errors.create_api_error_from_http_exception(exc) from None
        for line in response.iter_lines():
            if line.strip():
                yield json.loads(line)

    def push(self, image: str, ref: str, log: BuildLog | None = None,
             credentials: Credentials | None = None) -> str | None:
        import docker.auth

        if image != ref:
            raise PushFailed(f"the {self.name} engine pushes an image by its name: {image} is not named {ref}")

        repository, tag = split_ref(ref)
        auth = credentials.auth_config() if credentials else {}
        redact = credentials.redact if credentials else str
        digest = None
        try:
            if self.name == "podman" and self.insecure(ref):
                path = f"/v{self.client.api.api_version}/images/{quote(repository, safe='/:')}/push"
                chunks = self._post_stream(path, {"tag": tag, "tlsVerify": "false"},
                                           {"X-Registry-Auth": docker.auth.encode_header(auth).decode()})
            else:
                chunks = self.client.images.push(repository, tag=tag, stream=True, decode=True,
                                                 auth_config=auth or None)
            for chunk in chunks:
                if "error" in chunk or "errorDetail" in chunk:
                    message = chunk.get("error") or (chunk.get("errorDetail") or {}).get("message")
                    raise PushFailed(f"pushing {ref} failed: {shorten(redact(str(message)).strip(), 400)}"
                                     + _login_hint(ref, credentials, str(message)))
                aux = chunk.get("aux")
                if isinstance(aux, Mapping) and aux.get("Digest"):
                    digest = str(aux["Digest"])
                text = chunk.get("status") or chunk.get("stream") or ""
                found = _DIGEST.search(text)
                if found and digest is None:
                    digest = found[1]
                if log and text:
                    text = redact(text)
                    log.write(text if text.endswith("\n") else text + "\n")
        except docker.errors.DockerException as exc:
            raise PushFailed(f"pushing {ref} failed: {shorten(redact(_reason(exc)), 400)}"
                             + _login_hint(ref, credentials, _reason(exc))) from None
        return digest

    def pull(self, ref: str, credentials: Credentials | None = None) -> ImageInfo:
        import docker.auth

        repository, tag = split_ref(ref)
        auth = credentials.auth_config() if credentials else {}
        redact = credentials.redact if credentials else str
        try:
            if self.name == "podman" and self.insecure(ref):
                # Podman's Docker-compatible pull ignores tlsVerify; its own API takes it.
                chunks = self._post_stream("/v4.0.0/libpod/images/pull",
                                           {"reference": f"{repository}:{tag}", "tlsVerify": "false"},
                                           {"X-Registry-Auth": docker.auth.encode_header(auth).decode()})
            else:
                # The low-level pull: the high-level one drops the stream's error messages.
                chunks = self.client.api.pull(repository, tag=tag, stream=True, decode=True, auth_config=auth or None)
            for chunk in chunks:
                if chunk.get("error") or chunk.get("errorDetail"):
                    message = chunk.get("error") or (chunk.get("errorDetail") or {}).get("message")
                    raise PushFailed(f"pulling {ref} failed: {shorten(redact(str(message)).strip(), 400)}"
                                     + _login_hint(ref, credentials, str(message)))
        except docker.errors.DockerException as exc:
            raise PushFailed(f"pulling {ref} failed: {shorten(redact(_reason(exc)), 400)}"
                             + _login_hint(ref, credentials, _reason(exc))) from None
        info = self.inspect(ref)
        if info is None:
            raise PushFailed(f"pulled {ref}, but the engine has no image by that name")
        return info

    def save(self, ref: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        try:
            with partial.open("wb") as handle:
                for chunk in self.client.images.get(ref).save(named=True):
                    handle.write(chunk)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)

    def remove(self, ref: str) -> None:
        import docker

        try:
            self.client.images.remove(ref, force=False, noprune=False)
        except docker.errors.NotFound:
            pass



def _login_hint(ref: str, credentials: Credentials | None, message: str) -> str:
    """What to do about a registry that wants a login: how to give modak credentials, or that those it used were
    refused."""
    from modak.build.credentials import PASSWORD_ENV, USERNAME_ENV, registry_host

    if not re.search(r"unauthori[sz]ed|authenticat|denied|\b401\b|\b403\b", message, re.IGNORECASE):
        return ""
    if credentials:
        return f" (the registry refused the credentials from {credentials.source})"
    return (f" (no credentials for {registry_host(ref)}: set {USERNAME_ENV} and {PASSWORD_ENV}, or log in with "
            f"`podman login {registry_host(ref)}` or `docker login {registry_host(ref)}`)")


def _reason(exc: BaseException) -> str:
    """An exception as one line, without the SDK's nested wrappers where they add nothing."""
    explanation = getattr(exc, "explanation", None)
    text = str(explanation or exc) or type(exc).__name__
    return " ".join(text.split())

