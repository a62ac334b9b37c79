"""SkyPilot managed jobs behind the Launcher protocol: RunConfig -> ``sky.Task``, submit, status, cancel.

The task: ``setup`` installs the project (synced as the workdir) on each node; ``run`` starts the
training program under the spot-notice watcher (``thrifty.launchers.notice``), through torchrun
across nodes with SkyPilot's node variables; ``envs`` carry the RunConfig (``node_env``).
Resources are ``any_of`` candidates, one per (cloud[/region], accelerator[, spot|on-demand]) that
the price source knows, sharing one ``job_recovery`` (identical on every candidate, as SkyPilot
requires) whose ``recover_on_exit_codes`` holds the watcher's "stopped on a notice" code.

The store key is the run name (``THRIFTY_RUN_ID``), not ``SKYPILOT_TASK_ID``: a run stopped at its
budget and resumed later under a new managed job continues from its checkpoints. The task id
(stable across recoveries of one job) is logged by the node and kept in every ledger row.

Only ``submit``, ``status`` and ``cancel`` reach SkyPilot's API server (``sky.jobs.launch``,
``sky.jobs.queue_v2``, ``sky.jobs.cancel``, ``sky.get``); building the task and ``plan`` are offline.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from thrifty.config import ConfigError, RunConfig
from thrifty.launchers.base import JobState, JobStatus, LaunchError, node_env
from thrifty.pricing import PricingError, Quote, parse_accelerator, quote_accelerator
from thrifty.protocol import EXIT_RESUMABLE, STOP_KEY, STOPPED_KEY
from thrifty.runs import Attempt

log = logging.getLogger("thrifty.launch")

JOB_PREFIX = "sky-"  # our job ids: sky-<managed job id>
STORE_MOUNT = "/thrifty-store"  # where a MOUNT_CACHED store appears on the node
VENV = "~/.thrifty/venv"
MASTER_PORT = 29500
QUEUE_FIELDS = [
    "job_id", "task_id", "job_name", "task_name", "status", "recovery_count", "submitted_at", "start_at", "end_at",
    "last_recovered_at", "cloud", "region", "zone", "infra", "cluster_resources", "cluster_resources_full",
    "resources", "accelerators", "failure_reason", "details", "run_timestamp",
]

# SkyPilot's ManagedJobStatus -> ours. CANCELLING and WINDING_DOWN still run (and bill).
STATE_MAP = {
    "PENDING": JobState.PENDING, "SUBMITTED": JobState.PENDING, "STARTING": JobState.STARTING,
    "RUNNING": JobState.RUNNING, "WINDING_DOWN": JobState.RUNNING, "CANCELLING": JobState.RUNNING,
    "RECOVERING": JobState.RECOVERING, "SUCCEEDED": JobState.SUCCEEDED, "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED, "FAILED_SETUP": JobState.FAILED, "FAILED_PRECHECKS": JobState.FAILED,
    "FAILED_NO_RESOURCE": JobState.FAILED, "FAILED_CONTROLLER": JobState.FAILED,
}
END_REASON = {JobState.SUCCEEDED: "succeeded", JobState.CANCELLED: "cancelled", JobState.FAILED: "failed"}


# ---------------------------------------------------------------- candidates and the task


@dataclass(frozen=True)
class Candidate:
    """One ``any_of`` entry with the price the plan expects for it."""

    cloud: str
    region: str | None
    accelerator: str
    spot: bool
    quote: Quote
    nodes: int
    within_cap: bool  # price at or below compute.max_hourly_cost (SkyPilot would skip it otherwise)

    @property
    def infra(self) -> str:
        return f"{self.cloud}/{self.region}" if self.region else self.cloud

    @property
    def usd_per_hour(self) -> float:
        """The whole job: every node."""
        return self.quote.usd_per_hour * self.nodes


def candidates(cfg: RunConfig, source: str = "auto") -> tuple[list[Candidate], list[str]]:
    """Priced candidates, cheapest first, and notes on the combinations left out (not offered or unpriced)."""
    c = cfg.compute
    markets = [True, False] if c.use_spot and c.on_demand_fallback else [c.use_spot]
    out, notes = [], []
    for cloud in c.clouds:
        regions = [r.split("/", 1)[1] for r in c.regions if r.startswith(cloud + "/")] or [None]
        for acc in c.accelerators:
            name, count = parse_accelerator(acc)
            acc = f"{name}:{count}"
            missing = []
            for spot in markets:
                try:
                    q = quote_accelerator(cloud, acc, spot, source)  # type: ignore[arg-type]
                except PricingError:
                    missing.append("spot" if spot else "on-demand")
                    continue
                for region in regions:
                    within = c.max_hourly_cost is None or q.usd_per_hour <= c.max_hourly_cost
                    out.append(Candidate(cloud, region, acc, spot, q, c.num_nodes, within))
            if missing:
                notes.append(f"{cloud} {acc} ({', '.join(missing)}): no price known, probably not offered there; left out")
    out.sort(key=lambda k: (not k.within_cap, k.usd_per_hour))
    return out, notes


def job_name(cfg: RunConfig) -> str:
    """A SkyPilot-valid name (``[a-zA-Z0-9]+([._-]{1,2}[a-zA-Z0-9]+)*``) for the run."""
    name = re.sub(r"[._-]{3,}", "--", f"thrifty-{cfg.run_name}").rstrip("._-")
    return name


def store_mount_source(store: str) -> str:
    """The bucket source SkyPilot mounts for a store URI (Azure needs the account in the URL)."""
    scheme, _, rest = store.partition("://")
    if scheme in ("s3", "gs"):
        return store.rstrip("/")
    if scheme == "az":
        account = os.environ.get("AZURE_STORAGE_ACCOUNT")
        if not account:
            m = re.search(r"AccountName=([^;]+)", os.environ.get("AZURE_STORAGE_CONNECTION_STRING", ""))
            account = m.group(1) if m else None
        if not account:
            raise ConfigError("'compute.store_access': mounting an az:// store needs the storage account; set "
                              "AZURE_STORAGE_ACCOUNT (or AZURE_STORAGE_CONNECTION_STRING), or use store_access=sdk")
        return f"https://{account}.blob.core.windows.net/{rest.rstrip('/')}"
    raise ConfigError(f"'store': {store!r} is on this machine, which a cloud node cannot reach; "
                      "use s3://bucket/prefix, gs://bucket/prefix or az://container/prefix with compute.launcher=skypilot")


SETUP = f"""\
set -euo pipefail
# Install the project (the synced workdir) into its own Python 3.11 venv. uv is on every SkyPilot node
# (SkyPilot's own runtime uses Python 3.10, too old for this project). Recoveries run this again on each new VM.
UV="$HOME/.local/bin/uv"; command -v "$UV" >/dev/null || UV=uv
[ -x {VENV}/bin/python ] || "$UV" venv --python 3.11 {VENV}
"$UV" pip install --quiet --python {VENV}/bin/python .
# Azure turns Scheduled Events on at the first request (which may take minutes): ask now, before training.
{VENV}/bin/python -m thrifty.launchers.notice --prime
"""

_RUN_HEAD = f"""\
set -uo pipefail
source {VENV}/bin/activate
echo "thrifty: run $THRIFTY_RUN_ID, SkyPilot task ${{SKYPILOT_TASK_ID:-?}} (managed job ${{SKYPILOT_MANAGED_JOB_ID:-?}}), node ${{SKYPILOT_NODE_RANK:-0}}/${{SKYPILOT_NUM_NODES:-1}}"
# The watcher polls this cloud's spot-notice endpoint and SIGTERMs the torchrun workers, which checkpoint
# and exit; it then exits {EXIT_RESUMABLE} (recover_on_exit_codes) so SkyPilot recovers without spending a restart.
"""

RUN_SINGLE = _RUN_HEAD + """\
exec python -m thrifty.launchers.notice --signal-children -- \\
  python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node="${SKYPILOT_NUM_GPUS_PER_NODE:-1}" \\
  -m training
