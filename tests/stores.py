"""Wire-protocol stand-ins on loopback for the object stores, one each per test session, and env pointing SDKs at them.

moto's ThreadedMotoServer (S3) and gcp-storage-emulator (GCS) run in threads of the test process;
Azurite (Azure Blob) runs as a node subprocess from ``.ci/node_modules`` (``npm ci --prefix .ci``,
done here when missing). tests/conftest.py registers the fixtures once for the session. Nothing may reach
the internet or a cloud metadata address: every env below carries dummy credentials.

Where a stand-in falls short of its service in something the stores rely on, a small patch (marked STAND-IN PATCH)
makes it behave as the service does: moto's conditional writes made atomic; the GCS emulator's rewrite keeping the
storage class asked for, its ifGenerationMatch preconditions and its x-goog-generation download header.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent
CI_TOOLS = REPO / ".ci"
AZURITE_INSTALL = f"npm ci --prefix {CI_TOOLS}"
# Azurite's well-known development account (public, documented by Microsoft; it guards nothing)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

# env vars that could send an SDK somewhere other than the stand-in; every store env removes them
_CLOUD_ENV = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN",
              "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI",
              "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_CONNECTION_STRING",
              "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY")


def isolated_env(**extra: str) -> dict[str, str]:
    """Env settings common to every store test: no real config files, no metadata servers, nothing inherited."""
    home = Path(os.environ.get("HOME", tempfile.gettempdir()))
    env = {k: "" for k in _CLOUD_ENV}
    env.update({
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "AWS_DEFAULT_REGION": "us-east-1",
        "NO_GCE_CHECK": "True",  # google-auth: never probe the GCE metadata server
        "GCE_METADATA_HOST": "127.0.0.1:9",  # and if something did, it would hit a closed loopback port
        "GCE_METADATA_IP": "127.0.0.1:9",
    })
    env.update(extra)
    return env


def apply_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        if v == "":
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)


def child_env(base: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """``base`` with ``env`` applied, for a subprocess ("" removes a variable)."""
    out = dict(base)
    for k, v in env.items():
        if v == "":
            out.pop(k, None)
        else:
            out[k] = v
    return out


@dataclass
class S3StandIn:
    endpoint: str

    def env(self, **extra: str) -> dict[str, str]:
        return isolated_env(**{"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                               "AWS_SECRET_ACCESS_KEY": "testing", **extra})

    def client(self, service: str = "s3", key_id: str = "testing", secret: str = "testing"):
        import boto3

        return boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret,
                                     region_name="us-east-1").client(service, endpoint_url=self.endpoint)


@dataclass
class GCSStandIn:
    host: str  # host:port, the form STORAGE_EMULATOR_HOST takes with a scheme
    server: object  # gcp_storage_emulator.server.Server, for fixtures that patch its handlers

    def env(self, **extra: str) -> dict[str, str]:
        return isolated_env(**{"STORAGE_EMULATOR_HOST": f"http://{self.host}", "GOOGLE_CLOUD_PROJECT": "thrifty-test",
                               **extra})

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="thrifty-test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": f"http://{self.host}"})


@dataclass
class AzureStandIn:
    blob_endpoint: str

    def connection_string(self, key: str = AZURITE_KEY) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
                f"BlobEndpoint={self.blob_endpoint};")

    def env(self, key: str = AZURITE_KEY, **extra: str) -> dict[str, str]:
        return isolated_env(**{"AZURE_STORAGE_CONNECTION_STRING": self.connection_string(key), **extra})

    def client(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string())


def _one_at_a_time(real, lock: threading.Lock):
    """STAND-IN PATCH (moto): moto honours If-None-Match and If-Match on PutObject and DeleteObject, but checks the
    condition and then writes without a lock, and its server answers requests in threads: run these one at a time,
    so a conditional write is atomic as on S3 and races between them are decided as S3 decides them."""

    def method(self, *args, **kwargs):
        with lock:
            return real(self, *args, **kwargs)

    return method


@pytest.fixture(scope="session")
def s3_standin():
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    originals = {name: getattr(S3Response, name) for name in ("put_object", "delete_object")}
    lock = threading.Lock()
    for name, real in originals.items():
        setattr(S3Response, name, _one_at_a_time(real, lock))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3StandIn(f"http://{host}:{port}")
    finally:
        server.stop()
        for name, real in originals.items():
            setattr(S3Response, name, real)


def _rewrite_honouring_storage_class(real):
    """The emulator's rewrite copies an object but drops the storageClass asked for (GCS sets it): add that step."""

    def rewrite(request, response, storage, *args, **kwargs):
        body = request.data if isinstance(request.data, dict) else {}
        real(request, response, storage, *args, **kwargs)
        if body.get("storageClass") and response.status == HTTPStatus.OK:
            bucket, name = request.params["dest_bucket_name"], request.params["dest_object_id"]
            obj = {**storage.get_file_obj(bucket, name), "storageClass": body["storageClass"]}
            storage.patch_object(bucket, name, obj)
            response.json({**json.loads(response._content), "resource": obj})

    return rewrite


