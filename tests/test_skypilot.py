"""The SkyPilot launcher: RunConfig -> sky.Task (golden YAML through SkyPilot's own parser), plan, preflight,
and submit/status/cancel against faked SDK calls shaped like SkyPilot 0.14's responses.

Only the calls that need an API server or a cloud are faked (sky.jobs.launch, sky.jobs.queue_v2,
sky.jobs.cancel, sky.get); queue records go through SkyPilot's own response decoder. A guard makes
any non-loopback connection fail the test. Regenerate the golden files with THRIFTY_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import copy
import json
import os
import socket
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from thrifty.config import ConfigError, build_config, config_from_env
from thrifty.launchers import JobState, make_launcher
from thrifty.launchers.notice import EXIT_RESUMABLE, STOP_KEY, STOPPED_KEY
from thrifty.launchers import skypilot as sp
from thrifty.money.ledger import write_job_attempts
from thrifty.runs import run_key
from thrifty.storage import open_store

sky = pytest.importorskip("sky", reason="SkyPilot is part of the [cloud] extra that `make install` installs")

GOLDEN = Path(__file__).parent / "golden"
PLACEHOLDER = "<the RunConfig as JSON: checked by test_envs_carry_the_run_config>"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test here may reach a cloud, a metadata service or a SkyPilot API server: loopback only."""
    real_connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"test tried to connect to {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS",
                "AZURE_CLIENT_ID", "AZURE_TENANT_ID", "SKYPILOT_API_SERVER_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)


def cloud_cfg(store: str = "s3://thrifty-test-bucket/runs", **compute):
    data = {"run_name": "cloud-run", "recipe": "codelm", "store": store,
            "compute": {"launcher": "skypilot", "on_demand_fallback": False, **compute}}
    return build_config(data)


CASES = {
    "single_node": cloud_cfg(),
    "multi_node": cloud_cfg(num_nodes=2, accelerators=["A100:8"], disk_size_gb=500, max_restarts=5),
    "spot_fallback": cloud_cfg(on_demand_fallback=True, accelerators=["L4:1", "A10G:1"], max_hourly_cost=1.0,
                               clouds=["aws", "gcp"], regions=["aws/us-east-1", "aws/us-west-2"]),
    "aws_only": cloud_cfg(clouds=["aws"], accelerators=["T4:1"]),
    "gcp_only": cloud_cfg(clouds=["gcp"], accelerators=["T4:1"], job_recovery_strategy="FAILOVER"),
    "azure_only": cloud_cfg(clouds=["azure"], accelerators=["T4:1"]),
    # the user's cluster beside a cloud: no spot market there, so its entries say use_spot false
    "kubernetes": cloud_cfg(clouds=["kubernetes", "aws"], accelerators=["A10G:1"], on_demand_fallback=True),
}


def golden_config(cfg) -> dict:
    config = sp.task_config(cfg, source="offline")
    config["envs"] = {**config["envs"], "THRIFTY_RUN_CONFIG": PLACEHOLDER}
    return config


