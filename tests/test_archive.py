"""Stale-artifact archival on file://, s3:// (moto), gs:// (gcp-storage-emulator) and az:// (Azurite).

The clock is moved, not the objects: everything here was written seconds ago, and ``as_of`` a year
ahead makes it stale; ``scan(now=...)`` moves the pass's real clock too, which no option can (a run
touched within a day by it is never moved). Through the CLI and the flow, whose clock is real, a file
store's objects are aged instead. The planner's windows are tested on listings with chosen timestamps.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from stores import REPO, child_env
from thrifty import archive
from thrifty.archive import ArchiveSettings, Item, Policy, RunFacts
from thrifty.config import ConfigError
from thrifty.money.ledger import Attempt, write_job_attempts
from thrifty.runs import run_key
from thrifty.storage import ObjectInfo, is_cold, open_store
from training.checkpoint import CheckpointArchived, CheckpointManager
from training.data import ensure_shards
from training.recipes.base import resolve_recipe
from conftest import latest_artifacts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_only")]

NOW = dt.datetime.now(dt.timezone.utc)
LATER = NOW + dt.timedelta(days=365)
COLD = {"file": "ARCHIVE", "s3": "DEEP_ARCHIVE", "gcs": "ARCHIVE", "azure": "Archive"}


def attempt(number: int, started: float, ended: float | None) -> Attempt:
    return Attempt("job-1", number, "aws", "local", "g5.xlarge", True, 0.302, 1, started, ended)


def save_run(store, run_id: str, metrics: list[float], running: bool = False) -> None:
    """Checkpoints at steps 10, 20, ... with these validation losses, and a ledger."""
    ckpts = CheckpointManager(store, run_id, keep_last=10)
    for n, metric in enumerate(metrics, 1):
        ckpts.save({"w": torch.full((256,), float(n))}, n * 10, metric)
    write_job_attempts(store, run_id, "job-1", [attempt(1, 1.0, None if running else 2.0)])
    if not running:
        store.put_bytes(run_key(run_id, "summary.json"), b'{"steps": 40}')


def age(root, days: float = 30) -> None:
    """Make every object of a file store look ``days`` old to the real clock (the CLI and the flow cannot move it)."""
    then = (NOW - dt.timedelta(days=days)).timestamp()
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


def digits(store):
    recipe = resolve_recipe("digits")
    return ensure_shards(store, recipe, recipe.parse_params({"limit": 300}))


@pytest.fixture
def scenario(backend):
    """Four runs and a cache entry, all written just now."""
    store = open_store(backend.uri)
    save_run(store, "done", [0.5, 0.3, 0.4, 0.45])  # best at 20, latest 40, 30 pinned
    save_run(store, "live", [0.6, 0.9, 0.95], running=True)  # a job still running: best 10 and latest 30 stay
    save_run(store, "gold", [0.7, 0.6])  # marked gold by the user
    Policy(gold=["runs/gold/"], pinned=["runs/done/ckpt/step-000000030/"]).save(store)
    digits(store)
    return store


def classes(store) -> dict[str, str]:
    return {o.key: o.storage_class for o in store.list("runs/") + store.list("cache/")}


def settings(store, **kw) -> ArchiveSettings:
    return ArchiveSettings(store=store.uri, as_of=LATER, **kw)


def test_stale_checkpoints_move_gold_and_live_stay(scenario, backend):
    store = scenario
    before = classes(store)
    plan = archive.scan(store, settings(store), now=LATER)
    assert classes(store) == before, "planning moves nothing"
    moved = {i.key for i in plan.to_archive}
    out = archive.apply(store, plan)
    assert {i.key for i in out.moved} == moved and not out.failed and not out.left_alone

    after = classes(store)
    cold = {k for k, c in after.items() if is_cold(c)}
    assert all(after[k] == COLD[backend.name] for k in cold)
    expect = {k for k in before if k.startswith(("runs/done/ckpt/step-000000010/", "runs/done/ckpt/step-000000040/",
                                                 "runs/live/ckpt/step-000000020/", "cache/"))}
    assert cold == expect == moved
    # kept hot, and why
    reasons = {i.group: i.reason for i in plan.items if i.action == "keep"}
    assert reasons["runs/done/ckpt/step-000000020/"] == "best checkpoint (gold weights)"
    assert reasons["runs/done/ckpt/step-000000030/"] == "pinned"
    assert reasons["runs/live/ckpt/step-000000030/"] == "latest checkpoint of a running run"
    assert reasons["runs/gold/ckpt/step-000000010/"] == "marked gold"
    assert reasons["runs/done/"].startswith("run metadata")

    # a second pass changes nothing
    again = archive.scan(store, settings(store), now=LATER)
    assert again.to_archive == [] and archive.apply(store, again).moved == []
    assert classes(store) == after

    # the live run still resumes; the finished one says what to do instead of silently starting over
    info, state = CheckpointManager(store, "live", keep_last=10).load_latest()
    assert info.step == 30 and torch.equal(state["w"], torch.full((256,), 3.0))
    with pytest.raises(CheckpointArchived, match="thrifty archive restore done"):
        CheckpointManager(store, "done", keep_last=10).load_latest()
    if backend.name == "gcs":  # GCS's cold classes are online: the entry is read in place (an early rewrite costs more)
        assert digits(store).hit is True
    else:  # elsewhere an archived cache entry is a miss: rebuilt hot (not restored), then a hit again
        assert digits(store).hit is False and digits(store).hit is True
        assert not any(is_cold(o.storage_class) for o in store.list("cache/"))


# what the first restore call says: still archived and how long the provider says it takes, or done
FIRST_RESTORE = {("s3", "archive"): ("requested", "within 12 hours"), ("s3", "cold"): ("requested", "3-5 hours"),
                 ("azure", "archive"): ("requested", "up to 15 hours")}


@pytest.mark.parametrize("tier", ["archive", "cold"])
def test_restore_brings_a_run_back(scenario, backend, tier):
    store = scenario
    archive.apply(store, archive.scan(store, settings(store, tier=tier), now=LATER))
    cold = {"archive": COLD, "cold": {"file": "ARCHIVE", "s3": "GLACIER", "gcs": "COLDLINE", "azure": "Cold"}}[tier]
    assert {o.storage_class for o in store.list("runs/done/ckpt/step-000000040/")} == {cold[backend.name]}
    first = archive.restore_run(store, "done")
    assert {s.key for s in first} == {f"runs/done/ckpt/step-0000000{n}0/{f}" for n in (1, 4) for f in ("COMMIT", "state.pt")}
    assert [s.key.endswith("COMMIT") for s in first] == [False, False, True, True], "commit records come back last"
    state, eta = FIRST_RESTORE.get((backend.name, tier), ("done", None))
    assert {s.state for s in first} == {state}
    if eta:  # a real restore takes hours; the stand-ins finish at once, so the next call completes it
        assert {s.eta for s in first} == {eta}
    second = archive.restore_run(store, "done")
    assert {s.state for s in second} <= {"done"}
    assert not any(is_cold(o.storage_class) for o in store.list("runs/done/"))
    info, state = CheckpointManager(store, "done", keep_last=10).load_latest()
    assert info.step == 40 and torch.equal(state["w"], torch.full((256,), 4.0))
    with pytest.raises(ConfigError, match="no run 'nope'"):
        archive.restore_run(store, "nope")


class Killed(BaseException):
    """What a kill -9 looks like from inside: nothing after it runs (not even except Exception)."""


class DiesAfter:
    """A store that dies on the n-th storage-class change, and counts every change per key."""

    def __init__(self, store, n: int | None, changes: dict[str, int]):
        self._store, self._n, self.changes = store, n, changes

    def __getattr__(self, name):
        return getattr(self._store, name)

    def set_storage_class(self, key, storage_class):
        if self._n is not None and sum(self.changes.values()) == self._n:
            raise Killed
        self._store.set_storage_class(key, storage_class)
        self.changes[key] = self.changes.get(key, 0) + 1


@pytest.mark.parametrize("backend", ["file", "s3"], indirect=True)
@pytest.mark.parametrize("die_after", [1, 5])
def test_killed_half_way_then_run_again_finishes_once(scenario, die_after):
    store, changes = scenario, {}
    expected = {i.key for i in archive.scan(store, settings(store), now=LATER).to_archive}
    with pytest.raises(Killed):
        archive.apply(DiesAfter(store, die_after, changes), archive.scan(store, settings(store), now=LATER))
    assert sum(changes.values()) == die_after
    # in between, every checkpoint is either complete and hot or archived: never torn, never a silent fallback
    for run in ("done", "live"):
        for info in CheckpointManager(store, run, keep_last=10).committed():
            assert info.archived or not any(is_cold(o.storage_class) for o in store.list(info.prefix + "/"))
    archive.apply(DiesAfter(store, None, changes), archive.scan(store, settings(store), now=LATER))
    assert set(changes) == expected and set(changes.values()) == {1}, "everything moved, nothing twice"


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_kill_9_mid_pass_then_the_next_pass_finishes(scenario, backend):
    """A real SIGKILL in a real process (the CLI's --apply path minus Prefect), then a second pass."""
    store = scenario
    expected = {i.key for i in archive.scan(store, settings(store), now=LATER).to_archive}
    code = ("import sys; from thrifty import archive; s = archive.ArchiveSettings(store=sys.argv[1], "
            "as_of=sys.argv[2]); st = archive.open_checked(s); archive.apply(st, archive.scan(st, s, now=s.as_of))")
    proc = subprocess.run([sys.executable, "-c", code, store.uri, LATER.isoformat()], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=child_env(os.environ, {"THRIFTY_FAULT": "archive_move:3"}))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    cold = {k for k, c in classes(store).items() if is_cold(c)}
    assert len(cold) == 3 and cold < expected
    out = archive.apply(store, archive.scan(store, settings(store), now=LATER))
    assert {i.key for i in out.moved} == expected - cold and not out.failed
    assert {k for k, c in classes(store).items() if is_cold(c)} == expected


def test_a_run_that_wakes_up_during_the_pass_is_left_alone(tmp_path):
    store = open_store(str(tmp_path / "store"))
    save_run(store, "done", [0.5, 0.3, 0.4])
    plan = archive.scan(store, settings(store), now=LATER)
    assert {i.group for i in plan.to_archive} == {"runs/done/ckpt/step-000000010/", "runs/done/ckpt/step-000000030/"}
    write_job_attempts(store, "done", "job-1", [attempt(1, 1.0, 2.0), attempt(2, 3.0, None)])  # resumed meanwhile
    out = archive.apply(store, plan)
    assert out.moved == [] and len(out.left_alone) == len(plan.to_archive)
    assert not any(is_cold(o.storage_class) for o in store.list())


# ---------------------------------------------------------------------------------------- the planner's rules


def obj(key: str, days_old: float, storage_class: str = "STANDARD", size: int = 1000) -> ObjectInfo:
    return ObjectInfo(key, size, LATER - dt.timedelta(days=days_old), storage_class)


def decide(objects, runs, **kw) -> dict[str, str]:
    p = archive.plan(objects, runs, Policy(), ArchiveSettings(store="s3://b/p", **kw), LATER)
    return {i.key: i.action for i in p.items}


@pytest.mark.parametrize("active_days_ago, latest", [(10, "keep"), (20, "archive")])
def test_latest_checkpoint_of_a_recently_active_run_stays(active_days_ago, latest):
    objects = [obj("runs/r/ckpt/step-000000010/state.pt", 200), obj("runs/r/ckpt/step-000000020/state.pt", 100),
               obj("runs/r/metrics/1.jsonl", active_days_ago)]
    active = LATER - dt.timedelta(days=active_days_ago)
    runs = {"r": RunFacts(running=False, last_activity=active, latest_step=20)}
    got = decide(objects, runs, active_window_days=14)
    assert got == {"runs/r/ckpt/step-000000010/state.pt": "archive", "runs/r/ckpt/step-000000020/state.pt": latest,
                   "runs/r/metrics/1.jsonl": "keep"}


def test_cache_entry_age_is_its_last_use_and_cold_timestamps_do_not_count():
    objects = [obj("cache/used/manifest.json", 300), obj("cache/used/a.npy", 300), obj("cache/used/LAST_USED", 5),
               obj("cache/idle/manifest.json", 300, "DEEP_ARCHIVE"), obj("cache/idle/a.npy", 120),
               obj("cache/fresh/manifest.json", 30)]
    got = decide(objects, {})
    assert got == {"cache/used/manifest.json": "keep", "cache/used/a.npy": "keep", "cache/used/LAST_USED": "keep",
                   "cache/idle/manifest.json": "skip", "cache/idle/a.npy": "archive", "cache/fresh/manifest.json": "keep"}
    # the half-archived entry finishes, commit record first among what is left
    p = archive.plan(objects, {}, Policy(), ArchiveSettings(store="s3://b/p"), LATER)
    assert [i.key for i in p.to_archive] == ["cache/idle/a.npy"]


def test_the_summarys_best_checkpoint_stays_even_without_a_metric_mode_in_its_commits(tmp_path):
    """Commits written before they recorded min/max: the summary's best checkpoint is the gold weights."""
    store = open_store(str(tmp_path / "store"))
    save_run(store, "acc", [0.2, 0.9, 0.5])  # val_accuracy: higher is better, so step 20 is the best
    for c in CheckpointManager(store, "acc", 10).committed():  # an older format: no metric_mode
        record = json.loads(store.get_bytes(c.prefix + "/COMMIT"))
        del record["metric_mode"]
        store.put_bytes(c.prefix + "/COMMIT", json.dumps(record).encode())
    store.put_bytes(run_key("acc", "summary.json"), json.dumps({"best_metric": {"checkpoint_step": 20}}).encode())
    kept = {i.group for i in archive.scan(store, settings(store), now=LATER).items if i.reason.startswith("best")}
    assert kept == {"runs/acc/ckpt/step-000000010/", "runs/acc/ckpt/step-000000020/"}  # min by default, and 20


def test_commit_records_move_first():
    objects = [obj(f"runs/r/ckpt/step-000000010/{n}", 200) for n in ("state.pt", "COMMIT")]
    p = archive.plan(objects, {"r": RunFacts(False, None, 20)}, Policy(), ArchiveSettings(store="s3://b"), LATER)
    assert [i.key.rpartition("/")[2] for i in p.to_archive] == ["COMMIT", "state.pt"]


def test_monthly_savings_from_the_storage_price_table():
    items = [Item("runs/r/ckpt/step-000000010/state.pt", "g", 10 * archive.GIB, "STANDARD", NOW, "archive", "")]
    s3 = archive.monthly_savings(items, "s3://b/p", "DEEP_ARCHIVE")
    assert s3.usd_per_month == pytest.approx(10 * (0.023 - 0.00099)) and "180 days" in s3.note
    assert archive.monthly_savings(items, "gs://b", "COLDLINE").usd_per_month == pytest.approx(10 * (0.020 - 0.004))
    assert archive.monthly_savings(items, "/tmp/x", "ARCHIVE").usd_per_month is None


def test_report_rows_are_capped_for_big_stores():
    objects = [obj(f"runs/r{n}/ckpt/step-000000010/state.pt", 200) for n in range(30)]
    p = archive.plan(objects, {}, Policy(), ArchiveSettings(store="s3://b"), LATER)
    text = archive.markdown(p, max_rows=10)
    assert text.count("| archive | `runs/") == 10 and "20 more rows" in text
    assert "| to archive | 30 objects in 30 checkpoints" in text and "$0.00" in text


def test_bad_settings_are_clear():
    with pytest.raises(ConfigError, match="older_than_days.*greater than 0"):
        archive.build_settings({"older_than_days": 0})
    with pytest.raises(ConfigError, match="'tier'"):
        archive.build_settings({"tier": "freezer"})
    with pytest.raises(ConfigError, match="unsupported scheme 'ftp'"):
        archive.build_settings({"store": "ftp://x"})
    assert archive.build_settings({"as_of": "2027-01-01"}).as_of.tzinfo is not None


# ---------------------------------------------------------------------------------------- lifecycle rules


@pytest.mark.parametrize("backend", ["s3", "gcs"], indirect=True)
def test_lifecycle_rules_install_beside_other_rules(backend):
    store = open_store(backend.uri)
    cfg = ArchiveSettings(store=backend.uri, older_than_days=60, tier="cold")
    if backend.name == "s3":
        client = store._client
        client.put_bucket_lifecycle_configuration(Bucket=store.bucket, LifecycleConfiguration={"Rules": [
            {"ID": "someone-else", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 30}}]})
        for _ in range(2):  # installing twice replaces Thrifty's own rules
            archive.install_lifecycle(store, archive.lifecycle_rules(store, cfg))
        rules = client.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
        assert sorted(r["ID"] for r in rules) == ["someone-else", "thrifty-team-exp1-abort-incomplete-uploads",
                                                   "thrifty-team-exp1-cache-to-glacier",
                                                   "thrifty-team-exp1-runs-to-glacier"]
        moves = [r for r in rules if r.get("Transitions")]
        assert {r["Transitions"][0]["StorageClass"] for r in moves} == {"GLACIER"}
        assert {r["Transitions"][0]["Days"] for r in moves} == {60}
    else:
        for _ in range(2):
            archive.install_lifecycle(store, archive.lifecycle_rules(store, cfg))
        store._bucket.reload()
        [rule] = list(store._bucket.lifecycle_rules)
        assert rule["action"] == {"type": "SetStorageClass", "storageClass": "COLDLINE"}
        assert rule["condition"]["age"] == 60 and rule["condition"]["matchesSuffix"] == [".pt", ".npy"]


