"""Building, smoke-testing, pushing and submitting what :mod:`modak.render` writes.

* :mod:`modak.build.engines`: container engines behind one interface, one module each, registered by name
  (Docker Engine API for Docker and Podman's Docker-compatible service; the Apptainer/Singularity CLI).
* :mod:`modak.build.pipeline`: render -> build -> label -> smoke test -> push (``modak build``).
* :mod:`modak.build.submit`: hand the rendered job script to its scheduler (:mod:`modak.schedulers`; ``modak
  submit``).
"""
