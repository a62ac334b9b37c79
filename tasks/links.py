"""Links into the Prefect UI that a user can click: a flow run's page, and the runs page listing every flow run of
one Thrifty run (its tag, ``thrifty-run:<run_name>``, is not a link in the UI)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from thrifty.runs.names import run_tag

# the runs page filters by time too (the past week unless told): a date range that holds every flow run of any run
# (a span of seconds back from now would also miss the run's scheduled flow runs, and reads "Past 59 months 4 weeks")
RUNS_FROM, RUNS_TO = "2020-01-01", "2100-01-01"


def runs_page_path(run_name: str) -> str:
    """The UI's runs page filtered by the run's tag, in the query the page reads (``tag``; a ``range`` of dates)."""
    return "runs?" + urlencode({"tag": run_tag(run_name), "type": "range", "startDate": RUNS_FROM,
                                "endDate": RUNS_TO})


def ui_url(path: str) -> str:
    """``path`` under the Prefect UI (PREFECT_UI_URL, which Prefect derives from PREFECT_API_URL); the path alone
    when no UI is known."""
    try:
        from prefect.settings import PREFECT_UI_URL

        base = PREFECT_UI_URL.value()
    except Exception:  # noqa: BLE001 - a link is a courtesy
        base = None
    return f"{base.rstrip('/')}/{path}" if base else f"/{path}"


def run_flow_runs_link(run_name: str) -> str:
    """The address that lists every flow run of ``run_name`` (its first try, its resumes, its reports)."""
    return ui_url(runs_page_path(run_name))


def flow_run_link(flow_run: Any) -> str:
    """A flow run's page; its id when no UI is known."""
    try:
        from prefect.utilities.urls import url_for

        return url_for(flow_run) or str(flow_run.id)
    except Exception:  # noqa: BLE001 - a link is a courtesy
        return str(flow_run.id)
