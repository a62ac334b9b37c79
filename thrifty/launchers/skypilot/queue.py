"""SkyPilot managed-job records (``sky.jobs.queue_v2``) -> our JobState and the ledger's Attempts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from thrifty.launchers.base import JobState, LaunchError
from thrifty.money.ledger import Attempt

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


# (cloud, instance, accelerator, spot, region, zone) -> $/hour of one node, or ($/hour, where it came from[, when
# that price was last seen in force])
PriceFn = Callable[..., "float | tuple[float, str] | tuple[float, str, float]"]


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
            priced = price(cloud, instance, accelerator, spot_flag, region or None, _value(rec, "zone") or None)
            usd, source = priced[:2] if isinstance(priced, tuple) else (priced, "")
            out.append(Attempt(job_id, number, cloud, region, instance, spot_flag, usd, nodes, started,
                               task_id=skypilot_task_id(rec), price_source=source))
            current = out[-1]
    if state.terminal and current is not None:
        close(current, _time(rec, "end_at") or now, END_REASON[state])
    return out

