"""``modak whatif``: the job planned on each of several targets: the best candidate on each, its predicted step and
time to solution with intervals, the cost where a target states a price, ranked by the job's objective, and the
Pareto front of time against cost.

A target's ``scheduler.co_runners`` (busy processes time-sliced on the job's cores) is predicted by the sharing
model (:func:`modak.advise.contention.co_runner_slowdown`); ``scheduler.cores_per_job`` makes the
target a part of a node (its ceilings scale, its price is the cores' share of the node's).

Time and cost are per run when the job gives ``objective.steps`` (time to solution: compile/tune time plus the
steps; cost: the node share's price for that long); otherwise per :data:`PER_UNITS` samples (objective
throughput) or steps (latency), and the result says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from modak.advise.contention import co_runner_slowdown
from modak.documents import SCHEMA_VERSION, encoded, rounded
from modak.documents import whatif as doc
from modak.errors import InputError
from modak.plan import Plan
from modak.spec.models import Metric

PER_UNITS = 1000  # without objective.steps, time and cost are per this many samples (throughput) or steps
HOUR = 3600.0


@dataclass(frozen=True)
class Basis:
    """What a time and a cost are for: one run of ``count`` steps, or ``count`` samples or steps."""

    kind: str  # run, samples or steps
    count: int

    def describe(self) -> str:
        return f"the run ({self.count} steps)" if self.kind == "run" else f"{self.count} {self.kind}"


@dataclass(frozen=True)
class Outcome:
    """The job on one target: its plan's choice and what it predicts, time and cost on the job's basis."""

    file: Path
    plan: Plan
    sharing: float  # slowdown from the target's co-runners (1: none)
    time_seconds: float
    time_low: float
    time_high: float
    cost: float | None  # in ``currency``; None: the target states no price
    cost_low: float | None
    cost_high: float | None
    currency: str | None
    rank: int = 0
    pareto: bool | None = None  # on the time/cost front; None: unpriced, outside the front

    @property
    def target(self) -> str:
        return self.plan.loaded.target.name

    @property
    def step_seconds(self) -> float:
        return self.plan.choice.prediction.step_seconds * self.sharing

    @property
    def step_interval(self) -> tuple[float, float]:
        p = self.plan.choice.prediction
        return p.low_seconds * self.sharing, p.high_seconds * self.sharing

    @property
    def objective_seconds(self) -> float:
        """The step plus compile/tune time amortized over the job's steps (as the plan ranks)."""
        choice = self.plan.choice
        return choice.objective_seconds + choice.prediction.step_seconds * (self.sharing - 1.0)

    @property
    def samples_per_second(self) -> float:
        return self.plan.workload.batch_size / self.objective_seconds

    def record(self) -> doc.TargetOutcome:
        """A row of the document's ``targets``."""
        target, choice = self.plan.loaded.target, self.plan.choice
        low, high = self.step_interval
        return doc.TargetOutcome(
            rank=self.rank, target=self.target, file=str(self.file), candidate=choice.candidate.name,
            device=choice.candidate.device, threads=choice.candidate.threads,  # type: ignore[arg-type]
            cores=self.plan.ceilings.cores, co_runners=target.scheduler.co_runners,
            sharing_slowdown=rounded(self.sharing), batch_size=self.plan.workload.batch_size,
            predictor=choice.prediction.predictor, step_seconds=rounded(self.step_seconds),
            step_interval_seconds=[rounded(low), rounded(high)],
            compile_seconds=rounded(choice.prediction.compile_seconds),
            samples_per_second=rounded(self.samples_per_second), time_seconds=rounded(self.time_seconds),
            time_interval_seconds=[rounded(self.time_low), rounded(self.time_high)],
            cost=None if self.cost is None else rounded(self.cost),
            cost_interval=None if self.cost_low is None else [rounded(self.cost_low), rounded(self.cost_high or 0)],
            currency=self.currency, priced=self.cost is not None, pareto=self.pareto)


@dataclass(frozen=True)
class WhatIf:
    """The job on every target, ranked by its objective (rank 1 first)."""

    job: str
    metric: Metric
    basis: Basis
    outcomes: tuple[Outcome, ...]
    notes: tuple[str, ...]

    @property
    def front(self) -> tuple[Outcome, ...]:
        """The Pareto front of time against cost, fastest first."""
        return tuple(sorted((o for o in self.outcomes if o.pareto), key=lambda o: (o.time_seconds, o.cost or 0.0)))

    def to_dict(self) -> dict[str, Any]:
        """``modak whatif --json``: a :class:`~modak.documents.whatif.WhatIfDocument`."""
        return encoded(doc.WhatIfDocument(
            schema_version=SCHEMA_VERSION, job=self.job,
            objective=doc.WhatIfObjective(metric=self.metric.value),  # type: ignore[arg-type]
            basis=doc.Basis(kind=self.basis.kind, count=self.basis.count),  # type: ignore[arg-type]
            targets=[o.record() for o in self.outcomes], pareto_front=[o.target for o in self.front],
            notes=list(self.notes)))


