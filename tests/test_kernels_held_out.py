"""The held-out benchmark's choice of fits and rows: the draws of fewer groups, a held-out model's own launches and
the runs that correct its predictions."""

from __future__ import annotations

from benchmarks.models.kernels_held_out import _configuration, _data, fewer_groups, measured_runs, own_launches

MACHINES = ("ci-emeraldrapids-2c", "ci-zen4-2c")


def test_fewer_groups_draws_distinct_subsets_of_the_other_groups() -> None:
    groups = ["a", "b", "c", "d", "e"]
    jobs = fewer_groups(groups, [1, 3, 4], draws=2)
    for group in groups:
        mine = [(size, among) for held, size, among in jobs if held == group]
        # K = 4 is every other group: the fit on all of them, not a smaller one
        assert sorted(size for size, _ in mine) == [1, 1, 3, 3]
        assert all(group not in among and len(among) == size for size, among in mine)
        assert len({among for _, among in mine}) == 4
    assert jobs == fewer_groups(groups, [1, 3, 4], draws=2)  # seeded


def test_own_launches_take_one_fp32_launch_per_model_machine_and_runtime() -> None:
    whole = [w for w in _data(MACHINES)[2] if w.model in ("lstm_lm", "gru_kws")]
    launches = own_launches("recurrent", "family", MACHINES)
    chosen = [w for w in whole if _configuration(w) in launches]
    keys = [(w.machine, w.model, w.runtime) for w in chosen]
    assert len(keys) == len(set(keys)) == len({(w.machine, w.model, w.runtime) for w in whole})
    assert all(w.precision == "fp32" and w.batch_size == min(v.batch_size for v in whole if v.model == w.model)
               for w in chosen)


def test_measured_runs_take_the_predicted_best_of_each_workload_runtime_and_precision() -> None:
    whole = [w for w in _data(MACHINES)[2] if w.model in ("lstm_lm", "gru_kws")]
    predicted = [1 / w.step_s for w in whole]  # the slowest predicted fastest
    runs = measured_runs(whole, predicted)
    keys = [(w.machine, w.model, w.batch_size, w.input_shapes, w.runtime, w.precision) for w in runs]
    assert len(keys) == len(set(keys)) == len({(w.machine, w.model, w.batch_size, w.input_shapes, w.runtime,
                                                w.precision) for w in whole}) < len(whole)
    for run in runs:  # the slowest measured of its workload, runtime and precision
        mine = [w for w in whole if (w.machine, w.model, w.batch_size, w.input_shapes, w.runtime, w.precision)
                == (run.machine, run.model, run.batch_size, run.input_shapes, run.runtime, run.precision)]
        assert run.step_s == max(w.step_s for w in mine)