# STAND-IN PATCH (gcp-storage-emulator): it ignores ifGenerationMatch, and its downloads carry no x-goog-generation
# header (GCS sends both). The three wrappers below add them, so conditional writes (Store.put_bytes_if, delete_if,
# get_bytes_versioned) behave as on GCS. Its server answers one request at a time, so check-then-write is atomic.
# A resumable upload's precondition is checked when the upload starts (GCS checks it when the upload completes).

_GCS_PRECONDITION_FAILED = {"error": {"code": 412, "message": "At least one of the pre-conditions you specified "
                                      "did not hold.", "errors": [{"domain": "global", "reason": "conditionNotMet",
                                                                   "message": "Precondition Failed"}]}}


def _gcs_generation(storage, bucket: str, name: str | None) -> str:
    from gcp_storage_emulator.exceptions import NotFound

    try:
        return str(storage.get_file_obj(bucket, name)["generation"]) if name else "0"
    except NotFound:
        return "0"  # what ifGenerationMatch=0 stands for: no live object


def _gcs_precondition_holds(request, response, storage, name: str | None) -> bool:
    wanted = request.query.get("ifGenerationMatch")
    if wanted and _gcs_generation(storage, request.params["bucket_name"], name) != wanted[0]:
        response.status = HTTPStatus.PRECONDITION_FAILED
        response.json(_GCS_PRECONDITION_FAILED)
        return False
    return True


def _upload_honouring_generation_match(real):
    def insert(request, response, storage, *args, **kwargs):
        data = request.data if isinstance(request.data, dict) else {}
        name = request.query["name"][0] if "name" in request.query else (data.get("meta") or data).get("name")
        if _gcs_precondition_holds(request, response, storage, name):
            real(request, response, storage, *args, **kwargs)

    return insert


def _delete_honouring_generation_match(real):
    def delete(request, response, storage, *args, **kwargs):
        name = request.params["object_id"]
        if _gcs_generation(storage, request.params["bucket_name"], name) == "0":
            response.status = HTTPStatus.NOT_FOUND  # GCS: 404 for a missing object, whatever the precondition
        elif _gcs_precondition_holds(request, response, storage, name):
            real(request, response, storage, *args, **kwargs)

    return delete


def _download_with_generation(real):
    def download(request, response, storage, *args, **kwargs):
        real(request, response, storage, *args, **kwargs)
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj["metageneration"])

    return download


@pytest.fixture(scope="session")
def gcs_standin():
    from gcp_storage_emulator import server as emulator
    from gcp_storage_emulator.handlers import objects

    patches = {  # handler -> its wrapper: every route that serves it gets the wrapper
        (emulator.POST, objects.rewrite): _rewrite_honouring_storage_class,
        (emulator.POST, objects.insert): _upload_honouring_generation_match,
        (emulator.DELETE, objects.delete): _delete_honouring_generation_match,
        (emulator.GET, objects.download): _download_with_generation,
    }
    replaced = []  # (handlers dict, method, original)
    for _, handlers in emulator.HANDLERS:
        for method, real in list(handlers.items()):
            if (method, real) in patches:
                replaced.append((handlers, method, real))
                handlers[method] = patches[method, real](real)
    patched = {(method, real) for _, method, real in replaced}
    assert patched == set(patches), f"gcp-storage-emulator's routes moved: update the patches here ({patched})"
    # objects.get serves ?alt=media downloads by calling the module's download; the Router's own fallback for
    # uploads posted without the /upload prefix calls the module's insert
    real_download, real_insert = objects.download, objects.insert
    objects.download, objects.insert = _download_with_generation(real_download), \
        _upload_honouring_generation_match(real_insert)
    server = emulator.create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    host, port = server._api._httpd.server_address[:2]  # port 0: the kernel picked one
    try:
        yield GCSStandIn(f"{host}:{port}", server)
    finally:
        server.stop()
        objects.download, objects.insert = real_download, real_insert
        for handlers, method, real in replaced:
            handlers[method] = real


