"""``modak tune``: the model shortlists, the target decides.

The plan's candidates worth measuring (:func:`modak.plan.worth_tuning`: the predicted top few, every candidate
whose predicted spread, what the model's trees disagree between, overlaps the leader's, and stock) race in
measurement rounds (:class:`modak.bench.harness.Session`). After ``min_rounds`` rounds, a candidate is dropped
once it is confidently slower than the current leader (the lower end of the paired per-round ratio's interval
above 1). The race stops when one candidate is left (the winner is confidently the fastest), when the budget would
be exceeded by another round (the leader wins, not confidently, and its statistical ties are named), or after
``max_rounds``.
The stock guard is measured too: only a candidate confidently faster than stock (paired ratio interval below 1)
replaces it. When the leader is not, the fastest of those that are wins (a steady candidate tied with an erratic
leader); when none is, stock is kept.
Every launch is stored as it is measured; the winner is recorded for the job's workload on the target, and
``modak plan``/``modak build`` choose it from then on and say so. Compile and tuning time (TVM MetaSchedule
trials included) happen inside the launches, so they count against the same budget.

``modak build`` runs the same race before it chooses, where the target is the machine it runs on (#66): on
:func:`each_runtime`'s shortlist, the predicted best of each runtime and precision, within
:data:`MEASURE_BUDGET_S` unless told otherwise.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from modak.bench.dispatch import Dispatcher
from modak.bench.harness import BENCH_WORKDIR, BenchSettings, Session
from modak.candidates.enumerate import Candidate
from modak.errors import InputError
from modak.measurements.stats import Ratio, ratio
from modak.measurements.store import Measurement, PerfStore, TunedChoice
from modak.plan import Plan, workload_identity, worth_tuning

MEASURE_BUDGET_S = 60.0  # modak build's race before it chooses: wall-clock seconds, unless told otherwise
MEASURE_BUDGET_VARIABLE = "MODAK_MEASURE_BUDGET"  # the environment's default for it (a CI runner's 0: predict)
MEASURE_LAUNCH_SECONDS = 0.5  # timed seconds per launch of that race (modak tune's protocol: 1 s)


def measure_budget(environ: Mapping[str, str] = os.environ) -> float:
    """The default budget of ``modak build``'s race: ``$MODAK_MEASURE_BUDGET`` seconds, else
    :data:`MEASURE_BUDGET_S`."""
    text = environ.get(MEASURE_BUDGET_VARIABLE, "").strip()
    if not text:
        return MEASURE_BUDGET_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise InputError(f"{MEASURE_BUDGET_VARIABLE}={text!r}: expected seconds, 0 or more (0: choose by prediction)")
    return value


@dataclass(frozen=True)
class TuneSettings:
    """The race's limits; ``protocol`` times each launch (its ``launches`` is not used: rounds are)."""

    budget_s: float = 600.0  # wall-clock seconds for the whole race
    trials: int = 8  # candidates raced, at most
    min_rounds: int = 3  # launches of every candidate before any is dropped
    max_rounds: int = 8  # `modak tune --max-rounds`
    protocol: BenchSettings = BenchSettings()

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or self.trials < 1 or self.min_rounds < 1:
            raise InputError("--race-budget must be positive, --trials at least 1, and min rounds at least 1")
        if self.max_rounds < self.min_rounds:
            raise InputError(f"--max-rounds must be at least {self.min_rounds}, the rounds before a candidate can be "
                             "dropped")


@dataclass(frozen=True)
class Standing:
    """A finalist at the end of the race."""

    name: str
    launches: int
    step_s: float | None  # median over its launches (None: it never measured)
    interval: tuple[float, float] | None
    versus_winner: Ratio | None  # its step time / the winner's
    status: str  # winner, tied, dropped after N rounds, failed: ..., contended
    row: Measurement | None


@dataclass(frozen=True)
class TuneResult:
    shortlist: tuple[str, ...]
    zero_shot: str  # the plan's choice before tuning
    winner: str | None
    confident: bool
    stopped: str  # why the race ended
    rounds: int
    seconds: float
    standings: tuple[Standing, ...]
    recorded: TunedChoice | None


def shortlist(plan: Plan, trials: int) -> list[Candidate]:
    """At most ``trials`` candidates worth tuning, stock kept in when there is room for two."""
    return _with_stock(plan, [r.candidate for r in worth_tuning(plan)], trials)


def _with_stock(plan: Plan, candidates: list[Candidate], trials: int) -> list[Candidate]:
    """The first ``trials`` of ``candidates``, the plan's stock deployment among them when there is room for two."""
    stock = plan.stock.candidate if plan.stock else None
    if stock is None or stock in candidates[:trials] or trials < 2:
        return candidates[:trials]
    return [c for c in candidates if c != stock][: trials - 1] + [stock]


