"""The spot-notice watcher against a loopback metadata server: AWS, GCP and Azure notices SIGTERM the trainer in time.

Nothing here may reach a real metadata address: every probe is pointed at 127.0.0.1, and a guard
makes any connection to 169.254.169.254 or metadata.google.internal fail the test.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import PYTHON, REPO, python_env
from thrifty.launchers import notice
from thrifty.launchers.notice import exit_code
from thrifty.protocol import EXIT_RESUMABLE

POLL_S = 0.2

REAL_METADATA = ("169.254.169.254", "metadata.google.internal", "fd00:ec2::254")


@pytest.fixture(autouse=True)
def no_real_metadata(monkeypatch):
    """Fail loudly if anything in this process tries a cloud metadata address."""
    real_connect = socket.socket.connect
    real_create = socket.create_connection

    def guarded_connect(self, address):
        if isinstance(address, tuple) and str(address[0]) in REAL_METADATA:
            raise AssertionError(f"test tried to reach a real metadata address {address}")
        return real_connect(self, address)

    def guarded_create(address, *a, **kw):
        if str(address[0]) in REAL_METADATA:
            raise AssertionError(f"test tried to reach a real metadata address {address}")
        return real_create(address, *a, **kw)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "create_connection", guarded_create)
    monkeypatch.delenv("SKYPILOT_CLUSTER_INFO", raising=False)
    monkeypatch.delenv("SKYPILOT_MANAGED_JOB_ID", raising=False)
    monkeypatch.delenv("THRIFTY_RUN_CONFIG", raising=False)


class FakeMetadata:
    """A loopback server speaking the three providers' notice endpoints (formats from NOTICES.md)."""

    TOKEN = "tok-123"

    def __init__(self):
        self.aws_action: dict | None = None  # None -> 404
        self.aws_v1_only = False  # refuse the IMDSv2 token call
        self.gcp_preempted = False
        self.azure_events: list[dict] = []
        self.requests: list[tuple[str, str, dict]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes = b"", ctype: str = "text/plain"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                fake.requests.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path == "/latest/api/token" and not fake.aws_v1_only and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, fake.TOKEN.encode())
                return self._send(403)

            def do_GET(self):
                fake.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path == "/latest/meta-data/spot/instance-action":
                    token = self.headers.get("X-aws-ec2-metadata-token")
                    if not fake.aws_v1_only and token != fake.TOKEN:
                        return self._send(401)
                    if fake.aws_action is None:
                        return self._send(404, b"Not Found")
                    return self._send(200, json.dumps(fake.aws_action).encode(), "application/json")
                if self.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403, b"Missing Metadata-Flavor:Google header.")
                    return self._send(200, b"TRUE" if fake.gcp_preempted else b"FALSE")
                if self.path.startswith("/metadata/scheduledevents"):
                    if self.headers.get("Metadata") != "true":
                        return self._send(400, b'{"error": "Bad request. Required metadata header not specified"}')
                    body = {"DocumentIncarnation": len(fake.azure_events), "Events": fake.azure_events}
                    return self._send(200, json.dumps(body).encode(), "application/json")
                return self._send(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def notify(self, cloud: str) -> None:
        if cloud == "aws":
            self.aws_action = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}
        elif cloud == "gcp":
            self.gcp_preempted = True
        else:
            self.azure_events = [{
                "EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt",
                "ResourceType": "VirtualMachine", "Resources": ["vm-1"], "EventStatus": "Scheduled",
                "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "", "EventSource": "Platform",
                "DurationInSeconds": -1,
            }]


@pytest.fixture
def metadata(monkeypatch):
    fake = FakeMetadata()
    fake.thread.start()
    monkeypatch.setenv(notice.BASE_ENV, fake.base)
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


# ---------------------------------------------------------------- probes


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_probe_sees_nothing_then_the_notice(metadata, cloud):
    probe = notice.make_probe(cloud)
    assert probe() is None
    assert probe() is None
    metadata.notify(cloud)
    found = probe()
    assert found is not None and found.cloud == cloud
    assert found.kind == {"aws": "terminate", "gcp": "preempted", "azure": "Preempt"}[cloud]