"""

RUN_MULTI = _RUN_HEAD + f"""\
MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
exec python -m thrifty.launchers.notice --signal-children -- \\
  python -m torch.distributed.run --nnodes="$SKYPILOT_NUM_NODES" --node-rank="$SKYPILOT_NODE_RANK" \\
  --nproc-per-node="${{SKYPILOT_NUM_GPUS_PER_NODE:-1}}" --master-addr="$MASTER_ADDR" --master-port={MASTER_PORT} \\
  -m training
"""


def task_config(cfg: RunConfig, run_id: str | None = None, source: str = "auto") -> dict[str, Any]:
    """The SkyPilot task YAML (as a dict) for ``cfg``; what ``thrifty plan`` prints and ``submit`` launches."""
    c = cfg.compute
    run_id = run_id or cfg.run_name
    cands, _ = candidates(cfg, source)
    if not cands:
        raise ConfigError(f"'compute.accelerators': none of {c.accelerators} has a known price on {c.clouds}; "
                          "run `thrifty prices` to see what is offered where")
    node_cfg = cfg
    file_mounts: dict[str, Any] = {}
    if c.store_access == "mount_cached":
        file_mounts[STORE_MOUNT] = {"source": store_mount_source(cfg.store), "mode": "MOUNT_CACHED"}
        node_cfg = cfg.model_copy(update={"store": STORE_MOUNT})
    mixed = len({k.spot for k in cands}) > 1
    resources: dict[str, Any] = {}
    if not mixed:
        resources["use_spot"] = cands[0].spot
    if c.disk_size_gb is not None:
        resources["disk_size"] = c.disk_size_gb
    if c.max_hourly_cost is not None:
        resources["max_hourly_cost"] = c.max_hourly_cost
    # One job_recovery for the task: SkyPilot copies it into every any_of entry and refuses differing ones.
    resources["job_recovery"] = {
        "strategy": c.job_recovery_strategy,
        "max_restarts_on_errors": c.max_restarts,
        "recover_on_exit_codes": [EXIT_RESUMABLE],
    }
    any_of = []
    for k in sorted(cands, key=lambda k: (not k.spot, c.clouds.index(k.cloud), k.region or "",
                                          [parse_accelerator(a)[0] for a in c.accelerators].index(k.accelerator.split(":")[0]))):
        entry: dict[str, Any] = {"infra": k.infra, "accelerators": k.accelerator}
        if mixed:
            entry["use_spot"] = k.spot
        any_of.append(entry)
    resources["any_of"] = any_of
    config: dict[str, Any] = {
        "name": job_name(cfg),
        "workdir": c.workdir,
        "num_nodes": c.num_nodes,
        "resources": resources,
        "envs": node_env(node_cfg, run_id),
        "setup": SETUP,
        "run": RUN_MULTI if c.num_nodes > 1 else RUN_SINGLE,
    }
    if file_mounts:
        config["file_mounts"] = file_mounts
    return config


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, data: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def task_yaml(config: dict[str, Any]) -> str:
    """YAML text of a task config: scripts as literal blocks, keys in the order built."""
    shown = dict(config)
    for key in ("setup", "run"):
        if key in shown:
            shown[key] = _Literal(shown[key])
    return yaml.dump(shown, Dumper=_Dumper, sort_keys=False, width=1000)


def build_task(config: dict[str, Any]):
    """A real ``sky.Task``, parsed by SkyPilot's own YAML loader (offline; validates the schema)."""
    import sky

    try:
        return sky.Task.from_yaml_config(copy.deepcopy(config))  # SkyPilot pops keys from what it is given
    except Exception as exc:  # SkyPilot raises ValueError / jsonschema errors with a readable message
        raise ConfigError(f"SkyPilot rejected the task built from this config: {exc}") from exc


