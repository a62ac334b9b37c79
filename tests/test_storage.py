"""The store contract, run unchanged on file://, s3:// (moto), gs:// (gcp-storage-emulator) and az:// (Azurite),
and the preflight check that fails a misconfigured store before anything is spent."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stores import AZURITE_ACCOUNT, AZURITE_KEY, REPO, apply_env, child_env, isolated_env, unique
from thrifty.config import ConfigError, RunConfig
from thrifty.launchers.preflight import check_before_spending
from thrifty.storage import Archived, Conflict, NotFound, StoreError, check_store, open_store

pytestmark = pytest.mark.slow

PART_BYTES = 5 << 20  # S3's smallest multipart part; also the GCS chunk and the Azure block in these tests
BIG_BYTES = 12 << 20  # above GCS's 8 MiB single-request limit and more than two parts everywhere


@pytest.fixture(autouse=True)
def _stay_on_loopback(loopback_only):
    yield loopback_only


def test_the_loopback_guard_bites(monkeypatch, loopback_only):
    apply_env(monkeypatch, isolated_env(AWS_ENDPOINT_URL="http://192.0.2.1:9000", AWS_ACCESS_KEY_ID="testing",
                                        AWS_SECRET_ACCESS_KEY="testing"))  # TEST-NET-1: never routed
    with pytest.raises(StoreError, match="cannot reach the S3 endpoint"):
        check_store("s3://bucket/x")
    assert loopback_only and all("192.0.2.1" in a for a in loopback_only)
    loopback_only.clear()


@pytest.fixture
def store(backend):
    return open_store(backend.uri, part_size_bytes=PART_BYTES)


class TestStoreContract:
    def test_bytes_round_trip_and_overwrite(self, store):
        store.put_bytes("runs/r1/ledger.jsonl", b'{"usd": 1}\n')
        assert store.get_bytes("runs/r1/ledger.jsonl") == b'{"usd": 1}\n'
        store.put_bytes("runs/r1/ledger.jsonl", b"")
        assert store.get_bytes("runs/r1/ledger.jsonl") == b""
        assert store.exists("runs/r1/ledger.jsonl")
        assert store.local_path("runs/r1/ledger.jsonl") is None or store.uri.startswith("file://")

    def test_missing_key_is_not_found_and_leaves_no_file(self, store, tmp_path):
        with pytest.raises(NotFound):
            store.get_bytes("runs/nope/summary.json")
        dest = tmp_path / "fetched" / "state.pt"
        with pytest.raises(NotFound):
            store.get_file("runs/nope/state.pt", dest)
        assert not dest.exists()
        assert not dest.parent.exists() or list(dest.parent.iterdir()) == []  # no temp file left behind
        assert store.exists("runs/nope/summary.json") is False

    def test_large_file_goes_up_in_parts_and_comes_back_whole(self, store, backend, tmp_path):
        src = tmp_path / "state.pt"
        src.write_bytes(os.urandom(BIG_BYTES))
        store.put_file("runs/r1/ckpt/step-000000007/state.pt", src)
        dest = tmp_path / "back" / "state.pt"
        store.get_file("runs/r1/ckpt/step-000000007/state.pt", dest)
        assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
        [info] = store.list("runs/r1/ckpt/")
        assert info.size == BIG_BYTES
        parts = backend.parts("team/exp1/runs/r1/ckpt/step-000000007/state.pt")
        assert parts is None or parts >= 3, f"{backend.name}: a {BIG_BYTES >> 20} MiB file went up in {parts} part(s)"

    def test_list_prefix_ends_mid_name_and_reports_size_time_class(self, store, backend):
        before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
        objects = {"runs/abc/a.bin": b"1", "runs/abd/b.bin": b"22", "runs/b/c.bin": b"333", "cache/k/m.json": b"{}"}
        for key, data in objects.items():
            store.put_bytes(key, data)
        assert [o.key for o in store.list("runs/ab")] == ["runs/abc/a.bin", "runs/abd/b.bin"]
        assert [o.key for o in store.list("runs/")] == ["runs/abc/a.bin", "runs/abd/b.bin", "runs/b/c.bin"]
        everything = store.list()
        assert [o.key for o in everything] == sorted(objects)
        for o in everything:
            assert o.size == len(objects[o.key])
            assert o.last_modified.tzinfo is not None
            assert before <= o.last_modified <= dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)
            assert o.storage_class == backend.standard_class
        assert store.list("nothing/here") == []

    def test_delete_is_idempotent(self, store):
        store.put_bytes("runs/r1/ckpt/step-000000001/COMMIT", b"{}")
        store.delete("runs/r1/ckpt/step-000000001/COMMIT")
        store.delete("runs/r1/ckpt/step-000000001/COMMIT")
        store.delete("never/written")
        assert not store.exists("runs/r1/ckpt/step-000000001/COMMIT")
        with pytest.raises(NotFound):
            store.get_bytes("runs/r1/ckpt/step-000000001/COMMIT")
        assert store.list() == []

    def test_keys_are_strings_under_the_root(self, store, backend):
        store.put_bytes("a//b/./c.bin", b"x")
        assert backend.raw_names() == (["a/b/c.bin"] if backend.name == "file" else ["team/exp1/a/b/c.bin"])
        assert open_store(store.uri).get_bytes("a/b/c.bin") == b"x"  # the uri names the same place
        for bad in ("../escape", "a/../../b", "", "/"):
            with pytest.raises(ValueError):
                store.put_bytes(bad, b"x")

    def test_store_check_passes_and_leaves_nothing(self, store, backend):
        check_store(store.uri)
        assert store.list() == []
        assert backend.raw_names() == []
        if backend.name == "file":
            assert not Path(store.uri.removeprefix("file://")).exists(), "the check created the store's directory"


# ---------------------------------------------------------------------------------------- conditional writes


LEASE = "runs/r1/lease.json"
RACERS = 8


def race(uri: str, attempt) -> list:
    """Run ``attempt(store, i)`` in RACERS threads released at once, each with its own store (its own client and
    connections, as separate processes would have); a Conflict counts as None."""
    barrier = threading.Barrier(RACERS)

    def one(i: int):
        store = open_store(uri)
        barrier.wait()
        try:
            return attempt(store, i)
        except Conflict:
            return None

    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(one, range(RACERS)))


class TestConditionalWrites:
    def test_create_only_succeeds_once(self, store):
        v1 = store.put_bytes_if(LEASE, b"first", expected=None)
        assert isinstance(v1, str) and v1
        with pytest.raises(Conflict):
            store.put_bytes_if(LEASE, b"second", expected=None)
        assert store.get_bytes_versioned(LEASE) == (b"first", v1)
        assert store.get_bytes(LEASE) == b"first"

    def test_compare_and_swap_needs_the_current_version(self, store):
        v1 = store.put_bytes_if(LEASE, b"one", expected=None)
        v2 = store.put_bytes_if(LEASE, b"two", expected=v1)
        assert v2 != v1
        with pytest.raises(Conflict):
            store.put_bytes_if(LEASE, b"stale", expected=v1)
        assert store.get_bytes_versioned(LEASE) == (b"two", v2)  # unchanged by the failed write

        store.put_bytes(LEASE, b"someone else")  # an unconditional write makes a new version too
        with pytest.raises(Conflict):
            store.put_bytes_if(LEASE, b"stale", expected=v2)
        data, v3 = store.get_bytes_versioned(LEASE)
        assert data == b"someone else"
        v4 = store.put_bytes_if(LEASE, b"four", expected=v3)
        assert store.get_bytes_versioned(LEASE) == (b"four", v4)

        store.delete(LEASE)
        with pytest.raises(Conflict):  # gone is not "as last seen" either
            store.put_bytes_if(LEASE, b"five", expected=v4)
        assert not store.exists(LEASE)
        with pytest.raises(NotFound):
            store.get_bytes_versioned(LEASE)

    def test_delete_if_needs_the_current_version_and_leaves_nothing(self, store, backend):
        v1 = store.put_bytes_if(LEASE, b"one", expected=None)
        v2 = store.put_bytes_if(LEASE, b"two", expected=v1)
        with pytest.raises(Conflict):
            store.delete_if(LEASE, expected=v1)
        assert store.get_bytes(LEASE) == b"two"
        store.delete_if(LEASE, expected=v2)
        assert not store.exists(LEASE)
        with pytest.raises(Conflict):
            store.delete_if(LEASE, expected=v2)
        assert store.list() == [] and backend.raw_names() == []  # no lock or temp file left behind
        if backend.name == "file":
            assert not Path(store.uri.removeprefix("file://")).exists() or not any(
                Path(store.uri.removeprefix("file://")).iterdir()), "empty directories were left behind"

    def test_racing_creators_have_exactly_one_winner(self, store):
        versions = race(store.uri, lambda s, i: s.put_bytes_if(LEASE, f"racer {i}".encode(), expected=None))
        winners = [i for i, v in enumerate(versions) if v is not None]
        assert len(winners) == 1, versions
        assert store.get_bytes_versioned(LEASE) == (f"racer {winners[0]}".encode(), versions[winners[0]])
        assert [o.key for o in store.list()] == [LEASE]

    def test_racing_swappers_from_one_read_have_exactly_one_winner(self, store):
        v0 = store.put_bytes_if(LEASE, b"start", expected=None)
        versions = race(store.uri, lambda s, i: s.put_bytes_if(LEASE, f"swapper {i}".encode(), expected=v0))
        winners = [i for i, v in enumerate(versions) if v is not None]
        assert len(winners) == 1, versions
        assert store.get_bytes_versioned(LEASE) == (f"swapper {winners[0]}".encode(), versions[winners[0]])
        assert [o.key for o in store.list()] == [LEASE]


# ---------------------------------------------------------------------------------------- storage classes


COLD = {"file": "ARCHIVE", "s3": "GLACIER", "gcs": "COLDLINE", "azure": "Cool"}  # each service's own name for a colder class


@pytest.mark.parametrize("backend", ["file", "s3", "gcs", "azure"], indirect=True)
def test_storage_class_change_shows_in_listing(store, backend):
    store.put_bytes("runs/old/ckpt/step-000000007/state.pt", b"weights")
    store.put_bytes("runs/new/ckpt/step-000000007/state.pt", b"weights")
    store.set_storage_class("runs/old/ckpt/step-000000007/state.pt", COLD[backend.name])
    assert [(o.key, o.size, o.storage_class) for o in store.list("runs/")] == [
        ("runs/new/ckpt/step-000000007/state.pt", 7, backend.standard_class),
        ("runs/old/ckpt/step-000000007/state.pt", 7, COLD[backend.name]),
    ]
    with pytest.raises(NotFound):
        store.set_storage_class("runs/never/written", COLD[backend.name])


def test_file_store_archive_area(tmp_path):
    """A file store's cold tier: an archive/ area; the object keeps its key, reads say restore, a write supersedes it."""
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("runs/a/x.bin", b"x")
    with pytest.raises(StoreError, match="two storage classes"):
        store.set_storage_class("runs/a/x.bin", "GLACIER")
    store.set_storage_class("runs/a/x.bin", "ARCHIVE")
    store.set_storage_class("runs/a/x.bin", "ARCHIVE")  # again: nothing to do
    assert (tmp_path / "store/archive/runs/a/x.bin").is_file() and not (tmp_path / "store/runs").exists()
    assert store.exists("runs/a/x.bin") and [(o.key, o.storage_class) for o in store.list()] == [
        ("runs/a/x.bin", "ARCHIVE")]
    with pytest.raises(Archived, match="restore"):
        store.get_file("runs/a/x.bin", tmp_path / "out.bin")
    assert store.restore("runs/a/x.bin").state == "done" and store.get_bytes("runs/a/x.bin") == b"x"
    store.set_storage_class("runs/a/x.bin", "ARCHIVE")
    store.put_bytes("runs/a/x.bin", b"new")  # a new write supersedes the archived copy
    assert not (tmp_path / "store/archive/runs").exists() and store.get_bytes("runs/a/x.bin") == b"new"
    with pytest.raises(StoreError, match="reserved"):
        store.put_bytes("archive/x.bin", b"x")