def test_probes_send_the_headers_each_provider_requires(metadata):
    for cloud in ("aws", "gcp", "azure"):
        notice.make_probe(cloud)()
    by_path = {path.split("?")[0]: (method, headers) for method, path, headers in metadata.requests}
    assert by_path["/latest/api/token"][0] == "PUT"
    assert by_path["/latest/meta-data/spot/instance-action"][1]["x-aws-ec2-metadata-token"] == FakeMetadata.TOKEN
    assert by_path["/computeMetadata/v1/instance/preempted"][1]["metadata-flavor"] == "Google"
    assert by_path["/metadata/scheduledevents"][1]["metadata"] == "true"
    assert any("api-version=2020-07-01" in path for _, path, _ in metadata.requests)


def test_aws_falls_back_to_imdsv1_when_tokens_are_refused(metadata):
    metadata.aws_v1_only = True
    probe = notice.make_probe("aws")
    assert probe() is None
    metadata.notify("aws")
    assert probe().detail["action"] == "terminate"


def test_azure_ignores_events_for_other_vms_and_other_kinds(metadata):
    metadata.azure_events = [
        {"EventId": "a", "EventType": "Preempt", "Resources": ["someone-else"], "EventStatus": "Scheduled"},
        {"EventId": "b", "EventType": "Freeze", "Resources": ["vm-1"], "EventStatus": "Scheduled"},
    ]
    probe = notice.AzureProbe(metadata.base, vm_name="vm-1")
    assert probe() is None
    metadata.notify("azure")
    assert probe().detail["EventId"] == "602d9444-d2cd-49c7-8624-8643e7171297"


def test_cloud_comes_from_skypilot_cluster_info():
    assert notice.detect_cloud({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "GCP", "region": "us-central1"})}) == "gcp"
    assert notice.detect_cloud({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "Azure"})}) == "azure"
    assert notice.detect_cloud({}) is None
    assert notice.detect_cloud({"SKYPILOT_CLUSTER_INFO": "not json"}) is None


def test_an_unreachable_endpoint_never_stops_the_watch():
    seen = []
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] < 3:
            raise OSError("connection refused")
        return notice.Notice("aws", "terminate")

    w = notice.Watcher(flaky, 0.01, seen.append, "aws").start()
    w._thread.join(2)
    assert [n.kind for n in seen] == ["terminate"] and calls["n"] == 3


# ---------------------------------------------------------------- the exit code SkyPilot sees


@pytest.mark.parametrize("rc, finished, notice_seen, stop, term, expected", [
    (0, True, False, False, False, 0),                 # trained to the end
    (0, True, True, False, False, 0),                  # finished just as the notice came
    (0, False, True, False, False, EXIT_RESUMABLE),    # checkpointed on the notice: recover now
    (1, False, True, False, False, EXIT_RESUMABLE),    # torchrun lost a peer during the preemption
    (0, False, False, False, True, EXIT_RESUMABLE),    # SIGTERM to the wrapper (GCP soft-off, job cancel)
    (0, False, False, False, False, EXIT_RESUMABLE),   # a SIGTERM we never saw: still unfinished
    (1, False, False, False, False, 1),                # a real crash: counts against max_restarts_on_errors
    (2, False, False, False, False, 2),                # bad input
    (0, False, False, True, False, 0),                 # stopped on request: the launcher ends the job
    (0, None, False, False, False, 0),                 # no store to look at: trust the program
    (0, None, True, False, False, EXIT_RESUMABLE),
])
def test_exit_code(rc, finished, notice_seen, stop, term, expected):
    assert exit_code(rc, finished, notice_seen, stop, term) == expected


# ---------------------------------------------------------------- end to end: a process gets SIGTERM in time

TRAINER = """
import signal, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
def on_term(signum, frame):
    out.with_suffix(".sig").write_text(f"{signum} {time.time()}")
    sys.exit(0)   # the training program saves and exits 0
signal.signal(signal.SIGTERM, on_term)
out.with_suffix(".ready").write_text(str(time.time()))
time.sleep(30)
"""

# torchrun stand-in: a parent that exits with its child, so SIGTERM must reach the child to matter
LAUNCHER = """
import subprocess, sys, signal, pathlib
signal.signal(signal.SIGTERM, lambda s, f: pathlib.Path(sys.argv[2]).with_suffix(".parent-sig").write_text("x"))
child = subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]])
sys.exit(child.wait())
"""