def test_lifecycle_elsewhere_says_what_to_do(tmp_path):
    store = open_store(str(tmp_path))
    with pytest.raises(ConfigError, match="weekly-archive"):
        archive.lifecycle_rules(store, ArchiveSettings(store=str(tmp_path)))


# ---------------------------------------------------------------------------------------- the flow and the CLI


def test_flow_dry_run_then_apply_publishes_the_report(prefect_harness, tmp_path):

    from flows.archive_stale import archive_stale

    store = open_store(str(tmp_path / "store"))
    save_run(store, "done", [0.5, 0.3, 0.4])
    age(tmp_path / "store")
    dry = archive_stale(store=store.uri, as_of=LATER)
    assert dry["dry_run"] and dry["objects_to_archive"] == 4 and dry["bytes_to_archive"] > 0
    assert not any(is_cold(o.storage_class) for o in store.list())
    done = archive_stale(store=store.uri, as_of=LATER, dry_run=False)
    assert done["moved"] == 4 and done["bytes_moved"] == dry["bytes_to_archive"]

    artifact = latest_artifacts("thrifty-archive")["thrifty-archive"]
    assert "Moved 4 objects" in artifact.data and "best checkpoint (gold weights)" in artifact.data

    state = archive_stale(store=store.uri, older_than_days=-1, return_state=True)
    assert state.is_failed() and "older_than_days" in state.message


