"""`modak whatif`: the Pareto front, cost arithmetic, ranking by the job's objective, co-runners through the sharing
model, the JSON document against its schema, the HTML report, and bad target files (exit 2, the file named)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from modak import api
from modak.advise.contention import co_runner_slowdown, load_of
from modak.advise.whatif import cost, pareto_front
from modak.cli import main
from modak.errors import InputError
from modak.hardware.ceilings import Ceilings, core_share
from modak.predict.base import Prediction
from modak.predict.roofline import thread_shares
from modak.spec.models import Precision
from tests.support.onnx_graphs import write_onnx

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "modak" / "schemas" / "whatif.schema.json").read_text())


@dataclass(frozen=True)
class Scaled:
    """A predictor whose step follows the target: FLOPs over the candidate's share of the peak, plus overhead."""

    overhead_s: float = 1e-4
    name: str = "scaled"

    def predict(self, workload: Any, ceilings: Any, candidate: Any, recipe: Any) -> Prediction:
        device = ceilings.gpu if candidate.device == "gpu" else ceilings.cpu
        share, _ = thread_shares(candidate, ceilings.cores)
        compute = 1e6 * workload.batch_size / (device.peak_gflops[candidate.precision] * 1e9 * share)
        step = compute + self.overhead_s
        terms = (("compute_s", compute), ("memory_s", 0.0), ("overhead_s", self.overhead_s),
                 ("bandwidth_gbs", device.bandwidth_gbs))
        return Prediction(step, step / 2, step * 2, 3.0, terms, "compute", self.name)


def write_job(folder: Path, steps: int | None = 1000, metric: str = "throughput", name: str = "tiny") -> Path:
    write_onnx(folder / "model.onnx")
    objective: dict[str, Any] = {"metric": metric}
    if steps:
        objective["steps"] = steps
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "modak/v1", "kind": "Job", "name": name, "task": "inference",
                                    "model": {"onnx": "model.onnx", "batch_size": 8}, "objective": objective,
                                    "constraints": {"runtimes": ["onnxruntime"]}}))
    return path


def write_target(folder: Path, name: str, cores: int, price: float | None = None, currency: str = "EUR",
                 **scheduler: Any) -> Path:
    document: dict[str, Any] = {"apiVersion": "modak/v1", "kind": "Target", "name": name,
                                "cpu": {"microarchitecture": "zen3", "cores_per_socket": cores,
                                        "peaks": {"fp32_gflops": 100.0 * cores, "memory_bandwidth_gbs": 40.0}},
                                "memory": {"size_gb": 64}, "scheduler": {"kind": "none", **scheduler}}
    if price is not None:
        document["cost"] = {"per_node_hour": price, "currency": currency}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


# The Pareto front -------------------------------------------------------------------------------------------------


def test_pareto_front_keeps_the_points_no_other_beats_in_both() -> None:
    #        fast, dear   slow, cheap   dominated    in between   unpriced
    points = [(1.0, 9.0), (9.0, 1.0), (9.0, 9.0), (5.0, 5.0), None]
    assert pareto_front(points) == [True, True, False, True, None]


def test_pareto_front_ties() -> None:
    assert pareto_front([(2.0, 2.0), (2.0, 2.0)]) == [True, True]  # equal points: neither beats the other
    assert pareto_front([(2.0, 3.0), (2.0, 2.0)]) == [False, True]  # same time, dearer: dominated
    assert pareto_front([(3.0, 2.0), (2.0, 2.0)]) == [False, True]  # same cost, slower: dominated
    assert pareto_front([None, None]) == [None, None]
    assert pareto_front([]) == []


def test_cost_is_the_node_share_for_the_time() -> None:
    assert cost(2.0, 3600, 4, 4) == pytest.approx(2.0)
    assert cost(2.0, 1800, 1, 4) == pytest.approx(0.25)
    assert cost(0.0, 3600, 4, 4) == 0.0


# whatif over targets ----------------------------------------------------------------------------------------------


