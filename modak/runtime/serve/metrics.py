"""The server's Prometheus metrics (``GET /metrics``)."""

from __future__ import annotations


class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    def __init__(self, max_batch: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        sizes = sorted({2 ** i for i in range(max_batch.bit_length())} | {max_batch})
        self.requests = Counter("modak_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=self.registry)
        self.latency = Histogram("modak_request_seconds", "Seconds from a request's arrival to its response",
                                 ["endpoint"], registry=self.registry)
        self.batch_size = Histogram("modak_batch_size", "Samples per model step (dynamic batches)",
                                    buckets=[float(s) for s in sizes], registry=self.registry)
        self.batch_requests = Histogram("modak_batch_requests", "Requests per model step",
                                        buckets=[float(s) for s in sizes], registry=self.registry)
        self.inference = Histogram("modak_inference_seconds", "Seconds of one Model.run on a batch",
                                   registry=self.registry)
        self.preprocess = Histogram("modak_preprocess_seconds", "Seconds the pre-processing took on a request of "
                                    "raw items (text, images)", registry=self.registry)
        self.postprocess = Histogram("modak_postprocess_seconds", "Seconds the post-processing took on a request "
                                     "of raw items", registry=self.registry)
        self.queue_depth = Gauge("modak_queue_depth", "Requests waiting for a batch", registry=self.registry)

    def text(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