# ---------------------------------------------------------------- golden YAML through SkyPilot's parser


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_task_yaml(case):
    text = sp.task_yaml(golden_config(CASES[case]))
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("THRIFTY_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; rerun with THRIFTY_UPDATE_GOLDEN=1 if intended"


def parse(case: str):
    return sky.Task.from_yaml_config(yaml.safe_load((GOLDEN / f"{case}.yaml").read_text()))


def candidates_of(task) -> list[tuple[str, str, bool]]:
    out = []
    for r in task.resources:
        (name, count), = r.accelerators.items()
        out.append((str(r.cloud).lower(), f"{name}:{count}", r.use_spot) if r.region is None
                   else (f"{str(r.cloud).lower()}/{r.region}", f"{name}:{count}", r.use_spot))
    return sorted(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_parses_and_recovery_is_identical_on_every_candidate(case):
    cfg = CASES[case]
    task = parse(case)
    assert task.name == "thrifty-cloud-run" and task.num_nodes == cfg.compute.num_nodes
    recoveries = [r.job_recovery for r in task.resources]
    assert len(recoveries) >= 1 and all(jr == recoveries[0] for jr in recoveries)
    assert recoveries[0] == {"strategy": cfg.compute.job_recovery_strategy,
                             "max_restarts_on_errors": cfg.compute.max_restarts,
                             "recover_on_exit_codes": [EXIT_RESUMABLE]}
    assert task.envs["THRIFTY_RUN_ID"] == "cloud-run" and task.envs["THRIFTY_RUN_CONFIG"] == PLACEHOLDER
    assert "pip install --quiet --python ~/.thrifty/venv/bin/python ." in task.setup and "--python 3.11" in task.setup
    assert "thrifty.launchers.notice --prime" in task.setup
    assert "python -m thrifty.launchers.notice --signal-children --" in task.run
    # the YAML SkyPilot writes back parses to the same task
    again = sky.Task.from_yaml_config(task.to_yaml_config())
    assert candidates_of(again) == candidates_of(task) and again.envs == task.envs and again.run == task.run


def test_single_node_is_spot_on_each_priced_cloud_and_accelerator():
    task = parse("single_node")
    assert candidates_of(task) == [("aws", "A10G:1", True), ("aws", "L4:1", True), ("gcp", "L4:1", True)]
    assert "--standalone --nnodes=1" in task.run and "SKYPILOT_NODE_RANK\"" not in task.run


def test_multi_node_runs_torchrun_across_nodes_with_skypilot_variables():
    task = parse("multi_node")
    assert task.num_nodes == 2
    run = task.run
    for piece in ('--nnodes="$SKYPILOT_NUM_NODES"', '--node-rank="$SKYPILOT_NODE_RANK"',
                  '--nproc-per-node="${SKYPILOT_NUM_GPUS_PER_NODE:-1}"', 'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
                  '--master-addr="$MASTER_ADDR"'):
        assert piece in run, piece
    assert {r.disk_size for r in task.resources} == {500}
    assert candidates_of(task) == [("aws", "A100:8", True), ("azure", "A100:8", True), ("gcp", "A100:8", True)]


def test_spot_with_on_demand_fallback_regions_and_price_cap():
    task = parse("spot_fallback")
    got = candidates_of(task)
    spot = [c for c in got if c[2]]
    on_demand = [c for c in got if not c[2]]
    assert spot and on_demand and {c[:2] for c in spot} == {c[:2] for c in on_demand}
    assert ("aws/us-east-1", "A10G:1", True) in got and ("aws/us-west-2", "L4:1", False) in got
    assert ("gcp", "L4:1", True) in got and not any(c[0].startswith("azure") for c in got)
    assert {r.max_hourly_cost for r in task.resources} == {1.0}


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_each_cloud_alone(cloud):
    task = parse(f"{cloud}_only")
    assert candidates_of(task) == [(cloud, "T4:1", True)]


def test_envs_carry_the_run_config():
    cfg = CASES["multi_node"]
    task = sp.build_task(sp.task_config(cfg, source="offline"))
    assert config_from_env(task.envs) == cfg
    assert task.envs["THRIFTY_RUN_ID"] == cfg.run_name  # the store key: a new job of this run resumes its checkpoints


def test_mount_cached_store_is_mounted_and_the_node_uses_the_mount():
    cfg = cloud_cfg(store_access="mount_cached")
    config = sp.task_config(cfg, source="offline")
    assert config["file_mounts"] == {sp.STORE_MOUNT: {"source": "s3://thrifty-test-bucket/runs", "mode": "MOUNT_CACHED"}}
    task = sp.build_task(config)
    assert sp.STORE_MOUNT in task.storage_mounts
    assert config_from_env(task.envs).store == sp.STORE_MOUNT


def test_a_local_store_cannot_be_sent_to_a_node():
    with pytest.raises(ConfigError, match="cannot reach"):
        sp.store_mount_source("/tmp/store")


def test_job_names_are_valid_skypilot_names():
    assert sp.job_name(build_config({"run_name": "a_b.c---d-"})) == "thrifty-a_b.c--d"
    sky.Task.from_yaml_config({"name": sp.job_name(build_config({"run_name": "x..__y"})), "run": "true"})


# ---------------------------------------------------------------- plan (offline)


def test_plan_prints_a_task_skypilot_accepts_and_the_cheapest_candidates(tmp_path, capsys):
    from thrifty.cli import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"run_name": "cloud-run", "store": "gs://b/p",
                                    "compute": {"launcher": "skypilot", "accelerators": ["T4:1", "A100:1"]}}))
    assert main(["plan", "--config", str(path), "--source", "offline"]) == 0
    out = capsys.readouterr().out
    task = sky.Task.from_yaml_config(yaml.safe_load(out))  # the cost table is YAML comments
    # T4 on 3 clouds, A100:1 on gcp and azure (AWS sells A100s by 8), each spot + on-demand (fallback is on)
    assert len(task.resources) == 10
    lines = [line for line in out.splitlines() if line.startswith("#   ") and "$/h" not in line]
    assert "T4:1" in lines[0] and "spot" in lines[0] and "0.158" in lines[0]
    assert "offline table (" in out and "Estimated cost" in out
    assert main(["plan", "--config", str(path), "--set", "compute.accelerators=[X9:1]"]) == 2
    assert "none of ['X9:1'] has a known price" in capsys.readouterr().err


