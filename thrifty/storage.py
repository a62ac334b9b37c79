"""One Store over string URIs: shards, checkpoints, metrics and ledgers all go through it.

Keys are '/'-separated strings relative to the store root; a URI never passes through
``Path`` unless it is a local one. Every write is atomic for readers: an object is either
absent or complete. The object stores (s3://, gs://, az://) import their SDK when opened, take
credentials from the SDK's own chain (Thrifty stores none), and stream files in parts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol
from urllib.parse import urlparse


class StoreError(RuntimeError):
    """A store cannot be used as configured (missing, denied, unsupported)."""


class NotFound(KeyError):
    """No object at that key."""


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
    def local_path(self, key: str) -> Path | None:
        """A path readable in place (file stores), or None where the object must be fetched."""
        ...


RESTORE_PRIORITIES = ("bulk", "standard", "high")


def _clean_key(key: str) -> str:
    parts = [p for p in key.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or not parts:
        raise ValueError(f"invalid store key {key!r}")
    return "/".join(parts)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(path: str | Path, fill: Callable[[str], None], *, durable: bool = True) -> None:
    """Make ``path`` by ``fill``-ing a temp file beside it, then one rename: a crash or a failed ``fill``
    leaves the old file (or none), never half a new one. ``durable`` also fsyncs the data and the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        fill(tmp)
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half."""
    replace_atomically(path, lambda tmp: Path(tmp).write_bytes(data))


FILE_ARCHIVE_AREA = "archive"  # a file store's cold tier: <root>/archive/<key>; keys may not start with it
FILE_ARCHIVE_CLASS = "ARCHIVE"


class FileStore:
    """A directory on a local or mounted file system.

    Its cold tier is an ``archive/`` area beside the objects: an archived object moves (one atomic
    rename) to ``<root>/archive/<key>``, still lists under its key with storage class ARCHIVE, and
    reads fail with Archived until it is restored, as on the object stores.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = f"file://{self.root}"
        self._archive = self.root / FILE_ARCHIVE_AREA

    def _path(self, key: str) -> Path:
        key = _clean_key(key)
        if key.split("/", 1)[0] == FILE_ARCHIVE_AREA:
            raise StoreError(f"store {self.uri!r}: keys under {FILE_ARCHIVE_AREA}/ are reserved for archived objects")
        return self.root / key

    def _archived_path(self, key: str) -> Path:
        return self._archive / _clean_key(key)

    def _archived_error(self, key: str) -> Archived:
        return Archived(f"store {self.uri!r}: {key} is archived (in {self._archive}); restore it first "
                        "(thrifty archive restore RUN_ID, or Store.restore)")

    def _dropped_archived_copy(self, key: str) -> None:
        """A new write supersedes an archived copy: remove it so a restore never brings back old bytes."""
        old = self._archived_path(key)
        if old.exists():
            old.unlink()
            self._prune_dirs(old.parent, self._archive)

    def put_bytes(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self._path(key), data)
        self._dropped_archived_copy(key)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            if self._archived_path(key).is_file():
                raise self._archived_error(key) from None
            raise NotFound(key) from None

    def put_file(self, key: str, local_path: str | Path) -> None:
        replace_atomically(self._path(key), lambda tmp: shutil.copyfile(local_path, tmp))
        self._dropped_archived_copy(key)

    def get_file(self, key: str, local_path: str | Path) -> None:
        src = self._path(key)
        if not src.is_file():
            if self._archived_path(key).is_file():
                raise self._archived_error(key)
            raise NotFound(key)
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local_path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file() or self._archived_path(key).is_file()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        prefix = prefix.lstrip("/")
        found: dict[str, ObjectInfo] = {}
        for area, storage_class in ((self._archive, FILE_ARCHIVE_CLASS), (self.root, "STANDARD")):
            for key, st in self._walk(area, prefix):
                # hot wins over an archived copy (only a crash inside a write leaves both)
                found[key] = ObjectInfo(key, st.st_size, dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc),
                                        storage_class)
        return sorted(found.values(), key=lambda o: o.key)

    def _walk(self, area: Path, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
        base = area / prefix.strip("/") if prefix.strip("/") else area
        # a prefix may end mid-name ("runs/a" matches "runs/abc/..."), like object stores
        start = base if base.is_dir() else base.parent
        if not start.is_dir() or not start.is_relative_to(area):
            return
        for dirpath, dirs, files in os.walk(start):
            if Path(dirpath) == self.root and area == self.root and FILE_ARCHIVE_AREA in dirs:
                dirs.remove(FILE_ARCHIVE_AREA)  # the archive area is walked on its own
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # an in-flight atomic write, not an object
                p = Path(dirpath) / name
                key = p.relative_to(area).as_posix()
                if key.startswith(prefix) and not (area == self.root and key.startswith(FILE_ARCHIVE_AREA + "/")):
                    yield key, p.stat()

    def delete(self, key: str) -> None:
        p = self._path(key)
        p.unlink(missing_ok=True)
        self._prune_dirs(p.parent, self.root)
        self._dropped_archived_copy(key)

    @staticmethod
    def _prune_dirs(parent: Path, top: Path) -> None:
        """Remove empty directories from ``parent`` up to (not including) ``top``."""
        while parent != top and parent.is_dir() and parent.is_relative_to(top):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def _move(self, src: Path, dest: Path, top: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)  # one rename: the object is in one place or the other, never both or neither
        fsync_dir(dest.parent)
        fsync_dir(src.parent)
        self._prune_dirs(src.parent, top)

    def set_storage_class(self, key: str, storage_class: str) -> None:
        hot, cold = self._path(key), self._archived_path(key)
        if storage_class.upper() == FILE_ARCHIVE_CLASS:
            if hot.is_file():
                self._move(hot, cold, self.root)
            elif not cold.is_file():
                raise NotFound(key)
        elif storage_class.upper() == "STANDARD":
            if hot.is_file():
                self._dropped_archived_copy(key)  # a hot write newer than a leftover archived copy wins
            elif cold.is_file():
                self._move(cold, hot, self._archive)
            else:
                raise NotFound(key)
        else:
            raise StoreError(f"store {self.uri!r}: a file store has two storage classes, STANDARD and "
                             f"{FILE_ARCHIVE_CLASS} (its {FILE_ARCHIVE_AREA}/ area), not {storage_class!r}; "
                             "other cold tiers need an s3://, gs:// or az:// store")

    def restore(self, key: str, *, priority: str = "standard", days: int = 7) -> RestoreStatus:
        self.set_storage_class(key, "STANDARD")
        return RestoreStatus(key, "done", "immediate (a local move)")

    def local_path(self, key: str) -> Path | None:
        return self._path(key)


# ---------------------------------------------------------------------------------------- object stores

DEFAULT_PART_SIZE_BYTES = 16 << 20  # uploads above this go in parts of this size; one part is the most held in memory
PROBE_PREFIX = "_thrifty"  # check_store writes (and removes) one small object here


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

    # backends override these two
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


def _s3_error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Store(_ObjectStore):
    """An S3 bucket, or any S3-compatible service via AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3.

    Credentials come from boto3's chain (env, profiles, SSO, instance/task roles). Files go through
    s3transfer: multipart above ``part_size_bytes``, read from disk part by part; an object appears
    only when its upload completes. A killed multipart upload leaves parts that S3 bills until a
    bucket lifecycle rule (AbortIncompleteMultipartUpload) removes them.
    """

    def __init__(self, uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False):
        self._init_uri(uri)
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        # fail_fast (preflight): two attempts and short timeouts instead of the SDK's patient defaults
        config = None
        if fail_fast:
            config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=20)
        with self._translate("connect"):
            self._client = boto3.session.Session().client("s3", config=config)
        self._transfer = TransferConfig(multipart_threshold=part_size_bytes, multipart_chunksize=part_size_bytes,
                                        max_concurrency=4)
        # a class change is a copy onto itself, done by S3 without the bytes passing here; one request up to 4 GiB
        self._copy = TransferConfig(multipart_threshold=4 << 30, multipart_chunksize=512 << 20, max_concurrency=4)

    def _is_missing_key(self, exc: BaseException) -> bool:
        return _s3_error_code(exc) in ("NoSuchKey", "404", "NotFound")

    def _is_archived(self, exc: BaseException) -> bool:
        return _s3_error_code(exc) == "InvalidObjectState"

    def _explain(self, exc: BaseException, op: str) -> str | None:
        from botocore import exceptions as bx

        where = f"s3://{self.bucket}/{self.root}".rstrip("/")
        if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
            return (f"no AWS credentials found ({exc}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                    "pick a profile with AWS_PROFILE, or run where an instance or task role is attached")
        if isinstance(exc, bx.ProfileNotFound):
            return f"{exc}; fix AWS_PROFILE or add that profile to ~/.aws/config"
        if isinstance(exc, (bx.SSOError, bx.TokenRetrievalError)):
            return f"the AWS SSO login is missing or expired ({exc}); run `aws sso login`"
        if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
            return (f"cannot reach the S3 endpoint ({exc}); check the network, or AWS_ENDPOINT_URL / "
                    "AWS_ENDPOINT_URL_S3 if you use an S3-compatible service")
        code = _s3_error_code(exc)
        if code == "NoSuchBucket":
            return (f"bucket {self.bucket!r} does not exist (or is in another account); create it "
                    f"(aws s3 mb s3://{self.bucket}) or fix the bucket name in 'store'")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                    "TokenRefreshRequired", "InvalidClientTokenId"):
            return (f"AWS rejected the credentials ({code}); check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
                    "AWS_SESSION_TOKEN or the profile in use, or log in again")
        if code in ("AccessDenied", "AllAccessDisabled", "403", "Forbidden"):
            return (f"access denied ({op}) on {where}; grant the identity in use s3:PutObject, s3:GetObject, "
                    f"s3:DeleteObject on {where}/* and s3:ListBucket on bucket {self.bucket}")
        if code == "InvalidObjectState":
            return (f"it is in an archive storage class ({op}); restore it (thrifty archive restore RUN_ID, or "
                    "aws s3api restore-object) before reading")
        return None

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._translate("write"):
            self._client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        with self._translate("read", key):
            return self._client.get_object(Bucket=self.bucket, Key=self._name(key))["Body"].read()

    def put_file(self, key: str, local_path: str | Path) -> None:
        with self._translate("write"):
            self._client.upload_file(str(local_path), self.bucket, self._name(key), Config=self._transfer)

    def get_file(self, key: str, local_path: str | Path) -> None:
        with self._translate("read", key):
            replace_atomically(local_path, lambda tmp: self._client.download_file(
                self.bucket, self._name(key), tmp, Config=self._transfer), durable=False)

    def exists(self, key: str) -> bool:
        try:
            with self._translate("read", key):
                self._client.head_object(Bucket=self.bucket, Key=self._name(key))
        except NotFound:
            return False
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out = []
        with self._translate("list"):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                           Prefix=self._list_prefix(prefix))
            for page in pages:
                for obj in page.get("Contents", []):
                    if not obj["Key"].endswith("/"):  # a console "folder" marker, not an object
                        out.append(ObjectInfo(self._key(obj["Key"]), obj["Size"], obj["LastModified"],
                                              obj.get("StorageClass", "STANDARD")))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        with self._translate("delete"):
            self._client.delete_object(Bucket=self.bucket, Key=self._name(key))  # no error when absent

    def set_storage_class(self, key: str, storage_class: str) -> None:
        name = self._name(key)
        with self._translate("storage class change", key):
            self._client.copy({"Bucket": self.bucket, "Key": name}, self.bucket, name, Config=self._copy,
                              ExtraArgs={"StorageClass": storage_class, "MetadataDirective": "COPY"})

    def merge_lifecycle_rules(self, rules: list[dict]) -> None:
        """Put ``rules`` into the bucket's lifecycle configuration; rules with the same IDs are replaced, others kept."""
        ids = {r["ID"] for r in rules}
        with self._translate("lifecycle read"):
            try:
                current = self._client.get_bucket_lifecycle_configuration(Bucket=self.bucket)["Rules"]
            except Exception as exc:
                if _s3_error_code(exc) != "NoSuchLifecycleConfiguration":
                    raise
                current = []
        with self._translate("lifecycle write"):
            self._client.put_bucket_lifecycle_configuration(
                Bucket=self.bucket, LifecycleConfiguration={"Rules": [r for r in current if r["ID"] not in ids] + rules})

    # S3 retrieval tiers by priority, and what AWS documents they take (Deep Archive has no Expedited)
    _RESTORE_TIERS = {"bulk": "Bulk", "standard": "Standard", "high": "Expedited"}
    _RESTORE_ETA = {("GLACIER", "Expedited"): "1-5 minutes", ("GLACIER", "Standard"): "3-5 hours",
                    ("GLACIER", "Bulk"): "5-12 hours", ("DEEP_ARCHIVE", "Standard"): "within 12 hours",
                    ("DEEP_ARCHIVE", "Bulk"): "within 48 hours"}

    def restore(self, key: str, *, priority: str = "standard", days: int = 7) -> RestoreStatus:
        """GLACIER / DEEP_ARCHIVE: request a temporary restored copy, then (on a later call, once AWS has
        finished) copy it in place to STANDARD; other classes are copied to STANDARD at once."""
        name = self._name(key)
        with self._translate("restore", key):
            head = self._client.head_object(Bucket=self.bucket, Key=name)
        storage_class = head.get("StorageClass", "STANDARD")
        tier = self._RESTORE_TIERS[priority]
        if storage_class == "DEEP_ARCHIVE" and tier == "Expedited":
            tier = "Standard"
        eta = self._RESTORE_ETA.get((storage_class, tier), "immediate")
        if storage_class in ("GLACIER", "DEEP_ARCHIVE"):
            restore = head.get("Restore") or ""
            if 'ongoing-request="true"' in restore:
                return RestoreStatus(key, "in progress", eta)
            if not restore:
                with self._translate("restore request", key):
                    self._client.restore_object(Bucket=self.bucket, Key=name, RestoreRequest={
                        "Days": days, "GlacierJobParameters": {"Tier": tier}})
                return RestoreStatus(key, "requested", eta)
        if storage_class != "STANDARD":  # a finished restore, or a class that is readable in place
            self.set_storage_class(key, "STANDARD")
        return RestoreStatus(key, "done", eta)


