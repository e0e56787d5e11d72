"""What ``modak serve`` serves and its limits: the :class:`Settings` given, the :class:`Limits` they give a model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from modak.runtime import Model

MB = 1 << 20
QUEUED_BODIES = 4  # queued input bytes may reach this many body limits


@dataclass(frozen=True)
class Settings:
    """What the app serves and its limits (0 for ``max_batch``/``max_request_samples``: derived from the model)."""

    model_name: str = "model"
    max_batch: int = 0
    max_queue_delay_ms: float = 0.0
    max_queue: int = 64
    max_body_mb: float = 64.0
    max_request_samples: int = 0


@dataclass(frozen=True)
class Limits:
    """:class:`Settings` resolved for one model."""

    max_batch: int
    delay_s: float
    max_queue: int
    max_body: int
    max_request_samples: int
    max_queued_bytes: int


def resolve(model: Model, settings: Settings) -> Limits:
    """The limits ``settings`` give for ``model``; ValueError when one is out of range."""
    max_batch = settings.max_batch or model.capacity
    if not 1 <= max_batch <= model.capacity:
        raise ValueError(f"--max-batch must be between 1 and the model's capacity, {model.capacity}")
    if settings.max_queue_delay_ms < 0 or settings.max_queue < 1 or settings.max_body_mb <= 0:
        raise ValueError("--max-queue-delay-ms must be >= 0, --max-queue >= 1 and --max-body-mb > 0")
    if settings.max_request_samples < 0:
        raise ValueError("--max-request-samples must be >= 0")
    max_body = max(1, int(settings.max_body_mb * MB))
    sample_bytes = sum(math.prod(max(d, 1) for d in spec.shape) * np.dtype(spec.dtype).itemsize
                       for spec in (*model.inputs, *model.outputs))
    samples = settings.max_request_samples or max(max_batch, max_body // max(sample_bytes, 1))
    return Limits(max_batch, settings.max_queue_delay_ms / 1e3, settings.max_queue, max_body, samples,
                  QUEUED_BODIES * max_body)
