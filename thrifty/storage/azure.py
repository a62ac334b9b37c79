"""AzureStore: an Azure Blob Storage container; azure-storage-blob is imported when a store is opened."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from thrifty.storage.atomic import replace_atomically
from thrifty.storage.base import Archived, Conflict, NotFound, ObjectInfo, RestoreStatus, StoreError
from thrifty.storage.object import DEFAULT_PART_SIZE_BYTES, _ObjectStore
from thrifty.storage.retry import DEFAULT_RETRY_S, retried


def _azure_code(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None) or ""
    return str(getattr(code, "value", code))  # a StorageErrorCode enum or a plain string


@retried
class AzureStore(_ObjectStore):
    """An Azure Blob Storage container: az://container/prefix.

    The account comes from AZURE_STORAGE_CONNECTION_STRING (also how Azurite is reached), or from
    AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or, when azure-identity is installed,
    DefaultAzureCredential (az login, managed or workload identity). Files above ``part_size_bytes``
    go up as blocks committed at the end, so a blob appears only when complete.
    """

    def __init__(self, uri: str, *, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES, fail_fast: bool = False,
                 retry_s: float = DEFAULT_RETRY_S):
        self._init_uri(uri)
        self.retry_s = 0.0 if fail_fast else retry_s
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

    def _transient(self, exc: BaseException) -> bool:
        from azure.core import exceptions as zx

        if isinstance(exc, (zx.ServiceRequestError, zx.ServiceResponseError, zx.IncompleteReadError)):
            return True  # not sent (refused, unreachable) or no answer (reset, timed out, cut short)
        status = getattr(exc, "status_code", None) or 0
        return isinstance(exc, zx.HttpResponseError) and (status >= 500 or status == 429)

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

    # Conditional writes: the version token is the blob's ETag. Create-only is an upload without overwrite
    # (409 BlobAlreadyExists when it exists); compare-and-swap sends If-Match: <ETag> (412 ConditionNotMet when
    # it changed or is gone).

    @contextlib.contextmanager
    def _conditional(self, op: str, key: str, expected: str | None) -> Iterator[None]:
        from azure.core.exceptions import HttpResponseError

        try:
            with self._translate(op, None if op == "write" else key):  # a write's 404 is the container's
                yield
        except HttpResponseError as exc:
            code = _azure_code(exc)
            if code in ("BlobAlreadyExists", "ConditionNotMet") or (exc.status_code == 412 and not code):
                what = "already exists" if expected is None else f"changed or is gone (expected ETag {expected})"
                raise Conflict(f"store {self.uri!r}: {key} {what} ({code or exc.status_code})") from None
            raise
        except NotFound:
            raise Conflict(f"store {self.uri!r}: {key} is gone (expected ETag {expected})") from None

    def put_bytes_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        from azure.core import MatchConditions

        blob = self._container.get_blob_client(self._name(key))
        condition = ({"overwrite": False} if expected is None else
                     {"overwrite": True, "etag": expected, "match_condition": MatchConditions.IfNotModified})
        with self._conditional("write", key, expected):
            return blob.upload_blob(data, **condition)["etag"]

    def get_bytes_versioned(self, key: str) -> tuple[bytes, str]:
        with self._translate("read", key):
            download = self._container.download_blob(self._name(key))  # later chunks, if any, pinned to its ETag
            return download.readall(), download.properties.etag

    def delete_if(self, key: str, *, expected: str) -> None:
        from azure.core import MatchConditions

        with self._conditional("delete", key, expected):
            self._container.delete_blob(self._name(key), etag=expected, match_condition=MatchConditions.IfNotModified)

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