@pytest.mark.parametrize("backend, cold, says",
                         [("file", "ARCHIVE", "restore"), ("s3", "GLACIER", "restore-object"),
                          ("azure", "Archive", "rehydrate")], indirect=["backend"])
def test_reading_an_archived_object_says_restore_it_first(store, cold, says):
    store.put_bytes("runs/old/state.pt", b"weights")
    store.set_storage_class("runs/old/state.pt", cold)
    with pytest.raises(Archived, match=says):
        store.get_bytes("runs/old/state.pt")


# ---------------------------------------------------------------------------------------- imports and memory


def test_import_loads_no_cloud_sdk():
    sdks = ("boto3", "botocore", "google.cloud.storage", "azure.storage.blob")
    code = f"import sys, thrifty.storage, thrifty.launchers.preflight; print([m for m in {sdks!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=REPO, env=child_env(os.environ, {"PYTHONPATH": str(REPO)}))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


_MEMORY_PROBE = """
import json, re, sys
from pathlib import Path
from thrifty.storage import open_store

def peak_growth(action):
    status = lambda key: int(re.search(key + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the peak resident set size to the current one
    before = status("VmRSS")
    action()
    return status("VmHWM") - before

uri, src, dest, part = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = open_store(uri, part_size_bytes=part)
store.put_bytes("warm-up", b"x"); store.get_bytes("warm-up")  # SDK imports and connections outside the measure
up = peak_growth(lambda: store.put_file("big/state.pt", src))
down = peak_growth(lambda: store.get_file("big/state.pt", dest))
control = peak_growth(lambda: Path(src).read_bytes())  # what holding the whole file looks like
print(json.dumps({"up": up, "down": down, "control": control}))
"""


