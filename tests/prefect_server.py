"""A real Prefect server on loopback for end-to-end tests: started with a private PREFECT_HOME, its clients' env,
`thrifty deploy` and a process worker, and every process it started stopped with its children afterwards.

tests/test_deployments_e2e.py and tests/test_ui_browser.py share one (:func:`deployed_ui_server`: a server start and
a deploy are ~15 s); tests/test_work_pools.py starts its own (it moves the deployments to other pools) and
tests/test_postgres_scale.py runs one on a private PostgreSQL cluster (:func:`postgres_cluster`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, python_env
from thrifty.launchers.base import free_loopback_port
from deployments.deploy import WORK_POOL, WORK_POOL_TYPE

BIN = Path(sys.executable).parent


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) for every process, from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            table[int(stat.parent.name)] = (int(fields[1]), fields[19])
    return table


def descendants(pid: int) -> dict[int, str]:
    """The process tree under ``pid``: pid -> start time (so a reused pid is never signalled)."""
    table = _proc_table()
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, started) in table.items():
            if ppid == parent and child not in found:
                found[child] = started
                todo.append(child)
    return found


def stop(proc: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """SIGTERM the process and everything it started, SIGKILL what is left after ``timeout_s``."""
    tree = descendants(proc.pid) if proc.poll() is None else {}
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)

    def alive() -> list[int]:
        table = _proc_table()
        return [pid for pid, started in tree.items() if pid in table and table[pid][1] == started]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


class Server:
    """`prefect server start` on 127.0.0.1 with a private PREFECT_HOME; ``env`` is what its clients use."""

    def __init__(self, home: Path, ui: bool = False, env: dict[str, str] | None = None):
        self.home = home
        self.deploy_output: subprocess.CompletedProcess | None = None
        self.worker: subprocess.Popen | None = None
        port = free_loopback_port()
        self.url = f"http://127.0.0.1:{port}"
        self.api_url = f"{self.url}/api"
        self.env = {
            **python_env(),
            "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_API_HOST": "127.0.0.1",
            "PREFECT_SERVER_API_PORT": str(port),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # without the UI there is no bundle to copy at start: a faster server
            "PREFECT_UI_ENABLED": "true" if ui else "false",
            "PREFECT_UI_API_URL": self.api_url,  # the browser calls the API on loopback, where it is
            "DO_NOT_TRACK": "1",
            "PREFECT_WORKER_QUERY_SECONDS": "1",  # the worker picks up a new run within a second, not 10
            **(env or {}),
        }
        self.procs: list[subprocess.Popen] = []

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "w")
        proc = subprocess.Popen([str(BIN / "prefect"), *args], cwd=REPO, env={**self.env, **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.procs.append(proc)
        return proc

    def wait_healthy(self, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"prefect server exited {proc.returncode}:\n{tail(self.home / 'server.log')}"
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"prefect server not healthy after {timeout_s:.0f} s:\n{tail(self.home / 'server.log')}")

    def run(self, *cmd: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout_s)

    @contextmanager
    def client(self) -> Iterator[Any]:
        """A sync Prefect client on this server, whatever server the rest of the test session uses."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            yield client

    def stop_all(self) -> None:
        for proc in reversed(self.procs):  # the worker before the server it talks to
            stop(proc)


def deploy(server: Server, *args: str) -> subprocess.CompletedProcess:
    """`thrifty deploy` in the repo root as a user runs it; it must leave prefect.yaml as it was."""
    yaml_before = (REPO / "prefect.yaml").read_text()
    out = server.run(str(BIN / "thrifty"), "deploy", *args)
    assert out.returncode == 0, f"thrifty deploy failed:\n{out.stdout}\n{out.stderr}"
    assert f"work pool '{WORK_POOL}' ({WORK_POOL_TYPE})" in out.stderr
    assert (REPO / "prefect.yaml").read_text() == yaml_before, "deploy must not rewrite prefect.yaml"
    return out


@contextmanager
def deployed_server(home: Path, ui: bool = False, deploy_args: tuple[str, ...] = (),
                    env: dict[str, str] | None = None) -> Iterator[Server]:
    """A fresh server (with its UI when ``ui``) and `thrifty deploy` run against it; everything stopped after.
    ``env`` adds to the server's and its clients' environment (e.g. PREFECT_API_DATABASE_CONNECTION_URL)."""
    server = Server(home, ui=ui, env=env)
    try:
        server.wait_healthy(server.spawn("server", "server", "start", "--host", "127.0.0.1",
                                         "--port", server.env["PREFECT_SERVER_API_PORT"]))
        server.deploy_output = deploy(server, *deploy_args)
        yield server
    finally:
        server.stop_all()


# the worker's training jobs take at least 2 ms a step (thrifty.faults.pace): a run of N steps lasts at least N x 2 ms
# on any machine, so a test can know that a budget runs out before the end
WORKER_ENV = {"THRIFTY_MIN_STEP_S": "0.002"}
SHARED = "deployed_ui_server"  # the fixture's name: the modules that request it run one after another (conftest)
_shared: dict[str, Any] = {}  # the running server and the ExitStack that stops it


