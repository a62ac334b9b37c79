"""A store's faults never end a run by themselves (issue 21.3): moto behind a fault proxy that refuses, resets or
answers 503, and a file store on a full or read-only disk.

A brief outage of any kind is retried with backoff inside the store's window (``store_retry_s``), by the same code
for every backend (``thrifty.storage.retry``); one that lasts past it ends the job as a failure (exit 1) in the
store's own words, never as bad input (exit 2); a full or read-only disk is named as such. Outages are placed by
the fault they cause (they end a fixed time after the first failure was seen), never by a guess at speed.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, python_env
from stores import child_env
from thrifty.cli import guarded
from thrifty.protocol import EXIT_FAILED, EXIT_OK
from thrifty.runs import read_metrics
from thrifty.storage import StoreError, StoreUnavailable, open_store
from thrifty.storage.retry import on_retry

# how long an outage lasts after the first failure the store's retries met: that failure comes only once the SDK's own
# retries gave up (they end a run within 0.1-1.5 s of refused, reset or 503 answers here), so any outage that goes
# on after it is one the SDK alone could not ride out
OUTAGE_S = 2.0


def outage_ends_after_first_failure(proxy, seen: threading.Event, last_s: float = OUTAGE_S) -> threading.Thread:
    """Back to ``pass`` ``last_s`` after the first failure was met."""
    def restore() -> None:
        seen.wait(120)
        time.sleep(last_s)
        proxy.mode = "pass"

    t = threading.Thread(target=restore, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("mode,call", [("refuse", "write"), ("reset", "read"), ("503", "watch")])
def test_a_brief_outage_is_waited_out(s3_proxy, mode, call):
    """A checkpoint's write, a read, and the watch loop's metrics read ride out refused or reset connections and
    503s (the SDK's own retries used to end the run within 2 s: exit 2 on the node, a failed watch in the flow)."""
    store = open_store(f"s3://{s3_proxy.bucket}/runs", retry_s=120)
    store.put_bytes("runs/r/metrics/a.jsonl", b'{"step": 1, "loss": 2.0}\n')  # a pooled connection, as in a run
    store.put_bytes("runs/r/ckpt/step-1/COMMIT", b"{}")
    met: list[str] = []
    seen = threading.Event()

    def retried(op: str, exc: BaseException) -> None:
        met.append(op)
        seen.set()

    s3_proxy.proxy.mode = mode
    restorer = outage_ends_after_first_failure(s3_proxy.proxy, seen)
    with on_retry(retried):
        if call == "write":
            store.put_bytes("runs/r/ckpt/step-2/COMMIT", b"{}")
            got = s3_proxy.direct.get_object(Bucket=s3_proxy.bucket, Key="runs/runs/r/ckpt/step-2/COMMIT")
            assert got["Body"].read() == b"{}"
        elif call == "read":
            assert store.get_bytes("runs/r/ckpt/step-1/COMMIT") == b"{}"
        else:
            assert [r["step"] for r in read_metrics(store, "r")] == [1]  # what the watch loop reads every poll
    restorer.join(10)
    assert seen.is_set() and met, f"the {mode} outage was never met"


def test_an_outage_past_the_window_is_a_failure_in_the_stores_words_never_bad_input(s3_proxy):
    store = open_store(f"s3://{s3_proxy.bucket}/runs", retry_s=2.0)
    s3_proxy.proxy.mode = "503"
    with pytest.raises(StoreUnavailable) as err:
        store.list("runs/")
    assert not isinstance(err.value, StoreError), "a store error is bad input (exit 2); an outage is not"
    msg = str(err.value)
    assert "kept failing for 2 s" in msg and ("SlowDown" in msg or "reduce your request rate" in msg), msg
    assert guarded(lambda _args: store.list("runs/"), None) == EXIT_FAILED  # the CLI and the node: exit 1


@pytest.mark.slow
def test_the_node_trains_through_an_outage_from_its_first_store_call(s3_proxy, tmp_path):
    """`python -m training` on S3: the store resets every connection from the node's first call for OUTAGE_S; it
    waits, trains, and exits 0 (it used to exit 2, which no launcher restarts, and the flow said BadInput)."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "run_name": "blip", "recipe": "digits", "store": f"s3://{s3_proxy.bucket}/runs",
        "recipe_params": {"hidden": 16, "limit": 300},
        "train": {"max_epochs": 2, "micro_batch": 32, "checkpoint_every": 5, "early_stopping": {"enabled": False}},
    }))
    proxy = s3_proxy.proxy
    proxy.mode = "reset"
    first = threading.Event()

    def first_connection() -> None:
        while not proxy.connections:
            time.sleep(0.05)
        first.set()

    threading.Thread(target=first_connection, daemon=True).start()
    restorer = outage_ends_after_first_failure(proxy, first)
    done = subprocess.run([sys.executable, "-m", "training", "--config", str(cfg)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=child_env(python_env(), s3_proxy.env))
    restorer.join(1)
    assert proxy.connections, "the node never reached the store"
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "retrying for up to 300 s" in done.stderr
    assert s3_proxy.direct.get_object(Bucket=s3_proxy.bucket, Key="runs/runs/blip/summary.json")


# ------------------------------------------------------------------------------------- a full or read-only disk


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (a full disk for real), or, where this machine may not mount one, the same errno injected at the
    store's file creation (the fallback says so in the test's output)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0
    if not mounted:
        print("\n[small_disk] cannot mount a tmpfs here: the full disk's errno is injected instead")
    try:
        yield disk, mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def _inject(monkeypatch, disk: Path, code: int) -> None:
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # noqa: A002 -- tempfile's own name
        if dir is not None and Path(dir).resolve().is_relative_to(disk.resolve()):
            raise OSError(code, __import__("os").strerror(code))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("kind", ["full", "read-only"])
def test_a_full_or_read_only_disk_is_named_and_ends_the_job_as_a_failure(small_disk, monkeypatch, tmp_path, capsys,
                                                                         kind):
    disk, mounted = small_disk
    store_dir = disk / "store"
    store_dir.mkdir()
    if mounted and kind == "full":
        _fill(disk)
    elif mounted:
        assert subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True).returncode == 0
    else:
        _inject(monkeypatch, disk, errno.ENOSPC if kind == "full" else errno.EROFS)
    store = open_store(str(store_dir), retry_s=30)
    with pytest.raises(StoreUnavailable, match=f"the store's disk is {kind}"):
        store.put_bytes("runs/r/x.json", b"{}" * 100_000)
    with pytest.raises(StoreUnavailable, match=f"the store's disk is {kind}"):
        with store.writer("runs/r/ckpt/step-1/state.pt") as f:
            f.write(b"\0" * (2 << 20))

    # the training program on it: one line naming the disk, exit 1 (a failure), no traceback
    from training.cli import main

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"run_name": "disk", "recipe": "digits", "store": str(store_dir),
                                   "recipe_params": {"hidden": 16, "limit": 300}}))
    assert main(["--config", str(cfg)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert f"the store's disk is {kind}" in err and "Traceback" not in err, err


# ------------------------------------------------------------------------------------- the policy, in one place


def test_a_checkpoint_write_that_retries_lets_training_carry_on(s3_proxy):
    """The background write meets 503s and retries; meanwhile ``waiting_on_store`` tells the loop to train on rather
    than wait for it at the next due save; the write lands once the store answers."""
    import torch

    from training.checkpoint import CheckpointManager
    from training.ckpt_writer import CheckpointWriter

    store = open_store(f"s3://{s3_proxy.bucket}/runs", retry_s=120)
    writer = CheckpointWriter(CheckpointManager(store, "r", 2, "min"), background=True)
    s3_proxy.proxy.mode = "503"
    writer.save({"model": {"w": torch.zeros(4)}}, 10, None)
    deadline = time.time() + 60
    while not writer.waiting_on_store and time.time() < deadline:
        time.sleep(0.05)
    assert writer.waiting_on_store and writer.in_flight
    s3_proxy.proxy.mode = "pass"
    [written] = writer.close()
    assert written.step == 10 and not writer.waiting_on_store
    assert [c.step for c in CheckpointManager(store, "r", 2, "min").committed()] == [10]


def test_every_backend_tells_a_passing_error_from_a_lasting_one():
    """The one policy asks each backend's SDK errors: 5xx, throttling, resets and timeouts pass; denials do not."""
    import requests
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ServiceRequestError
    from botocore.exceptions import ClientError, ReadTimeoutError
    from google.api_core import exceptions as gx

    from thrifty.storage.azure import AzureStore
    from thrifty.storage.gcs import GCSStore
    from thrifty.storage.s3 import S3Store

    def http(status: int) -> HttpResponseError:
        exc = HttpResponseError(message=f"HTTP {status}")
        exc.status_code = status
        return exc

    def s3(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    cases = {
        S3Store: ([s3("SlowDown", 503), s3("InternalError", 500), s3("Throttling", 400),
                   ReadTimeoutError(endpoint_url="http://x")], [s3("AccessDenied", 403), s3("NoSuchBucket", 404)]),
        GCSStore: ([gx.ServiceUnavailable("x"), gx.TooManyRequests("x"), requests.ConnectionError("reset")],
                   [gx.Forbidden("x"), gx.NotFound("x")]),
        AzureStore: ([http(503), http(429), ServiceRequestError("refused")],
                     [http(403), ClientAuthenticationError("bad key")]),
    }
    for cls, (passing, lasting) in cases.items():
        store = cls.__new__(cls)  # no client: only the classification is asked
        assert all(store._transient(e) for e in passing), cls
        assert not any(store._transient(e) for e in lasting), cls


def test_a_mounted_file_systems_stall_is_retried_too(tmp_path, monkeypatch):
    """A file store on a network mount that answers EIO/ETIMEDOUT for a moment: the same retries as any store."""
    store = open_store(str(tmp_path / "store"), retry_s=30)
    store.put_bytes("runs/r/x.json", b"{}")
    real = Path.read_bytes
    stalls = [errno.EIO, errno.ETIMEDOUT]

    def read_bytes(self):
        if stalls:
            raise OSError(stalls.pop(0), "stalled")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    met: list[str] = []
    with on_retry(lambda op, exc: met.append(op)):
        assert store.get_bytes("runs/r/x.json") == b"{}"
    assert met == ["read", "read"]


def test_a_flow_task_that_meets_a_lasting_outage_fails_with_its_words_not_as_bad_input():
    from tasks.errors import BAD_INPUT, fails_quietly

    def watch():
        raise StoreUnavailable("store 's3://b/p': could not list runs/: it kept failing for 300 s (SlowDown)")

    state = fails_quietly(watch)()
    assert state.is_failed() and state.name != BAD_INPUT and "SlowDown" in state.message
