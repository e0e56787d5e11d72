"""Container engines behind one interface (:mod:`.base`), registered in :data:`ENGINES` by name:

* :class:`DockerEngine` (:mod:`.docker`): the Docker Engine API, for Docker and Podman's Docker-compatible service.
* :class:`ApptainerEngine` (:mod:`.apptainer`): the ``apptainer`` (or ``singularity``) command line.

:func:`parse_self_test` (:mod:`.selftest`) reads the image's self-test report from a run's output.
"""

from modak.build.engines.apptainer import ApptainerEngine
from modak.build.engines.base import ENGINES, BuildLog, Engine, ImageInfo, RunResult, Step, make_engine
from modak.build.engines.docker import DockerEngine
from modak.build.engines.selftest import parse_self_test

__all__ = ["ENGINES", "ApptainerEngine", "BuildLog", "DockerEngine", "Engine", "ImageInfo", "RunResult", "Step",
           "make_engine", "parse_self_test"]
