"""Transient store errors, retried in one place for every backend; a full or read-only disk named as such.

A backend says which of its SDK's errors are transient (``_transient``: connection refused or reset, a timeout,
a 5xx answer, throttling) and :func:`retried` wraps its operations: such an error is tried again with jittered
exponential backoff until the store's window (``retry_s``; ``RunConfig.store_retry_s`` on the training node and
in the watch loop) runs out, and then :class:`StoreUnavailable` names the store, the operation and the last
error in the service's own words. It is a failure (exit 1, a job the launcher may restart), never bad input: a
store that passed the preflight and fails mid-run is an outage, not a setting. A full or read-only disk is
named at once (``StoreUnavailable``; waiting would not free it). Only the outermost call of a thread retries
(an S3 restore that changes a class is one operation), so windows never multiply. ``retry_s`` 0 (the preflight's
``fail_fast``) leaves every error as the SDK raised it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import random
import threading
import time
from typing import Any, Callable, Iterator

from thrifty.storage.base import Archived, Conflict, NotFound

log = logging.getLogger("thrifty.storage")

DEFAULT_RETRY_S = 300.0  # RunConfig.store_retry_s's default: minutes, as a store's brief outage lasts
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 15.0

# what each wrapped operation is called in messages
OPERATIONS = {"put_bytes": "write", "put_file": "write", "put_bytes_if": "write", "get_bytes": "read",
              "get_file": "read", "get_bytes_versioned": "read", "exists": "read", "list": "list",
              "delete": "delete", "delete_if": "delete", "set_storage_class": "storage class change",
              "restore": "restore", "merge_lifecycle_rules": "lifecycle change"}

DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
READ_ONLY = {errno.EROFS}
# a network file system that stalls or drops its server, a local one interrupted: worth another try
TRANSIENT_ERRNO = {errno.EIO, errno.ETIMEDOUT, errno.ESTALE, errno.EAGAIN, errno.EINTR, errno.ECONNRESET,
                   errno.ECONNREFUSED, errno.ECONNABORTED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPIPE,
                   errno.ENOTCONN}


class StoreUnavailable(RuntimeError):
    """The store kept failing past its retry window, or its disk is full or read-only: the job fails (exit 1)."""


_here = threading.local()  # depth: this thread is inside a retried call; listeners: who hears of each retry


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or while handling (an SDK's error wrapped in ours or in another)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)


def disk_fault(exc: BaseException) -> str | None:
    """'full' or 'read-only' when the error is a disk that cannot take the write."""
    for e in chain(exc):
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return "full"
        if isinstance(e, OSError) and e.errno in READ_ONLY:
            return "read-only"
    return None


def transient_os(exc: BaseException) -> bool:
    """Errors any backend may see from the network stack or a mounted file system that a retry may cure."""
    return isinstance(exc, (ConnectionError, TimeoutError)) or (isinstance(exc, OSError) and exc.errno in
                                                                 TRANSIENT_ERRNO)


def words(exc: BaseException, limit: int = 400) -> str:
    """The error as the service said it, one line, bounded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def disk_error(uri: str, whose: str, op: str, key: str | None, exc: BaseException, kind: str) -> StoreUnavailable:
    fix = ("free space there or pick another 'store'" if kind == "full" else
           "mount it read-write or pick another 'store'")
    where = f" {key}" if key else ""
    return StoreUnavailable(f"store {uri!r}: {whose} is {kind}: cannot {op}{where} ({words(exc)}); {fix}")


@contextlib.contextmanager
def disk_errors_named(uri: str, op: str, key: str | None = None, whose: str = "the store's disk") -> Iterator[None]:
    """Turn a full or read-only disk under the block into :class:`StoreUnavailable` that says so."""
    try:
        yield
    except OSError as exc:
        kind = disk_fault(exc)
        if kind is None:
            raise
        raise disk_error(uri, whose, op, key, exc, kind) from exc


@contextlib.contextmanager
def on_retry(callback: Callable[[str, BaseException], None]) -> Iterator[None]:
    """Tell ``callback(operation, error)`` of every retry this thread's store calls make inside the block (the
    checkpoint writer uses it to let training carry on while its write waits for the store)."""
    listeners = getattr(_here, "listeners", [])
    _here.listeners = [*listeners, callback]
    try:
        yield
    finally:
        _here.listeners = listeners


def _is_transient(store: Any, exc: BaseException) -> bool:
    if isinstance(exc, (NotFound, Conflict, Archived)):
        return False
    return any(transient_os(e) or store._transient(e) for e in chain(exc))


def call(store: Any, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(store, *args, **kwargs)``, retried on transient errors within ``store.retry_s``."""
    if getattr(_here, "depth", 0):  # an operation inside another: the outer one retries the whole
        return fn(store, *args, **kwargs)
    op = OPERATIONS.get(name, name)
    key = args[0] if args and isinstance(args[0], str) else None
    _here.depth = 1
    try:
        deadline: float | None = None
        delay = FIRST_DELAY_S
        tries = 0
        while True:
            try:
                return fn(store, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 -- re-raised unless transient
                kind = disk_fault(exc)
                if kind is not None:
                    raise disk_error(store.uri, store._disk_is, op, key, exc, kind) from exc
                window = float(getattr(store, "retry_s", 0.0) or 0.0)
                if window <= 0 or not _is_transient(store, exc):
                    raise
                now = time.monotonic()
                tries += 1
                if deadline is None:
                    deadline = now + window
                    log.warning("store %s: %s%s failed (%s); retrying for up to %.0f s", store.uri, op,
                                f" {key}" if key else "", words(exc, 200), window)
                if now >= deadline:
                    raise StoreUnavailable(
                        f"store {store.uri!r}: could not {op}{f' {key}' if key else ''}: it kept failing for "
                        f"{window:.0f} s ({tries} tries); the last error: {words(exc)}. Check the store's service "
                        "and the network; store_retry_s sets how long to keep trying") from exc
                for listener in getattr(_here, "listeners", []):
                    listener(op, exc)
                time.sleep(min(delay * random.uniform(0.5, 1.0), max(0.0, deadline - now)))
                delay = min(delay * 2, MAX_DELAY_S)
    finally:
        _here.depth = 0


def retried(cls: type) -> type:
    """Wrap every store operation ``cls`` defines (see ``OPERATIONS``) in :func:`call`."""
    for name in OPERATIONS:
        fn = cls.__dict__.get(name)
        if fn is None:
            continue

        def wrapper(self: Any, *args: Any, _fn: Callable[..., Any] = fn, _name: str = name, **kwargs: Any) -> Any:
            return call(self, _name, _fn, *args, **kwargs)

        setattr(cls, name, functools.wraps(fn)(wrapper))
    return cls