# ---------------------------------------------------------------- preflight (offline)


def _credentials(home: Path, clouds=("aws", "gcp", "azure")) -> None:
    files = {"aws": ".aws/credentials", "gcp": ".config/gcloud/application_default_credentials.json",
             "azure": ".azure/azureProfile.json"}
    for c in clouds:
        (home / files[c]).parent.mkdir(parents=True, exist_ok=True)
        (home / files[c]).write_text("{}")


def test_preflight_names_each_cloud_without_credentials_and_how_to_fix_it(tmp_path):
    env = {"HOME": str(tmp_path)}
    cfg = cloud_cfg(workdir=str(REPO))
    with pytest.raises(ConfigError) as err:
        sp.preflight(cfg, env)
    msg = str(err.value)
    assert "no aws credentials" in msg and "`aws configure`" in msg
    assert "no gcp credentials" in msg and "gcloud auth application-default login" in msg
    assert "no azure credentials" in msg and "`az login`" in msg
    _credentials(tmp_path, ("aws", "gcp"))
    with pytest.raises(ConfigError, match="no azure credentials") as err:
        sp.preflight(cfg, env)
    assert "aws credentials" not in str(err.value)
    _credentials(tmp_path)
    sp.preflight(cfg, env)
    sp.preflight(cloud_cfg(workdir=str(REPO), clouds=["aws"]), {"HOME": str(tmp_path / "x"), "AWS_ACCESS_KEY_ID": "a",
                                                                 "AWS_SECRET_ACCESS_KEY": "b"})


def test_preflight_skips_credentials_with_a_remote_api_server(tmp_path):
    (tmp_path / ".sky").mkdir()
    (tmp_path / ".sky" / "config.yaml").write_text("api_server:\n  endpoint: https://sky.example.com\n")
    sp.preflight(cloud_cfg(workdir=str(REPO)), {"HOME": str(tmp_path)})
    assert sp.remote_api_server({"HOME": str(tmp_path), "SKYPILOT_API_SERVER_ENDPOINT": "http://127.0.0.1:46580"}) is None