def pareto_front(points: Sequence[tuple[float, float] | None]) -> list[bool | None]:
    """For each (time, cost) point, whether no other point is at least as good in both and better in one (None
    for a missing point: unpriced, outside the front). Equal points are all on the front."""
    flags: list[bool | None] = []
    for i, point in enumerate(points):
        if point is None:
            flags.append(None)
            continue
        dominated = any(other is not None and j != i and other[0] <= point[0] and other[1] <= point[1]
                        and other != point for j, other in enumerate(points))
        flags.append(not dominated)
    return flags


def cost(per_node_hour: float, seconds: float, cores: int, node_cores: int) -> float:
    """The price of ``seconds`` on ``cores`` of a node's ``node_cores``: one node's share for that long."""
    return per_node_hour * (cores / node_cores) * seconds / HOUR


def basis_of(metric: Metric, steps: int | None) -> Basis:
    if steps:
        return Basis("run", steps)
    return Basis("samples" if metric is Metric.throughput else "steps", PER_UNITS)


def outcome(file: Path, plan: Plan, basis: Basis) -> Outcome:
    """The job's outcome on the target of ``plan`` (its co-runners applied), on ``basis``."""
    target = plan.loaded.target
    sharing = co_runner_slowdown(plan, target.scheduler.co_runners)
    prediction = plan.choice.prediction
    batch = plan.workload.batch_size
    steps_of = {"run": basis.count, "steps": basis.count, "samples": basis.count / batch}[basis.kind]
    compile_s = prediction.compile_seconds if basis.kind == "run" else 0.0
    # Per samples or steps, compile time counts as the plan amortizes it over the job's steps (none without them).
    time, low, high = (compile_s + steps_of * seconds * sharing
                       for seconds in (prediction.step_seconds, prediction.low_seconds, prediction.high_seconds))
    price = target.cost
    node_cores = target.cpu.sockets * target.cpu.cores_per_socket
    if price is None:
        return Outcome(file, plan, sharing, time, low, high, None, None, None, None)
    money, money_low, money_high = (cost(price.per_node_hour, t, plan.ceilings.cores, node_cores)
                                    for t in (time, low, high))
    return Outcome(file, plan, sharing, time, low, high, money, money_low, money_high, price.currency)


def rank_key(item: Outcome, metric: Metric) -> tuple:
    """What the job's objective ranks by (smaller first), ties broken by cost (priced first) and target name."""
    value = {Metric.throughput: -item.samples_per_second, Metric.latency: item.objective_seconds,
             Metric.time_to_solution: item.time_seconds}[metric]
    return (value, item.cost is None, item.cost or 0.0, item.target)


def whatif(plans: Sequence[tuple[Path, Plan]]) -> WhatIf:
    """Rank the job's plans on several targets (each with the target's file) by the job's objective and mark the
    Pareto front of time against cost. :func:`modak.api.whatif` plans the job on each target."""
    if not plans:
        raise InputError("modak whatif needs at least one target (--targets A.yaml B.yaml ...)")
    first = plans[0][1].loaded.job
    metric, steps = first.objective.metric, first.objective.steps
    priced = [p.loaded for _, p in plans if p.loaded.target.cost]
    for loaded in priced[1:]:
        currency, first_currency = loaded.target.cost.currency, priced[0].target.cost.currency  # type: ignore[union-attr]
        if currency != first_currency:
            raise loaded.target_doc.error(("cost", "currency"),
                                          f"{currency}, but {priced[0].target_doc.path} prices in {first_currency}: "
                                          "costs in different currencies cannot be compared")
    basis = basis_of(metric, steps)
    items = sorted((outcome(file, plan, basis) for file, plan in plans), key=lambda o: rank_key(o, metric))
    front = pareto_front([(o.time_seconds, o.cost) if o.cost is not None else None for o in items])
    items = [replace(o, rank=i, pareto=flag) for i, (o, flag) in enumerate(zip(items, front), 1)]
    notes = []
    if basis.kind != "run":
        notes.append(f"the job gives no objective.steps: time and cost are per {basis.describe()}, ranked by "
                     f"{'samples per second' if metric is Metric.throughput else 'step time'}; give objective.steps "
                     "for time to solution")
    unpriced = [o.target for o in items if o.cost is None]
    if unpriced:
        notes.append(f"no price (cost.per_node_hour) for {', '.join(unpriced)}: outside the Pareto front of time "
                     "against cost")
    shared = [o for o in items if o.sharing > 1]
    for o in shared:
        notes.append(f"{o.target}: {o.plan.loaded.target.scheduler.co_runners} co-runner(s) on its "
                     f"{o.plan.ceilings.cores} core(s) slow the step {o.sharing:.2f}x "
                     "(the sharing model of modak pack)")
    return WhatIf(first.name, metric, basis, tuple(items), tuple(notes))

