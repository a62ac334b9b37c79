"""Asynchronous checkpoints (training.ckpt_writer): never two writes in flight, a background error raised on the
training thread, a snapshot the next optimizer step cannot change, and a stop that waits for the write in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time

import pytest
import torch

from conftest import PYTHON, python_env
from thrifty.config import RunConfig
from thrifty.storage import FileStore
from training.checkpoint import CheckpointManager
from training.ckpt_writer import CheckpointWriter, snapshot

RUN = "writer-test"


class SlowManager(CheckpointManager):
    """A real manager whose writes take ``delay_s`` longer (and wait for ``gate``, if given), counting how many run
    at once."""

    def __init__(self, *args, delay_s: float = 0.05, gate: threading.Event | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay_s, self.gate, self.active, self.most, self.lock = delay_s, gate, 0, 0, threading.Lock()

    def save(self, *args, **kwargs) -> float:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            if self.gate is not None:
                assert self.gate.wait(60), "the test never opened the gate"
            time.sleep(self.delay_s)
            return super().save(*args, **kwargs)
        finally:
            with self.lock:
                self.active -= 1


def tiny_training() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    opt.step()


def test_never_two_writes_in_flight_and_each_reports_block_and_write_time(tmp_path):
    gate = threading.Event()  # the writes wait for it: what a save waits for is known, however fast the machine is
    mgr = SlowManager(FileStore(tmp_path / "store"), RUN, keep_last=5, delay_s=0.1, gate=gate)
    writer = CheckpointWriter(mgr)
    model, opt = tiny_training()
    train_step(model, opt)
    reported = writer.save({"model": model.state_dict()}, 1, None)
    assert reported == [] and writer.in_flight and mgr.committed() == [], "the first save returned at its snapshot"
    gate.set()
    for step in (2, 3):
        train_step(model, opt)
        reported += writer.save({"model": model.state_dict()}, step, None)
        assert step - 1 in [c.step for c in mgr.committed()], "a save waits for the write in flight"
    assert writer.in_flight  # the third write was still in the background when its save returned
    reported += writer.close()
    assert mgr.most == 1, "never two writes at once"
    assert [w.step for w in reported] == [1, 2, 3] and all(w.background for w in reported)
    assert [c.step for c in mgr.committed()] == [1, 2, 3]
    assert all(w.write_s >= mgr.delay_s and w.block_s > 0 for w in reported)  # each write's own time, and the hold
    assert all(w.committed_at_step >= w.step for w in reported)
    event = reported[0].event()
    assert event["event"] == "checkpoint" and {"block_s", "write_s", "committed_at_step", "save_s"} <= set(event)


def test_an_error_in_the_background_write_is_raised_on_the_training_thread(tmp_path):
    class Full(CheckpointManager):
        def save(self, *args, **kwargs) -> float:
            raise OSError(28, "No space left on device")

    writer = CheckpointWriter(Full(FileStore(tmp_path / "store"), RUN, keep_last=2))
    assert writer.save({"w": torch.ones(3)}, 1, None) == []  # handed off: the error comes later
    with pytest.raises(OSError, match="No space left"):
        writer.save({"w": torch.ones(3)}, 2, None)
    writer.save({"w": torch.ones(3)}, 3, None)
    with pytest.raises(OSError, match="No space left"):
        writer.wait()  # the final save's wait, too
    writer.save({"w": torch.ones(3)}, 4, None)
    deadline = time.monotonic() + 30  # (the write fails at once: the limit only bounds a starved machine's wait)
    with pytest.raises(OSError, match="No space left"):  # and the per-step poll
        while time.monotonic() < deadline:
            writer.poll(5)
            time.sleep(0.01)


def test_the_snapshot_is_immune_to_the_next_steps_in_place_update(tmp_path):
    model, opt = tiny_training()
    train_step(model, opt)  # the optimizer has state (exp_avg...) to mutate in place
    live = {"model": model.state_dict(), "optimizer": opt.state_dict(), "loop": {"step": 1, "seen": [1]}}
    snap = snapshot(live)
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    exp_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    train_step(model, opt)
    live["loop"]["seen"].append(2)
    assert not torch.equal(model.weight, frozen["weight"]), "the step moved the weights in place"
    assert all(torch.equal(snap["model"][k], frozen[k]) for k in frozen)
    assert torch.equal(snap["optimizer"]["state"][0]["exp_avg"], exp_avg)
    assert snap["loop"] == {"step": 1, "seen": [1]}

    # and through a background write while the training thread keeps stepping: the checkpoint holds step 1's weights
    mgr = SlowManager(FileStore(tmp_path / "store"), RUN, keep_last=2, delay_s=0.2)
    writer = CheckpointWriter(mgr)
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    writer.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, 2, None)
    for _ in range(5):
        train_step(model, opt)
    assert writer.in_flight
    writer.close()
    _, saved = mgr.load_latest()
    assert all(torch.equal(saved["model"][k], at_save[k]) for k in at_save)
    assert not torch.equal(saved["model"]["weight"], model.weight.detach())


def test_a_foreground_writer_commits_before_save_returns(tmp_path):
    mgr = CheckpointManager(FileStore(tmp_path / "store"), RUN, keep_last=2)
    writer = CheckpointWriter(mgr, background=False)
    (w,) = writer.save({"w": torch.ones(2)}, 3, None)
    assert not writer.in_flight and [c.step for c in mgr.committed()] == [3]
    assert not w.background and w.committed_at_step == 3 and w.block_s >= w.write_s


@pytest.mark.parametrize("stop_at,background", [(5, True), (7, True), (7, False)])
def test_a_stop_waits_for_the_write_in_flight_and_loses_no_step(tmp_path, monkeypatch, stop_at, background):
    """At 5 the step's own save is in flight when the notice comes; at 7 the save of step 5 is. In the foreground
    (train.async_checkpoint: false) every save is whole before the next step."""
    import training.checkpoint
    import training.loop
    from training.loop import train

    slow_save = training.checkpoint.CheckpointManager.save
    noticed = threading.Event()

    def save(self, *args, **kwargs):
        if background:  # in the background, a write still in flight when the notice comes, on any machine
            assert noticed.wait(60)
        time.sleep(0.3)
        return slow_save(self, *args, **kwargs)

    def fault_point(point: str) -> None:
        if point == "step" and not hasattr(fault_point, "sent"):
            fault_point.steps = getattr(fault_point, "steps", 0) + 1
            if fault_point.steps == stop_at:
                fault_point.sent = True
                os.kill(os.getpid(), signal.SIGTERM)  # a spot notice, handled at the next step boundary
                noticed.set()

    monkeypatch.setattr(training.checkpoint.CheckpointManager, "save", save)
    monkeypatch.setattr(training.loop, "fault_point", fault_point)
    monkeypatch.setenv("THRIFTY_FAULT", "step:0")  # the loop passes its step fault point only when one is armed
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    store = tmp_path / "store"
    cfg = RunConfig(run_name=RUN, recipe="digits", recipe_params={"hidden": 16}, store=str(store), train={
        "max_steps": 40, "micro_batch": 32, "precision": "fp32", "device": "cpu", "checkpoint_every": 5,
        "log_every": 1, "early_stopping": {"enabled": False}, "async_checkpoint": background})
    before = set(threading.enumerate())
    try:
        result = train(cfg)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert result.status == "interrupted" and result.step == stop_at
    committed = CheckpointManager(FileStore(store), RUN, keep_last=3).committed()
    assert committed[-1].step == stop_at, "SIGTERM loses no step"
    records = [json.loads(line) for p in (store / "runs" / RUN / "metrics").glob("*.jsonl")
               for line in p.read_text().splitlines()]
    events = [r.get("event") for r in records]
    saves = [r for r in records if r.get("event") == "checkpoint"]
    assert [r["step"] for r in saves] == sorted({5, stop_at})
    assert events.index("interrupted") > max(i for i, e in enumerate(events) if e == "checkpoint")
    assert all(r["async"] is background for r in saves)
    if stop_at == 7 and background:  # the stop's own save waited for step 5's write, then wrote in the foreground
        assert saves[0]["committed_at_step"] == 7 and saves[-1]["block_s"] > saves[-1]["write_s"]
    if not background:
        assert all(r["committed_at_step"] == r["step"] and r["block_s"] >= r["write_s"] >= 0.3 for r in saves)
    assert not [t for t in threading.enumerate() if t not in before], "the writer thread ends with the run"


def test_a_fault_point_on_the_writer_thread_kills_the_whole_process():
    code = ("import threading, time\nfrom thrifty.faults import fault_point\n"
            "threading.Thread(target=fault_point, args=('during_data',)).start()\ntime.sleep(30)\nprint('alive')")
    proc = subprocess.run([PYTHON, "-c", code], env={**python_env(), "THRIFTY_FAULT": "during_data:1"},
                          capture_output=True, text=True, timeout=25)
    assert proc.returncode == -signal.SIGKILL and "alive" not in proc.stdout


def test_an_exit_with_a_write_in_flight_waits_for_its_commit(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time, torch
        from thrifty.storage import FileStore
        from training.checkpoint import CheckpointManager
        from training.ckpt_writer import CheckpointWriter

        class Slow(CheckpointManager):
            def save(self, *args, **kwargs):
                time.sleep(0.5)
                return super().save(*args, **kwargs)

        writer = CheckpointWriter(Slow(FileStore({str(tmp_path / "store")!r}), "r", keep_last=2))
        writer.save({{"w": torch.ones(3)}}, 4, None)
        sys.exit("a crash right after a save")
    """)
    proc = subprocess.run([PYTHON, "-c", code], env=python_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "a crash right after a save" in proc.stderr
    assert [c.step for c in CheckpointManager(FileStore(tmp_path / "store"), "r", keep_last=2).committed()] == [4]


def test_auto_plans_from_the_step_path_cost_but_never_an_interval_shorter_than_a_write():
    from training.progress import CheckpointSchedule

    cheap = CheckpointSchedule("auto", mtbp_s=3600.0, start_step=0)
    plan = cheap.saved(10, save_s=0.002, step_time_s=0.01, write_s=0.0)
    assert plan["steps"] == round(plan["seconds"] / 0.01)  # Young/Daly on the 2 ms the step was held
    slow_write = CheckpointSchedule("auto", mtbp_s=3600.0, start_step=0)
    plan = slow_write.saved(10, save_s=0.002, step_time_s=0.01, write_s=30.0)
    assert plan["steps"] == 3000, "a save due while the write is in flight would only wait for it"