def test_preflight_lists_every_problem_at_once(tmp_path):
    _credentials(tmp_path)
    cfg = build_config({"run_name": "r", "store": str(tmp_path / "store"),
                        "compute": {"launcher": "skypilot", "accelerators": ["A10G:1", "Q7:1"], "max_hourly_cost": 0.05,
                                    "workdir": str(tmp_path)}})
    with pytest.raises(ConfigError) as err:
        sp.preflight(cfg, {"HOME": str(tmp_path)})
    msg = str(err.value)
    assert "'store'" in msg and "cannot reach" in msg
    assert "no price for Q7:1" in msg
    assert "'compute.max_hourly_cost': $0.05/h is below every candidate" in msg
    assert "'compute.workdir'" in msg and "pyproject.toml" in msg


def test_check_before_spending_runs_the_skypilot_checks(tmp_path):
    from thrifty.launchers.preflight import check_before_spending

    cfg = build_config({"run_name": "r", "store": str(tmp_path / "s"), "compute": {"launcher": "skypilot"}})
    with pytest.raises(ConfigError, match="SkyPilot launch is not ready"):
        check_before_spending(cfg)
    assert isinstance(make_launcher(cfg), sp.SkyPilotLauncher)


# ---------------------------------------------------------------- submit / status / cancel, SDK faked

T0 = 1_767_225_600.0  # 2026-01-01
STAMP = "sky-2026-01-01-00-00-00-000000"


def record(job_id: int, status: str, **kw) -> dict:
    """A managed-job record as the API server sends it for queue_v2 (before SkyPilot's client decoder)."""
    rec = {"job_id": job_id, "task_id": 0, "job_name": "thrifty-cloud-run", "task_name": "thrifty-cloud-run",
           "status": status, "recovery_count": 0, "submitted_at": T0, "start_at": None, "end_at": None,
           "last_recovered_at": -1, "cloud": "-", "region": "-", "zone": "-", "infra": "-",
           "cluster_resources": "-", "cluster_resources_full": "-", "resources": "1x[spot](gpus=A10G:1, ...)",
           "accelerators": None, "failure_reason": None, "details": None, "run_timestamp": STAMP}
    rec.update(kw)
    return rec


def on_cluster(cloud: str, region: str, instance: str, gpu: str, spot: bool = True, **kw) -> dict:
    name, count = gpu.split(":")
    tag = "[spot]" if spot else ""
    return {"cloud": cloud, "region": region, "zone": f"{region}a", "infra": f"{cloud} ({region})",
            "cluster_resources": f"1x{tag}(gpus={gpu}, {instance[:15]}, ...)",
            "cluster_resources_full": f"1x{tag}(gpus={gpu}, cpus=4, mem=16, {instance}, disk=256)",
            "accelerators": {name: int(count)}, **kw}


class FakeSky:
    """sky.jobs.launch / queue_v2 / cancel return request ids; sky.get returns what SkyPilot 0.14 returns for them."""

    def __init__(self, monkeypatch):
        from sky.server.requests.serializers import decoders

        self.decode_queue = decoders.decode_jobs_queue_v2
        self.records: dict[int, dict] = {}
        self.launched: list = []
        self.cancelled: list[dict] = []
        self.queries: list[dict] = []
        self._pending: dict[str, tuple] = {}
        self.next_id = 7
        monkeypatch.setattr(sky.jobs, "launch", self.launch)
        monkeypatch.setattr(sky.jobs, "queue_v2", self.queue_v2)
        monkeypatch.setattr(sky.jobs, "cancel", self.cancel)
        monkeypatch.setattr(sky, "get", self.get)

    def _request(self, kind: str, *payload) -> str:
        rid = f"req-{len(self._pending)}"
        self._pending[rid] = (kind, *payload)
        return rid

    def launch(self, task, name=None, **kw):
        self.launched.append((task, name))
        job_id = self.next_id
        self.records[job_id] = record(job_id, "PENDING", job_name=name, task_name=name)
        return self._request("launch", job_id)

    def queue_v2(self, refresh, skip_finished=False, all_users=False, job_ids=None, fields=None, **kw):
        self.queries.append({"job_ids": job_ids, "fields": fields})
        return self._request("queue", job_ids)

    def cancel(self, name=None, job_ids=None, graceful=False, **kw):
        self.cancelled.append({"job_ids": job_ids, "graceful": graceful})
        for j in job_ids:
            self.records[j]["status"] = "CANCELLING"
        return self._request("cancel")

    def get(self, request_id):
        kind, *payload = self._pending.pop(request_id)
        if kind == "launch":
            return [payload[0]], None  # (job_ids, controller handle)
        if kind == "queue":
            jobs = [copy.deepcopy(r) for j, r in self.records.items() if payload[0] is None or j in payload[0]]
            return self.decode_queue({"jobs": jobs, "total": len(jobs), "total_no_filter": len(self.records),
                                      "status_counts": {}})
        return None

    def set(self, job_id: int, **kw) -> None:
        self.records[job_id].update(kw)


