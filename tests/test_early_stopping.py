"""Early stopping on scripted metric sequences: when it stops, what counts as better, and resume."""

from __future__ import annotations

import pytest

from training.early_stopping import EarlyStopping

NAN = float("nan")


def run(stopper: EarlyStopping, values: list[float], start: int = 0) -> int | None:
    """Feed ``values`` (evaluation i at step i); the index of the evaluation that set ``stopped``, or None."""
    for i, v in enumerate(values[start:], start=start):
        stopper.update(v, step=i)
        if stopper.stopped:
            return i
    return None


def test_min_mode_stops_after_patience_evaluations_without_improvement():
    es = EarlyStopping(mode="min", patience=3)
    #           best         1 bad  2 bad  3 bad -> stop here
    values = [1.0, 0.8, 0.5, 0.6, 0.55, 0.7, 0.1]
    assert run(es, values) == 5
    assert es.best == 0.5 and es.best_step == 2
    assert es.bad_evals == 3


def test_improvement_resets_the_patience_count():
    es = EarlyStopping(mode="min", patience=2)
    values = [1.0, 1.1, 0.9, 1.0, 0.8, 0.9, 0.95, 0.1]
    #              bad  best bad best  bad  bad -> stop at 6
    assert run(es, values) == 6
    assert (es.best, es.best_step) == (0.8, 4)


def test_update_returns_true_only_for_a_new_best():
    es = EarlyStopping(mode="min", patience=10)
    assert [es.update(v, i) for i, v in enumerate([3.0, 2.0, 2.0, 2.5, 1.0])] == [True, True, False, False, True]


def test_max_mode():
    es = EarlyStopping(mode="max", patience=2)
    values = [0.5, 0.7, 0.9, 0.85, 0.2, 0.99]
    assert run(es, values) == 4
    assert (es.best, es.best_step) == (0.9, 2)
    # lower values never count as improvements in max mode
    es = EarlyStopping(mode="max", patience=3)
    assert run(es, [1.0, 0.9, 0.8, 0.7]) == 3
    assert es.best == 1.0


@pytest.mark.parametrize("mode, values, best", [
    ("min", [1.0, 0.95, 0.92, 0.91], 1.0),  # each step improves by < 0.1: none counts
    ("max", [1.0, 1.05, 1.08, 1.09], 1.0),
])
def test_min_delta_ignores_small_improvements(mode, values, best):
    es = EarlyStopping(mode=mode, patience=3, min_delta=0.1)
    assert run(es, values) == 3
    assert es.best == best and es.best_step == 0


def test_min_delta_counts_a_real_improvement_from_the_best_not_from_the_last_value():
    es = EarlyStopping(mode="min", patience=3, min_delta=0.1)
    # 0.95, 0.92 are small steps; 0.85 is > 0.1 below the best (1.0): a real improvement, resets patience
    assert run(es, [1.0, 0.95, 0.92, 0.85, 0.84, 0.83]) is None
    assert (es.best, es.best_step, es.bad_evals) == (0.85, 3, 2)
    # exactly min_delta is not "more than min_delta"
    es = EarlyStopping(mode="min", patience=1, min_delta=0.5)
    es.update(1.0, 0)
    assert es.update(0.5, 1) is False and es.stopped


@pytest.mark.parametrize("mode", ["min", "max"])
def test_nan_never_improves(mode):
    es = EarlyStopping(mode=mode, patience=2)
    assert es.update(NAN, 0) is False
    assert es.best is None
    assert es.update(1.0, 1) is True
    assert es.update(NAN, 2) is False
    assert es.update(NAN, 3) is False
    assert es.stopped
    assert es.best == 1.0 and es.best_step == 1


def test_nan_first_then_patience_counts_it():
    es = EarlyStopping(mode="min", patience=2)
    assert run(es, [NAN, NAN, 0.1]) == 1
    assert es.best is None


def test_disabled_never_stops_but_tracks_the_best():
    es = EarlyStopping(mode="min", patience=1, enabled=False)
    values = [1.0, 0.5, 0.9, 0.8, NAN, 0.7, 0.6, 2.0]
    assert run(es, values) is None
    assert not es.stopped
    assert (es.best, es.best_step) == (0.5, 1)
    assert es.bad_evals == 6


def test_best_is_a_plain_float():
    es = EarlyStopping()
    import numpy as np

    es.update(np.float32(0.25), 0)
    assert type(es.best) is float and es.best == 0.25


SEQUENCES = [
    ("min", 3, 0.0, [1.0, 0.8, 0.9, 0.7, 0.75, 0.71, 0.72, 0.5, 0.6, 0.6, 0.6, 0.1]),
    ("max", 2, 0.01, [0.1, 0.2, 0.205, 0.3, 0.29, 0.31, 0.305, 0.3, 0.9]),
    ("min", 2, 0.0, [NAN, 1.0, NAN, 0.9, NAN, NAN, 0.1]),
]


@pytest.mark.parametrize("mode, patience, min_delta, values", SEQUENCES)
def test_state_dict_round_trip_resumes_identically(mode, patience, min_delta, values):
    reference = EarlyStopping(mode, patience, min_delta)
    stop_at = run(reference, values)
    assert stop_at is not None

    for cut in range(1, stop_at + 1):  # "preempted" after evaluation cut-1, resumed from its state
        first = EarlyStopping(mode, patience, min_delta)
        assert run(first, values[:cut]) is None
        state = first.state_dict()
        assert set(state) == {"best", "best_step", "bad_evals", "stopped"}
        resumed = EarlyStopping(mode, patience, min_delta)
        resumed.load_state_dict(state)
        assert run(resumed, values, start=cut) == stop_at, f"resumed after evaluation {cut - 1}"
        assert resumed.state_dict() == reference.state_dict()


def test_a_stopped_state_stays_stopped_after_loading():
    es = EarlyStopping("min", patience=1)
    run(es, [1.0, 2.0])
    assert es.stopped
    fresh = EarlyStopping("min", patience=1)
    fresh.load_state_dict(es.state_dict())
    assert fresh.stopped and fresh.best == 1.0 and fresh.bad_evals == 1


def test_state_dict_survives_torch_weights_only_load(tmp_path):
    """The state goes into the checkpoint, which is read back with weights_only=True."""
    import torch

    es = EarlyStopping("max", patience=5)
    run(es, [0.1, 0.3, 0.2])
    torch.save({"early_stopping": es.state_dict()}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)["early_stopping"]
    assert loaded == es.state_dict()