def _wait_for(path: Path, timeout: float = 15.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text():
            return time.time()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def _env(metadata, **extra) -> dict[str, str]:
    env = python_env()
    env[notice.BASE_ENV] = metadata.base
    env.pop("SKYPILOT_CLUSTER_INFO", None)
    env.pop("THRIFTY_RUN_CONFIG", None)
    env.update(extra)
    return env


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_wrapped_trainer_gets_sigterm_within_the_poll_interval(metadata, tmp_path, cloud):
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    out = tmp_path / "t.out"
    proc = subprocess.Popen(
        [PYTHON, "-m", "thrifty.launchers.notice", "--poll-s", str(POLL_S), "--", PYTHON, str(trainer), str(out)],
        env=_env(metadata, SKYPILOT_CLUSTER_INFO=json.dumps({"cloud": cloud.upper() if cloud != "azure" else "Azure"})),
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(out.with_suffix(".ready"))
        time.sleep(2 * POLL_S)  # a few polls that find nothing
        assert not out.with_suffix(".sig").exists()
        noticed = time.time()
        metadata.notify(cloud)
        signalled = _wait_for(out.with_suffix(".sig"))
        rc = proc.wait(timeout=15)
    finally:
        proc.kill()
    # a poll interval after the notice, give or take a starved scheduler: far inside the 30 s the shortest notice gives
    assert signalled - noticed <= POLL_S + 10.0, f"SIGTERM came {signalled - noticed:.2f} s after the notice"
    assert out.with_suffix(".sig").read_text().split()[0] == "15"
    # no summary (no run config here) + a notice: resumable, so SkyPilot recovers without spending a restart
    assert rc == EXIT_RESUMABLE, proc.stderr.read() if proc.stderr else ""


def test_signal_children_reaches_the_workers_not_the_launcher(metadata, tmp_path):
    trainer, launcher = tmp_path / "trainer.py", tmp_path / "launcher.py"
    trainer.write_text(TRAINER)
    launcher.write_text(LAUNCHER)
    out = tmp_path / "w.out"
    proc = subprocess.Popen(
        [PYTHON, "-m", "thrifty.launchers.notice", "--cloud", "aws", "--poll-s", str(POLL_S), "--signal-children",
         "--", PYTHON, str(launcher), str(trainer), str(out)],
        env=_env(metadata), stderr=subprocess.DEVNULL)
    try:
        _wait_for(out.with_suffix(".ready"))
        metadata.notify("aws")
        _wait_for(out.with_suffix(".sig"))
        assert proc.wait(timeout=15) == EXIT_RESUMABLE
    finally:
        proc.kill()
    assert not out.with_suffix(".parent-sig").exists()  # torchrun itself was left alone


def test_watch_only_mode_signals_a_pid(metadata, tmp_path):
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    out = tmp_path / "p.out"
    target = subprocess.Popen([PYTHON, str(trainer), str(out)], env=_env(metadata))
    try:
        _wait_for(out.with_suffix(".ready"))
        watcher = subprocess.Popen([PYTHON, "-m", "thrifty.launchers.notice", "--pid", str(target.pid), "--cloud", "gcp",
                                    "--poll-s", str(POLL_S)], env=_env(metadata), stderr=subprocess.DEVNULL)
        time.sleep(2 * POLL_S)
        metadata.notify("gcp")
        _wait_for(out.with_suffix(".sig"))
        assert target.wait(timeout=10) == 0
        assert watcher.wait(timeout=10) == 0
    finally:
        target.kill()


def test_finished_run_exits_zero_and_a_stop_request_is_honoured_for_this_job_only(metadata, tmp_path):
    """A stop request in the store for another job is ignored; one for this job checkpoints, acknowledges, exits 0."""
    from thrifty.config import build_config
    from thrifty.runs import run_key
    from thrifty.storage import open_store

    store_dir = tmp_path / "store"
    cfg = build_config({"run_name": "r1", "store": str(store_dir)})
    store = open_store(cfg.store)
    store.put_bytes(run_key("r1", notice.STOP_KEY), json.dumps({"managed_job_id": 6}).encode())  # an old job's
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    out = tmp_path / "s.out"
    env = _env(metadata, THRIFTY_RUN_CONFIG=cfg.to_env_json(), THRIFTY_RUN_ID="r1", SKYPILOT_MANAGED_JOB_ID="7")
    proc = subprocess.Popen(
        [PYTHON, "-m", "thrifty.launchers.notice", "--cloud", "aws", "--poll-s", "5", "--stop-poll-s", str(POLL_S),
         "--linger-s", "0.3", "--", PYTHON, str(trainer), str(out)], env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_for(out.with_suffix(".ready"))
        time.sleep(3 * POLL_S)
        assert not out.with_suffix(".sig").exists()
        store.put_bytes(run_key("r1", notice.STOP_KEY), json.dumps({"managed_job_id": 7}).encode())
        _wait_for(out.with_suffix(".sig"))
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
    ack = json.loads(store.get_bytes(run_key("r1", notice.STOPPED_KEY.format(job="7"))))
    assert ack["returncode"] == 0

    # the same wrapper around a run that has written its summary: finished, exit 0
    store.put_bytes(run_key("r1", "summary.json"), b"{}")
    done = subprocess.run([PYTHON, "-m", "thrifty.launchers.notice", "--cloud", "aws", "--", PYTHON, "-c", "pass"],
                          env=env, capture_output=True, timeout=30)
    assert done.returncode == 0


def test_prime_is_a_no_op_off_azure_and_one_request_on_it(metadata):
    assert notice.prime("aws") == 0 and metadata.requests == []
    assert notice.prime("azure") == 0
    assert [p.split("?")[0] for _, p, _ in metadata.requests] == ["/metadata/scheduledevents"]


def test_default_bases_are_the_providers_and_env_overrides_them(monkeypatch):
    monkeypatch.delenv(notice.BASE_ENV, raising=False)
    assert notice.metadata_base("aws") == "http://169.254.169.254"
    assert notice.metadata_base("gcp") == "http://metadata.google.internal"
    monkeypatch.setenv(notice.BASE_ENV, "http://127.0.0.1:1")
    assert notice.metadata_base("azure") == "http://127.0.0.1:1"


@pytest.mark.slow
def test_node_run_script_checkpoints_on_a_notice_exits_resumable_then_resumes(metadata, tmp_path):
    """The task's real ``run:`` script on this machine (torchrun, CPU): a notice mid-run -> checkpoint, exit 75;
    the recovery's run resumes from that checkpoint and exits 0."""
    from thrifty.config import build_config
    from thrifty.launchers.skypilot import RUN_SINGLE, VENV

    activate = Path(sys.executable).parent / "activate"
    if not activate.is_file():
        pytest.skip("needs the project's venv (its bin/activate) to stand in for the node's")
    home = tmp_path / "home"
    venv_bin = home / VENV.removeprefix("~/") / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "activate").symlink_to(activate)
    store = tmp_path / "store"

    def run_env(**train) -> dict[str, str]:
        cfg = build_config({"run_name": "node", "recipe": "digits", "store": str(store),
                            "train": {"precision": "fp32", "device": "cpu", "checkpoint_every": 10, **train}})
        return _env(metadata, HOME=str(home), THRIFTY_RUN_CONFIG=cfg.to_env_json(), THRIFTY_RUN_ID="node",
                    SKYPILOT_NUM_GPUS_PER_NODE="1", SKYPILOT_CLUSTER_INFO=json.dumps({"cloud": "AWS"}),
                    OMP_NUM_THREADS="1", THRIFTY_LOCAL_CACHE=str(tmp_path / "cache"),
                    THRIFTY_MIN_STEP_S="0.002")  # 4,400 steps take 9 s at least: the notice comes mid-run anywhere

    script = RUN_SINGLE.replace("--signal-children", f"--signal-children --poll-s {POLL_S}")
    first = subprocess.Popen(["bash", "-c", script], env=run_env(max_epochs=200), cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not list((store / "runs" / "node" / "ckpt").glob("*/COMMIT")) and time.time() < deadline:
            time.sleep(0.05)
        metadata.notify("aws")
        rc = first.wait(timeout=60)
    finally:
        first.kill()
    err = first.stderr.read()
    assert rc == EXIT_RESUMABLE, err[-3000:]
    assert "aws notice: terminate" in err and "received SIGTERM: saving a checkpoint" in err  # the worker, not torchrun
    assert not (store / "runs" / "node" / "summary.json").exists()
    saved = max(int(p.parent.name.split("-")[1]) for p in (store / "runs" / "node" / "ckpt").glob("*/COMMIT"))

    metadata.aws_action = None  # the recovery's new VM has no notice
    second = subprocess.run(["bash", "-c", script], env=run_env(max_epochs=200, max_steps=saved + 20), cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads((store / "runs" / "node" / "summary.json").read_text())
    assert summary["resumes"] == 1 and summary["steps"] == saved + 20