def each_runtime(plan: Plan, trials: int, budget_s: float) -> list[Candidate]:
    """``modak build``'s shortlist: the predicted best of each runtime, device and precision whose predicted
    compile and tuning time leaves room in ``budget_s`` for the others (at most half of it), best predicted first;
    stock kept in as in :func:`shortlist`. Never a candidate whose output failed the reference check."""
    best: dict[tuple[str, str, str], Candidate] = {}
    for ranked in sorted(plan.ranked, key=lambda r: r.objective_seconds):
        if ranked.failed_check is None and ranked.prediction.compile_seconds <= budget_s / 2:
            candidate = ranked.candidate
            best.setdefault((candidate.runtime, candidate.device, candidate.precision.value), candidate)
    return _with_stock(plan, list(best.values()), trials)


def tune(plan: Plan, store: PerfStore, settings: TuneSettings = TuneSettings(), dispatcher: Dispatcher | None = None,
         on_launch: Callable[[Candidate, dict], None] | None = None,
         on_round: Callable[[int, list[str], list[str]], None] | None = None,
         finalists: list[Candidate] | None = None, command: str = "modak tune") -> TuneResult:
    """Race ``finalists`` (default: the plan's :func:`shortlist`) on this target (see the module's description);
    ``on_round(round, alive, dropped)`` is told after every round; ``command`` is named in the recorded summary."""
    from modak.bench.dispatch import LocalDispatcher

    finalists = finalists if finalists is not None else shortlist(plan, settings.trials)
    alive = list(finalists)
    dropped: dict[str, int] = {}
    start = time.monotonic()
    stopped = f"{settings.max_rounds} rounds measured"
    with Session(plan, store, settings.protocol, dispatcher or LocalDispatcher(), BENCH_WORKDIR,
                 on_launch) as session:
        rows: dict[str, Measurement] = {}
        round_seconds = 0.0
        while session.rounds < settings.max_rounds:
            elapsed = time.monotonic() - start
            if session.rounds and elapsed + round_seconds > settings.budget_s:
                stopped = f"the budget ({settings.budget_s:g} s) leaves no time for another round"
                break
            began = time.monotonic()
            rows.update(session.run_round(alive))
            round_seconds = time.monotonic() - began
            alive = [c for c in alive if c.name not in session.failed]
            if not alive:
                stopped = "every candidate failed"
                break
            out = _confidently_slower(session, alive) if session.rounds >= settings.min_rounds else []
            for candidate in out:
                dropped[candidate.name] = session.rounds
            alive = [c for c in alive if c not in out]
            if on_round:
                on_round(session.rounds, [c.name for c in alive], [c.name for c in out])
            if len(alive) == 1 and session.rounds >= settings.min_rounds:
                stopped = "one candidate left: every other was confidently slower"
                break
        return _result(plan, store, session, finalists, alive, dropped, rows, stopped, time.monotonic() - start,
                       command)


def _center(session: Session, candidate: Candidate) -> float:
    """The geometric mean of ``candidate``'s launches: the same center as the paired ratios'."""
    times = [r["step_median_s"] for r in session.launches[candidate.name]]
    return math.exp(sum(math.log(t) for t in times) / len(times))


def _confidently_slower(session: Session, alive: list[Candidate]) -> list[Candidate]:
    """The candidates whose paired ratio to the current leader is confidently above 1."""
    leader = min(alive, key=lambda c: _center(session, c))
    return [c for c in alive if c is not leader and _versus(session, c, leader).slower()]


def _versus(session: Session, a: Candidate, b: Candidate) -> Ratio:
    return ratio([r["step_median_s"] for r in session.launches[a.name]],
                 [r["step_median_s"] for r in session.launches[b.name]], paired=True)


def _result(plan: Plan, store: PerfStore, session: Session, finalists: list[Candidate], alive: list[Candidate],
            dropped: dict[str, int], rows: dict[str, Measurement], stopped: str, seconds: float,
            command: str) -> TuneResult:
    measured = [c for c in alive if session.launches.get(c.name)]
    winner = min(measured, key=lambda c: _center(session, c)) if measured else None
    confident = winner is not None and len(alive) == 1 and session.rounds >= 2
    stock = plan.stock.candidate if plan.stock and session.launches.get(plan.stock.candidate.name) else None
    over_stock = None  # the stock guard, measured: the fastest, when it is not confidently faster than stock
    over_stock_ratio = None  # the fastest's step / stock's
    if winner is not None and stock is not None and winner != stock:
        over_stock_ratio = _versus(session, winner, stock)
        if not over_stock_ratio.faster():
            beating = [c for c in measured if c != stock and _versus(session, c, stock).faster()]
            over_stock, confident = winner, False
            winner = min(beating, key=lambda c: _center(session, c)) if beating else stock
    standings = []
    for candidate in finalists:
        launches = session.launches.get(candidate.name, [])
        row = rows.get(candidate.name)
        versus = _versus(session, candidate, winner) if launches and winner and candidate is not winner else None
        if candidate is winner:
            status = "winner" + ((" (stock kept)" if winner is stock else " (confidently faster than stock)")
                                 if over_stock else "")
        elif candidate is over_stock:
            status = "fastest, not confidently faster than stock"
        elif candidate.name in dropped:
            status = f"dropped after {dropped[candidate.name]} rounds"
        elif candidate.name in session.failed:
            status = f"failed: {session.failed[candidate.name]}"
        else:
            status = "tied with the winner" if versus and not versus.slower() else "slower"
        if row is not None and row.status == "contended":
            status += " (contended)"
        measured_row = row if launches else None  # its median and interval over the launches
        standings.append(Standing(candidate.name, len(launches),
                                  measured_row.step_median_s if measured_row else None,
                                  measured_row.interval_s if measured_row else None, versus, status, row))
    recorded = None
    winner_row = rows.get(winner.name) if winner else None
    if winner is not None and winner_row is not None and winner_row.status == "ok":
        recorded = _record(plan, store, session, winner, winner_row, confident, len(finalists), standings,
                           over_stock, over_stock_ratio, command)
    return TuneResult(tuple(c.name for c in finalists), plan.choice.candidate.name,
                      winner.name if winner else None, confident, stopped, session.rounds, seconds,
                      tuple(standings), recorded)


