"""Spot-notice watcher for a cloud node: poll the provider's notice endpoint, SIGTERM the trainer in time.

SkyPilot does not forward a cloud's preemption notice to the job. AWS (2 min) and Azure (>= 30 s)
only publish it as a metadata item, and GCP's ACPI soft-off leaves 30 s, so this watcher polls
the endpoint (AWS ``spot/instance-action``, GCP ``instance/preempted``, Azure Scheduled Events,
formats in shared/data/spot-traces/NOTICES.md) and sends SIGTERM to the training processes, which
save a checkpoint and exit. It also honours a stop request the launcher leaves in the store
(``runs/<run_id>/control/stop.json``), which is how a cancel checkpoints before the node is torn down.

Usage on a node (what the SkyPilot task's ``run:`` does)::

    python -m thrifty.launchers.notice --signal-children -- python -m torch.distributed.run ... -m training
    python -m thrifty.launchers.notice --pid 1234        # only watch: SIGTERM pid 1234 on a notice
    python -m thrifty.launchers.notice --prime           # one request that enables Azure Scheduled Events

Wrapping a command, it exits with the code that tells SkyPilot what happened (see ``exit_code``):
0 when training finished, 75 (``EXIT_RESUMABLE``, listed in the task's ``recover_on_exit_codes``)
when it stopped on a notice with its checkpoint saved, so the managed job recovers at once on a
new VM without spending a restart of ``max_restarts_on_errors``; the program's own code otherwise (from its
exit record: torchrun says 1 for any failure), except that bad input (2) and a failure that repeats the attempt
before it exit 0 with the job marked given up (``thrifty.launchers.failures``): no restart can fix them.
The endpoint base is ``$THRIFTY_METADATA_BASE`` (tests point it at a loopback server).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from thrifty.launchers.failures import settle_on_node
from thrifty.procs import process_alive
from thrifty.protocol import EXIT_BUDGET, EXIT_RESUMABLE, STOP_KEY, STOPPED_KEY

log = logging.getLogger("thrifty.notice")

BASE_ENV = "THRIFTY_METADATA_BASE"  # e.g. http://127.0.0.1:8123 in tests; the real link-local address otherwise
DEFAULT_BASE = {"aws": "http://169.254.169.254", "azure": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}
POLL_S = {"aws": 5.0, "gcp": 1.0, "azure": 1.0}  # AWS advises 5 s; Azure 1 s; GCP leaves only 30 s
HTTP_TIMEOUT_S = 2.0


@dataclass
class Notice:
    cloud: str
    kind: str  # terminate | stop | hibernate (AWS), preempted (GCP), Preempt | Terminate (Azure), stop-request
    detail: dict[str, Any] = field(default_factory=dict)
    detected_unix: float = field(default_factory=time.time)


# ---------------------------------------------------------------- probes: one HTTP request each, None = no notice


def _http(method: str, url: str, headers: dict[str, str], timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - URL built from a configured base
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() or b""


class AwsProbe:
    """IMDSv2 (token, then ``spot/instance-action``); IMDSv1 when the token call is refused. 404 = no notice."""

    def __init__(self, base: str):
        self.base, self.token, self.token_until = base.rstrip("/"), None, 0.0

    def _headers(self) -> dict[str, str]:
        if self.token is None or time.time() > self.token_until:
            status, body = _http("PUT", f"{self.base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
            self.token = body.decode().strip() if status == 200 else ""
            self.token_until = time.time() + (21000 if status == 200 else 60)
        return {"X-aws-ec2-metadata-token": self.token} if self.token else {}

    def __call__(self) -> Notice | None:
        status, body = _http("GET", f"{self.base}/latest/meta-data/spot/instance-action", self._headers())
        if status == 401:  # token expired early: fetch a new one next time
            self.token = None
        if status != 200:
            return None
        detail = json.loads(body)
        return Notice("aws", str(detail.get("action", "terminate")), detail)


class GcpProbe:
    """``instance/preempted`` turns FALSE -> TRUE; every request carries ``Metadata-Flavor: Google``."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def __call__(self) -> Notice | None:
        status, body = _http("GET", f"{self.base}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"})
        if status == 200 and body.strip().upper() == b"TRUE":
            return Notice("gcp", "preempted", {"preempted": "TRUE"})
        return None


