"""The ``report`` section: where a run's end is reported besides Prefect, and the check of an MLflow tracking URI.

Nothing here changes what is trained: the section is not in the training fingerprint, so setting it on a finished
run never retrains it.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from thrifty.config.base import ConfigError, _Frozen, shown

TRACKING_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variable: a machine already set up for MLflow needs nothing more
EXPERIMENT_PATTERN = r"^[^\x00-\x1f\x7f]{1,500}$"


def redacted(uri: str) -> str:
    """``uri`` with any user and password replaced by '***': what an error message or a warning may show."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^/@]*@", r"\1***@", uri.strip())


def check_tracking_uri(uri: str, where: str) -> str:
    """``uri`` without a trailing slash if it is an http(s) URL of a tracking server; ValueError naming the fix.

    Thrifty talks to the server through its REST API, so the MLflow client's other forms (a local path, file:,
    sqlite:, databricks) cannot be used here."""
    text = uri.strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"{where} holds a control character (a newline, a tab); remove it")
    try:
        parts = urlsplit(text)
        port = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"{where} {shown(redacted(uri))} is not a URL ({exc}); write it as "
                         "http(s)://HOST[:PORT][/PATH]") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{where} {shown(redacted(uri))} must be an http:// or https:// URL of an MLflow tracking "
                         "server (e.g. http://mlflow.internal:5000): Thrifty logs through MLflow's REST API, so a "
                         "local path, file:, sqlite: or databricks cannot be used; run `mlflow server` against that "
                         "store instead")
    if not parts.hostname:
        raise ValueError(f"{where} {shown(redacted(uri))} names no host; write it as "
                         f"{parts.scheme}://HOST[:PORT][/PATH]")
    if parts.query or parts.fragment:
        raise ValueError(f"{where} {shown(redacted(uri))} may not hold '?' or '#'; give the server's base URL only")
    if port == 0:
        raise ValueError(f"{where} {shown(redacted(uri))}: port 0 is not a server's port")
    if not re.fullmatch(r"[A-Za-z0-9.\-_\[\]:%]+", parts.hostname):
        raise ValueError(f"{where} {shown(redacted(uri))}: {shown(parts.hostname)} is not a host name")
    return text.rstrip("/")


class ReportConfig(_Frozen):
    """Where the run's end is reported besides Prefect's artifacts (none of it decides the weights)."""

    mlflow_tracking_uri: str | None = Field(
        None, description="Log every run's end to this MLflow tracking server (http(s)://HOST[:PORT][/PATH]): the "
        "config as params, loss, validation metrics, samples/s and cumulative spend by step, cost and savings. "
        "null = the MLFLOW_TRACKING_URI environment variable of the flow's process, else off. No credentials here "
        "(the config reaches the UI and the nodes): set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD, where the flow runs.")
    mlflow_experiment: str = Field(
        "thrifty", pattern=EXPERIMENT_PATTERN,
        description="The MLflow experiment the runs are logged to, created when missing (1-500 characters).")

    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _tracking_uri(cls, v: str | None) -> str | None:
        if v is None:
            return None
        uri = check_tracking_uri(v, "mlflow_tracking_uri")
        if urlsplit(uri).username is not None:
            raise ValueError("mlflow_tracking_uri may not hold credentials (user:password@): the config is shown in "
                             "the Prefect UI and sent to the nodes. Set MLFLOW_TRACKING_USERNAME and "
                             "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) where the flow runs instead")
        return uri


def tracking_uri(report: ReportConfig, environ: dict[str, str] | None = None) -> str | None:
    """The tracking server this run logs to: the setting, else ``$MLFLOW_TRACKING_URI``, else None (off). A
    malformed environment variable is a ConfigError, said before anything is rented."""
    if report.mlflow_tracking_uri is not None:
        return report.mlflow_tracking_uri
    raw = (os.environ if environ is None else environ).get(TRACKING_ENV, "").strip()
    if not raw:
        return None
    try:
        return check_tracking_uri(raw, f"${TRACKING_ENV}")
    except ValueError as exc:
        raise ConfigError(f"{exc}; or unset {TRACKING_ENV} (or set 'report.mlflow_tracking_uri') to log elsewhere") \
            from None
