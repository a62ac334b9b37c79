"""SkyPilot managed jobs behind the Launcher protocol: RunConfig -> ``sky.Task``, submit, status, cancel.

Only ``submit``, ``status`` and ``cancel`` reach SkyPilot's API server (``sky.jobs.launch``,
``sky.jobs.queue_v2``, ``sky.jobs.cancel``, ``sky.get``); building the task and ``plan`` are offline.

Files: ``candidates`` (what may be rented, priced), ``ranking`` (by the run's cost on each, the deadline),
``task`` (task YAML), ``plan`` (``thrifty plan``), ``queue`` (queue records -> JobState and Attempts),
``launcher`` (SkyPilotLauncher), ``preflight`` (offline checks before a launch).
"""

from __future__ import annotations

from thrifty.launchers.skypilot.launcher import JOB_PREFIX, SkyPilotLauncher
from thrifty.launchers.skypilot.preflight import CREDENTIAL_HINTS, has_credentials, kubeconfig, preflight, remote_api_server
from thrifty.launchers.skypilot.queue import (
    END_REASON, QUEUE_FIELDS, STATE_MAP, PriceFn, parse_cluster_resources, record_state, skypilot_task_id,
    update_attempts,
)
from thrifty.launchers.skypilot.candidates import KUBERNETES, Candidate, candidates, kubernetes_quote
from thrifty.launchers.skypilot.plan import plan_ranking, plan_text
from thrifty.launchers.skypilot.ranking import Costed, Ranking, rank
from thrifty.launchers.skypilot.task import (
    MASTER_PORT, RUN_MULTI, RUN_SINGLE, SETUP, STORE_MOUNT, VENV, build_task, job_name, ranked_candidates,
    store_mount_source, task_config, task_yaml,
)

__all__ = [
    "CREDENTIAL_HINTS", "END_REASON", "JOB_PREFIX", "MASTER_PORT", "QUEUE_FIELDS", "RUN_MULTI", "RUN_SINGLE", "SETUP",
    "STATE_MAP", "STORE_MOUNT", "VENV", "Candidate", "Costed", "Ranking", "PriceFn", "SkyPilotLauncher", "build_task", "candidates",
    "KUBERNETES", "has_credentials", "job_name", "kubeconfig", "kubernetes_quote", "parse_cluster_resources", "plan_ranking", "plan_text", "rank", "ranked_candidates", "preflight", "record_state",
    "remote_api_server", "skypilot_task_id", "store_mount_source", "task_config", "task_yaml", "update_attempts",
]
