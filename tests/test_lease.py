"""One run, one job: the run lease (thrifty.runs.lease) on file://, s3:// (moto), gs:// (gcp-storage-emulator) and
az:// (Azurite). Time is an injected clock: a lease expires without a minute of sleeping."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from stores import REPO, child_env
from thrifty.config import ConfigError
from thrifty.runs.lease import (ENV_LEASE_TOKEN, Heartbeat, Lease, LeaseHeld, LeaseLost, acquire, acquire_or_adopt, adopt,
                           lease_key, read)
from thrifty.storage import open_store

RUN = "digits-0001"
T0 = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC


@pytest.fixture(autouse=True)
def _stay_on_loopback(loopback_only):
    yield loopback_only


class Clock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def store(backend):
    return open_store(backend.uri)


def test_acquire_renew_attach_release(store, backend):
    clock = Clock()
    lease = acquire(store, RUN, "flow run 5f1 on box pid 42", ttl_s=60, clock=clock)
    assert read(store, RUN) == lease.record
    assert lease.record.holder == "flow run 5f1 on box pid 42" and len(lease.token) == 32
    assert (lease.job_id, lease.record.acquired_unix, lease.record.heartbeat_unix) == (None, T0, T0)

    clock.advance(20)
    lease.renew()
    assert read(store, RUN).heartbeat_unix == T0 + 20
    lease.attach("sky-17")
    clock.advance(20)
    lease.renew()
    record = read(store, RUN)
    assert (record.job_id, record.heartbeat_unix, record.acquired_unix, record.token) == (
        "sky-17", T0 + 40, T0, lease.token)
    assert record.live(T0 + 100) and not record.live(T0 + 101)

    assert lease.release() is True
    assert read(store, RUN) is None
    assert lease.release() is False  # once
    with pytest.raises(LeaseLost, match="released"):
        lease.renew()

    with acquire(store, RUN, "flow run 6a2", clock=clock) as again:  # the context manager form
        assert read(store, RUN).token == again.token
    assert read(store, RUN) is None
    assert store.list() == [] and backend.raw_names() == []


def test_a_second_start_is_refused_naming_the_holder(store):
    clock = Clock()
    first = acquire(store, RUN, "flow run 5f1 on box pid 42", ttl_s=60, clock=clock)
    first.attach("sky-17")
    clock.advance(25)
    with pytest.raises(LeaseHeld) as err:
        acquire(store, RUN, "flow run 9c3 on laptop pid 7", clock=clock)
    assert isinstance(err.value, ConfigError)  # the CLI shows it as a user error, exit 2
    assert err.value.record == read(store, RUN) == first.record
    msg = str(err.value)
    for part in (f"run {RUN!r} is already running", "held by flow run 5f1 on box pid 42",
                 "since 2026-09-21 14:13:20 UTC", "(job sky-17)", "last heartbeat 25 s ago",
                 "Wait for it to finish, cancel it, or use another run_name"):
        assert part in msg, msg
    clock.advance(35)  # 60 s after the last beat: still live
    with pytest.raises(LeaseHeld):
        acquire(store, RUN, "flow run 9c3", clock=clock)
    first.release()
    acquire(store, RUN, "flow run 9c3", clock=clock).release()


def test_a_dead_lease_is_taken_over_and_its_old_holder_loses(store):
    clock = Clock()
    old = acquire(store, RUN, "flow run 5f1", ttl_s=60, clock=clock)
    old.attach("sky-17")
    clock.advance(61)  # no beat for more than ttl_s: its holder is taken for dead
    new = acquire(store, RUN, "flow run 9c3", ttl_s=60, clock=clock)
    assert read(store, RUN) == new.record and new.token != old.token and new.job_id is None
    assert new.record.acquired_unix == T0 + 61

    with pytest.raises(LeaseLost) as err:
        old.renew()
    assert err.value.record == new.record and "flow run 9c3" in str(err.value)
    with pytest.raises(LeaseLost):
        old.attach("sky-18")
    assert old.release() is False  # not ours any more: the new holder's lease stays
    assert read(store, RUN) == new.record
    new.renew()
    assert new.release() is True and read(store, RUN) is None


def test_adopt_with_the_holders_token_only(store):
    clock = Clock()
    flow = acquire(store, RUN, "flow run 5f1", ttl_s=60, clock=clock)
    assert adopt(store, RUN, "0" * 32, clock=clock) is None
    assert adopt(store, "another-run", flow.token, clock=clock) is None
    node = adopt(store, RUN, flow.token, clock=clock)
    assert isinstance(node, Lease) and node.adopted and node.token == flow.token

    # both beat the one lease: each goes on from the other's write, and neither loses the job id
    clock.advance(10)
    node.renew()
    flow.attach("sky-17")
    clock.advance(10)
    node.renew()
    flow.renew()
    assert read(store, RUN).job_id == "sky-17" and read(store, RUN).heartbeat_unix == T0 + 20
    with node:
        pass  # leaving an adopted lease does not release it: its holder does
    assert read(store, RUN).token == flow.token

    assert acquire_or_adopt(store, RUN, "node", token=flow.token, clock=clock).adopted
    with pytest.raises(LeaseHeld):
        acquire_or_adopt(store, RUN, "node", token=None, clock=clock)
    clock.advance(61)
    assert adopt(store, RUN, flow.token, clock=clock) is None  # a dead lease is nobody's to adopt
    taken = acquire_or_adopt(store, RUN, "node pid 9", token=flow.token, clock=clock)  # so the node takes it
    assert not taken.adopted and taken.token != flow.token and read(store, RUN).holder == "node pid 9"


def _race(store, n: int, attempt) -> list:
    """``attempt(i)`` in ``n`` threads released at once; one client is shared (test_storage races separate ones)."""
    barrier = threading.Barrier(n)

    def one(i: int):
        barrier.wait()
        try:
            return attempt(i)
        except LeaseHeld as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_concurrent_starts_of_one_run_have_one_winner(store):
    """Two starts of one run at once (a double click), then eight at once on a dead lease (an overlapping
    schedule after a crash): exactly one holds the lease each time, and the others are told who does."""
    clock = Clock()

    def one_winner(n: int) -> Lease:
        results = _race(store, n, lambda i: acquire(store, RUN, f"start {i}", ttl_s=60, clock=clock))
        won = [r for r in results if isinstance(r, Lease)]
        assert len(won) == 1, results
        assert read(store, RUN) == won[0].record
        assert all(isinstance(r, LeaseHeld) and r.record.token == won[0].token for r in results if r is not won[0])
        return won[0]

    assert one_winner(2).release()
    dead = acquire(store, RUN, "crashed flow", ttl_s=60, clock=clock)
    clock.advance(120)
    winner = one_winner(8)
    with pytest.raises(LeaseLost):
        dead.renew()
    assert winner.release()


def test_heartbeat_thread_beats_and_reports_a_takeover(tmp_path):
    store = open_store(str(tmp_path / "store"))
    lease = acquire(store, RUN, "flow run 5f1", ttl_s=60)  # the real clock
    first_beat = lease.record.heartbeat_unix
    lost = threading.Event()
    with pytest.raises(ValueError, match="well below"):
        Heartbeat(lease, every_s=60)
    beat = Heartbeat(lease, every_s=0.02, on_lost=lambda exc: lost.set())
    deadline = time.monotonic() + 30  # (beats every 20 ms: the limit only bounds a starved machine's wait)
    while read(store, RUN).heartbeat_unix == first_beat and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read(store, RUN).heartbeat_unix > first_beat and beat.lost is None

    # another start whose clock says this lease is 2 minutes stale takes it over: the heartbeat notices
    taker = acquire(store, RUN, "flow run 9c3", ttl_s=60, clock=lambda: time.time() + 120)
    assert lost.wait(30), "the heartbeat did not notice the takeover"
    assert isinstance(beat.lost, LeaseLost) and beat.lost.record.token == taker.token
    beat.stop(timeout=5)
    assert not beat.alive and beat.failures == 0
    assert read(store, RUN).token == taker.token  # the lost holder's last beat did not overwrite it

    with Heartbeat(taker, every_s=0.02) as beat2:
        pass
    assert not beat2.alive and beat2.lost is None
    assert taker.release()


def test_an_unreadable_lease_is_taken_over(tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes(lease_key(RUN), b"{not json")
    lease = acquire(store, RUN, "flow run 5f1", clock=Clock())
    assert read(store, RUN) == lease.record


def test_lease_module_imports_neither_torch_nor_prefect():
    heavy = ("torch", "prefect", "boto3", "google.cloud.storage", "azure.storage.blob")
    code = f"import sys, thrifty.runs.lease; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env=child_env(os.environ, {"PYTHONPATH": str(REPO)}))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert ENV_LEASE_TOKEN == "THRIFTY_LEASE_TOKEN"


def test_a_holder_killed_on_this_machine_frees_the_lease_at_once(tmp_path):
    """kill -9 of a `thrifty train` and an immediate restart: the lease names a process that is gone."""
    import signal


    store_dir = tmp_path / "store"
    code = ("import time\nfrom thrifty.runs import lease\nfrom thrifty.storage import open_store\n"
            f"lease.acquire(open_store({str(store_dir)!r}), 'r', 'a doomed holder')\nprint('held', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        store = open_store(str(store_dir))
        with pytest.raises(LeaseHeld, match="a doomed holder"):
            acquire(store, "r", "second")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        held = acquire(store, "r", "second")  # no waiting out the ttl: its holder is gone
        assert read(store, "r").token == held.token
    finally:
        proc.kill()


def test_a_holder_killed_and_never_reaped_frees_the_lease_at_once(tmp_path):
    """A script killed with its node wrapper becomes an orphan; under an init that does not reap (a container's
    PID 1), it stays a zombie that `kill(pid, 0)` still finds. A zombie holds nothing: its restart is not refused."""
    import signal

    store_dir = tmp_path / "store"
    holder = ("import time\nfrom thrifty.runs import lease\nfrom thrifty.storage import open_store\n"
              f"lease.acquire(open_store({str(store_dir)!r}), 'r', 'an orphaned holder')\nprint('held', flush=True)\n"
              "time.sleep(120)\n")
    # a parent that never waits for its child: the killed child stays a zombie while the parent lives
    parent = ("import subprocess, sys, time\n"
              f"c = subprocess.Popen([sys.executable, '-c', {holder!r}], stdout=subprocess.PIPE, text=True)\n"
              "print(c.pid, c.stdout.readline().strip(), flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)
    try:
        pid, word = proc.stdout.readline().split()
        assert word == "held"
        store = open_store(str(store_dir))
        os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        held = acquire(store, "r", "second")  # a zombie: gone, though its pid still answers kill(pid, 0)
        assert read(store, "r").token == held.token
    finally:
        proc.kill()
        proc.wait()
