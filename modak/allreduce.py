"""The alpha-beta model of data-parallel training's all-reduce (:mod:`modak.scaling` explains it): the links
between workers, their defaults (``recipes/hardware/interconnects.yaml``), and the step predicted for a worker
count."""

from __future__ import annotations

import math
from dataclasses import dataclass

from modak.documents import rounded
from modak.documents import scale as doc
from modak.hardware.ceilings import interconnects

ALGORITHMS = ("ring", "tree")
GRADIENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes per gradient value, by scaling.gradient_dtype
MIB = 1024 * 1024


@dataclass(frozen=True)
class Link:
    """One level of the hierarchy: the link between the workers of a node, or between nodes."""

    kind: str  # nvlink, pcie4, infiniband, ethernet, ...
    bandwidth_gbs: float  # beta: GB/s (1e9 bytes) per direction, of one GPU (intra-node) or one node (network)
    latency_us: float  # alpha: one step of a collective
    source: str  # where the two numbers come from, in words

    def record(self) -> doc.Link:
        """``modak scale``'s ``intra_node`` or ``network``."""
        return doc.Link(kind=self.kind, bandwidth_gbs=rounded(self.bandwidth_gbs),
                        latency_us=rounded(self.latency_us), source=self.source)


@dataclass(frozen=True)
class Layout:
    workers: int
    nodes: int
    per_node: int


@dataclass(frozen=True)
class Point:
    """The prediction for one worker count."""

    workers: int
    nodes: int
    per_node: int
    step_s: float
    compute_s: float
    comm_s: float  # the all-reduce of one step, hidden or not
    exposed_s: float  # the part of it the step waits for
    algorithm: str | None  # ring or tree; None for one worker
    efficiency: float

    @property
    def comm_share(self) -> float:
        """The share of the step spent waiting for communication."""
        return self.exposed_s / self.step_s

    def samples_per_second(self, batch: int) -> float:
        return self.workers * batch / self.step_s

    def record(self, batch: int) -> doc.Point:
        """A row of ``modak scale``'s ``points``."""
        return doc.Point(workers=self.workers, nodes=self.nodes, workers_per_node=self.per_node,
                         step_seconds=rounded(self.step_s), compute_seconds=rounded(self.compute_s),
                         allreduce_seconds=rounded(self.comm_s), exposed_comm_seconds=rounded(self.exposed_s),
                         comm_share=rounded(self.comm_share), algorithm=self.algorithm,  # type: ignore[arg-type]
                         samples_per_second=rounded(self.samples_per_second(batch)),
                         efficiency=rounded(self.efficiency))