@pytest.mark.parametrize("name", ["s3", "gcs", "azure"])
def test_large_files_stream_without_holding_the_file_in_memory(name, request, tmp_path):
    """Up and back down, the peak resident memory of a child process (the stand-ins live in this one) grows by
    far less than the file: parts are read from and written to disk one at a time."""
    standin = request.getfixturevalue({"s3": "s3_standin", "gcs": "gcs_standin", "azure": "azure_standin"}[name])
    size = 96 << 20  # well above what a few parts in flight take (4 x 5 MiB here, twice over in Azure downloads)
    src = tmp_path / "state.pt"
    with open(src, "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    bucket = unique("memory")
    if name == "s3":
        standin.client().create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/m"
    elif name == "gcs":
        standin.client().create_bucket(bucket)
        uri = f"gs://{bucket}/m"
    else:
        standin.client().create_container(bucket)
        uri = f"az://{bucket}/m"
    env = child_env(os.environ, {**standin.env(), "PYTHONPATH": str(REPO)})
    args = [uri, str(src), str(tmp_path / "back.pt"), str(PART_BYTES)]
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, *args], capture_output=True, text=True, timeout=120,
                         env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    growth = json.loads(out.stdout.strip().splitlines()[-1])
    assert (tmp_path / "back.pt").read_bytes() == src.read_bytes()
    assert growth["control"] >= size * 0.9, growth  # the measure sees a whole file held in memory
    for way in ("up", "down"):
        assert growth[way] < size // 2, f"{name} {way}: a {size >> 20} MiB file took {growth[way] >> 20} MiB of memory"


