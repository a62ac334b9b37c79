"""The node's meter records kept on its own disk first: what it billed is never lost to a store that does not answer.

The meter (``thrifty.money.meter``) writes each record of its attempt here, at once and without the network, then
a background thread puts it in the store (``runs/<run>/meter/...``, retried through the store's window). A record
the store never got (the store was down when the job ended, or the process was killed while it was) stays here
until the next look from this machine puts it there: the next attempt's node, the local launcher when an attempt
ends, the flow's next run of it, ``thrifty report`` (:func:`flush`). Layout:
``<spool>/meter/<hash of the store's URI>/<run_id>/<job_id>/<started ms>.json``. A cloud VM's disk goes with it,
so there the record the node could not put before its teardown is lost, and the run is billed up to its
last heartbeat in the store plus a beat (``MeterRecord.end_unix``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from thrifty.money.ledger import MeterRecord, meter_key, write_meter
from thrifty.procs import process_alive
from thrifty.storage import NotFound, Store, atomic_write_bytes
from thrifty.storage.spool import spool_dir

log = logging.getLogger("thrifty.money.meter")


def local_dir(store: Store) -> Path:
    return spool_dir() / "meter" / hashlib.sha256(store.uri.encode()).hexdigest()[:16]


def local_path(store: Store, run_id: str, record: MeterRecord) -> Path:
    return local_dir(store) / run_id / record.job_id / f"{int(record.started_unix * 1000)}.json"


def keep(store: Store, run_id: str, record: MeterRecord) -> Path:
    """Write the record on this machine (atomically); the store gets it from :func:`put`."""
    path = local_path(store, run_id, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, record.model_dump_json().encode())
    return path


def newer(mine: MeterRecord, theirs: MeterRecord | None) -> bool:
    """Whether ``mine`` says more than the store's copy: an end it lacks, or a later heartbeat."""
    if theirs is None:
        return True
    if (mine.ended_unix is None) != (theirs.ended_unix is None):
        return mine.ended_unix is not None
    return (mine.ended_unix or mine.last_unix) > (theirs.ended_unix or theirs.last_unix)


def put(store: Store, run_id: str, record: MeterRecord) -> None:
    """The record in the store, and its local copy gone once the store holds its end."""
    write_meter(store, run_id, record)
    if record.ended_unix is not None:
        local_path(store, run_id, record).unlink(missing_ok=True)


def _in_store(store: Store, run_id: str, record: MeterRecord) -> MeterRecord | None:
    try:
        return MeterRecord.model_validate_json(store.get_bytes(meter_key(run_id, record)))
    except (NotFound, ValidationError):
        return None


def flush(store: Store, run_id: str | None = None) -> list[MeterRecord]:
    """Put in the store what nodes of this machine kept here and the store lacks (their process gone: a live node
    puts its own); returns the records written. A store still down keeps them here for the next look."""
    top = local_dir(store)
    written = []
    for path in sorted(top.glob(f"{run_id or '*'}/*/*.json")):
        run = path.parent.parent.name
        try:
            record = MeterRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            continue
        live = (record.host == socket.gethostname() and record.pid and process_alive(record.pid, record.pid_started))
        if record.ended_unix is None and (live or record.pid == os.getpid()):
            continue  # its node is alive and puts it itself
        try:
            if newer(record, _in_store(store, run, record)):
                write_meter(store, run, record)
                written.append(record)
            path.unlink(missing_ok=True)
        except Exception as exc:  # noqa: BLE001 -- the store is still down: kept here, tried at the next look
            log.warning("budget meter: the record of job %s (run %s) kept on this machine could not be written "
                        "to the store yet (%s); it stays in %s", record.job_id, run, exc, path.parent)
    return written


class RecordSync:
    """Keeps the meter's records here at once and puts the newest in the store from one background thread, which
    then calls ``after`` (the meter re-reads the run's ledger there): a store that hangs never holds up training,
    and the record it missed is in the store as soon as it answers again."""

    def __init__(self, store: Store, run_id: str, after: Callable[[], None]):
        self.store, self.run_id, self.after = store, run_id, after
        self._cv = threading.Condition()
        self._pending: MeterRecord | None = None
        self._done: MeterRecord | None = None  # the last record put in the store
        self._tried: MeterRecord | None = None  # the last record the thread tried to put
        self._closing = False
        self._thread: threading.Thread | None = None

    def keep(self, record: MeterRecord) -> None:
        """On this machine only."""
        try:
            keep(self.store, self.run_id, record)
        except OSError as exc:  # this machine's disk: the store copy is still tried
            log.warning("budget meter: could not keep the record on this machine (%s)", exc)

    def _put(self, record: MeterRecord) -> bool:
        try:
            put(self.store, self.run_id, record)
            self.after()
            return True
        except Exception as exc:  # noqa: BLE001 -- a store hiccup must not stop training; kept here, tried again
            log.warning("budget meter: could not update the run's record in the store (%s); it is kept on this "
                        "machine and written when the store answers", exc)
            return False

    def put_now(self, record: MeterRecord) -> None:
        """Keep and put ``record`` on the calling thread (the first one: the run's spend must be known first)."""
        self.keep(record)
        if self._put(record):
            self._done = record

    def offer(self, record: MeterRecord) -> None:
        """Keep ``record`` here and let the thread put it (a newer one offered meanwhile replaces it)."""
        self.keep(record)
        with self._cv:
            self._pending = record
            self._closing = False
            if self._thread is None or not self._thread.is_alive():  # (a second close: the first ended it)
                self._thread = threading.Thread(target=self._serve, name="thrifty-meter-sync", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _serve(self) -> None:
        flushed = False
        while True:
            with self._cv:
                while self._pending is None and not self._closing:
                    self._cv.wait()
                if self._pending is None:
                    return
                record, self._pending = self._pending, None
            put_ok = self._put(record)
            with self._cv:
                if put_ok:
                    self._done = record
                self._tried = record
                self._cv.notify_all()
            if put_ok and not flushed:  # the store answers: what earlier nodes of this run left on this machine
                flushed = True
                flush(self.store, self.run_id)

    def close(self, record: MeterRecord, wait_s: float | None) -> bool:
        """Offer the final record, wait up to ``wait_s`` (None: as long as the store's retries take) for the thread
        to have tried it, and end the thread; False when it is only on this machine."""
        self.offer(record)
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self._cv:
            while self._tried is not record:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cv.wait(left)
            self._closing = True
            self._cv.notify_all()
            return self._done is record
