"""A run's end, logged to an MLflow tracking server through its REST API (no mlflow package needed).

What is logged: the RunConfig as params (flattened: ``train.lr``); ``loss``, ``samples_per_s``, the validation
metrics (``val_*``) and the cumulative ``spend_usd`` by optimizer step, from the run's metric lines and ledger in the
store; the cost and savings as final metrics (step 0); the config's cost tags (``tags``) and the Prefect flow run (id
and link) as tags; the end's sentence as the run's description.

One MLflow run per Prefect flow run, named after the Thrifty run. It is found again by its ``thrifty.flow_run_id``
tag, so logging the same flow run's end twice (the end hook after a crash) fills in that MLflow run, never a second
one. A new flow run of the same Thrifty run (a resume after the cap, a rerun) makes a new MLflow run of the same name
and ``thrifty.run_name`` tag, holding the run's whole history so far (every job's metric lines, the whole ledger):
the newest MLflow run of a name shows the run entire.

Pure library code: the caller (tasks.report) decides when to log and turns every failure into a warning.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterable

from thrifty.config import RunConfig
from thrifty.money.budget import spend_usd
from thrifty.money.ledger import Attempt
from thrifty.money.savings import SavingsReport
from thrifty.report.chart import series, training_curve

API = "/api/2.0/mlflow"
TIMEOUT_S = 15.0  # per request: a server that stopped answering delays the report this long, once
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # runs/log-batch's limits per request
MAX_PARAM_CHARS = 500  # servers before MLflow 2.? took 500 characters per param value (newer ones 6000)
MAX_TAG_CHARS = 5000
MAX_KEY_CHARS = 250
# an end's MLflow status; every other end (the cap, a failure, bad input, a crash) is FAILED
STATUS = {"completed": "FINISHED", "stopped_early": "FINISHED", "rung": "FINISHED", "cancelled": "KILLED"}
FLOW_RUN_TAG = "thrifty.flow_run_id"


class MlflowError(Exception):
    """The tracking server refused or did not answer; the message names the endpoint, never credentials."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code  # MLflow's error_code, e.g. RESOURCE_DOES_NOT_EXIST


@dataclass(frozen=True)
class Server:
    """A tracking server's base URL (no credentials in it) and how to authenticate, as MLflow's client does."""

    uri: str
    authorization: str | None = None
    tls: ssl.SSLContext | None = None

    @classmethod
    def from_env(cls, uri: str, environ: Mapping[str, str] | None = None) -> "Server":
        """MLflow's own variables: MLFLOW_TRACKING_TOKEN (bearer), else MLFLOW_TRACKING_USERNAME and _PASSWORD (or
        user:password@ in the URI) for basic auth; MLFLOW_TRACKING_SERVER_CERT_PATH, MLFLOW_TRACKING_INSECURE_TLS."""
        env = os.environ if environ is None else environ
        parts = urllib.parse.urlsplit(uri)
        netloc = parts.netloc.rpartition("@")[2]
        user = env.get("MLFLOW_TRACKING_USERNAME") or urllib.parse.unquote(parts.username or "")
        password = env.get("MLFLOW_TRACKING_PASSWORD") or urllib.parse.unquote(parts.password or "")
        auth = None
        if env.get("MLFLOW_TRACKING_TOKEN"):
            auth = f"Bearer {env['MLFLOW_TRACKING_TOKEN']}"
        elif user:
            auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        tls = None
        if parts.scheme == "https":
            if env.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
                tls = ssl._create_unverified_context()  # noqa: S323 - the user asked for it, as MLflow's client does
            elif env.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
                tls = ssl.create_default_context(cafile=env["MLFLOW_TRACKING_SERVER_CERT_PATH"])
        return cls(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", "")), auth, tls)

    @property
    def host(self) -> str:
        """host[:port], what a warning may name."""
        return urllib.parse.urlsplit(self.uri).netloc

    def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None,
             query: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self.uri}{API}/{endpoint}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body, allow_nan=False).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.tls) as response:
                text = response.read().decode() or "{}"
        except urllib.error.HTTPError as exc:
            answer = _json(exc.read().decode(errors="replace"))
            raise MlflowError(f"{endpoint}: HTTP {exc.code} {answer.get('error_code', '')} "
                              f"{str(answer.get('message', exc.reason))[:300]}".strip(),
                              str(answer.get("error_code", ""))) from None
        except (urllib.error.URLError, OSError) as exc:  # refused, unresolvable, timed out, TLS
            reason = getattr(exc, "reason", exc)
            raise MlflowError(f"{endpoint}: no answer ({reason})") from None
        answer = _json(text)
        if not isinstance(answer, dict):
            raise MlflowError(f"{endpoint}: the answer is not MLflow's JSON (is this the tracking server's URL?)")
        return answer


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {}


