"""modak: a deployment optimizer that builds tuned containers for deep-learning jobs."""

__version__ = "0.1.0"
