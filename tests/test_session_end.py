"""Units of how a script's session ends and plans: the verdict after a stop, a checkpoint that does not fit the
script's model, and the checkpoint cadence across resumes."""

from __future__ import annotations

import pytest
import torch

from thrifty.protocol import EXIT_BAD_INPUT, EXIT_BUDGET
from thrifty.usercode.script import SessionStatus
from training.progress import CheckpointSchedule
from training.session_end import load_failure, state_mismatch, verdict


@pytest.mark.parametrize("reason, ended, code", [("signal", "interrupted", 0), ("budget", "budget", EXIT_BUDGET)])
def test_a_script_that_fails_after_a_stop_with_its_step_saved_ends_as_the_stop_says(reason, ended, code):
    saved = SessionStatus(last_saved_step=40, step=40)
    got = verdict(saved, reason, 40, crashed=True, write_error=None)
    assert got[:2] == (ended, code)
    assert "went on after the stop and failed" in got[2] and "sess.stopped" in got[2]
    assert verdict(saved, reason, 40, crashed=False, write_error=None)[:2] == (ended, code)
    unsaved = SessionStatus(last_saved_step=30, step=40)  # a crash before the stop's save: a failure, restarted
    assert verdict(unsaved, reason, 40, crashed=True, write_error=None)[:2] == ("crashed", None)


def test_a_checkpoint_that_does_not_fit_the_state_is_named_key_by_key():
    saved = {"model": {"wte.weight": torch.zeros(50, 32), "head.bias": torch.zeros(50), "old.weight": torch.zeros(1)},
             "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 1e-3}]}, "iter": 5}
    like = {"model": {"wte.weight": torch.zeros(50, 48), "head.bias": torch.zeros(50), "new.weight": torch.zeros(1)},
            "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3}]}, "iter": 0}
    assert state_mismatch(saved, like) == [
        "model.old.weight: in the checkpoint, not in the model now",
        "model.new.weight: in the model now, not in the checkpoint",
        "model.wte.weight: saved (50, 32), now (50, 48)",
    ], "an optimizer that has not stepped yet, or another counter, is no mismatch"
    assert state_mismatch(saved, {"model": {k: v.clone() for k, v in saved["model"].items()}}) == []


def test_an_error_raised_by_load_state_dict_is_told_apart_from_a_crash():
    model = torch.nn.Linear(4, 2)
    try:
        model.load_state_dict({"weight": torch.zeros(3, 4), "bias": torch.zeros(2)})
    except RuntimeError as exc:
        assert load_failure(exc).startswith("Error(s) in loading state_dict for Linear: size mismatch for weight")
    try:
        raise RuntimeError("CUDA error: an illegal memory access")
    except RuntimeError as exc:
        assert load_failure(exc) is None


def test_a_fixed_interval_saves_on_its_multiples_across_resumes_and_stops():
    schedule = CheckpointSchedule(50, mtbp_s=3600.0, start_step=181)  # resumed from a stop's save at 181
    assert [s for s in range(182, 301) if schedule.due(s) and not schedule.follow(s, 50)] == [200, 250, 300]
    auto = CheckpointSchedule("auto", mtbp_s=3600.0, start_step=181)  # auto: an interval after the last save
    assert [s for s in range(182, 215) if auto.due(s)][:1] == [191]


def test_a_stopped_session_status_carries_the_exit_code_the_wrapper_uses():
    from training.script import job_exit_code

    status = SessionStatus(closed=True, ended="interrupted", exit_code=0, message="stopped on a signal at step 13",
                           last_saved_step=13, step=13)
    assert job_exit_code(1, status, forwarded=True) == (0, "stopped on a signal at step 13")
    assert job_exit_code(1, SessionStatus(closed=True, ended="crashed", step=13), forwarded=False)[0] == 1
    assert job_exit_code(1, SessionStatus(closed=True, ended="bad_input", exit_code=EXIT_BAD_INPUT,
                                          message="m"), forwarded=False) == (EXIT_BAD_INPUT, "m")


def test_a_load_error_is_told_apart_even_when_a_library_left_tracebacks_off(monkeypatch):
    """SkyPilot leaves ``sys.tracebacklimit = 0`` after an exception passes its print_exception_no_traceback."""
    import sys

    monkeypatch.setattr(sys, "tracebacklimit", 0, raising=False)
    try:
        torch.nn.Linear(4, 2).load_state_dict({"weight": torch.zeros(3, 4), "bias": torch.zeros(2)})
    except RuntimeError as exc:
        assert load_failure(exc) is not None