# ---------------------------------------------------------------------------------------- preflight


def preflight_error(store_uri: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_before_spending(RunConfig(store=store_uri))
    msg = str(err.value)
    assert msg.startswith("'store': ") and repr(store_uri) in msg, msg  # names the setting and the store
    return msg


def test_preflight_s3_missing_bucket(s3_standin, monkeypatch):
    apply_env(monkeypatch, s3_standin.env())
    msg = preflight_error("s3://no-such-bucket-here/runs")
    assert "bucket 'no-such-bucket-here' does not exist" in msg and "aws s3 mb" in msg


def test_preflight_s3_no_credentials(s3_standin, monkeypatch):
    apply_env(monkeypatch, s3_standin.env(AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY=""))
    msg = preflight_error("s3://any-bucket/runs")
    assert "no AWS credentials" in msg and "AWS_ACCESS_KEY_ID" in msg and "AWS_PROFILE" in msg


def test_preflight_s3_unknown_key_and_denied_write(s3_standin, monkeypatch):
    """moto checks signatures and IAM policies while IAM authentication is on: a reader may not write."""
    from moto.core.authorization import enable_iam_authentication

    apply_env(monkeypatch, s3_standin.env())
    bucket = unique("guarded")
    s3_standin.client().create_bucket(Bucket=bucket)
    iam = s3_standin.client("iam")
    user = unique("reader")
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="read-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                       "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}],
    }))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    with enable_iam_authentication():
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "TESTKEYNOTKNOWNTOMOTO")  # a dummy id no IAM user has
        msg = preflight_error(f"s3://{bucket}/runs")
        assert "AWS rejected the credentials (InvalidAccessKeyId)" in msg

        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        msg = preflight_error(f"s3://{bucket}/runs")
        assert "access denied (write)" in msg and "s3:PutObject" in msg


def test_preflight_s3_unreachable_endpoint(s3_standin, monkeypatch):
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    apply_env(monkeypatch, s3_standin.env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}"))
    msg = preflight_error("s3://any-bucket/runs")
    assert "cannot reach the S3 endpoint" in msg and "AWS_ENDPOINT_URL" in msg


def test_preflight_gcs_missing_bucket(gcs_standin, monkeypatch):
    apply_env(monkeypatch, gcs_standin.env())
    msg = preflight_error("gs://no-such-bucket-here/runs")
    assert "bucket 'no-such-bucket-here' does not exist" in msg and "gcloud storage buckets create" in msg