# ---------------------------------------------------------------- plan (offline)


def plan_text(cfg: RunConfig, source: str = "auto", show: int = 8) -> str:
    """``thrifty plan``: the task YAML, then the cheapest candidates with their estimated cost."""
    config = task_config(cfg, source=source)
    build_task(config)  # the YAML printed is one SkyPilot accepts
    cands, notes = candidates(cfg, source)
    lines = [task_yaml(config).rstrip(), "", f"# Estimated cost, cheapest first ({cfg.compute.num_nodes} node(s); "
             f"budget.max_usd ${cfg.budget.max_usd:g}):"]
    header = f"#   {'infra':<18} {'accelerator':<10} {'market':<9} {'instance':<26} {'$/h node':>9} {'$/h job':>9} {'budget lasts':>12}"
    lines.append(header)
    for k in cands[:show]:
        hours = cfg.budget.max_usd / k.usd_per_hour
        flag = "" if k.within_cap else "  (over max_hourly_cost: SkyPilot skips it)"
        lines.append(f"#   {k.infra:<18} {k.accelerator:<10} {'spot' if k.spot else 'on-demand':<9} {k.quote.instance:<26} "
                     f"{k.quote.usd_per_hour:>9.3f} {k.usd_per_hour:>9.3f} {hours:>10.1f} h{flag}")
    if len(cands) > show:
        lines.append(f"#   ... {len(cands) - show} more")
    lines.append("# Price sources:")
    for src in sorted({k.quote.source for k in cands}):
        lines.append(f"#   {src}")
    for note in notes:
        lines.append(f"# Note: {note}")
    lines.append("# SkyPilot picks the cheapest feasible candidate at launch from its own catalog; these are estimates.")
    if cfg.compute.launcher != "skypilot":
        lines.append(f"# Note: compute.launcher is {cfg.compute.launcher}; set compute.launcher=skypilot to launch this task.")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- ledger rows from queue records


