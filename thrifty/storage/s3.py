"""S3Store: an S3 bucket or an S3-compatible service; boto3 is imported when a store is opened."""

from __future__ import annotations

from pathlib import Path

from thrifty.storage.atomic import replace_atomically
from thrifty.storage.base import Conflict, NotFound, ObjectInfo, RestoreStatus
from thrifty.storage.object import DEFAULT_PART_SIZE_BYTES, _ObjectStore
from thrifty.storage.retry import DEFAULT_RETRY_S, retried

# answers that mean "not now": the service is busy, throttling, or failed inside (HTTP 5xx, 429)
_S3_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
                       "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
                       "BandwidthLimitExceeded", "500", "502", "503", "504", "429"}


def _s3_error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


@retried
class S3Store(_ObjectStore):
    """An S3 bucket, or any S3-compatible service via AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3.

    Credentials come from boto3's chain (env, profiles, SSO, instance/task roles). Files go through
    s3transfer: multipart above ``part_size_bytes``, read from disk part by part; an object appears
    only when its upload completes. A killed multipart upload leaves parts that S3 bills until a
    bucket lifecycle rule (AbortIncompleteMultipartUpload) removes them.
    """

    def __init__(self, uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False,
                 retry_s: float = DEFAULT_RETRY_S):
        self._init_uri(uri)
        self.retry_s = 0.0 if fail_fast else retry_s
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

    def _transient(self, exc: BaseException) -> bool:
        from botocore import exceptions as bx

        if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError)):
            return True  # refused, reset, closed, timed out, a body cut short (EndpointConnectionError is one)
        status = (getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return _s3_error_code(exc) in _S3_TRANSIENT_CODES or status >= 500 or status == 429

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

    # Conditional writes: If-None-Match: * (create-only) and If-Match: <ETag> on PutObject and DeleteObject. AWS S3
    # honours them (an S3-compatible service that ignores the headers would make these plain writes: check yours).
    # 412 PreconditionFailed: the condition failed; 409 ConditionalRequestConflict: a concurrent write to the key won.
    _CONFLICT_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")

    def _conflict(self, key: str, exc: BaseException, expected: str | None) -> Conflict | None:
        code = _s3_error_code(exc)
        if code in self._CONFLICT_CODES:
            what = "already exists" if expected is None else f"changed (expected ETag {expected})"
            return Conflict(f"store {self.uri!r}: {key} {what} ({code})")
        if expected is not None and self._is_missing_key(exc):
            return Conflict(f"store {self.uri!r}: {key} is gone (expected ETag {expected})")
        return None

    def put_bytes_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        try:
            with self._translate("write"):
                return self._client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data,
                                               **condition)["ETag"]
        except Exception as exc:
            conflict = self._conflict(key, exc, expected)
            if conflict is None:
                raise
            raise conflict from None

    def get_bytes_versioned(self, key: str) -> tuple[bytes, str]:
        with self._translate("read", key):
            got = self._client.get_object(Bucket=self.bucket, Key=self._name(key))
            return got["Body"].read(), got["ETag"]

    def delete_if(self, key: str, *, expected: str) -> None:
        try:
            with self._translate("delete"):
                self._client.delete_object(Bucket=self.bucket, Key=self._name(key), IfMatch=expected)
        except Exception as exc:
            conflict = self._conflict(key, exc, expected)
            if conflict is None:
                raise
            raise conflict from None

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