class AzureProbe:
    """Scheduled Events: a ``Preempt`` (or ``Terminate``) event naming this VM, or any VM when its name is unknown."""

    KINDS = ("Preempt", "Terminate")

    def __init__(self, base: str, vm_name: str | None = None):
        self.base, self.vm_name = base.rstrip("/"), vm_name

    def __call__(self) -> Notice | None:
        status, body = _http("GET", f"{self.base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
        if status != 200:
            return None
        for event in json.loads(body).get("Events", []):
            mine = not self.vm_name or not event.get("Resources") or self.vm_name in event["Resources"]
            if event.get("EventType") in self.KINDS and mine:
                return Notice("azure", event["EventType"], event)
        return None


def metadata_base(cloud: str) -> str:
    return os.environ.get(BASE_ENV) or DEFAULT_BASE[cloud]


def make_probe(cloud: str, base: str | None = None) -> Callable[[], Notice | None]:
    base = base or metadata_base(cloud)
    if cloud == "aws":
        return AwsProbe(base)
    if cloud == "gcp":
        return GcpProbe(base)
    if cloud == "azure":
        return AzureProbe(base, os.environ.get("THRIFTY_AZURE_VM_NAME"))
    raise ValueError(f"no notice probe for cloud {cloud!r}; use aws, gcp or azure")


def cluster_cloud(environ: dict[str, str] | None = None) -> str | None:
    """The node's cloud, lower-cased, from SkyPilot's ``$SKYPILOT_CLUSTER_INFO`` (``{"cloud": "AWS", ...}``;
    ``Kubernetes`` on a pod), if set."""
    env = os.environ if environ is None else environ
    try:
        cloud = str(json.loads(env.get("SKYPILOT_CLUSTER_INFO", "{}")).get("cloud", "")).lower()
    except (json.JSONDecodeError, AttributeError):
        return None
    return cloud or None


def detect_cloud(environ: dict[str, str] | None = None) -> str | None:
    """The node's cloud when it is one with a spot-notice endpoint (aws, gcp, azure); else None."""
    cloud = cluster_cloud(environ)
    return cloud if cloud in DEFAULT_BASE else None


# ---------------------------------------------------------------- the stop request left by the launcher


class StopRequestProbe:
    """Reads ``runs/<run_id>/control/stop.json`` and fires when it names this managed job."""

    def __init__(self, store: Any, run_id: str, job: str):
        self.store, self.run_id, self.job = store, run_id, job

    def __call__(self) -> Notice | None:
        from thrifty.runs import run_key
        from thrifty.storage import NotFound

        try:
            req = json.loads(self.store.get_bytes(run_key(self.run_id, STOP_KEY)))
        except NotFound:
            return None
        if str(req.get("managed_job_id")) != self.job:
            return None  # left for an earlier job of this run
        return Notice("store", "stop-request", req)

    def acknowledge(self, detail: dict[str, Any]) -> None:
        from thrifty.runs import run_key

        self.store.put_bytes(run_key(self.run_id, STOPPED_KEY.format(job=self.job)), json.dumps(detail).encode())


# ---------------------------------------------------------------- watching


class Watcher:
    """Polls ``probe`` every ``poll_s`` on a daemon thread; calls ``on_notice`` once, on the first notice."""

    def __init__(self, probe: Callable[[], Notice | None], poll_s: float, on_notice: Callable[[Notice], None], name: str):
        self.probe, self.poll_s, self.on_notice, self.name = probe, poll_s, on_notice, name
        self.notice: Notice | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"notice-{name}", daemon=True)
        self._errors = 0

    def start(self) -> "Watcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.probe()
            except Exception as exc:  # an unreachable endpoint must never stop the training
                self._errors += 1
                if self._errors in (1, 10, 100):
                    log.warning("%s notice check failed (%d so far): %s", self.name, self._errors, exc)
                notice = None
            if notice is not None:
                self.notice = notice
                log.warning("%s notice: %s %s", notice.cloud, notice.kind, json.dumps(notice.detail)[:300])
                self.on_notice(notice)
                return
            self._stop.wait(self.poll_s)


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc); empty elsewhere."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        pass
    out = []
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
    except OSError:
        return []
    return out