def _value(rec: Any, key: str) -> Any:
    v = rec.get(key) if hasattr(rec, "get") else getattr(rec, key, None)
    return None if v in ("-", "") else v


def record_state(rec: Any) -> tuple[JobState, str]:
    """Our JobState for a ManagedJobRecord, and SkyPilot's own status name."""
    status = _value(rec, "status")
    name = str(getattr(status, "value", status))
    if name not in STATE_MAP:
        raise LaunchError(f"SkyPilot reported an unknown managed-job status {name!r}")
    return STATE_MAP[name], name


def parse_cluster_resources(text: str | None) -> tuple[str | None, bool | None]:
    """``1x[spot](gpus=A10G:1, cpus=4, mem=16, g5.xlarge, disk=256)`` -> ('g5.xlarge', True)."""
    if not text or "(" not in text:
        return None, None
    spot = "[spot]" in text.split("(", 1)[0]
    inside = text.split("(", 1)[1].rsplit(")", 1)[0]
    for part in (p.strip() for p in inside.split(",")):
        if part and "=" not in part and part != "...":
            return part, spot
    return None, spot


def skypilot_task_id(rec: Any) -> str | None:
    """The job's SKYPILOT_TASK_ID, computed the way the jobs controller does (stable across recoveries)."""
    stamp, name, job = _value(rec, "run_timestamp"), _value(rec, "job_name"), _value(rec, "job_id")
    if not stamp or not name or job is None:
        return None
    try:
        from sky.utils import common_utils

        return common_utils.get_global_job_id(stamp, name, str(job), task_id=_value(rec, "task_id") or 0,
                                              is_managed_job=True)
    except Exception:
        return None


PriceFn = Callable[[str, str | None, str | None, bool], float]


def _time(rec: Any, key: str) -> float | None:
    v = _value(rec, key)
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def update_attempts(attempts: list[Attempt], rec: Any, job_id: str, nodes: int, price: PriceFn, now: float) -> list[Attempt]:
    """Fold one queue record into the job's attempts (one per rented cluster), returning the new list.

    SkyPilot's record describes the current cluster only, so attempts are kept across polls: one
    opens when the job runs on a cluster not seen yet (its ``last_recovered_at``, set at the first
    start and at every recovery, is new; or cloud/region/instance changed); the open one closes as
    ``preempted`` when the job goes RECOVERING (or a recovery is seen after the fact), and with the
    job's end when it ends. Provisioning before RUNNING is not metered (SkyPilot has no time for it).
    """
    out = [replace(a) for a in attempts]
    state, _ = record_state(rec)
    cloud = (_value(rec, "cloud") or "").lower() or None
    region = _value(rec, "region") or ""
    instance, spot = parse_cluster_resources(_value(rec, "cluster_resources_full") or _value(rec, "cluster_resources"))
    accs = _value(rec, "accelerators") or {}
    accelerator = next((f"{n}:{int(k)}" for n, k in dict(accs).items()), None)
    current = out[-1] if out and out[-1].ended_unix is None else None

    def close(a: Attempt, when: float, reason: str) -> None:
        a.ended_unix, a.end_reason = max(a.started_unix, when), reason

    if state is JobState.RECOVERING:
        if current is not None:
            close(current, now, "preempted")
        return out
    never_seen_running = state.terminal and not out and _time(rec, "start_at") is not None
    if (state is JobState.RUNNING or never_seen_running) and cloud and instance:
        started = _time(rec, "last_recovered_at") or _time(rec, "start_at") or now
        if never_seen_running:
            started = _time(rec, "start_at") or started  # it ended between polls: one attempt for the whole job
        if current is not None and (started > current.started_unix + 1 or current.cloud != cloud
                                    or current.region != region or current.instance != instance):
            close(current, started if started > current.started_unix else now, "preempted")
            current = None
        if current is None and (not out or abs(out[-1].started_unix - started) > 1):
            number = out[-1].number + 1 if out else int(_value(rec, "recovery_count") or 0) + 1
            spot_flag = bool(spot) if spot is not None else True
            out.append(Attempt(job_id, number, cloud, region, instance, spot_flag,
                               price(cloud, instance, accelerator, spot_flag), nodes, started,
                               task_id=skypilot_task_id(rec)))
            current = out[-1]
    if state.terminal and current is not None:
        close(current, _time(rec, "end_at") or now, END_REASON[state])
    return out


