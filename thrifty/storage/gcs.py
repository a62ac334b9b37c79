"""GCSStore: a Google Cloud Storage bucket; google-cloud-storage is imported when a store is opened."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Iterator

from thrifty.storage.atomic import replace_atomically
from thrifty.storage.base import Conflict, NotFound, ObjectInfo, RestoreStatus, StoreError
from thrifty.storage.object import DEFAULT_PART_SIZE_BYTES, _ObjectStore
from thrifty.storage.retry import DEFAULT_RETRY_S, retried

_GCS_CHUNK_BYTES = 256 << 10  # resumable upload chunks must be multiples of this


@retried
class GCSStore(_ObjectStore):
    """A Google Cloud Storage bucket; STORAGE_EMULATOR_HOST points it at an emulator (anonymous credentials).

    Credentials come from Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
    login, workload identity). Files above 8 MiB go up as resumable uploads in ``part_size_bytes``
    chunks; an object appears only when its upload is finalized.
    """

    def __init__(self, uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False,
                 retry_s: float = DEFAULT_RETRY_S):
        self._init_uri(uri)
        self.retry_s = 0.0 if fail_fast else retry_s
        from google.cloud import storage

        self._chunk_bytes = max(1, -(-part_size_bytes // _GCS_CHUNK_BYTES)) * _GCS_CHUNK_BYTES
        # fail_fast (preflight): no retries and a short timeout instead of up to two minutes of retrying
        self._call: dict = {"retry": None, "timeout": 20} if fail_fast else {}
        with self._translate("connect"):
            if os.environ.get("STORAGE_EMULATOR_HOST"):
                from google.auth.credentials import AnonymousCredentials

                client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator"),
                                        credentials=AnonymousCredentials())
            else:
                client = storage.Client(project=None)  # object calls need no project; credentials from ADC
        self._client = client
        self._bucket = client.bucket(self.bucket)

    def _is_missing_key(self, exc: BaseException) -> bool:
        from google.api_core import exceptions as gx

        return isinstance(exc, gx.NotFound)

    def _transient(self, exc: BaseException) -> bool:
        import requests
        from google.api_core import exceptions as gx
        from google.auth import exceptions as ax

        if isinstance(exc, (gx.ServiceUnavailable, gx.InternalServerError, gx.BadGateway, gx.GatewayTimeout,
                            gx.TooManyRequests, gx.DeadlineExceeded, gx.RetryError, requests.ConnectionError,
                            requests.Timeout, requests.exceptions.ChunkedEncodingError, ax.TransportError)):
            return True
        status = getattr(getattr(exc, "response", None), "status_code", 0)  # google-resumable-media's InvalidResponse
        return isinstance(status, int) and (status >= 500 or status == 429)

    def _explain(self, exc: BaseException, op: str) -> str | None:
        import requests
        from google.api_core import exceptions as gx
        from google.auth import exceptions as ax

        where = f"gs://{self.bucket}"
        if isinstance(exc, ax.DefaultCredentialsError):
            return (f"no usable Google credentials ({exc}); run `gcloud auth application-default login`, set "
                    "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run with workload identity")
        if isinstance(exc, (ax.RefreshError, gx.Unauthorized)):
            return (f"Google rejected the credentials ({exc}); run `gcloud auth application-default login` again "
                    "or check the key file in GOOGLE_APPLICATION_CREDENTIALS")
        if isinstance(exc, gx.NotFound):  # a missing key is handled before this: here it is the bucket
            return (f"bucket {self.bucket!r} does not exist; create it (gcloud storage buckets create {where}) "
                    "or fix 'store'")
        if isinstance(exc, gx.Forbidden):
            # the service's own words name the account that was refused
            said = re.search(r'"message": "((?:[^"\\]|\\.)*)"', str(exc.message))
            return (f"access denied ({op}) on {where}; grant the account in use roles/storage.objectUser "
                    f"on the bucket ({said.group(1) if said else exc.message})")
        if isinstance(exc, (requests.ConnectionError, requests.Timeout, ax.TransportError, gx.RetryError)):
            return (f"cannot reach Google Cloud Storage ({exc}); check the network, or STORAGE_EMULATOR_HOST "
                    "if you use an emulator")
        return None

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._translate("write"):
            self._bucket.blob(self._name(key)).upload_from_string(data, content_type="application/octet-stream",
                                                                  **self._call)

    def get_bytes(self, key: str) -> bytes:
        with self._translate("read", key):
            return self._bucket.blob(self._name(key)).download_as_bytes(**self._call)

    # Conditional writes: the version token is the object's generation (a new one at every write, as a string);
    # ifGenerationMatch=0 means "only if absent". GCS answers a failed precondition with 412.

    @contextlib.contextmanager
    def _conditional(self, op: str, key: str, expected: str | None) -> Iterator[None]:
        from google.api_core import exceptions as gx

        what = "already exists" if expected is None else f"changed (expected generation {expected})"
        try:
            with self._translate(op, None if op == "write" else key):  # a write's 404 is the bucket's
                yield
        except gx.PreconditionFailed:
            raise Conflict(f"store {self.uri!r}: {key} {what}") from None
        except NotFound:
            raise Conflict(f"store {self.uri!r}: {key} is gone (expected generation {expected})") from None

    def put_bytes_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        blob = self._bucket.blob(self._name(key))
        with self._conditional("write", key, expected):
            blob.upload_from_string(data, content_type="application/octet-stream",
                                    if_generation_match=0 if expected is None else int(expected), **self._call)
        return str(blob.generation)

    def get_bytes_versioned(self, key: str) -> tuple[bytes, str]:
        blob = self._bucket.blob(self._name(key))
        with self._translate("read", key):
            data = blob.download_as_bytes(**self._call)
        if blob.generation is None:  # GCS sends x-goog-generation with every download
            raise StoreError(f"store {self.uri!r}: the service sent no generation with {key}, and conditional "
                             "writes need one (GCS sends it; an emulator may not)")
        return data, str(blob.generation)

    def delete_if(self, key: str, *, expected: str) -> None:
        with self._conditional("delete", key, expected):
            self._bucket.blob(self._name(key)).delete(if_generation_match=int(expected), **self._call)

    def put_file(self, key: str, local_path: str | Path) -> None:
        with self._translate("write"):
            blob = self._bucket.blob(self._name(key), chunk_size=self._chunk_bytes)
            blob.upload_from_filename(str(local_path), content_type="application/octet-stream", **self._call)

    def get_file(self, key: str, local_path: str | Path) -> None:
        with self._translate("read", key):
            blob = self._bucket.blob(self._name(key), chunk_size=self._chunk_bytes)
            replace_atomically(local_path, lambda tmp: blob.download_to_filename(tmp, **self._call), durable=False)

    def exists(self, key: str) -> bool:
        with self._translate("read"):
            return self._bucket.blob(self._name(key)).exists(**self._call)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        with self._translate("list"):
            blobs = list(self._client.list_blobs(self._bucket, prefix=self._list_prefix(prefix), **self._call))
        return sorted((ObjectInfo(self._key(b.name), b.size, b.updated, b.storage_class or "STANDARD")
                       for b in blobs if not b.name.endswith("/")), key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            with self._translate("delete", key):
                self._bucket.blob(self._name(key)).delete(**self._call)
        except NotFound:
            pass

    def set_storage_class(self, key: str, storage_class: str) -> None:
        with self._translate("storage class change", key):  # a rewrite in place, done inside GCS
            self._bucket.blob(self._name(key)).update_storage_class(storage_class, **self._call)

    def merge_lifecycle_rules(self, rules: list[dict]) -> None:
        """Add ``rules`` to the bucket's lifecycle; earlier rules with the same prefixes are replaced, others kept."""
        ours = [sorted(r["condition"].get("matchesPrefix", [])) for r in rules]
        with self._translate("lifecycle read"):
            self._bucket.reload(**self._call)
        kept = [r for r in self._bucket.lifecycle_rules if sorted(r.get("condition", {}).get("matchesPrefix", []))
                not in ours]
        self._bucket.lifecycle_rules = kept + rules
        with self._translate("lifecycle write"):
            self._bucket.patch(**self._call)

    def restore(self, key: str, *, priority: str = "standard", days: int = 7) -> RestoreStatus:
        """GCS's cold classes are online: one rewrite to STANDARD (a retrieval fee per GB, no wait)."""
        self.set_storage_class(key, "STANDARD")
        return RestoreStatus(key, "done", "immediate (GCS reads every class in milliseconds)")
