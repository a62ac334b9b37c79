"""One Store over string URIs: shards, checkpoints, metrics and ledgers all go through it.

Every write is atomic for readers: an object is either absent or complete. This package re-exports
the public API and holds ``open_store`` (which imports a backend only when its scheme is used) and ``check_store``.
Files: base (protocol, errors, keys), atomic (local writes), retry (transient errors, full disks), file (FileStore),
object (cloud base), s3, gcs, azure.
"""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path
from urllib.parse import urlparse

from thrifty.storage.atomic import atomic_write_bytes, fsync_dir, replace_atomically
from thrifty.storage.base import (COLD_CLASSES, RESTORE_PRIORITIES, Archived, Conflict, NotFound, ObjectInfo,
                                  RestoreStatus, Store, StoreError, is_cold, join_key)
from thrifty.storage.file import FILE_ARCHIVE_AREA, FILE_ARCHIVE_CLASS, FileStore
from thrifty.storage.object import DEFAULT_PART_SIZE_BYTES
from thrifty.storage.retry import DEFAULT_RETRY_S, StoreUnavailable

__all__ = ["COLD_CLASSES", "DEFAULT_PART_SIZE_BYTES", "DEFAULT_RETRY_S", "FILE_ARCHIVE_AREA", "FILE_ARCHIVE_CLASS",
           "PROBE_PREFIX", "RESTORE_PRIORITIES", "Archived", "Conflict", "FileStore", "NotFound", "ObjectInfo",
           "RestoreStatus", "Store", "StoreError", "StoreUnavailable", "atomic_write_bytes", "check_store", "fsync_dir",
           "is_cold", "join_key", "open_store", "replace_atomically"]

PROBE_PREFIX = "_thrifty"  # check_store writes (and removes) one small object here

# scheme -> (module, class): a backend's module is imported only when a store of that scheme is opened
_BACKENDS = {"s3": ("thrifty.storage.s3", "S3Store"), "gs": ("thrifty.storage.gcs", "GCSStore"),
             "az": ("thrifty.storage.azure", "AzureStore")}


def __getattr__(name: str):
    """``thrifty.storage.S3Store``, ``GCSStore`` and ``AzureStore`` still resolve, importing that backend's module."""
    for module, cls in _BACKENDS.values():
        if name == cls:
            return getattr(importlib.import_module(module), cls)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False,
               retry_s: float = DEFAULT_RETRY_S) -> Store:
    """A Store for ``uri``: a plain path or file://, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix.

    ``part_size_bytes`` sets the upload part size of the object stores; ``retry_s`` how long a transient error
    (a refused connection, a timeout, a 5xx, throttling) is retried before StoreUnavailable (``RunConfig.
    store_retry_s``); ``fail_fast`` trades every retry for a quick answer (preflight). Opening a store sends it no
    request (finding GCS credentials may ask the GCE metadata server, as Google's credential chain does).
    """
    retry_s = 0.0 if fail_fast else retry_s
    if "://" not in uri:
        return FileStore(uri, retry_s=retry_s)
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return FileStore(parsed.netloc + parsed.path if parsed.netloc not in ("", "localhost") else parsed.path,
                         retry_s=retry_s)
    if parsed.scheme in _BACKENDS:
        module, name = _BACKENDS[parsed.scheme]
        backend = getattr(importlib.import_module(module), name)
        return backend(uri, part_size_bytes=part_size_bytes, fail_fast=fail_fast, retry_s=retry_s)
    raise StoreError(f"store {uri!r}: unsupported scheme {parsed.scheme!r}; use file://, s3://, gs:// or az://")


def check_store(uri: str) -> None:
    """Write, read, list and delete a probe object under ``_thrifty/``; raise StoreError naming the store and the fix."""
    step = "open"
    created: list[Path] = []  # directories a file store's probe makes; removed again, so a check leaves no trace
    try:
        store = open_store(uri, fail_fast=True)
        if isinstance(store, FileStore):
            created = [d for d in (store.root, *store.root.parents) if not d.exists()]
        key = join_key(PROBE_PREFIX, f"probe-{uuid.uuid4().hex}")
        payload = b"thrifty store probe\n"
        step = "write"
        store.put_bytes(key, payload)
        step = "read"
        if store.get_bytes(key) != payload:
            raise StoreError(f"store {uri!r}: a probe object read back different from what was written")
        step = "list"
        if key not in [o.key for o in store.list(PROBE_PREFIX + "/")]:
            raise StoreError(f"store {uri!r}: a probe object just written is missing from the listing")
        step = "delete"
        store.delete(key)
    except StoreError:
        raise
    except NotFound:
        raise StoreError(f"store {uri!r}: a probe object just written could not be read back") from None
    except OSError as exc:  # file stores: a path that cannot be created or written
        raise StoreError(f"store {uri!r}: cannot {step} there ({exc}); fix the permissions or pick another 'store'"
                         ) from None
    except Exception as exc:
        raise StoreError(f"store {uri!r}: the probe {step} failed ({type(exc).__name__}: {exc})") from exc
    finally:
        for d in created:  # deepest first
            try:
                d.rmdir()
            except OSError:
                break
