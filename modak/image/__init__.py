"""In-image code: the runner, the runtimes, the model zoo and the deployment environment.

What goes into a built image, with only the runtime's dependencies: it imports nothing of modak but
:mod:`modak.errors`, :mod:`modak.paths` and this package (no CLI, build, predict or report code; no msgspec or
PyYAML).
"""