@pytest.fixture
def fake(monkeypatch):
    return FakeSky(monkeypatch)


def test_submit_launches_a_real_task_with_an_absolute_workdir(fake, tmp_path):
    cfg = cloud_cfg(workdir=str(REPO))
    launcher = sp.SkyPilotLauncher(cfg)
    job_id = launcher.submit(cfg)
    assert job_id == "sky-7"
    task, name = fake.launched[0]
    assert isinstance(task, sky.Task) and name == "thrifty-cloud-run" == task.name
    assert task.workdir == str(REPO) and task.envs["THRIFTY_RUN_ID"] == "cloud-run"
    assert launcher.status(job_id).state is JobState.PENDING
    assert fake.queries[-1]["job_ids"] == [7] and "recovery_count" in fake.queries[-1]["fields"]


def test_submit_orders_the_task_by_the_gates_estimate_cheapest_run_first(fake):
    """The budget gate's speeds reach the launched task: a long run tries the H100 (dearer per hour) first."""
    from thrifty.money.estimate import estimate_run
    from thrifty.money.throughput import Measured, speeds_for

    cfg = cloud_cfg(workdir=str(REPO), clouds=["aws", "azure"], accelerators=["A10G:1", "H100:1"])
    measured = {n: Measured(accelerator=n, examples_per_s_per_gpu=v, windows=3, runs=["r"])
                for n, v in (("A10G", 1000.0), ("H100", 12000.0))}
    speeds = speeds_for(["A10G", "H100"], measured)
    launcher = sp.SkyPilotLauncher(cfg)
    for steps, first in ((1_000_000, "H100"), (100, "A10G")):  # 64M examples: hours; 6400: the start-up decides
        estimate = estimate_run(steps, 1.0, cfg.train.examples_per_step(1), 2.79, 1, "H100:1", "skypilot", speeds=speeds)
        launcher.submit(cfg, estimate=estimate)
        task, _ = fake.launched[-1]
        assert [next(iter(r.accelerators)) for r in task.resources] == ([first] + [n for n in ("A10G", "H100") if n != first])
        fake.next_id += 1