def test_cli_dry_run_marks_and_restore(tmp_path, capsys):
    from thrifty.cli import main

    root = tmp_path / "store"
    store = open_store(str(root))
    save_run(store, "done", [0.5, 0.3, 0.4])
    age(root)
    later = LATER.date().isoformat()
    assert main(["archive", "--dry-run", "--store", str(root), "--as-of", later]) == 0
    out = capsys.readouterr().out
    assert "Dry run: nothing moved" in out and "| to archive | 4 objects in 2 checkpoints" in out and "--apply" in out
    assert main(["archive", "gold", "done", "--store", str(root)]) == 0
    assert json.loads(store.get_bytes(archive.POLICY_KEY))["gold"] == ["runs/done/"]
    assert main(["archive", "--store", str(root), "--as-of", later]) == 0
    assert "| to archive | 0 objects" in capsys.readouterr().out
    assert main(["archive", "unmark", "done", "--store", str(root)]) == 0
    archive.apply(store, archive.scan(store, settings(store), now=LATER))
    assert main(["archive", "restore", "done", "--store", str(root)]) == 0
    assert "4 object(s) back in the hot tier, 0 restoring; the run can resume" in capsys.readouterr().out
    assert main(["archive", "--store", str(root), "--older-than-days", "0"]) == 2
    assert "older_than_days" in capsys.readouterr().err