@dataclass(frozen=True)
class ScalingModel:
    """The alpha-beta model of one job on one target (see the module docstring)."""

    compute_s: float  # one worker's step
    backward_share: float  # of compute_s
    gradient_bytes: float  # S
    overlap: float  # share of the communication that can hide behind the backward pass
    workers_per_node: int  # g
    max_nodes: int
    intra: Link | None  # None: one worker per node
    network: Link | None  # None: one node only
    bucket_bytes: float
    base_latency_us: float
    algorithms: tuple[str, ...] = ALGORITHMS

    @property
    def backward_s(self) -> float:
        return self.compute_s * self.backward_share

    @property
    def calls(self) -> int:
        """Collective calls a step: one per gradient bucket."""
        return max(1, math.ceil(self.gradient_bytes / self.bucket_bytes))

    @property
    def max_workers(self) -> int:
        return self.workers_per_node * self.max_nodes

    def layout(self, workers: int) -> Layout:
        """``workers`` as nodes x workers per node: a part of one node, or whole nodes."""
        g = self.workers_per_node
        if workers < 1 or (workers > g and workers % g):
            raise ValueError(f"{workers} workers are neither part of one node nor whole nodes of {g}")
        return Layout(workers, 1, workers) if workers <= g else Layout(workers, workers // g, g)

    def allreduce_s(self, workers: int) -> dict[str, float]:
        """Seconds of one step's all-reduce per algorithm (0 for one worker)."""
        if workers == 1:
            return {a: 0.0 for a in self.algorithms}
        shape = self.layout(workers)
        links = []
        alpha_intra = alpha_net = 0.0
        if shape.per_node > 1:
            assert self.intra is not None
            links.append(self.intra)
            alpha_intra = self.intra.latency_us
        if shape.nodes > 1:
            if self.network is None:
                raise ValueError(f"{workers} workers need {shape.nodes} nodes, but the nodes are not connected")
            links.append(self.network)
            alpha_net = self.network.latency_us
        beta = min(link.bandwidth_gbs for link in links) * 1e9
        n, g, size = shape.nodes, shape.per_node, self.gradient_bytes
        times = {}
        if "ring" in self.algorithms:
            latency = self.base_latency_us + 2 * (workers - n) * alpha_intra + 2 * (n - 1) * alpha_net
            times["ring"] = self.calls * latency * 1e-6 + 2 * (workers - 1) / workers * size / beta
        if "tree" in self.algorithms:
            latency = self.base_latency_us + 2 * ((g - 1) * alpha_intra + math.ceil(math.log2(n)) * alpha_net)
            times["tree"] = self.calls * latency * 1e-6 + 2 * size / beta
        return times

    def exposed_s(self, comm_s: float) -> float:
        """The communication the step waits for: what does not hide behind the backward pass."""
        return comm_s - self.overlap * min(comm_s, self.backward_s)

    def predict(self, workers: int) -> Point:
        shape = self.layout(workers)
        times = self.allreduce_s(workers)
        algorithm = min(times, key=lambda a: times[a]) if workers > 1 else None
        comm = times[algorithm] if algorithm else 0.0
        exposed = self.exposed_s(comm)
        step = self.compute_s + exposed
        return Point(workers, shape.nodes, shape.per_node, step, self.compute_s, comm, exposed, algorithm,
                     self.compute_s / step)

    def worker_counts(self, limit: int | None = None) -> tuple[int, ...]:
        """The counts to predict: powers of two within a node and the full node, then whole nodes by powers of
        two, and the most there are (within ``limit``, whole nodes beyond one)."""
        g = self.workers_per_node
        top = min(limit or self.max_workers, self.max_workers)
        if top > g:
            top -= top % g
        counts = {1, min(g, top), top}
        k = 2
        while k < min(g, top):
            counts.add(k)
            k *= 2
        nodes = 2
        while nodes * g <= top:
            counts.add(nodes * g)
            nodes *= 2
        return tuple(sorted(counts))

    def record(self) -> doc.Model:
        """``modak scale``'s ``model``."""
        return doc.Model(compute_seconds=rounded(self.compute_s), backward_seconds=rounded(self.backward_s),
                         gradient_bytes=int(self.gradient_bytes), bucket_bytes=int(self.bucket_bytes),
                         allreduce_calls=self.calls, overlap=rounded(self.overlap),
                         workers_per_node=self.workers_per_node, max_nodes=self.max_nodes,
                         base_latency_us=rounded(self.base_latency_us),
                         algorithms=list(self.algorithms),  # type: ignore[arg-type]
                         intra_node=self.intra.record() if self.intra else None,
                         network=self.network.record() if self.network else None)


def network_link(kind: str, bandwidth_gbps: float | None = None, latency_us: float | None = None,
                 efficiency: float | None = None, given: str = "the given") -> Link:
    """The link between nodes of network ``kind``: the line rate (``bandwidth_gbps``, Gbit/s per direction) times
    the share of it a collective moves data at (``efficiency``), and the latency per step; each value not given
    is the interconnect table's default for ``kind``, and the link's source says which came from where."""
    spec = interconnects()["network"][kind]
    gbps = float(bandwidth_gbps or spec["bandwidth_gbps"])
    share = float(efficiency or spec["efficiency"])
    parts = [f"{kind}: bandwidth " + (f"{given} {gbps:g} Gbit/s" if bandwidth_gbps
                                       else f"the default for {kind} ({gbps:g} Gbit/s)"),
             f"x {share:g} " + (f"({given} efficiency)" if efficiency else
                                "(what TCP sockets reach, recipes/hardware/interconnects.yaml)" if share < 1
                                else "(RDMA: the line rate)"),
             "latency " + (given if latency_us else "NCCL's per-step constant")]
    return Link(kind, gbps * share / 8, float(latency_us or spec["latency_us"]), ", ".join(parts))


def default_overlap(gradient_bytes: float, bucket_bytes: float) -> float:
    """1 - bucket/S: all buckets but the last can be all-reduced while the backward pass runs."""
    return 1.0 - min(1.0, bucket_bytes / gradient_bytes) if gradient_bytes > 0 else 0.0