# ---------------------------------------------------------------- the launcher


def _number(job_id: str) -> int:
    if not job_id.startswith(JOB_PREFIX) or not job_id[len(JOB_PREFIX):].isdigit():
        raise LaunchError(f"{job_id!r} is not a SkyPilot job id of this launcher (expected {JOB_PREFIX}<number>)")
    return int(job_id[len(JOB_PREFIX):])


class SkyPilotLauncher:
    """Managed jobs through SkyPilot's SDK; one instance may watch jobs it did not submit (ids ``sky-<n>``)."""

    def __init__(self, cfg: RunConfig | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time):
        self.cfg, self.sleep, self.clock = cfg, sleep, clock
        self._attempts: dict[str, list[Attempt]] = {}
        self._nodes: dict[str, int] = {}

    # ------------------------------------------------------------ submit
    def submit(self, cfg: RunConfig, run_id: str) -> str:
        import sky

        self.cfg = cfg
        config = task_config(cfg, run_id)
        workdir = Path(cfg.compute.workdir).resolve()
        if not (workdir / "pyproject.toml").is_file():
            raise ConfigError(f"'compute.workdir': {str(workdir)!r} has no pyproject.toml; point it at the thrifty "
                              "project directory (setup installs it on the node)")
        config["workdir"] = str(workdir)
        task = build_task(config)
        name = config["name"]
        request = sky.jobs.launch(task, name=name)
        job_ids, _handle = sky.get(request)
        ids = job_ids if isinstance(job_ids, list) else [job_ids]
        if not ids or ids[0] is None:
            raise LaunchError(f"SkyPilot accepted job {name!r} but returned no job id")
        job_id = f"{JOB_PREFIX}{int(ids[0])}"
        self._attempts[job_id], self._nodes[job_id] = self._seed(job_id), cfg.compute.num_nodes
        log.info("submitted SkyPilot managed job %s (%s): `sky jobs logs %d` follows it", job_id, name, ids[0])
        return job_id

    # ------------------------------------------------------------ status
    def _record(self, job_id: str) -> Any:
        import sky

        number = _number(job_id)
        result = sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=False, job_ids=[number], fields=QUEUE_FIELDS))
        records = result[0] if isinstance(result, tuple) else result
        mine = [r for r in records if _value(r, "job_id") == number]
        if not mine:
            raise LaunchError(f"SkyPilot has no managed job {number} ({job_id}); `sky jobs queue` lists the jobs")
        return mine[0]

    def _seed(self, job_id: str) -> list[Attempt]:
        """Attempts this run's ledger already holds for ``job_id`` (a restarted watcher keeps its history)."""
        if self.cfg is None:
            return []
        try:
            from thrifty.runs import read_attempts
            from thrifty.storage import open_store

            attempts = read_attempts(open_store(self.cfg.store), self.cfg.run_name)
        except Exception:
            return []
        return [a for a in attempts if a.job_id == job_id]

    def _price(self, cloud: str, instance: str | None, accelerator: str | None, spot: bool) -> float:
        """$/hour of one node: the instance if the offline table knows it, else the accelerator's cheapest offer."""
        from thrifty.pricing import find_instance

        if instance:
            try:
                row = find_instance(cloud, instance)
                price = row.spot_usd_per_hour if spot else row.on_demand_usd_per_hour
                if price is not None:
                    return float(price)
            except PricingError:
                pass
        if accelerator:
            try:
                return quote_accelerator(cloud, accelerator, spot).usd_per_hour
            except PricingError:
                pass
        # Never $0: charge the dearest candidate this run allows on that cloud, or fail loudly.
        if self.cfg is not None:
            cands = [k.quote.usd_per_hour for k in candidates(self.cfg)[0] if k.cloud == cloud]
            if cands:
                log.warning("no price for %s %s (%s); metering at the dearest candidate, $%.3f/h", cloud, instance,
                            accelerator, max(cands))
                return max(cands)
        raise LaunchError(f"no price for {cloud} {instance} ({accelerator}); add it to thrifty/pricing.py")

    def status(self, job_id: str) -> JobStatus:
        rec = self._record(job_id)
        state, sky_state = record_state(rec)
        if job_id not in self._attempts:
            self._attempts[job_id] = self._seed(job_id)
        nodes = self._nodes.get(job_id) or (self.cfg.compute.num_nodes if self.cfg else 1)
        self._attempts[job_id] = update_attempts(self._attempts[job_id], rec, job_id, nodes, self._price, self.clock())
        attempts = self._attempts[job_id]
        where = ""
        if attempts:
            a = attempts[-1]
            where = f" on {a.cloud} {a.region} {a.instance} {'spot' if a.spot else 'on-demand'}"
        recoveries = int(_value(rec, "recovery_count") or 0)
        parts = [f"SkyPilot {sky_state}{where}", f"{recoveries} recovery(ies)"]
        if _value(rec, "failure_reason"):
            parts.append(str(_value(rec, "failure_reason")))
        elif _value(rec, "details"):
            parts.append(str(_value(rec, "details")))
        task_id = skypilot_task_id(rec)
        if task_id:
            parts.append(f"task {task_id}")
        return JobStatus(job_id, state, [replace(a) for a in attempts], "; ".join(parts))

    def attempts(self, job_id: str) -> list[Attempt]:
        return self.status(job_id).attempts

    # ------------------------------------------------------------ cancel
    def cancel(self, job_id: str) -> None:
        """Checkpoint first, then tear down.

        ``sky.jobs.cancel(graceful=True)`` SIGTERMs the job's process group and flushes MOUNT_CACHED
        uploads, but does not wait for the trainer to save. So a running job is first asked to stop
        through the store (the node's watcher SIGTERMs the trainer and acknowledges once the
        checkpoint is written), and only then, or after ``stop_checkpoint_timeout_s``, cancelled.
        """
        import sky

        number = _number(job_id)
        state, sky_state = record_state(self._record(job_id))
        if state.terminal or sky_state == "CANCELLING":
            return
        if sky_state == "RUNNING" and self.cfg is not None:
            self._request_stop(job_id, number)
        sky.get(sky.jobs.cancel(job_ids=[number], graceful=True))
        log.info("cancelled SkyPilot managed job %s", job_id)

    def _request_stop(self, job_id: str, number: int) -> None:
        from thrifty.runs import run_key
        from thrifty.storage import NotFound, open_store

        assert self.cfg is not None
        store, run_id = open_store(self.cfg.store), self.cfg.run_name
        store.put_bytes(run_key(run_id, STOP_KEY), json.dumps(
            {"managed_job_id": number, "job_id": job_id, "requested_unix": self.clock(), "reason": "cancel"}).encode())
        deadline = self.clock() + self.cfg.compute.stop_checkpoint_timeout_s
        ack = run_key(run_id, STOPPED_KEY.format(job=number))
        next_status = 0.0
        while self.clock() < deadline:
            try:
                store.get_bytes(ack)
                log.info("job %s saved its checkpoint; tearing it down", job_id)
                return
            except NotFound:
                pass
            if self.clock() >= next_status:  # the job may end on its own meanwhile
                if record_state(self._record(job_id))[0].terminal:
                    return
                next_status = self.clock() + 15.0
            self.sleep(2.0)
        log.warning("job %s did not confirm a checkpoint within %.0f s; cancelling anyway", job_id,
                    self.cfg.compute.stop_checkpoint_timeout_s)