def test_whatif_ranks_by_throughput_prices_and_marks_the_front(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    targets = [write_target(tmp_path, "big", 8, price=8.0), write_target(tmp_path, "small", 2, price=1.0),
               write_target(tmp_path, "dear-small", 2, price=5.0), write_target(tmp_path, "free-beer", 4)]
    result = api.whatif(job, targets, using=Scaled())
    names = [o.target for o in result.outcomes]
    assert names[0] == "big" and names[-2:] == ["small", "dear-small"]  # fastest first; a tie goes to the cheaper
    by_name = {o.target: o for o in result.outcomes}
    small = by_name["small"]
    step = small.plan.choice.prediction.step_seconds
    assert small.time_seconds == pytest.approx(3.0 + 1000 * step)  # compile + steps x step
    assert small.cost == pytest.approx(1.0 * small.time_seconds / 3600)
    assert small.cost_low == pytest.approx(1.0 * (3.0 + 1000 * step / 2) / 3600)
    assert (by_name["big"].pareto, small.pareto, by_name["dear-small"].pareto) == (True, True, False)
    assert by_name["free-beer"].pareto is None and by_name["free-beer"].cost is None
    assert any("free-beer" in note and "Pareto" in note for note in result.notes)
    document = result.to_dict()
    Draft202012Validator(SCHEMA).validate(document)
    assert document["pareto_front"] == ["big", "small"]


def test_a_part_of_a_node_pays_its_share(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    whole, half = (write_target(tmp_path, "whole", 4, price=4.0),
                   write_target(tmp_path, "half", 4, price=4.0, cores_per_job=2))
    by_name = {o.target: o for o in api.whatif(job, [whole, half], using=Scaled()).outcomes}
    assert by_name["half"].plan.ceilings.cores == 2
    assert by_name["half"].cost == pytest.approx(4.0 * 0.5 * by_name["half"].time_seconds / 3600)


def test_a_part_of_a_node_draws_its_cores_measured_bandwidth_up_to_the_nodes() -> None:
    node = Ceilings(kind="cpu", name="zen3", peak_gflops={Precision.fp32: 400.0}, bandwidth_gbs=40.0, memory_gb=8.0,
                    measured=True, core_bandwidth_gbs=15.0)
    assert [core_share(node, k, 4).bandwidth_gbs for k in (1, 2, 3, 4)] == [15.0, 30.0, 40.0, 40.0]
    assert core_share(node, 1, 4).peak_gflops == {Precision.fp32: 100.0}
    unmeasured = replace(node, core_bandwidth_gbs=None)  # a few cores draw much of it: all at half the node's
    assert [core_share(unmeasured, k, 4).bandwidth_gbs for k in (1, 2, 3)] == [20.0, 40.0, 40.0]


def test_without_steps_time_and_cost_are_per_thousand_samples(tmp_path: Path) -> None:
    job = write_job(tmp_path, steps=None)
    result = api.whatif(job, [write_target(tmp_path, "one", 2, price=3.6)], using=Scaled())
    o = result.outcomes[0]
    assert (result.basis.kind, result.basis.count) == ("samples", 1000)
    assert o.time_seconds == pytest.approx(1000 / 8 * o.plan.choice.prediction.step_seconds)  # no compile
    assert any("no objective.steps" in note for note in result.notes)


def test_latency_jobs_rank_by_step_time(tmp_path: Path) -> None:
    job = write_job(tmp_path, steps=None, metric="latency")
    result = api.whatif(job, [write_target(tmp_path, "two", 2), write_target(tmp_path, "four", 4)], using=Scaled())
    assert [o.target for o in result.outcomes] == ["four", "two"]
    assert result.basis.kind == "steps"


def test_co_runners_use_the_sharing_model(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    quiet = write_target(tmp_path, "quiet", 2)
    busy = write_target(tmp_path, "busy", 2, allocation="shared", co_runners=1)
    result = api.whatif(job, [busy, quiet], using=Scaled())
    by_name = {o.target: o for o in result.outcomes}
    factor = co_runner_slowdown(by_name["busy"].plan, 1)
    assert factor > 1.0 and by_name["busy"].sharing == factor
    load = load_of(by_name["busy"].plan)  # two threads: their parallel share waits for the one beside the co-runner
    assert load.threads == 2 and load.synchronized == pytest.approx((load.cpu_demand - 1.0) / (load.threads - 1.0))
    assert factor > (load.cpu_demand + 1.0) / 2  # above the average share
    assert by_name["busy"].step_seconds == pytest.approx(by_name["busy"].plan.choice.prediction.step_seconds * factor)
    assert [o.target for o in result.outcomes] == ["quiet", "busy"]
    assert by_name["busy"].plan.choice.candidate.param("wait_policy") == "passive"  # shared cores: passive pools


def test_currencies_must_agree(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    eur, usd = write_target(tmp_path, "eur", 2, price=1.0), write_target(tmp_path, "usd", 2, price=1.0, currency="USD")
    with pytest.raises(InputError) as error:
        api.whatif(job, [eur, usd], using=Scaled())
    assert error.value.file == str(usd) and error.value.field == "cost.currency"


def test_co_runners_need_shared_cores_and_cores_per_job_fits_the_node(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    with pytest.raises(InputError) as error:
        api.load(job, write_target(tmp_path, "bad", 2, co_runners=1))
    assert "co_runners needs allocation: shared" in str(error.value) and error.value.field == "scheduler"
    with pytest.raises(InputError) as error:
        api.plan_job(job, write_target(tmp_path, "over", 2, cores_per_job=3), using=Scaled())
    assert error.value.field == "scheduler.cores_per_job"


# The command line ---------------------------------------------------------------------------------------------------


def test_cli_json_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job(tmp_path)
    targets = [write_target(tmp_path, "a", 2, price=1.0), write_target(tmp_path, "b", 4, price=3.0),
               write_target(tmp_path, "c", 4)]
    report = tmp_path / "whatif.html"
    code = main(["whatif", str(job), "--targets", *map(str, targets), "--predictor", "roofline", "--json",
                 "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0
    document = json.loads(out)
    Draft202012Validator(SCHEMA).validate(document)
    assert [t["rank"] for t in document["targets"]] == [1, 2, 3]
    html = report.read_text()
    assert 'id="time-cost"' in html and "data:image/png;base64," in html and "Pareto front" in html
    assert main(["whatif", str(job), "--targets", *map(str, targets), "--predictor", "roofline"]) == 0
    assert "Pareto front" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "invalid"])
def test_cli_bad_target_file_is_exit_2_naming_it(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job(tmp_path)
    good = write_target(tmp_path, "good", 2)
    bad = tmp_path / "bad.yaml"
    if case == "invalid":
        bad.write_text(good.read_text().replace("cores_per_socket: 2", "cores_per_socket: -2"))
    code = main(["whatif", str(job), "--targets", str(good), str(bad), "--predictor", "roofline"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"modak: error: {bad}")
    if case == "invalid":
        assert "cpu.cores_per_socket" in err[0]
