"""Upcoming flow runs under the names they will run under.

Prefect's scheduler creates a scheduled deployment's flow runs with random names (``precise-quail``); a flow run
takes its real name (``nightly-20261129``) only when it starts. The name is a pure function of the run's parameters
and its scheduled time (thrifty.runs.names), so it can be given ahead: `thrifty deploy` names the runs it asks the
server to schedule, and each scheduled run of ours names the newest ones when it starts and ends.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from thrifty.runs.names import flow_run_name

MAX_UPCOMING = 200  # far more than the scheduler keeps ahead (3 runs, or 100 within its horizon)


def schedule_runs(client: Any, deployment_id: UUID | str) -> None:
    """Ask the server to schedule the deployment's upcoming runs now (as its scheduler service would within a
    minute), with the server's own horizon and counts. A deploy deletes the auto-scheduled runs it replaces."""
    response = client.request("POST", "/deployments/{id}/schedule", path_params={"id": str(deployment_id)}, json={})
    response.raise_for_status()


def upcoming_runs(client: Any, deployment_id: UUID | str) -> list[Any]:
    """The deployment's flow runs in a Scheduled state, soonest first."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    return client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[UUID(str(deployment_id))])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=MAX_UPCOMING)


def name_upcoming_runs(client: Any, deployment_id: UUID | str) -> list[tuple[Any, str]]:
    """Rename the deployment's Scheduled flow runs whose names differ from the one each will run under; returns
    (flow run, new name) for each renamed. A deployment without schedules or of a flow Thrifty does not name is
    left alone."""
    deployment = client.read_deployment(deployment_id)
    if not deployment.schedules:
        return []
    flow_name = client.read_flow(deployment.flow_id).name
    renamed = []
    for run in upcoming_runs(client, deployment.id):
        name = flow_run_name(flow_name, run.parameters, run.expected_start_time)
        if name and name != run.name:
            client.update_flow_run(run.id, name=name)
            renamed.append((run, name))
    return renamed
