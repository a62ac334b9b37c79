"""What every store shares: the Store protocol, its errors, ObjectInfo, RestoreStatus, cold classes, key helpers.

Keys are '/'-separated strings relative to the store root; a URI never passes through
``Path`` unless it is a local one.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, ContextManager, Protocol


class StoreError(RuntimeError):
    """A store cannot be used as configured (missing, denied, unsupported)."""


class NotFound(KeyError):
    """No object at that key."""


class Conflict(StoreError):
    """A conditional write or delete lost: the object was created, changed or removed since the version expected."""


class Archived(StoreError):
    """The object is in an archive tier: it must be restored (``thrifty archive restore``) before it can be read."""


# storage classes / access tiers whose objects are not meant to be read in place (a restore or a retrieval
# fee first): what the archiver moves things to, and what checkpoints and the cache treat as archived
COLD_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE", "GLACIER_IR", "COLDLINE", "ARCHIVE", "Cold", "Archive"})


def is_cold(storage_class: str) -> bool:
    return storage_class in COLD_CLASSES


@dataclass(frozen=True)
class RestoreStatus:
    """Where the restore of one archived object stands."""

    key: str
    state: str  # "done" (readable, back in the hot class), "requested" (just asked), "in progress"
    eta: str  # what the provider says a restore takes, e.g. "3-5 hours"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: dt.datetime
    storage_class: str


class Store(Protocol):
    uri: str

    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def put_file(self, key: str, local_path: str | Path) -> None: ...
    def get_file(self, key: str, local_path: str | Path) -> None: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Move an object to another class or tier, named as its service names them (GLACIER, COLDLINE, Cool)."""
        ...
    def restore(self, key: str, *, priority: str = "standard", days: int = 7) -> RestoreStatus:
        """Start (or finish) bringing an archived object back to the hot class; safe to call again.

        ``priority`` is bulk | standard | high (the provider's cheaper/faster retrieval options);
        ``days`` is how long S3 keeps a restored copy readable before it is copied back to STANDARD.
        """
        ...
    def writer(self, key: str) -> ContextManager[BinaryIO]:
        """A file to stream an object into (a checkpoint, a metrics file): it appears at ``key`` whole when the block
        ends, or not at all. File stores write beside the target; object stores spool locally, then upload."""
        ...
    def sweep(self, prefix: str = "") -> int:
        """Remove what killed writers left (temp files whose writer is gone, the directories they leave empty)
        under ``prefix``, and in this machine's spool; the number of files removed."""
        ...
    def local_path(self, key: str) -> Path | None:
        """A path readable in place (file stores), or None where the object must be fetched."""
        ...

    # ------------------------------------------------------------- conditional writes (compare-and-swap)
    # For small control objects (a run's lease): a writer that read version v replaces the object only if it is
    # still at v, so of two writers racing from the same read exactly one wins. A version token is the backend's
    # own (S3 and Azure: the ETag; GCS: the generation; file stores: the SHA-256 of the content), opaque to callers:
    # compare tokens only with ==, and only ones from the same store. Where the token follows from the content
    # (file stores; S3's ETag of a plain upload is its MD5), writing identical bytes yields the same token: a
    # compare-and-swap then compares content, which is what a caller that computed its write from what it read
    # needs. Unconditional writes (put_bytes, delete) to the same key take no part in the comparison on file
    # stores: on such keys, use only the conditional ones.

    def put_bytes_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Write ``data`` at ``key`` only if the object is as the caller last saw it; return the new version token.

        ``expected=None``: only if no object exists at ``key`` (create-only). Otherwise ``expected`` is a token
        that ``get_bytes_versioned`` or an earlier ``put_bytes_if`` returned: only if the object still has that
        version. Raises :class:`Conflict` when the precondition fails (someone else created, changed or removed it
        first); the object is then left as it was. Like every write, atomic for readers.
        """
        ...

    def get_bytes_versioned(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its version token, read together (one request); NotFound like ``get_bytes``."""
        ...

    def delete_if(self, key: str, *, expected: str) -> None:
        """Delete the object at ``key`` only if it still has version ``expected``; :class:`Conflict` otherwise
        (it changed, or is gone)."""
        ...


RESTORE_PRIORITIES = ("bulk", "standard", "high")


def _clean_key(key: str) -> str:
    parts = [p for p in key.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or not parts:
        raise ValueError(f"invalid store key {key!r}")
    return "/".join(parts)


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