def _record(plan: Plan, store: PerfStore, session: Session, winner: Candidate, row: Measurement, confident: bool,
            trials: int, standings: list[Standing], over_stock: Candidate | None,
            over_stock_ratio: Ratio | None, command: str) -> TunedChoice:
    others = [s for s in standings if s.versus_winner is not None]
    stock = next((s for s in others if plan.stock and s.name == plan.stock.candidate.name), None)
    if over_stock is not None and over_stock_ratio is not None:
        fastest = (f"the fastest measured, {over_stock.name}, ran at {over_stock_ratio.describe()} of stock's step "
                   "time, not confidently faster")
        kept = plan.stock is not None and winner == plan.stock.candidate
        guard = f"kept the stock deployment: {fastest}; " if kept else f"{fastest}; this one is: "
    else:
        guard = ""
    step, interval = row.step_s, row.interval_s
    if interval is None:
        raise ValueError(f"the winner's row of {winner.name} has no interval (aggregate_row gives every row one)")
    versus_stock = stock.versus_winner if stock else None
    summary = guard + (f"measured {step * 1e3:.3g} ms per step [{interval[0] * 1e3:.3g}, "
               f"{interval[1] * 1e3:.3g}] over {row.launches} launches in `{command}` "
               + ("(confidently the fastest" if confident else "(the fastest when the race stopped, not confidently")
               + f" of {trials} candidates"
               + (f"; stock was {versus_stock.describe()} its step time" if versus_stock else "") + ")")
    choice = TunedChoice(
        machine=plan.loaded.target.name, workload=workload_identity(plan.loaded, plan.workload),
        candidate=winner.name, step_s=step, ci_low_s=interval[0], ci_high_s=interval[1],
        confident=confident, trials=trials, rounds=session.rounds, session=session.id, summary=summary,
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    store.record_tuned(choice)
    return choice


def result_dict(result: TuneResult) -> dict:
    """JSON-ready form of a race (``modak tune --json``)."""
    return {
        "shortlist": list(result.shortlist), "zero_shot": result.zero_shot, "winner": result.winner,
        "confident": result.confident, "stopped": result.stopped, "rounds": result.rounds,
        "seconds": round(result.seconds, 2), "recorded": result.recorded is not None,
        "standings": [{"candidate": s.name, "launches": s.launches, "step_seconds": s.step_s,
                       "interval_seconds": list(s.interval) if s.interval else None, "status": s.status,
                       "versus_winner": None if s.versus_winner is None else {
                           "ratio": s.versus_winner.estimate, "interval": [s.versus_winner.low,
                                                                          s.versus_winner.high]}}
                      for s in result.standings]}


def describe(result: TuneResult) -> list[str]:
    """Lines for the terminal."""
    lines = [f"raced {len(result.shortlist)} candidates in {result.rounds} rounds, {result.seconds:.0f} s: "
             f"{result.stopped}"]
    for s in result.standings:
        timing = (f"{s.step_s * 1e3:8.3g} ms [{s.interval[0] * 1e3:.3g}, {s.interval[1] * 1e3:.3g}]"
                  if s.step_s and s.interval else f"{'-':>8}")
        versus = f"  {s.versus_winner.describe()} of the winner" if s.versus_winner else ""
        lines.append(f"  {timing}  {s.status:<28} {s.name}{versus}")
    if result.winner:
        same = result.winner == result.zero_shot
        lines.append(f"winner: {result.winner}" + (" (the plan's zero-shot choice too)" if same else
                                                   f" (the plan had predicted {result.zero_shot})"))
    if result.recorded:
        lines.append("recorded for this job on this target: `modak plan` and `modak build` now choose it")
    elif result.winner:
        lines.append("not recorded: the winner's measurement ran on a busy machine; tune again when it is quiet")
    return lines
