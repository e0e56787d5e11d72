"""Benchmarks and studies of modak: run each from the repository root as ``python -m benchmarks.FOLDER.SCRIPT``
(README.md)."""