_GCS_CHUNK_BYTES = 256 << 10  # resumable upload chunks must be multiples of this


class GCSStore(_ObjectStore):
    """A Google Cloud Storage bucket; STORAGE_EMULATOR_HOST points it at an emulator (anonymous credentials).

    Credentials come from Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
    login, workload identity). Files above 8 MiB go up as resumable uploads in ``part_size_bytes``
    chunks; an object appears only when its upload is finalized.
    """

    def __init__(self, uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False):
        self._init_uri(uri)
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


def _azure_code(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None) or ""
    return str(getattr(code, "value", code))  # a StorageErrorCode enum or a plain string


class AzureStore(_ObjectStore):
    """An Azure Blob Storage container: az://container/prefix.

    The account comes from AZURE_STORAGE_CONNECTION_STRING (also how Azurite is reached), or from
    AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or, when azure-identity is installed,
    DefaultAzureCredential (az login, managed or workload identity). Files above ``part_size_bytes``
    go up as blocks committed at the end, so a blob appears only when complete.
    """

    def __init__(self, uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False):
        self._init_uri(uri)
        from azure.storage.blob import BlobServiceClient

        options: dict = {"max_single_put_size": part_size_bytes, "max_block_size": part_size_bytes,
                         "max_single_get_size": part_size_bytes, "max_chunk_get_size": part_size_bytes}
        if fail_fast:  # preflight: one retry and short timeouts instead of the SDK's patient defaults
            options.update(retry_total=1, retry_backoff_factor=0.2, connection_timeout=5, read_timeout=20)
        conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        account = os.environ.get("AZURE_STORAGE_ACCOUNT")
        # how requests are signed decides what a 403 means: a shared key may do anything, so a 403 is the key
        self._signed_with = "token"
        if conn:
            lowered = conn.lower()
            self._signed_with = ("key" if "accountkey=" in lowered else
                                 "sas" if "sharedaccesssignature=" in lowered else "token")
            try:
                service = BlobServiceClient.from_connection_string(conn, **options)
            except ValueError as exc:
                raise StoreError(f"store {self.uri!r}: AZURE_STORAGE_CONNECTION_STRING is malformed ({exc}); copy it "
                                 "again from the portal (Access keys) or `az storage account show-connection-string`"
                                 ) from None
        elif account:
            credential = os.environ.get("AZURE_STORAGE_KEY")
            if credential:
                self._signed_with = "key"
            else:
                try:
                    from azure.identity import DefaultAzureCredential
                except ImportError:
                    raise StoreError(
                        f"store {self.uri!r}: AZURE_STORAGE_ACCOUNT is set but no credential is: set "
                        "AZURE_STORAGE_KEY, or AZURE_STORAGE_CONNECTION_STRING, or `pip install azure-identity` "
                        "to sign in with az login / managed identity") from None
                credential = DefaultAzureCredential()
            service = BlobServiceClient(f"https://{account}.blob.core.windows.net", credential=credential,
                                        **options)
        else:
            raise StoreError(f"store {self.uri!r}: no Azure storage account configured; set "
                             "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT (with AZURE_STORAGE_KEY, or "
                             "azure-identity for az login / managed identity)")
        self.account = service.account_name
        self._container = service.get_container_client(self.bucket)

    def _is_missing_key(self, exc: BaseException) -> bool:
        from azure.core.exceptions import ResourceNotFoundError

        return isinstance(exc, ResourceNotFoundError) and _azure_code(exc) != "ContainerNotFound"

    def _is_archived(self, exc: BaseException) -> bool:
        return _azure_code(exc) == "BlobArchived"

    def _explain(self, exc: BaseException, op: str) -> str | None:
        from azure.core import exceptions as zx

        code = _azure_code(exc)
        where = f"container {self.bucket!r} of storage account {self.account!r}"
        if type(exc).__name__ == "CredentialUnavailableError":  # azure.identity, when nothing could sign in
            return (f"no Azure credential could be found ({exc.message}); run `az login`, use a managed identity, "
                    "or set AZURE_STORAGE_CONNECTION_STRING")
        if isinstance(exc, zx.ClientAuthenticationError) or code in ("AuthenticationFailed",
                                                                      "InvalidAuthenticationInfo"):
            return (f"Azure rejected the credentials for account {self.account!r} ({code or exc.message}); check the "
                    "AccountKey in AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_KEY, or the signed-in identity")
        denied = (getattr(exc, "status_code", None) == 403 or code.startswith("Authorization")
                  or code == "InsufficientAccountPermissions")
        if denied and self._signed_with == "key":  # Azurite answers a wrong key this way (Azure: AuthenticationFailed)
            return (f"Azure refused the account key for account {self.account!r} ({code}); check the AccountKey in "
                    "AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_KEY. If it is right, the account's firewall or "
                    "a disabled 'Allow storage account key access' is blocking it")
        if denied and self._signed_with == "sas":
            return (f"the SAS token was refused ({op}) on {where} ({code}); issue one that has not expired with "
                    "read, add, create, write, delete and list permissions on the container")
        if denied:
            return (f"access denied ({op}) on {where} ({code}); assign the identity in use the "
                    "'Storage Blob Data Contributor' role on the container")
        if code == "ContainerNotFound":
            return (f"{where} does not exist; create it (az storage container create --name {self.bucket} "
                    f"--account-name {self.account}) or fix 'store'")
        if code == "BlobArchived":
            return (f"it is in the Archive tier ({op}); rehydrate it to Hot (thrifty archive restore RUN_ID) "
                    "before reading")
        if isinstance(exc, zx.ServiceRequestError):
            return (f"cannot reach the blob endpoint of account {self.account!r} ({exc.message}); check the account "
                    "name, the network, or the BlobEndpoint in AZURE_STORAGE_CONNECTION_STRING")
        return None

    def _write(self, key: str, upload) -> None:
        try:
            with self._translate("write", key):
                upload()
        except Archived:  # Azure will not overwrite an archived blob; its old bytes are unreadable anyway: replace it
            self.delete(key)
            with self._translate("write", key):
                upload()

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(key, lambda: self._container.upload_blob(self._name(key), data, overwrite=True))

    def get_bytes(self, key: str) -> bytes:
        with self._translate("read", key):
            return self._container.download_blob(self._name(key)).readall()

    def put_file(self, key: str, local_path: str | Path) -> None:
        def upload() -> None:
            with open(local_path, "rb") as f:
                self._container.upload_blob(self._name(key), f, length=os.fstat(f.fileno()).st_size,
                                            overwrite=True, max_concurrency=4)

        self._write(key, upload)

    def get_file(self, key: str, local_path: str | Path) -> None:
        def fetch(tmp: str) -> None:
            with open(tmp, "wb") as f:
                self._container.download_blob(self._name(key), max_concurrency=4).readinto(f)

        with self._translate("read", key):
            replace_atomically(local_path, fetch, durable=False)

    def exists(self, key: str) -> bool:
        with self._translate("read"):
            return self._container.get_blob_client(self._name(key)).exists()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out = []
        with self._translate("list"):
            for b in self._container.list_blobs(name_starts_with=self._list_prefix(prefix)):
                tier = b.blob_tier
                out.append(ObjectInfo(self._key(b.name), b.size, b.last_modified,
                                      str(getattr(tier, "value", tier) or "Hot")))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            with self._translate("delete", key):
                self._container.delete_blob(self._name(key))
        except NotFound:
            pass

    def set_storage_class(self, key: str, storage_class: str) -> None:
        with self._translate("tier change", key):
            self._container.get_blob_client(self._name(key)).set_standard_blob_tier(storage_class)

    _RESTORE_ETA = {"Standard": "up to 15 hours", "High": "under 1 hour for blobs under 10 GiB"}

    def restore(self, key: str, *, priority: str = "standard", days: int = 7) -> RestoreStatus:
        """Archive: start a rehydration to Hot (Standard or High priority); Cool and Cold go to Hot at once."""
        blob = self._container.get_blob_client(self._name(key))
        with self._translate("restore", key):
            props = blob.get_blob_properties()
        tier = str(getattr(props.blob_tier, "value", props.blob_tier) or "Hot")
        rehydrate = "High" if priority == "high" else "Standard"
        if str(props.archive_status or "").startswith("rehydrate-pending"):
            return RestoreStatus(key, "in progress", self._RESTORE_ETA[rehydrate])
        if tier == "Archive":
            with self._translate("rehydrate", key):
                blob.set_standard_blob_tier("Hot", rehydrate_priority=rehydrate)
            return RestoreStatus(key, "requested", self._RESTORE_ETA[rehydrate])
        if tier != "Hot":
            self.set_storage_class(key, "Hot")
        return RestoreStatus(key, "done", "immediate")


_BACKENDS = {"s3": S3Store, "gs": GCSStore, "az": AzureStore}


def open_store(uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False) -> Store:
    """A Store for ``uri``: a plain path or file://, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix.

    ``part_size_bytes`` sets the upload part size of the object stores; ``fail_fast`` trades their
    retries for a quick answer (preflight). Opening a store sends it no request (finding GCS
    credentials may ask the GCE metadata server, as Google's credential chain does).
    """
    if "://" not in uri:
        return FileStore(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return FileStore(parsed.netloc + parsed.path if parsed.netloc not in ("", "localhost") else parsed.path)
    if parsed.scheme in _BACKENDS:
        return _BACKENDS[parsed.scheme](uri, part_size_bytes=part_size_bytes, fail_fast=fail_fast)
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


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
