"""What the object stores (s3://, gs://, az://) share: bucket URIs, key mapping, error translation.

The object stores import their SDK when opened, take credentials from the SDK's own chain
(Thrifty stores none), and stream files in parts.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import BinaryIO, Iterator

from thrifty.storage.base import Archived, NotFound, StoreError, _clean_key
from thrifty.storage.retry import DEFAULT_RETRY_S
from thrifty.storage.spool import spooled, sweep_spool

DEFAULT_PART_SIZE_BYTES = 16 << 20  # uploads above this go in parts of this size; one part is the most held in memory


def _split_bucket_uri(uri: str) -> tuple[str, str, str]:
    """``scheme://bucket/a/b/`` -> (scheme, bucket, "a/b"); a bucket's root has prefix ""."""
    scheme, _, rest = uri.partition("://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        what = "container" if scheme == "az" else "bucket"
        raise StoreError(f"store {uri!r}: no {what} name; write it as {scheme}://{what}/prefix")
    return scheme, bucket, "/".join(p for p in prefix.split("/") if p)


class _ObjectStore:
    """What the three cloud backends share: key mapping under a root prefix, and error translation.

    Object names are built from strings only (never ``Path``). Each backend says which SDK errors
    mean "no such key" and which mean "the store is misconfigured" (with the fix, for StoreError).
    """

    uri: str
    bucket: str
    root: str
    retry_s: float = DEFAULT_RETRY_S  # how long a transient error is retried (thrifty.storage.retry)
    _disk_is = "this machine's disk"  # an object store's only disk here: the spool and downloads

    def _init_uri(self, uri: str) -> None:
        scheme, self.bucket, self.root = _split_bucket_uri(uri)
        self.uri = f"{scheme}://{self.bucket}" + (f"/{self.root}" if self.root else "")

    def _name(self, key: str) -> str:
        key = _clean_key(key)
        return f"{self.root}/{key}" if self.root else key

    def _list_prefix(self, prefix: str) -> str:
        # a prefix may end mid-name ("runs/a" matches "runs/abc/..."); the root itself always ends with "/"
        prefix = prefix.lstrip("/")
        return f"{self.root}/{prefix}" if self.root else prefix

    def _key(self, name: str) -> str:
        return name[len(self.root) + 1 :] if self.root else name

    def local_path(self, key: str) -> Path | None:
        return None

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """Spooled on this machine, uploaded whole (in parts above the part size) when the block ends."""
        with spooled(lambda path: self.put_file(key, path), key.rpartition("/")[2]) as f:
            yield f

    def sweep(self, prefix: str = "") -> int:
        """Uploads are atomic, so the store holds no leftovers (a bucket rule aborts multipart ones); the spool may."""
        return sweep_spool()

    # backends override these
    def _transient(self, exc: BaseException) -> bool:
        """An error of the service or the network that another try may cure (5xx, throttling, a reset, a timeout)."""
        return False

    def _is_missing_key(self, exc: BaseException) -> bool:
        return False

    def _explain(self, exc: BaseException, op: str) -> str | None:
        """What is wrong with the store's setup and how to fix it, or None for an error that is not a setup problem."""
        return None

    def _is_archived(self, exc: BaseException) -> bool:
        """The service refused a read because the object is in an archive tier."""
        return False

    @contextlib.contextmanager
    def _translate(self, op: str, key: str | None = None) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            if key is not None and self._is_missing_key(exc):
                raise NotFound(key) from None
            hint = self._explain(exc, op)
            if hint is None:
                raise
            if self._is_archived(exc):
                raise Archived(f"store {self.uri!r}: {key or 'an object'} is archived: {hint}") from exc
            raise StoreError(f"store {self.uri!r}: {hint}") from exc
