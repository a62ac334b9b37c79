"""Archival never moves a live run's checkpoints, whatever its options (issue 21.4): a run that holds a live lease
(a job, its flow, or a `thrifty train` that writes no ledger) or that wrote anything within a day by the pass's own
clock keeps every object hot, even with ``--active-window-days 0`` and ``--as-of`` a year ahead. The restart gap (a
preempted attempt closed in the ledger, the next not yet open, the emergency checkpoint just written) is such a run.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time

import pytest
import torch

from conftest import python_env
from test_archive import LATER, NOW, age, attempt, save_run
from thrifty import archive
from thrifty.archive import ArchiveSettings, Policy, RunFacts
from thrifty.money.ledger import write_job_attempts
from thrifty.runs import lease
from thrifty.storage import ObjectInfo, is_cold, open_store
from training.checkpoint import CheckpointManager

pytestmark = pytest.mark.usefixtures("loopback_only")

RECKLESS = {"active_window_days": 0, "older_than_days": 1, "as_of": LATER}  # every option pointing at "move it"


def cold(store, prefix: str = "runs/") -> set[str]:
    return {o.key for o in store.list(prefix) if is_cold(o.storage_class)}


@pytest.mark.parametrize("backend", ["file", "s3"], indirect=True)
def test_the_restart_gap_is_never_archived(backend):
    """Attempt 1 ended at a preemption, attempt 2 is not open yet, no lease (its flow died): the emergency checkpoint
    just written stays hot and the restart resumes from it, instead of failing "restore first"."""
    store = open_store(backend.uri)
    ckpts = CheckpointManager(store, "gap", keep_last=10)
    for step in (10, 20, 30):
        ckpts.save({"w": torch.full((64,), float(step))}, step, None)
    write_job_attempts(store, "gap", "job-1", [attempt(1, 1.0, 2.0)])  # preempted: closed
    p = archive.scan(store, ArchiveSettings(store=store.uri, **RECKLESS))  # the real clock: no option moves it
    assert p.to_archive == [] and {i.reason for i in p.items if "/ckpt/" in i.key} == {
        "run active within the last 24 hours"}
    assert archive.apply(store, p).moved == [] and cold(store) == set()
    info, state = ckpts.load_latest()
    assert info.step == 30 and torch.equal(state["w"], torch.full((64,), 30.0))
    # the same run a year later (the pass's clock moved too) is stale: what kept it hot was its being live
    later = archive.scan(store, ArchiveSettings(store=store.uri, **RECKLESS), now=LATER)
    assert {i.group for i in later.to_archive} == {f"runs/gap/ckpt/step-0000000{n}0/" for n in (1, 2, 3)}


def test_a_thrifty_train_run_is_kept_hot_by_its_lease_alone(tmp_path):
    """A real `thrifty train` (no ledger) frozen right after a checkpoint, its files aged a month: only its lease says
    it is live, and that keeps its checkpoints and the cache entry it trains from; once the trainer is dead, the same
    pass moves them."""
    root = tmp_path / "store"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"run_name: solo\nstore: {root}\nrecipe_params: {{limit: 400}}\n"
                   "train: {max_epochs: 500, checkpoint_every: 5, async_checkpoint: false, precision: fp32,\n"
                   "        early_stopping: {enabled: false}}\n")
    env = {**python_env(), "THRIFTY_FAULT": "after_commit:2:stop"}  # frozen after its second checkpoint's commit
    proc = subprocess.Popen([sys.executable, "-m", "training", "--config", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not _stopped(proc.pid):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the trainer never reached its second checkpoint"
            time.sleep(0.05)
        store = open_store(str(root))
        held = lease.read(store, "solo")
        assert held is not None and held.live(time.time()) and not (root / "runs" / "solo" / "ledger").exists()
        age(root)
        p = archive.scan(store, ArchiveSettings(store=store.uri, **RECKLESS))
        assert p.runs["solo"].leased and p.to_archive == []
        assert {i.reason for i in p.items if "/ckpt/" in i.key} == {"run holds a live lease (training now)"}
        assert {i.reason for i in p.items if i.key.startswith("cache/")} == {"cache entry of live run solo"}
        assert archive.apply(store, p).moved == [] and cold(store) == set()
    finally:
        proc.kill()
        proc.wait(30)
    # dead on this machine: its lease frees at once, and the month-old run is archived like any other
    p = archive.scan(store, ArchiveSettings(store=store.uri, **RECKLESS))
    assert not p.runs["solo"].leased and p.to_archive
    assert {i.key for i in archive.apply(store, p).moved} == cold(store, "")


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_a_lease_taken_between_scan_and_move_leaves_the_run_alone(tmp_path):
    root = tmp_path / "store"
    store = open_store(str(root))
    save_run(store, "wakes", [0.5, 0.3, 0.4])
    age(root)
    p = archive.scan(store, ArchiveSettings(store=store.uri, **RECKLESS))
    assert {i.group for i in p.to_archive} == {"runs/wakes/ckpt/step-000000010/", "runs/wakes/ckpt/step-000000030/"}
    with lease.acquire(store, "wakes", "a `thrifty train` started in between"):
        out = archive.apply(store, p)
    assert out.moved == [] and len(out.left_alone) == len(p.to_archive) and cold(store) == set()


# ---------------------------------------------------------------------------------------- the rule, as a pure plan


def obj(key: str, when: dt.datetime) -> ObjectInfo:
    return ObjectInfo(key, 100, when, "STANDARD")


@pytest.mark.parametrize("hours_ago, leased, moved", [
    (23, False, False),  # within the day before the real clock: untouched, whatever as_of and the window say
    (25, False, True),
    (24 * 400, True, False),  # a year idle by its files, but holding a live lease
    (24 * 400, False, True),
])
def test_live_runs_by_the_real_clock_and_the_lease(hours_ago, leased, moved):
    now = NOW
    touched = now - dt.timedelta(hours=hours_ago)
    objects = [obj(f"runs/r/ckpt/step-0000000{n}0/state.pt", touched) for n in (1, 2)]
    facts = {"r": RunFacts(running=False, last_activity=touched, latest_step=20, leased=leased)}
    for as_of in (now, LATER):  # a future as_of never shortens the floor
        p = archive.plan(objects, facts, Policy(), ArchiveSettings(store="s3://bkt/p", active_window_days=0,
                                                                   older_than_days=0.5), as_of, now)
        assert bool(p.to_archive) == moved, (hours_ago, leased, as_of)
        if not moved:
            assert len(p.items) == 2 and all(i.action == "keep" for i in p.items)


def test_the_window_counts_from_the_real_clock_when_as_of_is_ahead():
    """--as-of a year ahead with the default 14-day window: a run active 5 days ago still keeps its latest."""
    touched = NOW - dt.timedelta(days=5)
    objects = [obj(f"runs/r/ckpt/step-0000000{n}0/state.pt", touched) for n in (1, 2)]
    facts = {"r": RunFacts(running=False, last_activity=touched, latest_step=20)}
    p = archive.plan(objects, facts, Policy(), ArchiveSettings(store="s3://bkt/p", older_than_days=90), LATER, NOW)
    assert {i.key: i.action for i in p.items} == {"runs/r/ckpt/step-000000010/state.pt": "archive",
                                                  "runs/r/ckpt/step-000000020/state.pt": "keep"}


def test_a_cache_entry_used_today_stays_whatever_as_of_says():
    objects = [obj("cache/k/manifest.json", NOW - dt.timedelta(days=200)), obj("cache/k/LAST_USED", NOW)]
    p = archive.plan(objects, {}, Policy(), ArchiveSettings(store="s3://bkt/p", older_than_days=1), LATER, NOW)
    assert p.to_archive == [] and {i.reason for i in p.items} == {"cache entry used within the last 24 hours"}