# ---------------------------------------------------------------- checks before spending (offline)

CREDENTIAL_HINTS = {
    "aws": "run `aws configure` (or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), then `sky check aws`",
    "gcp": "run `gcloud auth login` and `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
           "to a service-account key file), then `sky check gcp`",
    "azure": "run `az login` and `az account set -s <subscription>` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and "
             "AZURE_CLIENT_SECRET), then `sky check azure`",
}


def _home(environ: dict[str, str]) -> Path:
    return Path(environ.get("HOME") or Path.home())


def remote_api_server(environ: dict[str, str] | None = None) -> str | None:
    """The SkyPilot API server endpoint when it is not this machine (credentials then live on the server)."""
    env = dict(os.environ) if environ is None else environ
    endpoint = env.get("SKYPILOT_API_SERVER_ENDPOINT")
    if not endpoint:
        path = _home(env) / ".sky" / "config.yaml"
        try:
            endpoint = ((yaml.safe_load(path.read_text()) or {}).get("api_server") or {}).get("endpoint")
        except (OSError, yaml.YAMLError, AttributeError):
            endpoint = None
    if endpoint and not re.match(r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0)(:|/|$)", endpoint):
        return endpoint
    return None


def has_credentials(cloud: str, environ: dict[str, str] | None = None) -> bool:
    """Whether this machine has the files or variables the cloud's SDK reads (a cheap, offline look; not `sky check`)."""
    env = dict(os.environ) if environ is None else environ
    home = _home(env)

    def file(var: str, default: Path) -> bool:
        return Path(env.get(var) or default).expanduser().is_file()

    if cloud == "aws":
        return bool((env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"))
                    or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                    or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                    or file("AWS_SHARED_CREDENTIALS_FILE", home / ".aws" / "credentials")
                    or file("AWS_CONFIG_FILE", home / ".aws" / "config"))
    if cloud == "gcp":
        gcloud = Path(env.get("CLOUDSDK_CONFIG") or home / ".config" / "gcloud")
        return bool((env.get("GOOGLE_APPLICATION_CREDENTIALS") and Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).is_file())
                    or (gcloud / "application_default_credentials.json").is_file())
    if cloud == "azure":
        az = Path(env.get("AZURE_CONFIG_DIR") or home / ".azure")
        return bool((env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID"))
                    or (az / "azureProfile.json").is_file() or (az / "msal_token_cache.json").is_file())
    raise ValueError(f"unknown cloud {cloud!r}")


def preflight(cfg: RunConfig, environ: dict[str, str] | None = None) -> None:
    """Everything about a SkyPilot launch that can be checked offline; one ConfigError listing every problem."""
    import importlib.util

    from thrifty.pricing import offers

    c = cfg.compute
    problems: list[str] = []
    if importlib.util.find_spec("sky") is None:
        raise ConfigError("'compute.launcher': skypilot needs SkyPilot on this machine: "
                          "pip install -e '.[cloud]' (skypilot==0.14.1), or use compute.launcher=local")
    try:
        if c.store_access == "mount_cached":
            store_mount_source(cfg.store)
        elif "://" not in cfg.store or cfg.store.startswith("file://"):
            store_mount_source(cfg.store)  # raises: a local store is unreachable from a node
    except ConfigError as exc:
        problems.append(str(exc))
    for acc in c.accelerators:
        if not any(offers(cloud, acc)[0] for cloud in c.clouds):
            problems.append(f"'compute.accelerators': no price for {acc} on any of {c.clouds}; "
                            "`thrifty prices` lists what each cloud offers")
    cands, _ = candidates(cfg)
    if cands and not any(k.within_cap for k in cands):
        cheapest = min(k.quote.usd_per_hour for k in cands)
        problems.append(f"'compute.max_hourly_cost': ${c.max_hourly_cost:g}/h is below every candidate "
                        f"(cheapest ${cheapest:.3f}/h per node); raise it or add cheaper accelerators")
    endpoint = remote_api_server(environ)
    if endpoint is None:
        for cloud in c.clouds:
            if not has_credentials(cloud, environ):
                problems.append(f"'compute.clouds': no {cloud} credentials on this machine: {CREDENTIAL_HINTS[cloud]}; "
                                f"or remove {cloud} from compute.clouds")
    else:
        log.info("SkyPilot API server %s holds the cloud credentials; not checking them here", endpoint)
    if not (Path(c.workdir) / "pyproject.toml").is_file():
        problems.append(f"'compute.workdir': {c.workdir!r} has no pyproject.toml; point it at the thrifty project "
                        "directory (setup installs it on the node)")
    if not problems:
        try:
            build_task(task_config(cfg))
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("SkyPilot launch is not ready:\n  - " + "\n  - ".join(problems))