def send_sigterm(pid: int, children: bool) -> list[int]:
    """SIGTERM ``pid``, or its direct children (torchrun's workers: torchrun itself would give them only 30 s)."""
    targets = (children_of(pid) or [pid]) if children else [pid]
    for t in targets:
        try:
            os.kill(t, signal.SIGTERM)
        except ProcessLookupError:
            pass
    log.warning("sent SIGTERM to %s", targets)
    return targets


# ---------------------------------------------------------------- the exit code SkyPilot sees


def exit_code(returncode: int, finished: bool | None, notice_seen: bool, stop_requested: bool, terminated: bool) -> int:
    """What the node's run script exits with.

    - finished (``summary.json`` written): 0, the job SUCCEEDED.
    - a stop request from the launcher: 0 after lingering; the launcher tears the job down itself.
    - a spot notice, or SIGTERM to this wrapper, without a finished run: ``EXIT_RESUMABLE``. Exiting 0
      here would mark the managed job SUCCEEDED with training unfinished; sleeping until the VM dies
      wastes up to 2 min of billing and hangs forever on a notice that never ends in a reclaim.
    - the program exited 0 without finishing (a SIGTERM this wrapper never saw): ``EXIT_RESUMABLE`` too.
    - the program stopped itself at the budget cap (``EXIT_BUDGET``, its checkpoint saved): 0, so that
      SkyPilot, which retries every other non-zero code, never rents a machine past the cap.
    - any other failure: its own code, which counts against ``max_restarts_on_errors``.
    """
    if returncode == EXIT_BUDGET:
        return 0
    if finished or (finished is None and returncode == 0 and not (notice_seen or terminated)):
        return 0
    if stop_requested:
        return 0
    if notice_seen or terminated or returncode == 0:
        return EXIT_RESUMABLE
    return returncode


def _run_finished() -> bool | None:
    """Whether this node's run wrote ``summary.json``; None when the node has no run config to look with."""
    try:
        from thrifty.config import config_from_env
        from thrifty.runs import run_key
        from thrifty.storage import open_store

        cfg = config_from_env(dict(os.environ))
        if cfg is None:
            return None
        return open_store(cfg.store).exists(run_key(cfg.run_name, "summary.json"))
    except Exception as exc:  # an unreadable store: trust the program's exit code
        log.warning("could not read the run summary: %s", exc)
        return None


def _stop_request_probe() -> StopRequestProbe | None:
    job = os.environ.get("SKYPILOT_MANAGED_JOB_ID")
    if not job:
        return None
    try:
        from thrifty.config import config_from_env
        from thrifty.storage import open_store

        cfg = config_from_env(dict(os.environ))
        if cfg is None:
            return None
        return StopRequestProbe(open_store(cfg.store), cfg.run_name, job)
    except Exception as exc:
        log.warning("stop requests will not be seen (no store): %s", exc)
        return None


