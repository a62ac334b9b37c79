"""One run, one job: a lease in the store says who is training a run, and a heartbeat says it is still alive.

The lease is ``runs/<run_id>/lease.json``, written only with the store's conditional writes
(``Store.put_bytes_if``): of two starts of one run, even a double click apart, exactly one creates it;
the other gets :class:`LeaseHeld` (a ConfigError: the CLI shows it as a user error, exit 2) naming the
holder and what to do. The holder renews the heartbeat (:class:`Heartbeat`, a thread) well inside
``ttl_s``; a lease whose heartbeat is older than that is dead (its holder crashed or lost the network)
and the next start takes it over, with a compare-and-swap on the version it read, so of two takers one
wins. A holder that finds its lease taken over gets :class:`LeaseLost` and must stop its work.

A training process started for the holder (a flow launched it) gets the holder's token in
``THRIFTY_LEASE_TOKEN`` (``thrifty.protocol.ENV_LEASE_TOKEN``) and :func:`adopt`-s the lease instead of
acquiring a second one: it may heartbeat it too, so the lease stays live if the flow dies, and it leaves
releasing it to the holder. :func:`acquire_or_adopt` is that rule in one call.

Liveness compares the heartbeat, written with the writer's clock, with the reader's clock: machines that
share a lease need clocks within a small part of ``ttl_s`` of each other (NTP keeps them within a second).
Torch-free and Prefect-free: the CLI, the flow and the training node all import it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Callable

from thrifty.config import ConfigError
from thrifty.procs import process_alive, process_started
from thrifty.protocol import ENV_LEASE_TOKEN
from thrifty.runs.records import run_key
from thrifty.storage import Conflict, NotFound, Store

__all__ = ["DEFAULT_TTL_S", "ENV_LEASE_TOKEN", "LEASE_FILE", "Heartbeat", "Lease", "LeaseHeld", "LeaseLost",
           "LeaseRecord", "acquire", "acquire_or_adopt", "adopt", "lease_key", "read"]

LEASE_FILE = "lease.json"
DEFAULT_TTL_S = 60.0  # a holder that has not beaten for this long is taken for dead; beat every ttl_s / 3 or so
_ATTEMPTS = 8  # rounds of read-and-swap before giving up on a key that keeps changing under us

Clock = Callable[[], float]


def lease_key(run_id: str) -> str:
    return run_key(run_id, LEASE_FILE)


def _utc(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class LeaseRecord:
    """What ``lease.json`` holds."""

    holder: str  # who, in words: "flow run <id> on <host> pid <pid>"
    token: str  # uuid4 hex, new at every acquire: tells this holder's lease from any later one
    job_id: str | None  # the job the holder submitted for the run; None until it has
    acquired_unix: float
    heartbeat_unix: float
    ttl_s: float
    host: str = ""  # the holder's machine and process: a holder that died on this machine frees the lease at once
    pid: int = 0
    pid_started: str = ""  # the process's start time as the kernel keeps it (a reused pid is another process)

    def live(self, now: float) -> bool:
        """Its holder beat within ``ttl_s`` of ``now``, and is not a process known to be gone: a kill -9 on this
        machine frees the lease at once instead of after the ttl."""
        if now - self.heartbeat_unix > self.ttl_s:
            return False
        return not (self.host == socket.gethostname() and self.pid and not process_alive(self.pid, self.pid_started))

    def describe(self, now: float) -> str:
        job = f"job {self.job_id}" if self.job_id else "no job submitted yet"
        return (f"held by {self.holder} since {_utc(self.acquired_unix)} ({job}), last heartbeat "
                f"{max(0.0, now - self.heartbeat_unix):.0f} s ago (ttl {self.ttl_s:.0f} s)")

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "LeaseRecord":
        """Parse ``lease.json``; one that cannot be read counts as a dead lease (writes are atomic, so only a
        hand edit makes one), so that it blocks nobody for longer than a takeover."""
        try:
            raw = json.loads(data)
            return cls(holder=str(raw["holder"]), token=str(raw["token"]), job_id=raw.get("job_id"),
                       acquired_unix=float(raw["acquired_unix"]), heartbeat_unix=float(raw["heartbeat_unix"]),
                       ttl_s=float(raw["ttl_s"]), host=str(raw.get("host") or ""), pid=int(raw.get("pid") or 0),
                       pid_started=str(raw.get("pid_started") or ""))
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls(holder="an unreadable lease.json", token="", job_id=None, acquired_unix=0.0,
                       heartbeat_unix=0.0, ttl_s=0.0)


class LeaseHeld(ConfigError):
    """Another start of this run holds its live lease; ``record`` is that lease."""

    def __init__(self, run_id: str, record: LeaseRecord, now: float):
        self.run_id = run_id
        self.record = record
        super().__init__(f"run {run_id!r} is already running: its lease is {record.describe(now)}. Wait for it to "
                         "finish, cancel it, or use another run_name")


class LeaseLost(RuntimeError):
    """The lease this process held was taken over (after it missed its heartbeats) or removed: stop the work.

    ``record`` is the lease now in the store (another holder's), or None when there is none."""

    def __init__(self, run_id: str, record: LeaseRecord | None, now: float, why: str = ""):
        self.run_id = run_id
        self.record = record
        now_there = f"the lease is now {record.describe(now)}" if record else "there is no lease now"
        super().__init__(f"run {run_id!r}: this process lost its lease{why}; {now_there}")


class Lease:
    """This process's hold on a run's lease: renew it, record the job on it, release it.

    Safe to share between threads (a :class:`Heartbeat` renews it while the caller attaches a job). As a
    context manager it releases the lease on exit, unless it was adopted (the holder releases those): leave
    the block only once the run's job is over, since a released lease lets the next start submit a new job.
    """

    def __init__(self, store: Store, run_id: str, record: LeaseRecord, version: str, *, clock: Clock = time.time,
                 adopted: bool = False):
        self.store = store
        self.run_id = run_id
        self.key = lease_key(run_id)
        self.adopted = adopted
        self._record = record
        self._version = version
        self._clock = clock
        self._lock = threading.Lock()
        self._released = False
        self._lost = ""  # why, once this process has found the lease is no longer its

    @property
    def record(self) -> LeaseRecord:
        """The lease as this process last wrote or read it."""
        return self._record

    @property
    def token(self) -> str:
        return self._record.token

    @property
    def job_id(self) -> str | None:
        return self._record.job_id

    def renew(self) -> LeaseRecord:
        """Beat: write a fresh heartbeat. LeaseLost if the lease is no longer this holder's."""
        return self._change(lambda r: replace(r, heartbeat_unix=self._clock()))

    def attach(self, job_id: str) -> LeaseRecord:
        """Record the job submitted for the run (and beat). LeaseLost if the lease is no longer this holder's."""
        return self._change(lambda r: replace(r, job_id=job_id, heartbeat_unix=self._clock()))

    def _change(self, change: Callable[[LeaseRecord], LeaseRecord]) -> LeaseRecord:
        with self._lock:
            if self._released:
                raise LeaseLost(self.run_id, None, self._clock(), " (this process released it)")
            if self._lost:
                current = self._read_current()
                raise LeaseLost(self.run_id, current[0] if current else None, self._clock(), self._lost)
            for _ in range(_ATTEMPTS):
                new = change(self._record)
                try:
                    self._version = self.store.put_bytes_if(self.key, new.to_bytes(), expected=self._version)
                    self._record = new
                    return new
                except Conflict:
                    pass
                # changed since our last write: by another holder (lost), or by a co-holder of the same token (an
                # adopter beating too), or our own write went through and its retry was refused: read, and go on
                # from the current version while the token is ours
                current = self._read_current()
                if current is None:
                    self._lost = " (it was removed)"
                    raise LeaseLost(self.run_id, None, self._clock(), self._lost)
                if current[0].token != self.token:  # never swap from another holder's version: lost for good
                    self._lost = " (another start took it over)"
                    raise LeaseLost(self.run_id, current[0], self._clock(), self._lost)
                self._record, self._version = current
            raise LeaseLost(self.run_id, self._record, self._clock(), " (it kept changing under this process)")

    def _read_current(self) -> tuple[LeaseRecord, str] | None:
        try:
            data, version = self.store.get_bytes_versioned(self.key)
        except NotFound:
            return None
        return LeaseRecord.from_bytes(data), version

    def release(self) -> bool:
        """Remove the lease if it is still this holder's; True if it did. A lost lease (another holder's now) or
        one already gone is left as it is. The delete is conditional on the version read, so it never removes a
        lease that another start took over in between."""
        with self._lock:
            if self._released:
                return False
            self._released = True
            for _ in range(_ATTEMPTS):
                current = self._read_current()
                if current is None or current[0].token != self.token:
                    return False
                try:
                    self.store.delete_if(self.key, expected=current[1])
                    return True
                except Conflict:
                    continue  # a co-holder beat in between: read again
            return False

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        if not self.adopted:
            self.release()

    def __repr__(self) -> str:
        return f"Lease({self.run_id!r}, token={self.token[:8]}, job_id={self.job_id!r}, adopted={self.adopted})"


def read(store: Store, run_id: str) -> LeaseRecord | None:
    """The run's lease, live or not, or None when there is none."""
    try:
        return LeaseRecord.from_bytes(store.get_bytes(lease_key(run_id)))
    except NotFound:
        return None


def acquire(store: Store, run_id: str, holder: str, ttl_s: float = DEFAULT_TTL_S, clock: Clock = time.time) -> Lease:
    """Take the run's lease: create it, or take over one whose heartbeat is older than its ttl_s.

    Raises :class:`LeaseHeld` (with the holder's record) when a live lease is there, also when another start
    took over a dead one at the same moment and won.
    """
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, not {ttl_s}")
    key = lease_key(run_id)
    now = clock()
    mine = LeaseRecord(holder=holder, token=uuid.uuid4().hex, job_id=None, acquired_unix=now, heartbeat_unix=now,
                       ttl_s=float(ttl_s), host=socket.gethostname(), pid=os.getpid(),
                       pid_started=process_started(os.getpid()))
    expected: str | None = None  # first: create-only
    for _ in range(_ATTEMPTS):
        try:
            version = store.put_bytes_if(key, mine.to_bytes(), expected=expected)
            return Lease(store, run_id, mine, version, clock=clock)
        except Conflict:
            pass
        try:
            data, version = store.get_bytes_versioned(key)
        except NotFound:  # released in between: try to create it again
            expected = None
            continue
        current = LeaseRecord.from_bytes(data)
        if current.token == mine.token:  # our write went through and a retry of it was refused
            return Lease(store, run_id, current, version, clock=clock)
        if current.live(clock()):
            raise LeaseHeld(run_id, current, clock())
        # dead: take it over, only if it is still this dead one (a concurrent taker wins or we do)
        now = clock()
        mine = replace(mine, acquired_unix=now, heartbeat_unix=now)
        expected = version
    raise Conflict(f"run {run_id!r}: its lease kept changing while this process tried to take it; try again")


def adopt(store: Store, run_id: str, token: str, clock: Clock = time.time) -> Lease | None:
    """The run's live lease as a Lease, if its token is ``token`` (this process works for its holder), else None.

    The adopted lease may be renewed (so it stays live if the holder dies) and have a job attached; leaving it
    as a context manager does not release it.
    """
    try:
        data, version = store.get_bytes_versioned(lease_key(run_id))
    except NotFound:
        return None
    record = LeaseRecord.from_bytes(data)
    if not token or record.token != token or not record.live(clock()):
        return None
    return Lease(store, run_id, record, version, clock=clock, adopted=True)


def acquire_or_adopt(store: Store, run_id: str, holder: str, *, token: str | None, ttl_s: float = DEFAULT_TTL_S,
                     clock: Clock = time.time) -> Lease:
    """What a training process does: adopt the live lease named by ``token`` (pass
    ``os.environ.get(ENV_LEASE_TOKEN)``) when it is there; otherwise acquire one of its own (LeaseHeld if
    another start holds the run)."""
    if token:
        adopted = adopt(store, run_id, token, clock=clock)
        if adopted is not None:
            return adopted
    return acquire(store, run_id, holder, ttl_s=ttl_s, clock=clock)


class Heartbeat:
    """A daemon thread that renews ``lease`` every ``every_s`` seconds until :meth:`stop`.

    When the lease is lost it stops beating and keeps the :class:`LeaseLost` in ``lost`` (and calls
    ``on_lost`` with it, from the thread): the caller must then stop its work. A renewal that fails for
    another reason (the store unreachable for a moment) is counted in ``failures``, kept in ``last_error``
    and tried again at the next beat; if they go on past the ttl, the lease dies and may be taken over.
    """

    def __init__(self, lease: Lease, every_s: float, on_lost: Callable[[LeaseLost], None] | None = None):
        if not 0 < every_s < lease.record.ttl_s:
            raise ValueError(f"every_s ({every_s}) must be positive and well below the lease's ttl_s "
                             f"({lease.record.ttl_s}); a third of it is usual")
        self.lease = lease
        self.every_s = every_s
        self.lost: LeaseLost | None = None
        self.failures = 0
        self.last_error: Exception | None = None
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-heartbeat-{lease.run_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.lease.renew()
            except LeaseLost as exc:
                self.lost = exc
                if self._on_lost is not None:
                    self._on_lost(exc)
                return
            except Exception as exc:  # noqa: BLE001 - a transient store error: beat again next time
                self.failures += 1
                self.last_error = exc

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop beating and wait for the thread (a renewal in flight finishes first)."""
        self._stop.set()
        self._thread.join(timeout)

    def __enter__(self) -> "Heartbeat":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