def test_status_follows_a_preemption_into_ledger_rows(fake, tmp_path):
    cfg = cloud_cfg(workdir=str(REPO), store=str(tmp_path / "store"))
    clock = {"now": T0}
    launcher = sp.SkyPilotLauncher(cfg, clock=lambda: clock["now"])
    job = launcher.submit(cfg)

    fake.set(7, status="STARTING")
    assert launcher.status(job).state is JobState.STARTING and launcher.attempts(job) == []

    fake.set(7, status="RUNNING", start_at=T0 + 300, last_recovered_at=T0 + 300,
             **on_cluster("AWS", "us-east-1", "g5.xlarge", "A10G:1"))
    clock["now"] = T0 + 400
    st = launcher.status(job)
    assert st.state is JobState.RUNNING and len(st.attempts) == 1
    first = st.attempts[0]
    assert (first.cloud, first.region, first.instance, first.spot, first.started_unix) == ("aws", "us-east-1", "g5.xlarge", True, T0 + 300)
    assert first.usd_per_hour == 0.302 and first.ended_unix is None and first.number == 1
    assert first.task_id == "sky-managed-2026-01-01-00-00-00-000000_thrifty-cloud-run_7-0"
    assert "SkyPilot RUNNING on aws us-east-1 g5.xlarge spot" in st.message and first.task_id in st.message

    clock["now"] = T0 + 3900
    fake.set(7, status="RECOVERING")
    st = launcher.status(job)
    assert st.state is JobState.RECOVERING
    assert (st.attempts[0].ended_unix, st.attempts[0].end_reason) == (T0 + 3900, "preempted")

    fake.set(7, status="RUNNING", recovery_count=1, last_recovered_at=T0 + 4200,
             **on_cluster("GCP", "us-central1", "g2-standard-4", "L4:1"))
    clock["now"] = T0 + 4300
    st = launcher.status(job)
    assert st.state is JobState.RUNNING and st.recoveries == 1
    second = st.attempts[1]
    assert (second.number, second.cloud, second.instance, second.started_unix) == (2, "gcp", "g2-standard-4", T0 + 4200)
    assert second.usd_per_hour == 0.283 and second.task_id == first.task_id  # stable across recoveries

    fake.set(7, status="SUCCEEDED", end_at=T0 + 7800)
    st = launcher.status(job)
    assert st.state is JobState.SUCCEEDED and st.state.terminal
    assert [(a.end_reason, a.ended_unix) for a in st.attempts] == [("preempted", T0 + 3900), ("succeeded", T0 + 7800)]
    assert sum(a.cost_usd() for a in st.attempts) == pytest.approx(1.0 * 0.302 + 1.0 * 0.283)
    assert st.attempts[0].row()["task_id"] == first.task_id  # ledger rows carry SKYPILOT_TASK_ID

    # a watcher that restarts picks up the history from the run's ledger
    write_job_attempts(open_store(cfg.store), "cloud-run", job, st.attempts)
    again = sp.SkyPilotLauncher(cfg)
    assert [a.instance for a in again.status(job).attempts] == ["g5.xlarge", "g2-standard-4"]


def test_a_recovery_missed_between_polls_still_opens_a_new_attempt(fake):
    cfg = cloud_cfg(workdir=str(REPO))
    launcher = sp.SkyPilotLauncher(cfg, clock=lambda: T0 + 9000)
    fake.records[3] = record(3, "RUNNING", start_at=T0, last_recovered_at=T0, **on_cluster("AWS", "us-east-1", "g5.xlarge", "A10G:1"))
    launcher.status("sky-3")
    fake.set(3, recovery_count=1, last_recovered_at=T0 + 5000)  # same instance type, a new VM
    attempts = launcher.status("sky-3").attempts
    assert [(a.number, a.started_unix, a.ended_unix, a.end_reason) for a in attempts] == [
        (1, T0, T0 + 5000, "preempted"), (2, T0 + 5000, None, None)]


def test_every_skypilot_state_maps_and_failures_say_why(fake):
    for status in sky.jobs.ManagedJobStatus:
        state, name = sp.record_state({"status": status})
        assert name == status.value
        assert state.terminal == status.is_terminal(), status
        assert (state is JobState.FAILED) == status.is_failed(), status
    launcher = sp.SkyPilotLauncher(cloud_cfg())
    fake.records[4] = record(4, "FAILED_NO_RESOURCE", failure_reason="No resource satisfying the request: A10G:1 spot")
    st = launcher.status("sky-4")
    assert st.state is JobState.FAILED and "FAILED_NO_RESOURCE" in st.message and "No resource" in st.message
    assert st.attempts == []