def wrap(command: list[str], cloud: str | None, poll_s: float | None, signal_children: bool,
         stop_poll_s: float = 10.0, linger_s: float = 600.0) -> int:
    """Run ``command`` under the watchers and return the exit code SkyPilot should see."""
    started = time.time()
    proc = subprocess.Popen(command)
    state = {"notice": False, "stop": False, "terminated": False}
    signalled = threading.Event()

    def signal_trainer(kind: str) -> None:
        state[kind] = True
        if not signalled.is_set():
            signalled.set()
            send_sigterm(proc.pid, signal_children)

    def on_sigterm(signum: int, _frame: Any) -> None:
        log.warning("wrapper got %s: asking the trainer to checkpoint", signal.Signals(signum).name)
        signal_trainer("terminated")

    signal.signal(signal.SIGTERM, on_sigterm)
    watchers = []
    if cloud:
        watchers.append(Watcher(make_probe(cloud), poll_s or POLL_S[cloud], lambda n: signal_trainer("notice"), cloud).start())
    else:
        log.warning("cloud unknown (no --cloud, no $SKYPILOT_CLUSTER_INFO): not watching for spot notices")
    stop_probe = _stop_request_probe()
    if stop_probe is not None:
        watchers.append(Watcher(stop_probe, stop_poll_s, lambda n: signal_trainer("stop"), "stop-request").start())
    while True:
        try:
            rc = proc.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue
    for w in watchers:
        w.stop()
    finished = _run_finished()
    # the program's own code (torchrun says 1 for any failure) decides; a failure no restart can fix ends the job
    code = settle_on_node(rc, started, lambda own: exit_code(own, finished, state["notice"], state["stop"],
                                                               state["terminated"]))
    log.warning("trainer exited %d (finished=%s, notice=%s, stop=%s, sigterm=%s): exiting %d",
                rc, finished, state["notice"], state["stop"], state["terminated"], code)
    if state["stop"] and stop_probe is not None and not finished:
        stop_probe.acknowledge({"returncode": rc, "stopped_unix": time.time(), "task_id": os.environ.get("SKYPILOT_TASK_ID")})
        log.warning("checkpoint saved on a stop request; waiting up to %.0f s for the launcher to end the job", linger_s)
        deadline = time.time() + linger_s
        while time.time() < deadline and not state["terminated"]:
            time.sleep(1.0)
    return code


def watch_pid(pid: int, cloud: str, poll_s: float | None, signal_children: bool) -> int:
    """Watch only: SIGTERM ``pid`` on a notice; return when it has exited."""
    done = threading.Event()
    watcher = Watcher(make_probe(cloud), poll_s or POLL_S[cloud], lambda n: (send_sigterm(pid, signal_children), done.set()),
                      cloud).start()
    while not done.is_set() and process_alive(pid):
        done.wait(0.2)
    watcher.stop()
    return 0


def prime(cloud: str | None) -> int:
    """One request that makes Azure start Scheduled Events (the first call can take minutes); a no-op elsewhere."""
    if cloud != "azure":
        return 0
    try:
        make_probe("azure")()
    except Exception as exc:
        log.warning("priming Azure Scheduled Events failed: %s", exc)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thrifty.launchers.notice", description=__doc__.split("\n")[0])
    parser.add_argument("--cloud", choices=sorted(DEFAULT_BASE), help="default: from $SKYPILOT_CLUSTER_INFO")
    parser.add_argument("--pid", type=int, help="watch only: the process to SIGTERM on a notice")
    parser.add_argument("--poll-s", type=float, help="seconds between checks (default: aws 5, gcp 1, azure 1)")
    parser.add_argument("--stop-poll-s", type=float, default=10.0, help="seconds between checks for a stop request")
    parser.add_argument("--linger-s", type=float, default=600.0, help="after a stop request, wait this long to be torn down")
    parser.add_argument("--signal-children", action="store_true", help="SIGTERM the command's children (torchrun workers)")
    parser.add_argument("--prime", action="store_true", help="enable Azure Scheduled Events and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... to run and watch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s notice %(levelname)s %(message)s")
    cloud = args.cloud or detect_cloud()
    if args.prime:
        return prime(cloud)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.pid is not None:
        if not cloud:
            parser.error("--pid needs --cloud or $SKYPILOT_CLUSTER_INFO")
        return watch_pid(args.pid, cloud, args.poll_s, args.signal_children)
    if not command:
        parser.error("give --pid PID, or a command after --")
    return wrap(command, cloud, args.poll_s, args.signal_children, args.stop_poll_s, args.linger_s)


if __name__ == "__main__":
    sys.exit(main())