def azurite_bin() -> Path:
    """The azurite-blob launcher: $AZURITE_BIN, else .ci/node_modules (installed with npm ci if missing)."""
    if os.environ.get("AZURITE_BIN"):
        given = Path(os.environ["AZURITE_BIN"])
        if not os.access(given, os.X_OK):
            pytest.fail(f"AZURITE_BIN={given} is not an executable azurite-blob; unset it to use .ci/node_modules")
        return given
    local = CI_TOOLS / "node_modules" / ".bin" / "azurite-blob"
    if not local.exists():
        if shutil.which("npm") is None:
            pytest.fail(f"Azurite (the Azure Blob stand-in) is not installed and npm is missing: install Node.js 18+ "
                        f"and run `{AZURITE_INSTALL}`, or point AZURITE_BIN at an azurite-blob executable")
        done = subprocess.run(AZURITE_INSTALL.split() + ["--no-audit", "--no-fund", "--loglevel=error"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not local.exists():
            pytest.fail(f"installing Azurite with `{AZURITE_INSTALL}` failed:\n{done.stderr[-2000:]}")
    return local


@pytest.fixture(scope="session")
def azure_standin(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("azurite")
    log = open(workdir / "azurite.log", "w+")
    proc = subprocess.Popen(
        [str(azurite_bin()), "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
         "--skipApiVersionCheck", "--silent"],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        endpoint = None
        while endpoint is None:
            text = (workdir / "azurite.log").read_text()
            m = re.search(r"listens on (http://127\.0\.0\.1:\d+)", text)
            if m:
                endpoint = m.group(1)
            elif proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Azurite did not start (exit {proc.poll()}):\n{text[-2000:]}")
            else:
                time.sleep(0.05)
        yield AzureStandIn(f"{endpoint}/{AZURITE_ACCOUNT}")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:  # a graceful stop waits ~7 s for the SDKs' idle keep-alive connections; in memory, nothing is lost
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


# ---------------------------------------------------------------------------------------- per-test stores


@pytest.fixture
def loopback_only(monkeypatch):
    """Every connection or name lookup these tests make stays on this machine: no cloud, no metadata server.

    An attempt elsewhere is refused as an unreachable network would refuse it, and fails the test at teardown
    (an SDK may wrap or swallow the refusal)."""
    import socket

    attempts: list[str] = []

    def local(host) -> bool:
        return (host.decode() if isinstance(host, bytes) else host) in ("127.0.0.1", "localhost", "::1", None)

    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not local(address[0]):
            attempts.append(f"connect {address}")
            raise ConnectionRefusedError(f"tests stay on loopback: {address}")
        return real_connect(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if not local(host):
            attempts.append(f"lookup {host!r}")
            raise socket.gaierror(socket.EAI_NONAME, f"tests stay on loopback: {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield attempts
    assert not attempts, f"a test reached beyond loopback: {attempts}"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


@dataclass
class Backend:
    name: str
    uri: str  # a fresh store root for this test
    raw_names: Callable[[], list[str]]  # every object name in the bucket, as the service holds it
    parts: Callable[[str], int | None]  # parts an object (by full name) was uploaded in; None where not observable
    standard_class: str  # what listing says for a plain write


def _file_backend(tmp_path: Path) -> Backend:
    root = tmp_path / "store"

    def names() -> list[str]:
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    return Backend("file", f"file://{root}", names, lambda name: None, "STANDARD")


def _s3_backend(request, monkeypatch) -> Backend:
    s3 = request.getfixturevalue("s3_standin")
    apply_env(monkeypatch, s3.env())
    client, bucket = s3.client(), unique("contract")
    client.create_bucket(Bucket=bucket)

    def parts(name: str) -> int | None:
        etag = client.head_object(Bucket=bucket, Key=name)["ETag"].strip('"')
        return int(etag.rpartition("-")[2]) if "-" in etag else 1  # a multipart ETag ends in -<parts>

    def names() -> list[str]:
        return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))

    return Backend("s3", f"s3://{bucket}/team/exp1", names, parts, "STANDARD")


def _gcs_backend(request, monkeypatch) -> Backend:
    gcs = request.getfixturevalue("gcs_standin")
    apply_env(monkeypatch, gcs.env())
    client, bucket = gcs.client(), unique("contract")
    client.create_bucket(bucket)
    # the emulator keeps no trace of resumable chunks: count the chunk PUTs as they arrive
    from gcp_storage_emulator.handlers import objects

    counted: dict[str, int] = {}
    real = objects._handle_resumable_chunk

    def count_chunk(response, storage, upload_id, chunk, parsed):
        data = real(response, storage, upload_id, chunk, parsed)
        name = storage.get_resumable_file_obj(upload_id)["name"]
        counted[name] = counted.get(name, 0) + 1
        return data

    monkeypatch.setattr(objects, "_handle_resumable_chunk", count_chunk)
    return Backend("gcs", f"gs://{bucket}/team/exp1", lambda: sorted(b.name for b in client.list_blobs(bucket)),
                   lambda name: counted.get(name, 1), "STANDARD")


def _azure_backend(request, monkeypatch) -> Backend:
    az = request.getfixturevalue("azure_standin")
    apply_env(monkeypatch, az.env())
    container = az.client().create_container(unique("contract"))

    def parts(name: str) -> int | None:
        committed, _ = container.get_blob_client(name).get_block_list("committed")
        return max(1, len(committed))  # a single-request upload has no blocks

    return Backend("azure", f"az://{container.container_name}/team/exp1",
                   lambda: sorted(b.name for b in container.list_blobs()), parts, "Hot")


@pytest.fixture(params=["file", "s3", "gcs", "azure"])
def backend(request, monkeypatch, tmp_path) -> Backend:
    if request.param == "file":
        return _file_backend(tmp_path)
    return {"s3": _s3_backend, "gcs": _gcs_backend, "azure": _azure_backend}[request.param](request, monkeypatch)