def test_preflight_gcs_denied_write(gcs_standin, monkeypatch):
    """The emulator checks no credentials, so its upload route answers here as GCS answers a read-only account."""
    from http import HTTPStatus

    from gcp_storage_emulator import server

    apply_env(monkeypatch, gcs_standin.env())
    bucket = unique("guarded")
    gcs_standin.client().create_bucket(bucket)

    def refuse(request, response, storage, *args, **kwargs):
        response.status = HTTPStatus.FORBIDDEN
        response.json({"error": {"code": 403, "message": "reader@example.iam.gserviceaccount.com does not have "
                                 "storage.objects.create access to the Google Cloud Storage object. "
                                 "Permission 'storage.objects.create' denied."}})

    routes = [handlers for regex, handlers in server.HANDLERS if "upload" in regex and server.POST in handlers]
    assert routes, "the emulator's upload route moved"
    for handlers in routes:
        monkeypatch.setitem(handlers, server.POST, refuse)
    msg = preflight_error(f"gs://{bucket}/runs")
    assert f"access denied (write) on gs://{bucket}" in msg and "roles/storage.objectUser" in msg
    assert "reader@example.iam.gserviceaccount.com does not have storage.objects.create access" in msg


def test_preflight_gcs_bad_credentials_file(monkeypatch, tmp_path):
    """Without the emulator, the ADC chain reads GOOGLE_APPLICATION_CREDENTIALS first: a missing file fails offline."""
    apply_env(monkeypatch, isolated_env(GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "missing-key.json")))
    msg = preflight_error("gs://any-bucket/runs")
    assert "no usable Google credentials" in msg and "gcloud auth application-default login" in msg


def test_preflight_azure_wrong_or_malformed_key(azure_standin, monkeypatch):
    apply_env(monkeypatch, azure_standin.env())
    container = azure_standin.client().create_container(unique("keyed")).container_name
    for key in (base64.b64encode(bytes(64)).decode(), "not-base64"):  # refused by the service; refused before sending
        apply_env(monkeypatch, azure_standin.env(key=key))
        msg = preflight_error(f"az://{container}/runs")
        assert "account 'devstoreaccount1'" in msg and "AccountKey in AZURE_STORAGE_CONNECTION_STRING" in msg


def test_preflight_azure_read_only_sas_cannot_write(azure_standin, monkeypatch):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    container = azure_standin.client().create_container(unique("sas")).container_name
    sas = generate_container_sas(AZURITE_ACCOUNT, container, account_key=AZURITE_KEY,
                                 permission=ContainerSasPermissions(read=True, list=True),
                                 expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    apply_env(monkeypatch, isolated_env(
        AZURE_STORAGE_CONNECTION_STRING=f"BlobEndpoint={azure_standin.blob_endpoint};SharedAccessSignature={sas}"))
    msg = preflight_error(f"az://{container}/runs")
    assert "SAS token was refused (write)" in msg and f"container {container!r}" in msg


def test_preflight_azure_missing_container(azure_standin, monkeypatch):
    apply_env(monkeypatch, azure_standin.env())
    msg = preflight_error("az://no-such-container/runs")
    assert "container 'no-such-container' of storage account 'devstoreaccount1' does not exist" in msg
    assert "az storage container create" in msg


def test_preflight_azure_no_account(monkeypatch):
    apply_env(monkeypatch, isolated_env())
    msg = preflight_error("az://models/runs")
    assert "AZURE_STORAGE_CONNECTION_STRING" in msg and "AZURE_STORAGE_ACCOUNT" in msg


def test_preflight_azure_account_without_credential(monkeypatch):
    """azure-identity is optional: with only an account name, the message says how to supply a credential."""
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # as if not installed, wherever it is
    apply_env(monkeypatch, isolated_env(AZURE_STORAGE_ACCOUNT="thriftyexample"))
    msg = preflight_error("az://models/runs")
    assert "AZURE_STORAGE_KEY" in msg and "azure-identity" in msg


def test_preflight_file_store_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    msg = preflight_error(f"file://{blocker}/store")
    assert "cannot" in msg and "pick another 'store'" in msg


def test_preflight_unsupported_scheme_and_missing_bucket_name():
    with pytest.raises(StoreError, match="no bucket name"):
        check_store("s3://")
    with pytest.raises(StoreError, match="no container name"):
        check_store("az:///runs")