def _key(text: str) -> str:
    """A name MLflow accepts as a metric, param or tag key: letters, digits, '_', '-', '.', ' ', '/'."""
    return re.sub(r"[^\w\-. /]", "_", text)[:MAX_KEY_CHARS] or "_"


def _cut(value: str, limit: int) -> str:
    return value if len(value) <= limit else f"{value[:limit - 30]}... ({len(value):,} characters)"


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested settings as ``section.key`` -> text: strings as they are, everything else as JSON (true, null,
    [\"aws\"]); an empty mapping stays one param ({})."""
    if isinstance(value, Mapping) and value:
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{_key(str(k))}" if prefix else _key(str(k))))
        return out
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return {prefix: _cut(text, MAX_PARAM_CHARS)}


def params(config: RunConfig) -> dict[str, str]:
    """The RunConfig as MLflow params, e.g. ``train.lr`` -> ``0.001``."""
    return flatten(config.model_dump(mode="json"))


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None  # JSON has no NaN or inf, and a flag is not a metric
    return float(v)


def _metric(key: str, value: float, time_unix: float, step: int) -> dict[str, Any]:
    return {"key": key, "value": value, "timestamp": int(round(time_unix * 1000)), "step": int(step)}


def step_metrics(metrics: list[dict[str, Any]], attempts: list[Attempt]) -> list[dict[str, Any]]:
    """Histories by optimizer step: one value a step, the later record winning (a resumed attempt trains again the
    steps a preempted one logged past its checkpoint); ``spend_usd`` as the report's chart has it, ending at the
    ledger's total once every attempt has ended."""
    out = []
    for rec in training_curve(metrics):
        for name in ("loss", "samples_per_s"):
            if (v := _number(rec.get(name))) is not None:
                out.append(_metric(name, v, rec.get("time_unix", 0.0), rec["step"]))
    evals: dict[int, dict[str, Any]] = {}
    for rec in sorted((m for m in metrics if m.get("event") == "eval" and "step" in m),
                      key=lambda m: m.get("time_unix", 0.0)):
        evals[int(rec["step"])] = rec
    for step, rec in sorted(evals.items()):
        out += [_metric(_key(k), v, rec.get("time_unix", 0.0), step) for k, raw in rec.items()
                if k.startswith("val_") and (v := _number(raw)) is not None]
    out += [_metric("spend_usd", p.spend_usd, p.time_unix, p.step) for p in series(metrics, attempts)]
    return out


def final_metrics(figures: SavingsReport | None, attempts: list[Attempt], now: float) -> list[dict[str, Any]]:
    """Cost and savings, at step 0: the savings report's figures when the run has one, else the ledger's spend."""
    values: dict[str, float] = {"cost_usd": figures.actual_usd if figures else round(spend_usd(attempts), 6),
                                "attempts": float(len(attempts))}
    if figures is not None:
        values.update(on_demand_usd=figures.on_demand_usd, naive_usd=figures.naive_usd, saved_usd=figures.saved_usd,
                      saved_fraction=figures.saved_fraction, instance_hours=figures.instance_hours,
                      preemption_waste_usd=figures.preemption_waste.usd,
                      recomputed_steps=float(figures.preemption_waste.steps),
                      **{f"saved_{_key(k)}_usd": v for k, v in figures.levers_usd.items()})
        if figures.early_stop is not None:
            values["early_stop_unspent_usd"] = figures.early_stop.usd
    return [_metric(k, v, now, 0) for k, v in values.items() if _number(v) is not None]


def run_tags(config: RunConfig, kind: str, end: str, flow_run_id: str | None,
             flow_run_url: str | None) -> dict[str, str]:
    """The config's cost tags (``tags``: label-shaped, so never one of MLflow's ``mlflow.*``), then Thrifty's own."""
    tags: dict[str, str] = dict(config.tags)
    note = end + (f"\n\nPrefect flow run: {flow_run_url}" if flow_run_url else "")
    tags.update({"thrifty.run_name": config.run_name, "thrifty.end": kind, "thrifty.recipe": config.recipe,
                 "thrifty.training_fingerprint": config.training_fingerprint(), "mlflow.note.content": note})
    if flow_run_id:
        tags[FLOW_RUN_TAG] = flow_run_id
    if flow_run_url:
        tags["thrifty.flow_run_url"] = flow_run_url
    return {k: _cut(v, MAX_TAG_CHARS) for k, v in tags.items()}


def experiment_id(server: Server, name: str) -> str:
    """The experiment's id, created when missing (another run creating it at the same moment is fine)."""
    for _ in range(2):
        try:
            found = server.call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"]
        except MlflowError as exc:
            if exc.code != "RESOURCE_DOES_NOT_EXIST":
                raise
        else:
            if found.get("lifecycle_stage") == "deleted":
                raise MlflowError(f"the experiment {name!r} is deleted on the server: restore it there, or set "
                                  "report.mlflow_experiment to another name")
            return str(found["experiment_id"])
        try:
            return str(server.call("POST", "experiments/create", {"name": name})["experiment_id"])
        except MlflowError as exc:
            if exc.code != "RESOURCE_ALREADY_EXISTS":
                raise
    raise MlflowError(f"the experiment {name!r} could be neither found nor created")


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    return (items[i:i + size] for i in range(0, len(items), size))


def log_end(server: Server, config: RunConfig, kind: str, end: str, figures: SavingsReport | None,
            attempts: list[Attempt], metrics: list[dict[str, Any]], flow_run_id: str | None = None,
            flow_run_url: str | None = None, now: float | None = None) -> str:
    """Log the run's end as one MLflow run of this flow run (found again by its tag, else created); returns the
    MLflow run's link. Raises MlflowError."""
    now = time.time() if now is None else now
    exp = experiment_id(server, config.report.mlflow_experiment)
    run, logged = None, set()
    if flow_run_id:
        ident = flow_run_id.replace("\\", "\\\\").replace("'", "\\'")
        found = server.call("POST", "runs/search", {"experiment_ids": [exp], "max_results": 1,
                                                    "filter": f"tags.\"{FLOW_RUN_TAG}\" = '{ident}'"}).get("runs")
        if found:
            run = found[0]["info"]["run_id"]
            logged = {p["key"] for p in found[0].get("data", {}).get("params", [])}  # params never change: skip them
    if run is None:
        began = min((a.started_unix for a in attempts), default=now)
        run = server.call("POST", "runs/create", {"experiment_id": exp, "run_name": config.run_name,
                                                  "start_time": int(began * 1000)})["run"]["info"]["run_id"]
    tags = [{"key": k, "value": v} for k, v in run_tags(config, kind, end, flow_run_id, flow_run_url).items()]
    for batch in _chunks(tags, MAX_TAGS):
        server.call("POST", "runs/log-batch", {"run_id": run, "tags": batch})
    fresh = [{"key": k, "value": v} for k, v in params(config).items() if k not in logged]
    for batch in _chunks(fresh, MAX_PARAMS):
        server.call("POST", "runs/log-batch", {"run_id": run, "params": batch})
    for batch in _chunks(step_metrics(metrics, attempts) + final_metrics(figures, attempts, now), MAX_METRICS):
        server.call("POST", "runs/log-batch", {"run_id": run, "metrics": batch})  # a value logged before is kept once
    server.call("POST", "runs/update", {"run_id": run, "status": STATUS.get(kind, "FAILED"),
                                        "end_time": int(now * 1000)})
    return f"{server.uri}/#/experiments/{exp}/runs/{run}"