def _next_module_uses_it(request: pytest.FixtureRequest) -> bool:
    """Whether the module that runs right after this one requests the shared server too (then it stays up)."""
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.module is request.module]
    following = items[mine[-1] + 1] if mine and mine[-1] + 1 < len(items) else None
    return following is not None and SHARED in following.fixturenames


@pytest.fixture(scope="module")
def deployed_ui_server(tmp_path_factory, request) -> Iterator[Server]:
    """A server with its UI, `thrifty deploy` run on it once (no alerts block: the deploy's 'next steps'), and a
    process worker on its pool (``server.worker``, logging to worker.log). Kept up while the next module uses it too,
    stopped after the last one, so it never idles beside unrelated tests."""
    if "server" not in _shared:
        stack = ExitStack()
        server = stack.enter_context(deployed_server(tmp_path_factory.mktemp("prefect-deployed"), ui=True))
        server.worker = server.spawn("worker", "worker", "start", "--pool", WORK_POOL, env=WORKER_ENV)
        _shared.update(server=server, stack=stack)
        # under pytest-xdist the next module may run on another worker and never come here: stopped at the end then
        request.config.add_cleanup(_stop_shared)
    yield _shared["server"]
    if not _next_module_uses_it(request):
        _stop_shared()


def _stop_shared() -> None:
    if "server" in _shared:
        _shared.pop("server")
        _shared.pop("stack").close()  # the worker first, then the server (Server.stop_all)


def wait_final(server: Server, flow_run_id: str, worker: subprocess.Popen | None = None,
               timeout_s: float = 240.0) -> Any:
    """Poll a flow run until its state is final; fail with the worker's log when it takes too long."""
    deadline = time.monotonic() + timeout_s
    with server.client() as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            if flow_run.state is not None and flow_run.state.is_final():
                return flow_run
            if worker is not None:
                assert worker.poll() is None, f"worker exited {worker.returncode}:\n{tail(server.home / 'worker.log')}"
            assert time.monotonic() < deadline, (f"flow run still {flow_run.state_name} after {timeout_s:.0f} s:\n"
                                                 f"{tail(server.home / 'worker.log')}")
            time.sleep(0.5)


# ---------------------------------------------------------------- PostgreSQL: Debian's packaged server, on loopback

PG_INSTALL = "apt-get update && apt-get install -y postgresql"


def postgres_bin() -> Path:
    """The newest /usr/lib/postgresql/<major>/bin; fails with the install command when there is none."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    assert found, f"PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb); install it: `{PG_INSTALL}`"
    return found[-1].parent


@contextmanager
def postgres_cluster(database: str = "prefect") -> Iterator[str]:
    """A private PostgreSQL cluster in a temp dir, listening on 127.0.0.1 only (unix socket in the temp dir), with
    ``database`` created; yields its SQLAlchemy asyncpg URL. The postmaster is our child, stopped by its pid.

    As root the cluster runs as the ``postgres`` user (PostgreSQL refuses root), so the dir is made theirs."""
    pg_bin = postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="thrifty-pg-"))
    data, port, password = root / "data", free_loopback_port(), "thrifty-test"
    as_user: list[str] = []
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--"]
    (pwfile := root / "pw").write_text(password)
    os.chmod(pwfile, 0o644)
    postmaster = None
    try:
        init = subprocess.run([*as_user, str(pg_bin / "initdb"), "-D", str(data), "-U", "thrifty", "-A", "scram-sha-256",
                               f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"],
                              capture_output=True, text=True, timeout=120, cwd=root)
        assert init.returncode == 0, f"initdb failed:\n{init.stdout}\n{init.stderr}"
        log = open(root / "postgres.log", "w")
        # fsync off: a test cluster that dies with the test needs no durability, and it is much faster on a busy disk
        postmaster = subprocess.Popen([*as_user, str(pg_bin / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                                       "-p", str(port), "-k", str(root), "-c", "fsync=off",
                                       "-c", "synchronous_commit=off", "-c", "max_connections=200"],
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=root)
        log.close()
        env = {**os.environ, "PGPASSWORD": password}
        deadline = time.monotonic() + 60
        while True:
            assert postmaster.poll() is None, f"postgres exited {postmaster.returncode}:\n{tail(root / 'postgres.log')}"
            made = subprocess.run([str(pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "thrifty",
                                   database], capture_output=True, text=True, env=env, timeout=30)
            if made.returncode == 0:
                break
            assert time.monotonic() < deadline, f"createdb failed: {made.stderr}\n{tail(root / 'postgres.log')}"
            time.sleep(0.3)
        yield f"postgresql+asyncpg://thrifty:{password}@127.0.0.1:{port}/{database}"
    finally:
        if postmaster is not None and postmaster.poll() is None:
            postmaster.send_signal(signal.SIGINT)  # "fast" shutdown: disconnect clients, stop cleanly
            try:
                postmaster.wait(30)
            except subprocess.TimeoutExpired:
                stop(postmaster)
        shutil.rmtree(root, ignore_errors=True)