def test_a_dry_run_needs_no_write_access(tmp_path, monkeypatch, capsys):
    """Read-only credentials can preview a pass; moving needs the probe write to pass first."""
    from thrifty.cli import main
    from thrifty.storage import StoreError

    root = tmp_path / "store"
    save_run(open_store(str(root)), "done", [0.5, 0.3, 0.4])
    age(root)

    def denied(uri):
        raise StoreError(f"store {uri!r}: access denied (write); grant the identity in use s3:PutObject")

    monkeypatch.setattr(archive.store, "check_store", denied)
    assert main(["archive", "--store", str(root), "--as-of", LATER.date().isoformat()]) == 0
    assert "| to archive | 4 objects" in capsys.readouterr().out
    assert main(["archive", "gold", "done", "--store", str(root)]) == 2
    assert "access denied (write)" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_s3_class_change_keeps_metadata(backend):
    store = open_store(backend.uri)
    name = f"{store.root}/runs/r/ckpt/step-000000010/state.pt"
    store._client.put_object(Bucket=store.bucket, Key=name, Body=b"w", ContentType="application/x-torch",
                             Metadata={"sha256": "abc"})
    store.set_storage_class("runs/r/ckpt/step-000000010/state.pt", "DEEP_ARCHIVE")
    head = store._client.head_object(Bucket=store.bucket, Key=name)
    assert (head["StorageClass"], head["ContentType"], head["Metadata"]) == ("DEEP_ARCHIVE", "application/x-torch",
                                                                             {"sha256": "abc"})