def test_unknown_job_ids_are_errors(fake):
    from thrifty.launchers.base import LaunchError

    launcher = sp.SkyPilotLauncher()
    with pytest.raises(LaunchError, match="has no managed job 99"):
        launcher.status("sky-99")
    with pytest.raises(LaunchError, match="not a SkyPilot job id"):
        launcher.status("local-abc")


def test_cancel_asks_the_node_to_checkpoint_then_cancels_gracefully(fake, tmp_path):
    cfg = cloud_cfg(workdir=str(REPO), store=str(tmp_path / "store"))
    store = open_store(cfg.store)
    slept = []

    def node_acknowledges(seconds):  # what the node's watcher does once the trainer has saved
        slept.append(seconds)
        stop = json.loads(store.get_bytes(run_key("cloud-run", STOP_KEY)))
        assert stop["managed_job_id"] == 7 and stop["job_id"] == "sky-7"
        store.put_bytes(run_key("cloud-run", STOPPED_KEY.format(job=7)), b"{}")

    launcher = sp.SkyPilotLauncher(cfg, sleep=node_acknowledges)
    job = launcher.submit(cfg)
    fake.set(7, status="RUNNING", start_at=T0, last_recovered_at=T0, **on_cluster("AWS", "us-east-1", "g5.xlarge", "A10G:1"))
    launcher.cancel(job)
    assert len(slept) == 1
    assert fake.cancelled == [{"job_ids": [7], "graceful": True}]
    assert launcher.status(job).state is JobState.RUNNING  # CANCELLING still runs (and bills) until torn down
    fake.set(7, status="CANCELLED", end_at=T0 + 60)
    st = launcher.status(job)
    assert st.state is JobState.CANCELLED and st.attempts[-1].end_reason == "cancelled"


def test_cancel_gives_up_waiting_after_the_timeout_and_skips_pending_jobs(fake, tmp_path):
    cfg = cloud_cfg(workdir=str(REPO), store=str(tmp_path / "store"), stop_checkpoint_timeout_s=10)
    clock = {"now": T0}
    launcher = sp.SkyPilotLauncher(cfg, sleep=lambda s: clock.update(now=clock["now"] + s), clock=lambda: clock["now"])
    job = launcher.submit(cfg)
    launcher.cancel(job)  # PENDING: nothing to checkpoint, cancel at once
    assert fake.cancelled[-1] == {"job_ids": [7], "graceful": True} and clock["now"] == T0
    assert not open_store(cfg.store).exists(run_key("cloud-run", STOP_KEY))

    fake.set(7, status="RUNNING", start_at=T0, last_recovered_at=T0, **on_cluster("AWS", "us-east-1", "g5.xlarge", "A10G:1"))
    launcher.cancel(job)  # no acknowledgement ever comes
    assert clock["now"] >= T0 + 10 and len(fake.cancelled) == 2

    fake.set(7, status="CANCELLED")
    launcher.cancel(job)  # already over: nothing to do
    assert len(fake.cancelled) == 2


def test_an_unknown_instance_is_never_metered_at_zero():
    launcher = sp.SkyPilotLauncher(cloud_cfg())
    assert launcher._price("aws", "g5.4xlarge", "A10G:1", True) == 0.302  # by its accelerator
    assert launcher._price("aws", "mystery.large", None, True) == max(
        k.quote.usd_per_hour for k in sp.candidates(cloud_cfg())[0] if k.cloud == "aws")
    from thrifty.launchers.base import LaunchError

    with pytest.raises(LaunchError, match="no price"):
        sp.SkyPilotLauncher()._price("aws", "mystery.large", None, True)


def test_the_cloud_example_plans():
    from thrifty.config import load_config

    cfg = load_config(REPO / "examples" / "cloud.yaml")
    assert cfg.compute.launcher == "skypilot"
    task = sp.build_task(sp.task_config(cfg, source="offline"))
    assert {r.max_hourly_cost for r in task.resources} == {1.0}
    assert "Note: compute.launcher" not in sp.plan_text(cfg, source="offline")
